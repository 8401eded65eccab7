"""The front door's arithmetic: connection caps, caller caps, throttles, failure tallies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcall.relay.gate import (
    ConnectionGate,
    GateLimits,
    LetIn,
    Ticket,
    TurnedAway,
    TurnedAwayTally,
    busy_retry_after_s,
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


def let_in(g: ConnectionGate, source: str) -> Ticket:
    """Admit a newcomer that evicts nobody."""
    decision = g.admit(source)
    assert isinstance(decision, LetIn) and decision.evicted == (), decision
    return decision.ticket


def test_per_source_cap_refuses_only_that_source() -> None:
    g = gate()
    let_in(g, "a")
    let_in(g, "a")
    assert g.admit("a") is TurnedAway.PER_SOURCE
    let_in(g, "b")
    assert g.open_from("a") == 2 and g.open_total == 3


def test_release_frees_a_place_and_is_idempotent() -> None:
    g = gate()
    first = let_in(g, "a")
    let_in(g, "a")
    g.release(first)
    g.release(first)
    assert g.open_from("a") == 1 and g.open_total == 1 and g.in_head == 1
    let_in(g, "a")


def test_sources_are_forgotten_when_their_last_connection_goes() -> None:
    g = gate()
    g.release(let_in(g, "a"))
    assert g.sources == 0 and g.open_from("a") == 0


def test_at_the_total_cap_the_oldest_plain_http_connection_makes_room() -> None:
    """A flood of plain HTTP connections from many sources cannot keep a newcomer out."""
    g = gate(per_source=10, total=3, handshakes=10)
    oldest, middle, newest = let_in(g, "a"), let_in(g, "b"), let_in(g, "c")
    for ticket in (oldest, middle, newest):
        g.head_done(ticket)  # kept alive between requests, still plain HTTP
    decision = g.admit("d")
    assert isinstance(decision, LetIn)
    assert decision.evicted == ((oldest, TurnedAway.EVICTED_PLAIN_HTTP),)
    assert oldest.released and g.open_total == 3 and g.open_from("a") == 0
    again = g.admit("e")
    assert isinstance(again, LetIn) and again.evicted == ((middle, TurnedAway.EVICTED_PLAIN_HTTP),)


def test_authenticated_websockets_are_never_evicted() -> None:
    """When every place holds an upgraded socket, a newcomer is turned away instead."""
    g = gate(per_source=10, total=2, handshakes=10)
    one, two = let_in(g, "a"), let_in(g, "b")
    g.upgraded(one)
    assert g.plain_http == 1 and g.in_head == 1
    decision = g.admit("c")
    assert isinstance(decision, LetIn) and decision.evicted == (
        (two, TurnedAway.EVICTED_PLAIN_HTTP),
    )
    g.upgraded(decision.ticket)
    assert g.admit("d") is TurnedAway.TOTAL
    assert not one.released and g.open_total == 2


def test_at_the_handshake_cap_the_oldest_unfinished_head_makes_room() -> None:
    """Only connections still in their first head count; the oldest of them is evicted."""
    g = gate(per_source=10, total=10, handshakes=2)
    one, two = let_in(g, "a"), let_in(g, "b")
    decision = g.admit("c")
    assert isinstance(decision, LetIn)
    assert decision.evicted == ((one, TurnedAway.EVICTED_IN_HEAD),)
    assert one.released and g.in_head == 2 and g.open_total == 2
    g.head_done(two)
    g.head_done(two)
    assert g.in_head == 1
    let_in(g, "d")
    g.release(two)  # head already done: the head count does not move again
    assert g.in_head == 2


def test_both_caps_at_once_evict_one_of_each() -> None:
    g = gate(per_source=10, total=2, handshakes=1)
    idle, heading = let_in(g, "a"), None
    g.head_done(idle)
    heading = let_in(g, "b")
    decision = g.admit("c")
    assert isinstance(decision, LetIn)
    assert decision.evicted == (
        (idle, TurnedAway.EVICTED_PLAIN_HTTP),
        (heading, TurnedAway.EVICTED_IN_HEAD),
    )
    assert g.open_total == 1 and g.in_head == 1


def test_a_source_at_its_own_cap_evicts_nobody() -> None:
    g = gate(per_source=1, total=1, handshakes=1)
    let_in(g, "a")
    assert g.admit("a") is TurnedAway.PER_SOURCE
    assert g.open_total == 1


def test_head_done_and_upgrade_after_release_change_nothing() -> None:
    g = gate()
    ticket = let_in(g, "a")
    g.release(ticket)
    g.head_done(ticket)
    g.upgraded(ticket)
    assert g.in_head == 0 and g.open_total == 0 and g.plain_http == 0


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


@pytest.mark.parametrize(
    "field", ["per_source", "total", "handshakes", "callers_per_identity", "upgrades"]
)
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


def test_bucket_table_is_bounded_and_new_keys_share_the_overflow() -> None:
    buckets = TokenBuckets(1, max_keys=2)
    assert buckets.take("a", 0.0) is None
    assert buckets.take("b", 0.0) is None
    assert buckets.take("c", 0.0) is None  # the overflow bucket's one token
    assert buckets.take("d", 0.0) == 60.0  # shared with c
    assert buckets.take("d", 61.0) is None  # pruning made room for d's own bucket
    assert len(buckets) == 1


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


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.sampled_from(["admit", "head", "up", "release"]), st.integers(0, 7)),
        max_size=60,
    )
)
def test_the_counts_always_match_the_open_connections(ops: list[tuple[str, int]]) -> None:
    """Whatever happens, the caps hold, the counts are those of the live connections, and an
    upgraded socket is only ever released by its own end."""
    g = gate(per_source=3, total=5, handshakes=3)
    live: list[Ticket] = []
    for op, n in ops:
        if op == "admit":
            decision = g.admit(f"s{n % 4}")
            if isinstance(decision, LetIn):
                for victim, _why in decision.evicted:
                    assert victim.plain_http and victim in live
                    live.remove(victim)
                live.append(decision.ticket)
        elif live:
            ticket = live[n % len(live)]
            if op == "head":
                g.head_done(ticket)
            elif op == "up":
                g.upgraded(ticket)
            else:
                g.release(ticket)
                live.remove(ticket)
        assert g.open_total == len(live) <= 5
        assert g.in_head == sum(t.in_head for t in live) <= 3
        assert g.plain_http == sum(t.plain_http for t in live)
        for source in {t.source for t in live}:
            assert g.open_from(source) == sum(t.source == source for t in live) <= 3


def test_a_full_table_shares_one_bucket_among_new_keys() -> None:
    """A flood of fresh sources neither locks out every other new source nor escapes counting;
    sources already known keep their own buckets."""
    buckets = TokenBuckets(2, max_keys=10)
    for n in range(9):
        assert buckets.take(f"flood-{n}", 0.0) is None
    assert buckets.take("known", 0.0) is None  # the table is now full
    # New keys share the overflow bucket: its two tokens, then a wait, for all of them.
    assert buckets.take("honest", 1.0) is None
    assert buckets.take("guesser", 1.0) is None
    assert buckets.take("guesser", 1.0) is not None
    assert buckets.retry_after("anyone-new", 1.0) is not None
    # A known key is untouched by the overflow.
    assert buckets.take("known", 1.0) is None
    assert len(buckets) == 11


# --- upgrades in flight -------------------------------------------------------------------------


def test_upgrades_are_counted_up_to_their_cap() -> None:
    g = ConnectionGate(GateLimits(10, 10, 10, 1, upgrades=2))
    one, two, three = (let_in(g, "a") for _ in range(3))
    assert g.begin_upgrade(one) and g.begin_upgrade(two)
    assert g.begin_upgrade(one)  # the same upgrade again takes no second place
    assert not g.begin_upgrade(three)
    assert g.upgrades_in_flight == 2 and not three.upgrading
    g.end_upgrade(one)
    g.end_upgrade(one)
    assert g.upgrades_in_flight == 1
    assert g.begin_upgrade(three)


def test_an_upgrade_ends_when_it_opens_or_its_connection_goes() -> None:
    g = ConnectionGate(GateLimits(10, 10, 10, 1, upgrades=5))
    opened, gone = let_in(g, "a"), let_in(g, "a")
    g.begin_upgrade(opened)
    g.begin_upgrade(gone)
    g.upgraded(opened)
    g.release(gone)
    assert g.upgrades_in_flight == 0
    assert not g.begin_upgrade(gone)  # a released connection upgrades nothing
    assert g.upgrades_in_flight == 0


@pytest.mark.parametrize(("r", "seconds"), [(0.0, 1), (0.09, 1), (0.1, 2), (0.55, 6), (0.999, 10)])
def test_busy_retry_after_spreads_evenly_over_its_range(r: float, seconds: int) -> None:
    assert busy_retry_after_s(lambda: r, 1, 10) == seconds


def test_busy_retry_after_stays_in_range_even_for_a_random_of_one() -> None:
    assert busy_retry_after_s(lambda: 1.0, 2, 4) == 4
    with pytest.raises(ValueError):
        busy_retry_after_s(lambda: 0.5, 0, 3)
    with pytest.raises(ValueError):
        busy_retry_after_s(lambda: 0.5, 5, 3)


# --- the head grace (reconnect storms) -----------------------------------------------------------


def graceful(handshakes: int = 2, total: int = 10, grace: float = 2.0) -> ConnectionGate:
    return ConnectionGate(GateLimits(10, total, handshakes, 1, head_grace_s=grace))


def test_at_the_head_cap_a_newcomer_evicts_the_oldest_head_however_young() -> None:
    """A connection the relay accepted is never closed for the head cap: the grace only tells
    the accept valve how long to keep newcomers waiting in the kernel's queue."""
    g = graceful()
    one, two = g.admit("a", 100.0), g.admit("b", 100.5)
    assert isinstance(one, LetIn) and isinstance(two, LetIn)
    decision = g.admit("c", 100.6)
    assert isinstance(decision, LetIn)
    assert decision.evicted == ((one.ticket, TurnedAway.EVICTED_IN_HEAD),)
    assert decision.ticket.opened_at == 100.6
    assert g.open_total == 2 and g.in_head == 2 and g.oldest_head_opened_at == 100.5


