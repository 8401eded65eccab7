"""Recording fakes for the relay cores: a channel, a directory and an audit sink."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from twisted.internet.defer import Deferred, succeed
from zope.interface import implementer

from agentcall.interfaces import IChannel
from agentcall.relay.audit import AuditEntry

T = TypeVar("T")


@implementer(IChannel)
class RecordingChannel:
    """A channel that keeps every frame sent to it and every close asked of it, in order."""

    def __init__(self, peer: str = "test-peer") -> None:
        self.peer = peer
        self.sent: list[object] = []
        self.closes: list[tuple[int, str]] = []
        # One trace of both, for tests that care whether a frame came before or after a close.
        self.events: list[tuple[str, object]] = []

    def send(self, frame: object) -> None:
        self.sent.append(frame)
        self.events.append(("send", frame))

    def close(self, code: int, reason: str) -> None:
        self.closes.append((code, reason))
        self.events.append(("close", (code, reason)))

    @property
    def closed(self) -> bool:
        return bool(self.closes)

    def of_type(self, kind: type[T]) -> list[T]:
        """The sent frames of one class, in order."""
        return [frame for frame in self.sent if isinstance(frame, kind)]

    def clear(self) -> None:
        self.sent.clear()
        self.closes.clear()
        self.events.clear()

    def __repr__(self) -> str:
        return f"<RecordingChannel {self.peer}>"


class MemoryDirectory:
    """A :class:`~agentcall.relay.store_interface.Directory` held in a set of (org, handle)
    pairs; it answers at once."""

    def __init__(self, members: Iterable[tuple[str, str]] = ()) -> None:
        self.members: set[tuple[str, str]] = set(members)

    def handle_exists(self, org: str, handle: str) -> Deferred[bool]:
        return succeed((org, handle) in self.members)

    def add(self, org: str, handle: str) -> None:
        self.members.add((org, handle))

    def remove(self, org: str, handle: str) -> None:
        self.members.discard((org, handle))


class RecordingAudit:
    """An :class:`~agentcall.relay.audit.AuditSink` that keeps its rows in a list."""

    def __init__(self) -> None:
        self.rows: list[AuditEntry] = []

    def record(self, entry: AuditEntry) -> Deferred[None]:
        self.rows.append(entry)
        return succeed(None)

    def record_many(self, entries: Sequence[AuditEntry]) -> Deferred[None]:
        self.rows.extend(entries)
        return succeed(None)

    def events(self, call_id: str | None = None) -> list[str]:
        """Event names in order, optionally only those of one call."""
        return [row.event for row in self.rows if call_id is None or row.call_id == call_id]
