"""The call budget: an exact sliding window per key."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall import limits
from agentcall.relay.ratelimit import SlidingWindowLimiter

PAIR = ("acme", "ana", "ken")
T0 = 1_000_000.0
HOUR = limits.RATE_WINDOW_S


def budget() -> SlidingWindowLimiter:
    return SlidingWindowLimiter(limits.CALLS_PER_HOUR_PER_PAIR, limits.RATE_WINDOW_S)


def test_thirty_allowed_thirty_first_refused() -> None:
    """Thirty calls in an hour pass; the thirty-first in the same hour is refused."""
    limiter = budget()
    assert [limiter.hit(PAIR, T0 + i) for i in range(30)] == [True] * 30
    assert limiter.hit(PAIR, T0 + 30) is False
    assert limiter.count(PAIR, T0 + 30) == 30


def test_refused_hits_are_not_recorded() -> None:
    """Hammering a full window does not push its reopening further away."""
    limiter = SlidingWindowLimiter(1, 10.0)
    assert limiter.hit(PAIR, 0.0)
    for t in range(1, 10):
        assert not limiter.hit(PAIR, float(t))
    assert limiter.hit(PAIR, 10.0)


def test_hit_stops_counting_exactly_at_t_plus_window() -> None:
    """A hit at t still counts just before t + window and no longer at t + window."""
    limiter = budget()
    for _ in range(30):
        limiter.hit(PAIR, T0)
    just_before = T0 + HOUR - 1e-6
    assert limiter.hit(PAIR, just_before) is False
    assert limiter.retry_after(PAIR, just_before) == pytest.approx(1e-6, abs=1e-9)
    assert limiter.hit(PAIR, T0 + HOUR) is True
    assert limiter.count(PAIR, T0 + HOUR) == 1


def test_window_slides_one_hit_at_a_time() -> None:
    """Only as many new calls pass as old ones have left the window."""
    limiter = budget()
    for i in range(30):
        limiter.hit(PAIR, T0 + i * 60)
    # At T0 + HOUR + 90 the hits at T0 and T0 + 60 have expired, the one at T0 + 120 has not.
    now = T0 + HOUR + 90
    assert limiter.hit(PAIR, now)
    assert limiter.hit(PAIR, now)
    assert not limiter.hit(PAIR, now)
    assert limiter.retry_after(PAIR, now) == pytest.approx(30.0)


def test_retry_after_zero_when_room() -> None:
    """retry_after is zero while the window has room, and does not record a hit."""
    limiter = SlidingWindowLimiter(1, 5.0)
    assert limiter.retry_after(PAIR, 0.0) == 0.0
    assert limiter.hit(PAIR, 0.0)
    assert limiter.retry_after(PAIR, 2.0) == pytest.approx(3.0)


def test_keys_are_independent() -> None:
    """One pair's exhausted budget leaves other pairs, and the reverse direction, alone."""
    limiter = budget()
    for _ in range(30):
        limiter.hit(PAIR, T0)
    assert not limiter.hit(PAIR, T0)
    assert limiter.hit(("acme", "ana", "bob"), T0)
    assert limiter.hit(("acme", "ken", "ana"), T0)
    assert limiter.hit(("other", "ana", "ken"), T0)


def test_prune_drops_expired_keys_only() -> None:
    """prune forgets keys whose hits have all expired and keeps live ones."""
    limiter = SlidingWindowLimiter(5, 10.0)
    for i in range(100):
        limiter.hit(("acme", f"caller-{i}", "ken"), 0.0)
    limiter.hit(PAIR, 5.0)
    assert limiter.tracked_keys() == 101
    assert limiter.prune(9.0) == 0
    assert limiter.prune(10.0) == 100
    assert limiter.tracked_keys() == 1
    assert limiter.count(PAIR, 10.0) == 1
    assert limiter.prune(15.0) == 1
    assert limiter.tracked_keys() == 0


def test_zero_limit_refuses_everything_without_state() -> None:
    """A zero budget refuses every hit and keeps nothing."""
    limiter = SlidingWindowLimiter(0, 10.0)
    assert not limiter.hit(PAIR, 0.0)
    assert limiter.tracked_keys() == 0
    assert limiter.retry_after(PAIR, 0.0) == float("inf")


