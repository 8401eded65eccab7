"""``agentcall install claude|codex``: register ``agentcall mcp`` with a coding agent."""
