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
        """The process's real user id (from ``status``, which a hidden process still shows)."""
        try:
            with open(f"{self._proc}/{pid}/status", "rb") as handle:
                raw = handle.read()
        except OSError:
            return None
        return parse_uid(raw)

    def hidden(self, pid: int) -> bool:
        """Whether the process made itself not dumpable: its /proc files become root's."""
        try:
            return os.stat(f"{self._proc}/{pid}").st_uid == 0
        except OSError:
            return False


def parse_uid(raw: bytes) -> int | None:
    """The real uid on the ``Uid:`` line of ``/proc/PID/status``."""
    for line in raw.splitlines():
        if line.startswith(b"Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
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
    service_pid: int | None = None,
) -> bool:
    """True when ``pid``, or a process of this user on its parent chain, carries a run
    marker, leads a run, is in a run's session (``run_leaders``: the pids of the runs now
    going, each the leader of its own session), or is the service itself (``service_pid``,
    this process by default: whatever descends from the listener is a run).

    A peer that hid itself (not dumpable, so its environment cannot be read) counts as a
    run's: the owner's own clients never hide. An environment unreadable for another reason
    (a peer of this user running with another group) is no evidence either way, and the walk
    goes on. Ancestors of another user (init, sshd) end the walk.
    """
    seen = facts or ProcessFacts()
    me = os.getuid() if uid is None else uid
    myself = os.getpid() if service_pid is None else service_pid
    leaders = set(run_leaders())
    current = pid
    for depth in range(MAX_ANCESTORS):
        if current <= 1:
            return False
        if depth and seen.uid(current) != me:
            return False
        place = seen.stat(current)
        if place is None:
            return depth == 0  # the peer is gone, or cannot be seen at all
        parent, session = place
        if (depth and current == myself) or current in leaders or session in leaders:
            return True
        environ = seen.environ(current)
        if environ is None:
            if depth == 0 and me != 0 and seen.hidden(current):
                return True
        elif environ_marked(environ):
            return True
        current = parent
    return False
