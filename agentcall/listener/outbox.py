"""Live calls' terminal frames kept while the relay is away, sent in order once it is back.

A live call's progress frames only matter while the caller waits, so they are dropped when no
relay connection exists; its terminal frame is kept until the relay's own deadline for the call
(:data:`~agentcall.limits.CALL_DEADLINE_S`) has passed, after which nobody is waiting for it.
Mailbox jobs do not come through here: their results live in the execution journal until the
relay acknowledges them (:mod:`agentcall.listener.mailboxdesk`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from twisted.internet.interfaces import IReactorTime

from agentcall import limits
from agentcall.logevents import Logger
from agentcall.wire.frames import Frame

_log = Logger(namespace="agentcall.listener.core")

# Terminal frames kept while the relay is away; the relay drops a call after its deadline.
MAX_KEPT_FRAMES: Final = 64


class Outbox:
    """Sends frames to the relay now, or keeps the terminal ones for the next connection."""

    def __init__(self, clock: IReactorTime, send: Callable[[Frame], bool]) -> None:
        self._clock = clock
        self._send = send
        self._kept: list[tuple[float, Frame]] = []

    @property
    def kept(self) -> tuple[Frame, ...]:
        return tuple(frame for _, frame in self._kept)

    def deliver(self, frame: Frame, *, keep: bool) -> None:
        if self._send(frame) or not keep:
            return
        deadline = self._clock.seconds() + limits.CALL_DEADLINE_S
        self._kept.append((deadline, frame))
        if len(self._kept) > MAX_KEPT_FRAMES:
            dropped = self._kept.pop(0)[1]
            _log.warn("outcome_dropped", frame_type=dropped.type)
        _log.info("outcome_kept", frame_type=frame.type, kept=len(self._kept))

    def relay_ready(self) -> None:
        """A relay connection became usable: send what was kept for it, in order."""
        now = self._clock.seconds()
        kept, self._kept = self._kept, []
        sent = 0
        for deadline, frame in kept:
            if deadline <= now:
                _log.info("outcome_expired", frame_type=frame.type)
            elif self._send(frame):
                sent += 1
            else:
                self._kept.append((deadline, frame))
        if sent:
            _log.info("outcome_delivered_late", count=sent)