def test_at_both_caps_a_young_newcomer_evicts_one_of_each() -> None:
    g = graceful(handshakes=1, total=2)
    idle = g.admit("a", 100.0)
    assert isinstance(idle, LetIn)
    g.head_done(idle.ticket)
    heading = g.admit("b", 101.0)
    assert isinstance(heading, LetIn)
    decision = g.admit("c", 101.5)
    assert isinstance(decision, LetIn)
    assert decision.evicted == (
        (idle.ticket, TurnedAway.EVICTED_PLAIN_HTTP),
        (heading.ticket, TurnedAway.EVICTED_IN_HEAD),
    )


def test_a_negative_grace_is_refused() -> None:
    with pytest.raises(ValueError):
        GateLimits(1, 1, 1, 1, head_grace_s=-1.0)


def expected_admission(
    live: list[Ticket], *, source: str
) -> TurnedAway | list[tuple[Ticket, TurnedAway]]:
    """What the gate of the test below (3 per source, 5 in all, 2 in head) should do with a
    newcomer, worked out from the live connections in the order they were let in."""
    if sum(t.source == source for t in live) >= 3:
        return TurnedAway.PER_SOURCE
    evicted: list[tuple[Ticket, TurnedAway]] = []
    if len(live) >= 5:
        plain = [t for t in live if t.plain_http]
        if not plain:
            return TurnedAway.TOTAL
        evicted.append((plain[0], TurnedAway.EVICTED_PLAIN_HTTP))
    heads = [t for t in live if t.in_head and all(t is not v for v, _ in evicted)]
    if len(heads) >= 2:
        evicted.append((heads[0], TurnedAway.EVICTED_IN_HEAD))
    return evicted


