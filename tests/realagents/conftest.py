"""The real-agent tier: pinned Claude Code and Codex from npm, driven by loopback mock models.

Opt-in, because the first run downloads ~400 MB: the tests run when selected with
``-m realagent`` (any marker expression naming it) or with ``AGENTCALL_REAL_AGENTS=1``, and are
skipped otherwise. When the npm registry cannot be reached the tier skips with the reason;
any other install problem fails it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realagents.harness import GuardWiring, Layout
from tests.realagents.install import (
    InstalledAgent,
    InstallFailed,
    RegistryUnreachable,
    claude_package,
    codex_package,
    ensure_installed,
)
from tests.realagents.mock_anthropic import MockAnthropic
from tests.realagents.mock_openai import MockResponses

MARKER = "realagent"
OPT_IN_ENV = "AGENTCALL_REAL_AGENTS"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}: runs the real Claude Code / Codex CLIs (npm, cached) against loopback mocks",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = MARKER in (config.getoption("markexpr", "") or "")
    if selected or os.environ.get(OPT_IN_ENV) == "1":
        return
    skip = pytest.mark.skip(
        reason=f"real-agent tier is opt-in: run with -m {MARKER} (or {OPT_IN_ENV}=1)"
    )
    for item in items:
        if item.get_closest_marker(MARKER) is not None:
            item.add_marker(skip)


def _install(which: str) -> InstalledAgent:
    package = claude_package() if which == "claude" else codex_package()
    try:
        return ensure_installed(package)
    except RegistryUnreachable as exc:
        pytest.skip(f"real-agent tier skipped: {exc}")
    except InstallFailed as exc:
        pytest.fail(f"installing {package.spec} failed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def claude_install() -> InstalledAgent:
    return _install("claude")


@pytest.fixture(scope="session")
def codex_install() -> InstalledAgent:
    return _install("codex")


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout.create(tmp_path)


@pytest.fixture
def guard() -> GuardWiring:
    return GuardWiring.from_environment()


@pytest.fixture
def anthropic_mock() -> Iterator[MockAnthropic]:
    mock = MockAnthropic(lifetime_s=300).start()
    yield mock
    mock.stop()


@pytest.fixture
def openai_mock() -> Iterator[MockResponses]:
    mock = MockResponses(lifetime_s=300).start()
    yield mock
    mock.stop()
