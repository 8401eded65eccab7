"""Compositions that wire the roles together (above caller/, listener/ and relay/, below cli/).

The roles are peers and never import one another; a program that needs two of them is
assembled here. :mod:`agentcall.compose.listen` is the listener service as it runs on a
machine: it answers calls (listener/) and places the calls thin CLIs hand it (caller/).
"""
