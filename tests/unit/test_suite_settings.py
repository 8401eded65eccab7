"""The test tree's own settings: nothing may pass or fail on how fast the machine is."""

from __future__ import annotations

from hypothesis import settings


def test_property_examples_have_no_deadline() -> None:
    """Hypothesis's 200 ms per-example deadline is off for every property test."""
    current = settings.default
    assert current is not None and current.deadline is None
    assert settings(max_examples=5).deadline is None
