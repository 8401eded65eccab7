"""Whether a local process belongs to an answering agent's run.

The surfaces that act as the owner (the service socket, the A2A bridge) accept only a client
that shows a secret the agent cannot read. As a second line they also refuse a client that is
plainly part of a run, even one that somehow holds the secret. Every process of a run inherits
the run's marker variables (:data:`RUN_MARKERS`); a process that scrubbed its environment is
still caught while its parent chain leads to a marked process or to a run's session leader
(:func:`belongs_to_run` walks it). A process that both scrubbed its environment and was
re-parented away (a double fork after ``setsid``) is not found: the secret is what stops it.

Linux only (``/proc``); elsewhere nothing is found and the secret is the whole control.
Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection

# The variables every process of a run inherits (agentcall.listener.runner's RUN_ID_ENV and
# agentcall.listener.agent_env's CALL_ID_ENV), as they appear in /proc/PID/environ.
RUN_MARKERS: tuple[bytes, ...] = (b"AGENTCALL_RUN_ID=", b"AGENTCALL_CALL_ID=")
# A parent chain longer than this is not followed further (a loop cannot happen in /proc,
# but a deep chain costs a read per step).
MAX_ANCESTORS = 64


class ProcessFacts:
    """What :func:`belongs_to_run` reads of one process; a test gives its own."""

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc

    def environ(self, pid: int) -> bytes | None:
        """The process's environment block, None when it cannot be read."""
        try:
            with open(f"{self._proc}/{pid}/environ", "rb") as handle:
                return handle.read()
        except OSError:
            return None

    def stat(self, pid: int) -> tuple[int, int] | None:
        """``(parent pid, session id)``, None when the process is gone or unreadable."""
        try:
            with open(f"{self._proc}/{pid}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            return None
        return parse_stat(raw)

    def uid(self, pid: int) -> int | None:
        try:
            return os.stat(f"{self._proc}/{pid}").st_uid
        except OSError:
            return None


def parse_stat(raw: bytes) -> tuple[int, int] | None:
    """``(ppid, session)`` from a ``/proc/PID/stat`` line; None when it is not one.

    The command name in parentheses may itself hold spaces and parentheses, so the fields are
    counted from the last ``)``.
    """
    _head, paren, rest = raw.rpartition(b")")
    if not paren:
        return None
    fields = rest.split()
    # state, ppid, pgrp, session, ...
    if len(fields) < 4:
        return None
    try:
        return int(fields[1]), int(fields[3])
    except ValueError:
        return None


def environ_marked(environ: bytes) -> bool:
    """Whether an environment block holds one of the run markers."""
    return any(entry.startswith(RUN_MARKERS) for entry in environ.split(b"\0"))


def belongs_to_run(
    pid: int,
    *,
    run_leaders: Callable[[], Collection[int]] = lambda: (),
    facts: ProcessFacts | None = None,
    uid: int | None = None,
) -> bool:
    """True when ``pid``, or a process of this user on its parent chain, carries a run
    marker, leads a run, or is in a run's session (``run_leaders``: the pids of the runs now
    going, each the leader of its own session).

    The peer itself must be readable: a process of this user whose environment cannot be
    read (it made itself non-dumpable, or it is already gone) is counted as a run's, since
    the owner's own clients never hide. Ancestors of another user (init, sshd) end the walk.
    """
    seen = facts or ProcessFacts()
    me = os.getuid() if uid is None else uid
    leaders = set(run_leaders())
    current = pid
    for depth in range(MAX_ANCESTORS):
        if current <= 1:
            return False
        if depth and seen.uid(current) != me:
            return False
        environ = seen.environ(current)
        facts_of = seen.stat(current)
        if environ is None or facts_of is None:
            return depth == 0
        if environ_marked(environ):
            return True
        parent, session = facts_of
        if current in leaders or session in leaders:
            return True
        current = parent
    return False
