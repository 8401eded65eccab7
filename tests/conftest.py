"""Settings for the whole test tree."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.hypothesis_profiles import default_profile
from tests.netguard import loopback_only

# ``--hypothesis-profile=NAME`` still wins: Hypothesis's plugin loads it after this file.
settings.load_profile(default_profile(os.environ))


@pytest.fixture(autouse=True)
def _log_level_restored() -> Iterator[None]:
    """A test that composes a program (its tap sets the log level) leaves the level as it was."""
    from agentcall import logevents

    before = logevents.lowest_level()
    try:
        yield
    finally:
        logevents.set_level(before)


@pytest.fixture(autouse=True)
def _off_the_network(request: pytest.FixtureRequest) -> Iterator[None]:
    """Only tests marked ``network`` may dial beyond loopback (tests/netguard.py)."""
    if request.node.get_closest_marker("network") is not None:
        yield
        return
    attempts: list[str] = []
    with loopback_only(attempts):
        yield
    if attempts:
        pytest.fail(f"a test not marked `network` dialled beyond loopback: {', '.join(attempts)}")
