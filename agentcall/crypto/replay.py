"""The replay window: each (sender, request id) opens at most once while it could still be valid.

A request is valid until its ``expires_at`` by the callee's clock, give or take the allowed
skew, so its reservation is kept until ``expires_at + CLOCK_SKEW_S``. A request lives at most
``MAX_ENVELOPE_VALIDITY_S`` (a queued job's 72 hours), which bounds how long any reservation
may be held, and the window itself is bounded: when full it refuses rather than forgets.
"""

from __future__ import annotations

from zope.interface import Interface, implementer

from agentcall import limits
from agentcall.errors import ReplayDetected, RequestExpired


class ReplayWindowFull(ReplayDetected):
    """The window holds its maximum of live reservations; new requests are refused."""


class IReplayStorage(Interface):
    """Reservations keyed by (sender fingerprint, request id), each with a keep-until time."""

    def keep_until(sender_fingerprint: str, request_id: str) -> float | None:
        """When the reservation may be dropped, or None if there is none."""

    def add(sender_fingerprint: str, request_id: str, keep_until: float) -> None:
        """Record a reservation (replacing a stale one with the same key)."""

    def count_live(now: float) -> int:
        """How many reservations are still held at ``now``."""

    def prune(now: float) -> int:
        """Drop every reservation whose keep-until is at or before ``now``; how many went."""


@implementer(IReplayStorage)
class MemoryReplayStorage:
    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], float] = {}

    def keep_until(self, sender_fingerprint: str, request_id: str) -> float | None:
        return self._entries.get((sender_fingerprint, request_id))

    def add(self, sender_fingerprint: str, request_id: str, keep_until: float) -> None:
        self._entries[(sender_fingerprint, request_id)] = keep_until

    def count_live(self, now: float) -> int:
        return sum(1 for until in self._entries.values() if until > now)

    def prune(self, now: float) -> int:
        stale = [key for key, until in self._entries.items() if until <= now]
        for key in stale:
            del self._entries[key]
        return len(stale)


class ReplayWindow:
    """Reserve request ids after a request has been opened and verified, before acting on it."""

    def __init__(
        self,
        max_entries: int = limits.REPLAY_MAX_ENTRIES,
        storage: IReplayStorage | None = None,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._max_entries = max_entries
        self._storage: IReplayStorage = storage if storage is not None else MemoryReplayStorage()

    def reserve(
        self, sender_fingerprint: str, request_id: str, expires_at: float, now: float
    ) -> None:
        """Reserve ``request_id`` for this sender, or raise.

        :raises ReplayDetected: the id is already reserved and still live.
        :raises ReplayWindowFull: no room for another reservation.
        :raises RequestExpired: the request claims to stay valid longer than any request may.
        """
        # Reservations may only be as long as a request can legitimately live, so a forged
        # far-future expiry cannot pin an entry (and a slot) for ever.
        if expires_at > now + limits.MAX_ENVELOPE_VALIDITY_S + limits.CLOCK_SKEW_S:
            raise RequestExpired("replay: expires_at is further ahead than any request may live")
        self._storage.prune(now)
        until = self._storage.keep_until(sender_fingerprint, request_id)
        if until is not None and until > now:
            raise ReplayDetected("replay: this request id was already used by this sender")
        if self._storage.count_live(now) >= self._max_entries:
            raise ReplayWindowFull("replay: the window is full; refusing new requests")
        self._storage.add(sender_fingerprint, request_id, expires_at + limits.CLOCK_SKEW_S)

    def prune(self, now: float) -> int:
        """Drop reservations that can no longer matter; returns how many."""
        return self._storage.prune(now)

    def live_count(self, now: float) -> int:
        return self._storage.count_live(now)
