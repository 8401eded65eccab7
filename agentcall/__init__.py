"""AgentCall: call a coworker's coding agent, end-to-end encrypted."""

__version__ = "0.1.0"
