"""The batching audit sink: the rows of a short window in one store call, nothing lost when
the database refuses a batch (within a bound), driven with a Clock."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.errors import StoreError
from agentcall.relay import audit
from agentcall.relay.audit import AuditEntry, BatchingAuditSink
from agentcall.relay.calls import restore_windows
from agentcall.relay.ratelimit import SlidingWindowLimiter
from agentcall.relay.store import open_relay_store
from tests.unit.relay_helpers import Fired, fired

T0 = 1_700_000_000.0


def entry(n: int, event: str = audit.CALL_SUBMIT) -> AuditEntry:
    return AuditEntry(event, "acme", "ana", "ken", f"call-{n}", T0 + n, None)


class Log:
    """An AuditLog that records each batch; it refuses while ``refusing`` is set, and with
    ``later`` it answers only on :meth:`answer`, as a remote database would."""

    def __init__(self) -> None:
        self.batches: list[list[AuditEntry]] = []
        self.refusing = False
        self.later = False
        self.waiting: list[Deferred[None]] = []

    def record_many(self, entries: Sequence[AuditEntry]) -> Deferred[None]:
        if self.refusing:
            return fail(StoreError("database is locked"))
        self.batches.append(list(entries))
        if self.later:
            answer: Deferred[None] = Deferred()
            self.waiting.append(answer)
            return answer
        return succeed(None)

    def answer(self) -> None:
        waiting, self.waiting = self.waiting, []
        for answer in waiting:
            answer.callback(None)


def outcomes(deferreds: list[Deferred[None]]) -> list[object]:
    seen: list[object] = []
    for d in deferreds:
        box: list[object] = []
        d.addBoth(box.append)
        seen.append(box[0] if box else "pending")
    return [type(o.value).__name__ if isinstance(o, Failure) else o for o in seen]


@pytest.fixture
def clock() -> Clock:
    c = Clock()
    c.advance(T0)
    return c


def test_the_rows_of_one_window_are_written_by_one_call_at_its_end(clock: Clock) -> None:
    log = Log()
    sink = BatchingAuditSink(log, clock, window_s=0.01)
    written = [sink.record(entry(n)) for n in range(2)]
    # Not at the next turn: the frames the rows audit go out before the database is touched.
    clock.advance(0)
    assert log.batches == [] and outcomes(written) == ["pending"] * 2
    clock.advance(0.005)
    written.append(sink.record(entry(2)))  # the window runs from the batch's first row
    clock.advance(0.004)
    assert log.batches == []
    clock.advance(0.001)
    assert log.batches == [[entry(0), entry(1), entry(2)]]
    assert outcomes(written) == [None, None, None]
    later = sink.record(entry(3))
    clock.advance(0.01)
    assert log.batches[1:] == [[entry(3)]] and outcomes([later]) == [None]
    assert sink.batches == 2


def test_a_full_batch_is_written_at_the_next_turn(clock: Clock) -> None:
    log = Log()
    sink = BatchingAuditSink(log, clock, window_s=0.01, max_rows=3)
    written = [sink.record(entry(n)) for n in range(3)]
    clock.advance(0)
    assert log.batches == [[entry(0), entry(1), entry(2)]]
    assert outcomes(written) == [None, None, None]
    # The window timer that the first row armed is gone with its batch.
    assert clock.getDelayedCalls() == []
    sink.record(entry(3))
    clock.advance(0)
    assert len(log.batches) == 1
    clock.advance(0.01)
    assert log.batches[1:] == [[entry(3)]]


def test_the_default_window_is_short_and_bounded() -> None:
    assert 0 < limits.AUDIT_WINDOW_S <= 0.05
    assert 1 < limits.AUDIT_BATCH_ROWS <= limits.AUDIT_MAX_PENDING


def test_a_refused_batch_is_logged_kept_and_tried_again_in_order(clock: Clock) -> None:
    log = Log()
    log.refusing = True
    sink = BatchingAuditSink(log, clock, retry_s=5.0, window_s=0, max_rows=2)
    first = [sink.record(entry(n)) for n in range(2)]
    with capturedLogs() as events:
        clock.advance(0)
    assert [e.get("event") for e in events] == ["audit_batch_failed"]
    assert events[0]["rows"] == 2
    log.refusing = False
    # Rows recorded during the back-off wait for the retry instead of hitting the database now.
    second = sink.record(entry(2))
    clock.advance(0)
    clock.advance(4.9)
    assert log.batches == []
    clock.advance(0.1)
    assert log.batches == [[entry(0), entry(1), entry(2)]]
    assert outcomes([*first, second]) == [None, None, None]


def test_the_backlog_is_bounded_by_dropping_the_oldest(clock: Clock) -> None:
    log = Log()
    log.refusing = True
    sink = BatchingAuditSink(log, clock, max_pending=3, window_s=0)
    written = [sink.record(entry(n)) for n in range(2)]
    clock.advance(0)  # refused: both kept
    with capturedLogs() as events:
        written += [sink.record(entry(n)) for n in range(2, 5)]
    assert outcomes(written) == ["AuditDropped", "AuditDropped", "pending", "pending", "pending"]
    assert sink.dropped == 2 and sink.pending == 3
    assert [e.get("event") for e in events] == ["audit_dropped", "audit_dropped"]
    log.refusing = False
    clock.advance(limits.AUDIT_RETRY_S)
    assert log.batches == [[entry(2), entry(3), entry(4)]]


def test_one_batch_is_in_flight_at_a_time(clock: Clock) -> None:
    """With a store that answers later, rows recorded meanwhile go in the next batch, after."""
    log = Log()
    log.later = True
    sink = BatchingAuditSink(log, clock, window_s=0)
    first = sink.record(entry(0))
    clock.advance(0)
    second = sink.record(entry(1))
    clock.advance(0)
    assert log.batches == [[entry(0)]]
    assert outcomes([first, second]) == ["pending", "pending"]
    log.answer()
    assert outcomes([first]) == [None]
    clock.advance(0)
    assert log.batches == [[entry(0)], [entry(1)]]
    log.answer()
    assert outcomes([second]) == [None]


def test_flush_writes_what_waits_at_once(clock: Clock) -> None:
    log = Log()
    sink = BatchingAuditSink(log, clock)
    sink.record(entry(0))
    sink.flush()
    assert log.batches == [[entry(0)]]
    clock.advance(0)
    assert log.batches == [[entry(0)]]  # the turn's write found nothing left
    assert clock.getDelayedCalls() == []


def test_a_bound_below_one_is_refused(clock: Clock) -> None:
    with pytest.raises(ValueError):
        BatchingAuditSink(Log(), clock, max_pending=0)
    with pytest.raises(ValueError):
        BatchingAuditSink(Log(), clock, max_rows=0)


# --- SQLite ---------------------------------------------------------------------------------


def test_sqlite_writes_a_batch_in_one_transaction(tmp_path: Path) -> None:
    store = open_relay_store(tmp_path / "relay.sqlite")
    fired(store.ensure_org("acme", T0))
    statements: list[str] = []
    store.registry._conn.set_trace_callback(statements.append)
    fired(store.record_many([entry(0), entry(1, audit.CALL_ACCEPT), entry(2)]))
    store.registry._conn.set_trace_callback(None)
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == [
        "BEGIN IMMEDIATE",
        "COMMIT",
    ]
    rows = fired(store.audit_rows("acme"))
    assert [(r.event, r.call_id) for r in rows] == [
        (audit.CALL_SUBMIT, "call-0"),
        (audit.CALL_ACCEPT, "call-1"),
        (audit.CALL_SUBMIT, "call-2"),
    ]
    store.close()


def test_sqlite_writes_a_batch_of_one_as_one_statement(tmp_path: Path) -> None:
    store = open_relay_store(tmp_path / "relay.sqlite")
    fired(store.ensure_org("acme", T0))
    statements: list[str] = []
    store.registry._conn.set_trace_callback(statements.append)
    fired(store.record_many([entry(0)]))
    store.registry._conn.set_trace_callback(None)
    assert len(statements) == 1 and statements[0].startswith("INSERT INTO audit")
    with pytest.raises(ValueError, match="not an audit event"):
        fired(store.record_many([entry(1, "call.peek")]))
    assert [r.call_id for r in fired(store.audit_rows("acme"))] == ["call-0"]
    store.close()


def test_sqlite_writes_all_of_a_batch_or_none(tmp_path: Path) -> None:
    store = Fired(open_relay_store(tmp_path / "relay.sqlite"))
    store.ensure_org("acme", T0)
    with pytest.raises(ValueError, match="not an audit event"):
        store.record_many([entry(0), entry(1, "call.peek")])
    registry = store.wrapped.registry
    registry._conn.execute(
        "CREATE TRIGGER no_third BEFORE INSERT ON audit"
        " WHEN NEW.call_id = 'call-2' BEGIN SELECT RAISE(ABORT, 'full'); END"
    )
    with pytest.raises(StoreError):
        store.record_many([entry(1), entry(2)])
    assert store.audit_rows("acme") == []
    assert not registry._conn.in_transaction
    store.record_many([])
    store.close()


def test_batched_call_rows_rebuild_the_rate_windows(tmp_path: Path, clock: Clock) -> None:
    """What the sink wrote is what the next start-up counts into the windows."""
    store = open_relay_store(tmp_path / "relay.sqlite")
    fired(store.ensure_org("acme", T0))
    sink = BatchingAuditSink(store, clock)
    for n in range(3):
        sink.record(entry(n))
    sink.record(entry(3, audit.CALL_COMPLETE))
    clock.advance(limits.AUDIT_WINDOW_S)
    limiter = SlidingWindowLimiter(limits.CALLS_PER_HOUR_PER_PAIR, limits.RATE_WINDOW_S)
    with capturedLogs() as events:
        fired(restore_windows(store, limiter, T0 + 10))
    (restored,) = [e for e in events if e.get("event") == "rate_windows_restored"]
    assert (restored["calls"], restored["pairs"]) == (3, 1)
    store.close()


def test_sqlite_busy_is_a_store_error(tmp_path: Path) -> None:
    """Another writer holding the file: the batch fails as StoreError (and is kept above)."""
    path = tmp_path / "relay.sqlite"
    store = open_relay_store(path)
    fired(store.ensure_org("acme", T0))
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    store.registry._conn.execute("PRAGMA busy_timeout = 0")
    with pytest.raises(StoreError):
        fired(store.record_many([entry(0)]))
    other.execute("ROLLBACK")
    other.close()
    store.close()
