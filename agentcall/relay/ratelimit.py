"""An exact sliding-window rate limiter, keyed by tuples of strings, with time passed in.

The relay budgets calls per (org, caller, callee): at most ``limit`` allowed hits in any window of
``window_s`` seconds. Only allowed hits are recorded, so a caller hammering a closed window does
not push its own reopening further away.

The windows live in memory; :meth:`SlidingWindowLimiter.restore` refills them from hits recorded
elsewhere (the relay's audit rows), so a restart does not grant a fresh window.
"""

from __future__ import annotations

from collections.abc import Iterable

Key = tuple[str, ...]


class SlidingWindowLimiter:
    """At most ``limit`` hits per key within any ``window_s``-second window.

    A hit recorded at time ``t`` counts for every ``now`` with ``t <= now < t + window_s`` and
    stops counting at exactly ``t + window_s``.
    """

    def __init__(self, limit: int, window_s: float) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError("limit must be a non-negative integer")
        if not window_s > 0:
            raise ValueError("window_s must be positive")
        self.limit = limit
        self.window_s = window_s
        # Per key, the times of the allowed hits still inside the window, oldest first. Only
        # allowed hits are stored, so no list ever grows beyond ``limit``.
        self._hits: dict[Key, list[float]] = {}

    def hit(self, key: Key, now: float) -> bool:
        """Record a hit for ``key`` at ``now`` if the window has room; True when allowed."""
        stamps = self._live(key, now)
        if len(stamps) >= self.limit:
            return False
        # An injected clock only moves forward, but keep the list ordered regardless so that
        # expiry from the front stays correct.
        index = len(stamps)
        while index > 0 and stamps[index - 1] > now:
            index -= 1
        stamps.insert(index, now)
        self._hits[key] = stamps
        return True

    def restore(self, hits: Iterable[tuple[Key, float]], now: float) -> int:
        """Add hits allowed before ``now`` (in any order); returns how many the keys now hold.

        Hits already expired at ``now`` are skipped, and per key only the newest ``limit`` are
        kept: older ones can no longer decide anything. A hit stamped after ``now`` (the clock
        went back across a restart) counts as made at ``now``, so it blocks at most one window.
        """
        if self.limit == 0:
            return 0  # nothing is ever allowed; there is no window to fill
        restored: dict[Key, list[float]] = {}
        for key, at in hits:
            stamp = min(at, now)
            if stamp + self.window_s > now:
                restored.setdefault(key, []).append(stamp)
        kept = 0
        for key, stamps in restored.items():
            merged = sorted([*self._hits.get(key, []), *stamps])[-self.limit :]
            self._hits[key] = merged
            kept += len(merged)
        return kept

    def retry_after(self, key: Key, now: float) -> float:
        """Seconds from ``now`` until a hit for ``key`` would be allowed (0.0 when it is now)."""
        stamps = self._live(key, now)
        if len(stamps) < self.limit:
            return 0.0
        if self.limit == 0:
            return float("inf")
        # Room opens once all but limit-1 of the live hits have expired.
        oldest_blocking = stamps[len(stamps) - self.limit]
        return max(0.0, oldest_blocking + self.window_s - now)

    def count(self, key: Key, now: float) -> int:
        """How many hits for ``key`` are inside the window at ``now``."""
        return len(self._live(key, now))

    def prune(self, now: float) -> int:
        """Drop expired hits everywhere and forget keys left empty; returns keys dropped."""
        dropped = 0
        for key in list(self._hits):
            if not self._live(key, now):
                dropped += 1
        return dropped

    def tracked_keys(self) -> int:
        """How many keys currently hold state (what :meth:`prune` keeps bounded)."""
        return len(self._hits)

    def _live(self, key: Key, now: float) -> list[float]:
        """The key's unexpired hits at ``now``; an emptied key is forgotten on the way."""
        stamps = self._hits.get(key)
        if stamps is None:
            return []
        # Compare as ``t + window <= now`` (not ``t <= now - window``) so that the edge is
        # exactly the float the caller computes for "t plus the window".
        expired = 0
        while expired < len(stamps) and stamps[expired] + self.window_s <= now:
            expired += 1
        if expired:
            del stamps[:expired]
        if not stamps:
            del self._hits[key]
        return stamps
