"""The kernel read boundary: a Landlock ruleset that confines an answering agent and its children.

``rules`` decides which paths get which access (pure, given plain values and a view of the file
system); ``needs`` finds what an agent needs to run; ``landlock`` is the three system calls and
the ABI probe; ``main`` is the exec wrapper (``python -I -m agentcall.confine``) that applies a
ruleset and execs the agent. Standard library only: the wrapper runs before every agent.
"""
