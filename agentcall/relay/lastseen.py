"""When each member was last seen: noted as their sockets open and close, written in batches.

Writing a row per connection would put a database write on every socket of a reconnect storm;
instead :class:`LastSeen` keeps the newest time per member in memory and hands the store one
batch every ``LAST_SEEN_FLUSH_S`` (the relay's timer), when ``LAST_SEEN_MAX_PENDING`` members
are waiting, and when the relay stops. ``GET /v1/members`` reads the store and overlays what is
still waiting, so an admin never sees a time older than the relay knows. A batch the store
refuses is put back (newer times win) and tried with the next one; a restart between batches
loses at most that minute of last-seen times, which is what this coarse figure is for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.logevents import Logger

_log = Logger(namespace="agentcall.relay.lastseen")


class SeenStore(Protocol):
    def record_seen(self, seen: Sequence[tuple[str, str, float]]) -> Deferred[None]: ...


class LastSeen:
    """The last-seen times not yet written, and the writing of them."""

    def __init__(
        self, store: SeenStore, *, max_pending: int = limits.LAST_SEEN_MAX_PENDING
    ) -> None:
        self._store = store
        self._max_pending = max_pending
        self._pending: dict[tuple[str, str], float] = {}
        self._writing = False

    def note(self, org: str, handle: str, at: float) -> None:
        key = (org, handle)
        if at > self._pending.get(key, 0.0):
            self._pending[key] = at
        if len(self._pending) >= self._max_pending:
            self.flush()

    def pending(self, org: str, handle: str) -> float | None:
        """The time waiting to be written for ``@org/handle``, if any."""
        return self._pending.get((org, handle))

    def flush(self) -> Deferred[None] | None:
        """Hand what is waiting to the store (one batch at a time); None when there is nothing
        to write or a batch is already on its way."""
        if self._writing or not self._pending:
            return None
        batch, self._pending = self._pending, {}
        self._writing = True
        rows = [(org, handle, at) for (org, handle), at in batch.items()]
        written = self._store.record_seen(rows)
        written.addCallbacks(self._written, self._refused, errbackArgs=(batch,))
        return written

    def _written(self, _result: object) -> None:
        self._writing = False

    def _refused(self, failure: Failure, batch: dict[tuple[str, str], float]) -> None:
        self._writing = False
        for key, at in batch.items():
            if at > self._pending.get(key, 0.0):
                self._pending[key] = at
        _log.failure("last_seen_write_failed", failure=failure, members=len(batch))
