"""Keep the listener's memory and environment from its own user's other processes.

The answering agent runs as the owner's user, so ordinary permissions let it read
``/proc/<listener>/environ`` (the tokens the listener inherited), its memory and its open
files. A process that is not dumpable has those files owned by root and refuses ptrace-like
access from the same user; Landlock already denies a confined run that access, and this holds
where Landlock is missing or the run escaped it. Children are dumpable again after ``execve``,
so the agents the listener starts are not affected.
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def make_undumpable(platform: str = sys.platform) -> bool:
    """Mark this process not dumpable; False where the system has no such switch."""
    if not platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)


def is_dumpable() -> bool:
    """Whether this process is dumpable now (Linux; True elsewhere)."""
    if not sys.platform.startswith("linux"):
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1)
