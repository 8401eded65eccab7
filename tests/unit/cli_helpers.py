"""Shared pieces of the CLI tests: an isolated environment, an installation, a clock runner."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from agentcall.local.config import Config, save_config
from agentcall.local.home import Home
from agentcall.local.keystore import LocalKeys, create_keys
from agentcall.wire.http import MemberRole

T = TypeVar("T")

ORIGIN = "relay.example"
RELAY_URL = "https://relay.example"
TOKEN = "tok3n-" + "x" * 37
NOW = 1_750_000_000.0
# Variables that would make a test depend on the machine it runs on.
_SCRUBBED = (
    "AGENTCALL_HOME",
    "AGENTCALL_RELAY",
    "AGENTCALL_CALL_ID",
    "AGENTCALL_INVITE",
    "SSL_CERT_FILE",
    "XDG_CONFIG_HOME",
)


def isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A private HOME for this test, with the AgentCall variables unset; returns HOME."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in _SCRUBBED:
        monkeypatch.delenv(name, raising=False)
    return home


def install(
    home_dir: Path, handle: str = "ann", *, org: str = "acme", now: float = NOW
) -> tuple[Home, Config, LocalKeys]:
    """An enrolled installation on disk: config.json and keys.json, as setup leaves them."""
    home = Home.from_environ({"HOME": str(home_dir)})
    keys = create_keys(home, ORIGIN, f"@{org}/{handle}", now)
    config = Config(
        relay_url=RELAY_URL,
        relay_origin=ORIGIN,
        org=org,
        handle=handle,
        role=MemberRole.MEMBER,
        token=TOKEN,
        agent_kind="claude",
        read_roots=(str(home.user_home),),
    )
    save_config(home, config)
    return home, config, keys


def run_with_clock(
    work: Callable[[Any], Coroutine[Any, Any, T]], *, now: float = NOW, step: float = 0.5
) -> T:
    """Stand-in for ``run_on_reactor``: runs ``work`` on a Clock, advancing it until done."""
    clock = Clock()
    clock.advance(now)
    pending = defer.ensureDeferred(work(clock))
    results: list[object] = []
    pending.addBoth(results.append)
    for _ in range(10_000):
        if results:
            break
        clock.advance(step)
    if not results:
        raise AssertionError("the work never finished")
    outcome = results[0]
    if isinstance(outcome, Failure):
        outcome.raiseException()
    value: T = outcome  # type: ignore[assignment]
    return value