@pytest.mark.parametrize(("limit", "window"), [(-1, 10.0), (1, 0.0), (1, -5.0)])
def test_rejects_bad_configuration(limit: int, window: float) -> None:
    """A negative limit or a non-positive window is refused at construction."""
    with pytest.raises(ValueError, match="must be"):
        SlidingWindowLimiter(limit, window)


class NaiveWindow:
    """Reference model: every allowed hit kept forever, counted by brute force."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit, self.window = limit, window
        self.hits: list[tuple[tuple[str, ...], float]] = []

    def hit(self, key: tuple[str, ...], now: float) -> bool:
        live = sum(1 for k, t in self.hits if k == key and t <= now < t + self.window)
        if live >= self.limit:
            return False
        self.hits.append((key, now))
        return True


steps = st.lists(
    st.tuples(
        st.sampled_from([("o", "a", "b"), ("o", "b", "a"), ("o", "a", "c")]),
        # Small integer steps hit the window edge exactly and often.
        st.integers(min_value=0, max_value=4),
        st.booleans(),
    ),
    max_size=200,
)


@given(limit=st.integers(min_value=0, max_value=4), window=st.integers(1, 12), ops=steps)
def test_matches_naive_model(
    limit: int, window: int, ops: list[tuple[tuple[str, ...], int, bool]]
) -> None:
    """Every decision equals the brute-force model's, with prunes interleaved anywhere."""
    limiter = SlidingWindowLimiter(limit, float(window))
    model = NaiveWindow(limit, float(window))
    now = 0.0
    for key, step, prune_first in ops:
        now += step
        if prune_first:
            limiter.prune(now)
        assert limiter.hit(key, now) == model.hit(key, now)
        assert limiter.tracked_keys() <= 3
    limiter.prune(now + window)
    assert limiter.tracked_keys() == 0


# --- restoring the windows after a restart ------------------------------------------------------


def test_a_limiter_restored_with_a_full_hour_refuses_the_next_hit() -> None:
    """Thirty calls recorded in the last hour: a fresh limiter refuses the thirty-first."""
    limiter = budget()
    now = T0 + HOUR - 10
    kept = limiter.restore([(PAIR, T0 + i) for i in range(30)], now)
    assert kept == 30
    assert limiter.hit(PAIR, now) is False
    assert limiter.retry_after(PAIR, now) == pytest.approx(10.0)
    assert limiter.hit(PAIR, T0 + HOUR) is True


def test_restoring_skips_expired_hits_and_keeps_only_the_newest_limit() -> None:
    limiter = SlidingWindowLimiter(2, 100.0)
    other = ("acme", "bob", "ken")
    hits = [(PAIR, 0.0), (PAIR, 60.0), (PAIR, 50.0), (PAIR, 70.0), (other, 5.0)]
    assert limiter.restore(hits, now=105.0) == 2
    assert limiter.count(PAIR, 105.0) == 2
    assert limiter.count(other, 105.0) == 0
    assert limiter.tracked_keys() == 1
    # The newest two (60 and 70) decide: room again once 60 has left the window.
    assert limiter.retry_after(PAIR, 105.0) == pytest.approx(55.0)


def test_a_hit_stamped_in_the_future_counts_as_now() -> None:
    """A wall clock that went back across a restart blocks for at most one window."""
    limiter = SlidingWindowLimiter(1, 100.0)
    limiter.restore([(PAIR, 10_000.0)], now=500.0)
    assert limiter.hit(PAIR, 599.0) is False
    assert limiter.hit(PAIR, 600.0) is True


def test_restoring_merges_with_hits_already_recorded() -> None:
    limiter = SlidingWindowLimiter(3, 100.0)
    assert limiter.hit(PAIR, 40.0)
    limiter.restore([(PAIR, 20.0), (PAIR, 30.0)], now=50.0)
    assert limiter.hit(PAIR, 50.0) is False
    assert limiter.retry_after(PAIR, 50.0) == pytest.approx(70.0)


def test_a_zero_limit_restores_nothing() -> None:
    limiter = SlidingWindowLimiter(0, 100.0)
    assert limiter.restore([(PAIR, 10.0)], now=20.0) == 0
    assert limiter.tracked_keys() == 0
