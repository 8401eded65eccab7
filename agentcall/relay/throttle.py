"""Per-source-address throttles against guessing, and the per-minute tally of failed logins.

Pure: ``now`` (seconds) is always passed in. The relay keeps one :class:`TokenBuckets` for
``POST /v1/register`` (every attempt takes a token) and one for failed authentication (only a
failure takes a token; a source whose bucket is empty is answered 429 before its credentials
are even looked at). :class:`FailureTally` turns a flood of failures into one audit row per
source and minute.
"""

from __future__ import annotations

import math

import attrs

MINUTE_S = 60.0
# The one bucket every new key shares while the table is full (no address looks like this).
OVERFLOW_KEY = "(overflow)"


@attrs.define
class _Bucket:
    tokens: float
    at: float


class TokenBuckets:
    """A token bucket per key: ``capacity`` tokens, refilled at ``per_minute`` a minute.

    A key whose bucket has refilled is forgotten by :meth:`prune`, so memory is bounded by the
    keys seen within about one refill period. ``max_keys`` bounds it in between: past it, the
    table is pruned on insert, and every new key that still does not fit shares one overflow
    bucket. So a flood of fresh addresses neither locks out every other new address (as a
    refusal would) nor escapes counting (as ignoring them would); keys already in the table
    keep their own buckets.
    """

    def __init__(self, per_minute: int, *, max_keys: int = 100_000) -> None:
        if per_minute < 1:
            raise ValueError("per_minute must be at least 1")
        self.capacity = float(per_minute)
        self._rate = per_minute / MINUTE_S
        self._max_keys = max_keys
        self._buckets: dict[str, _Bucket] = {}

    def _level(self, key: str, now: float) -> float:
        bucket = self._buckets.get(key)
        if bucket is None:
            return self.capacity
        # A clock that steps back never grants tokens.
        return min(self.capacity, bucket.tokens + max(0.0, now - bucket.at) * self._rate)

    def _slot(self, key: str) -> str:
        if key in self._buckets or len(self._buckets) < self._max_keys:
            return key
        return OVERFLOW_KEY

    def retry_after(self, key: str, now: float) -> float | None:
        """None while ``key`` has a token; otherwise the seconds until it has one."""
        level = self._level(self._slot(key), now)
        if level >= 1.0:
            return None
        return (1.0 - level) / self._rate

    def take(self, key: str, now: float) -> float | None:
        """Take a token: None when one was taken, else the seconds until one is available."""
        if key not in self._buckets and len(self._buckets) >= self._max_keys:
            self.prune(now)
        slot = self._slot(key)
        wait = self.retry_after(slot, now)
        if wait is not None:
            return wait
        self._buckets[slot] = _Bucket(self._level(slot, now) - 1.0, now)
        return None

    def prune(self, now: float) -> None:
        """Forget every key whose bucket is full again."""
        full = [key for key in self._buckets if self._level(key, now) >= self.capacity]
        for key in full:
            del self._buckets[key]

    def __len__(self) -> int:
        return len(self._buckets)


def retry_after_header(wait_s: float) -> str:
    """Whole seconds for ``Retry-After``, rounded up and at least 1."""
    return str(max(1, math.ceil(wait_s)))


@attrs.frozen
class FailureRow:
    """Failed authentications from one source within one minute."""

    source: str
    minute: float  # start of the minute, seconds since the epoch
    count: int


# Stands for every source past the cap within one minute, so the tally stays bounded.
OTHER_SOURCES = "other"


class FailureTally:
    """Counts failures per (source, minute); hands back each minute once it has ended."""

    def __init__(self, *, max_sources_per_minute: int = 1_000) -> None:
        self._max = max_sources_per_minute
        self._counts: dict[tuple[float, str], int] = {}
        self._per_minute: dict[float, int] = {}

    def note(self, source: str, now: float) -> None:
        minute = math.floor(now / MINUTE_S) * MINUTE_S
        key = (minute, source)
        if key not in self._counts:
            if self._per_minute.get(minute, 0) >= self._max:
                key = (minute, OTHER_SOURCES)
            else:
                self._per_minute[minute] = self._per_minute.get(minute, 0) + 1
        self._counts[key] = self._counts.get(key, 0) + 1

    def due(self, now: float) -> list[FailureRow]:
        """Rows of the minutes that ended at or before ``now``, oldest first; they are removed."""
        ended = sorted(key for key in self._counts if key[0] + MINUTE_S <= now)
        return self._pop(ended)

    def restore(self, row: FailureRow) -> None:
        """Put back a row that could not be written, to be handed out again."""
        key = (row.minute, row.source)
        if key not in self._counts:
            self._per_minute[row.minute] = self._per_minute.get(row.minute, 0) + 1
        self._counts[key] = self._counts.get(key, 0) + row.count

    def drain(self) -> list[FailureRow]:
        """Every row, the current minute included (at shutdown)."""
        return self._pop(sorted(self._counts))

    def _pop(self, keys: list[tuple[float, str]]) -> list[FailureRow]:
        rows = [
            FailureRow(source, minute, self._counts.pop((minute, source)))
            for minute, source in keys
        ]
        for minute in {row.minute for row in rows}:
            if not any(key[0] == minute for key in self._counts):
                self._per_minute.pop(minute, None)
        return rows
