"""Last-seen times: kept in memory, written in batches, nothing newer lost to a failed write."""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.defer import Deferred
from twisted.logger import capturedLogs

from agentcall.relay.lastseen import LastSeen


class Store:
    def __init__(self) -> None:
        self.batches: list[list[tuple[str, str, float]]] = []
        self.answers: list[Deferred[None]] = []

    def record_seen(self, seen: Sequence[tuple[str, str, float]]) -> Deferred[None]:
        self.batches.append(sorted(seen))
        answer: Deferred[None] = Deferred()
        self.answers.append(answer)
        return answer


def test_the_newest_time_per_member_is_written_in_one_batch() -> None:
    store = Store()
    seen = LastSeen(store)
    seen.note("acme", "ken", 10.0)
    seen.note("acme", "ken", 30.0)
    seen.note("acme", "ken", 20.0)  # an older close after a newer open
    seen.note("acme", "ann", 5.0)
    assert seen.pending("acme", "ken") == 30.0 and store.batches == []
    seen.flush()
    assert store.batches == [[("acme", "ann", 5.0), ("acme", "ken", 30.0)]]
    assert seen.pending("acme", "ken") is None
    # One batch at a time; nothing to write is no batch at all.
    seen.note("acme", "ken", 40.0)
    assert seen.flush() is None
    store.answers[0].callback(None)
    seen.flush()
    assert store.batches[1:] == [[("acme", "ken", 40.0)]]
    store.answers[1].callback(None)
    assert seen.flush() is None and len(store.batches) == 2


def test_a_batch_is_written_as_soon_as_enough_members_wait() -> None:
    store = Store()
    seen = LastSeen(store, max_pending=3)
    seen.note("acme", "a1", 1.0)
    seen.note("acme", "a2", 1.0)
    assert store.batches == []
    seen.note("acme", "a3", 1.0)
    assert [len(batch) for batch in store.batches] == [3]


def test_a_refused_batch_is_kept_and_newer_times_win() -> None:
    store = Store()
    seen = LastSeen(store)
    seen.note("acme", "ken", 10.0)
    seen.note("acme", "ann", 10.0)
    seen.flush()
    seen.note("acme", "ken", 50.0)  # arrives while the batch is on its way
    with capturedLogs() as events:
        store.answers[0].errback(RuntimeError("database is locked"))
    assert [e.get("event") for e in events if "log_failure" in e] == ["last_seen_write_failed"]
    assert (seen.pending("acme", "ken"), seen.pending("acme", "ann")) == (50.0, 10.0)
    seen.flush()
    assert store.batches[1] == [("acme", "ann", 10.0), ("acme", "ken", 50.0)]
