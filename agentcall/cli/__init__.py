"""The ``agentcall`` command line."""