@settings(max_examples=500)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["admit", "admit", "head", "up", "release"]),
            st.integers(0, 7),
            st.sampled_from([0.0, 0.1, 1.0, 3.0]),
        ),
        max_size=60,
    ),
    st.sampled_from([0.0, 0.5, 2.0, 60.0]),
)
def test_only_its_own_source_or_a_total_of_sockets_turns_a_newcomer_away(
    ops: list[tuple[str, int, float]], grace: float
) -> None:
    """Whatever the ages of the heads and the grace, a newcomer is closed only at its own
    source's cap, or at the total cap when every place holds an authenticated socket; at the
    head cap it takes the place of the oldest connection in head."""
    g = ConnectionGate(GateLimits(3, 5, 2, 1, head_grace_s=grace))
    live: list[Ticket] = []  # in the order they were let in
    now = 0.0
    for op, n, step in ops:
        now += step
        if op == "admit":
            expected = expected_admission(live, source=f"s{n % 4}")
            decision = g.admit(f"s{n % 4}", now)
            if isinstance(expected, TurnedAway):
                assert decision is expected
                continue
            assert isinstance(decision, LetIn) and list(decision.evicted) == expected
            for victim, _why in expected:
                live.remove(victim)
            live.append(decision.ticket)
        elif live:
            ticket = live[n % len(live)]
            if op == "head":
                g.head_done(ticket)
            elif op == "up":
                g.upgraded(ticket)
            else:
                g.release(ticket)
                live.remove(ticket)
        assert g.open_total == len(live) and g.in_head == sum(t.in_head for t in live) <= 2
