"""The front door's arithmetic: connection caps, caller caps, throttles, failure tallies."""

from __future__ import annotations

import pytest

from agentcall.relay.gate import (
    ConnectionGate,
    GateLimits,
    Ticket,
    TurnedAway,
    TurnedAwayTally,
    total_cap,
)
from agentcall.relay.throttle import (
    OTHER_SOURCES,
    FailureRow,
    FailureTally,
    TokenBuckets,
    retry_after_header,
)


def gate(
    per_source: int = 2, total: int = 5, handshakes: int = 4, callers: int = 2
) -> ConnectionGate:
    return ConnectionGate(GateLimits(per_source, total, handshakes, callers))


def test_per_source_cap_refuses_only_that_source() -> None:
    g = gate()
    assert isinstance(g.admit("a"), Ticket)
    assert isinstance(g.admit("a"), Ticket)
    assert g.admit("a") is TurnedAway.PER_SOURCE
    assert isinstance(g.admit("b"), Ticket)
    assert g.open_from("a") == 2 and g.open_total == 3


def test_release_frees_a_place_and_is_idempotent() -> None:
    g = gate()
    first = g.admit("a")
    assert isinstance(first, Ticket)
    g.admit("a")
    g.release(first)
    g.release(first)
    assert g.open_from("a") == 1 and g.open_total == 1 and g.in_head == 1
    assert isinstance(g.admit("a"), Ticket)


def test_sources_are_forgotten_when_their_last_connection_goes() -> None:
    g = gate()
    ticket = g.admit("a")
    assert isinstance(ticket, Ticket)
    g.release(ticket)
    assert g.sources == 0 and g.open_from("a") == 0


def test_total_cap_comes_first() -> None:
    g = gate(per_source=10, total=2, handshakes=10)
    g.admit("a")
    g.admit("b")
    assert g.admit("c") is TurnedAway.TOTAL


def test_handshake_cap_counts_only_connections_still_in_their_head() -> None:
    g = gate(per_source=10, total=10, handshakes=2)
    one, two = g.admit("a"), g.admit("b")
    assert isinstance(one, Ticket) and isinstance(two, Ticket)
    assert g.admit("c") is TurnedAway.HANDSHAKES
    g.head_done(one)
    g.head_done(one)
    assert g.in_head == 1
    assert isinstance(g.admit("c"), Ticket)
    g.release(one)  # head already done: the head count does not move again
    assert g.in_head == 2


def test_head_done_after_release_changes_nothing() -> None:
    g = gate()
    ticket = g.admit("a")
    assert isinstance(ticket, Ticket)
    g.release(ticket)
    g.head_done(ticket)
    assert g.in_head == 0 and g.open_total == 0


def test_callers_per_identity() -> None:
    g = gate(callers=2)
    assert g.admit_caller("@acme/ann") and g.admit_caller("@acme/ann")
    assert not g.admit_caller("@acme/ann")
    assert g.admit_caller("@acme/ken")
    g.release_caller("@acme/ann")
    assert g.callers_of("@acme/ann") == 1
    assert g.admit_caller("@acme/ann")
    g.release_caller("@acme/ken")
    g.release_caller("@acme/ken")  # one too many is harmless
    assert g.callers_of("@acme/ken") == 0


@pytest.mark.parametrize("field", ["per_source", "total", "handshakes", "callers_per_identity"])
def test_caps_must_be_positive(field: str) -> None:
    values = {"per_source": 1, "total": 1, "handshakes": 1, "callers_per_identity": 1, field: 0}
    with pytest.raises(ValueError, match=field):
        GateLimits(**values)


def test_turned_away_tally_drains_counts_by_reason() -> None:
    tally = TurnedAwayTally()
    assert tally.drain() == {}
    for _ in range(3):
        tally.note(TurnedAway.PER_SOURCE)
    tally.note(TurnedAway.HEAD_TIMEOUT)
    assert tally.drain() == {"head_timeout": 1, "per_source": 3}
    assert tally.drain() == {}


def test_total_cap_keeps_the_reserve() -> None:
    assert total_cap(1024, 64) == 960
    with pytest.raises(ValueError, match="LimitNOFILE"):
        total_cap(64, 64)
    with pytest.raises(ValueError, match="negative"):
        total_cap(1024, -1)


# --- throttle -------------------------------------------------------------------------------


def test_bucket_allows_a_burst_then_refuses_with_the_wait() -> None:
    buckets = TokenBuckets(3)  # 3 a minute: one token every 20 s
    assert [buckets.take("a", 100.0) for _ in range(3)] == [None, None, None]
    assert buckets.take("a", 100.0) == pytest.approx(20.0)
    assert buckets.retry_after("a", 110.0) == pytest.approx(10.0)
    assert buckets.take("b", 100.0) is None  # another source is untouched
    assert buckets.take("a", 120.0) is None
    assert buckets.take("a", 120.0) == pytest.approx(20.0)


def test_retry_after_does_not_take() -> None:
    buckets = TokenBuckets(1)
    assert buckets.retry_after("a", 0.0) is None
    assert buckets.retry_after("a", 0.0) is None
    assert buckets.take("a", 0.0) is None
    assert buckets.retry_after("a", 0.0) == pytest.approx(60.0)


def test_a_clock_stepping_back_grants_nothing() -> None:
    buckets = TokenBuckets(1)
    buckets.take("a", 1000.0)
    assert buckets.retry_after("a", 10.0) == pytest.approx(60.0)


def test_prune_forgets_full_buckets_only() -> None:
    buckets = TokenBuckets(2)
    buckets.take("a", 0.0)
    buckets.take("b", 50.0)
    buckets.prune(60.0)  # a refilled after 30 s, b has not
    assert len(buckets) == 1
    assert buckets.retry_after("a", 60.0) is None


def test_bucket_table_is_bounded_and_fails_closed() -> None:
    buckets = TokenBuckets(1, max_keys=2)
    assert buckets.take("a", 0.0) is None
    assert buckets.take("b", 0.0) is None
    assert buckets.take("c", 0.0) == 60.0
    assert buckets.take("c", 61.0) is None  # pruning made room


def test_bucket_rate_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TokenBuckets(0)


@pytest.mark.parametrize(("wait", "header"), [(0.01, "1"), (1.0, "1"), (1.2, "2"), (59.9, "60")])
def test_retry_after_header_rounds_up(wait: float, header: str) -> None:
    assert retry_after_header(wait) == header


def test_failure_tally_one_row_per_source_and_minute() -> None:
    tally = FailureTally()
    for at in (60.0, 61.0, 119.9):
        tally.note("10.0.0.1", at)
    tally.note("10.0.0.2", 70.0)
    tally.note("10.0.0.1", 120.0)
    assert tally.due(119.9) == []
    assert tally.due(120.0) == [FailureRow("10.0.0.1", 60.0, 3), FailureRow("10.0.0.2", 60.0, 1)]
    assert tally.due(500.0) == [FailureRow("10.0.0.1", 120.0, 1)]
    assert tally.due(500.0) == []


def test_failure_tally_bounds_sources_per_minute() -> None:
    tally = FailureTally(max_sources_per_minute=2)
    for source in ("a", "b", "c", "d", "a"):
        tally.note(source, 0.0)
    rows = tally.drain()
    assert {(row.source, row.count) for row in rows} == {("a", 2), ("b", 1), (OTHER_SOURCES, 2)}
    assert tally.drain() == []
