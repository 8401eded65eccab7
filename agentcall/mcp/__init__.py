"""``agentcall mcp``: AgentCall as tools of a coding agent, over the Model Context Protocol."""
