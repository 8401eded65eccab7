"""The test tree's own settings: nothing may pass or fail on how fast the machine is, CI runs
property tests at full strength, and every input a test reads is part of the checkout."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.hypothesis_profiles import CI_EXAMPLES, default_profile, examples
from tests.unit.agent_helpers import REPO, SAMPLES

# Every max_examples a test in the tree asks for today.
COUNTS_IN_USE = (25, 30, 40, 100, 150, 200, 300)
# How the tests name a capture: "claude-....jsonl", "codex-....txt" and the like.
CAPTURE_NAME = re.compile(r'"((?:claude|codex)-[\w.-]+\.(?:jsonl|txt))"')


@pytest.fixture
def profile() -> Iterator[None]:
    """Lets a test load another profile; the one in force comes back afterwards."""
    before = settings.get_current_profile_name()
    yield
    settings.load_profile(before)


def test_property_examples_have_no_deadline() -> None:
    """Hypothesis's 200 ms per-example deadline is off for every property test."""
    current = settings.default
    assert current is not None and current.deadline is None
    assert settings(max_examples=5).deadline is None


@pytest.mark.parametrize("name", ["dev", "ci"])
def test_both_profiles_have_no_deadline(name: str) -> None:
    assert settings.get_profile(name).deadline is None


def test_ci_runs_hypothesis_at_its_default_strength() -> None:
    """CI keeps the 100 examples every property test ran before the profiles existed."""
    assert settings.get_profile("ci").max_examples == CI_EXAMPLES == 100
    assert settings.get_profile("dev").max_examples == CI_EXAMPLES // 5


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"CI": "true"}, "ci"),
        ({"CI": "1"}, "ci"),
        ({"CI": "yes"}, "ci"),
        ({}, "dev"),
        ({"CI": ""}, "dev"),
        ({"CI": "false"}, "dev"),
        ({"CI": "0"}, "dev"),
    ],
)
def test_the_ci_variable_picks_the_profile(environ: dict[str, str], expected: str) -> None:
    assert default_profile(environ) == expected


def test_this_run_uses_the_profile_its_environment_asks_for(
    pytestconfig: pytest.Config,
) -> None:
    """Under CI=true the loaded profile is ``ci``, unless --hypothesis-profile names another."""
    chosen = pytestconfig.getoption("hypothesis_profile", None)
    assert settings.get_current_profile_name() == (chosen or default_profile(os.environ))


@pytest.mark.parametrize("n", COUNTS_IN_USE)
def test_explicit_counts_are_kept_under_ci(profile: None, n: int) -> None:
    settings.load_profile("ci")
    assert examples(n) == n


@pytest.mark.parametrize(("n", "expected"), [(300, 60), (100, 20), (40, 10), (25, 10), (5, 5)])
def test_explicit_counts_shrink_under_dev(profile: None, n: int, expected: int) -> None:
    settings.load_profile("dev")
    assert examples(n) == expected


def test_a_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        examples(0)


def test_the_cli_captures_are_in_the_checkout() -> None:
    """The parser and guard tests read real CLI output kept in the repository, so a fresh
    clone runs them; nothing outside the checkout is looked for."""
    assert SAMPLES.is_relative_to(REPO)
    readers = ("test_agents_claude.py", "test_agents_codex.py", "test_guard.py")
    named = {
        name
        for reader in readers
        for name in CAPTURE_NAME.findall((REPO / "tests" / "unit" / reader).read_text())
    }
    assert len(named) >= 12
    missing = sorted(name for name in named if not (SAMPLES / name).is_file())
    assert missing == []
