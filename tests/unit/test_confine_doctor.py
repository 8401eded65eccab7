"""``agentcall doctor``'s line on the kernel read boundary."""

from __future__ import annotations

from typing import Any

import pytest

from agentcall.cli import doctor_checks as dc
from tests.unit.test_listener_stages import make_config


def check(kind: str, abi: int, why: str = "", required: bool = False) -> dc.Check:
    config: Any = make_config(agent_kind=kind, agent_command=None)
    return dc.kernel_boundary(config, probe=lambda: (abi, why), required=lambda: required)


@pytest.mark.parametrize("kind", ["claude", "command"])
def test_on_where_landlock_is(kind: str) -> None:
    if kind == "command":
        config: Any = make_config()
        found = dc.kernel_boundary(config, probe=lambda: (7, ""), required=lambda: False)
    else:
        found = check(kind, 7)
    assert found == dc.Check("kernel read boundary", dc.OK, "on, Landlock ABI 7")


def test_off_says_why_and_that_the_guard_is_the_only_boundary() -> None:
    found = check("claude", 0, "this kernel has no Landlock")
    assert found.status == dc.WARN
    assert found.detail == "off: this kernel has no Landlock; the tool guard is the only boundary"


def test_off_fails_when_the_admin_ceiling_requires_it() -> None:
    found = check("claude", 0, "Landlock exists only on Linux", required=True)
    assert found.status == dc.FAIL
    assert found.detail is not None and found.detail.startswith("off: Landlock exists only")
    assert "no agent is started" in found.detail


@pytest.mark.parametrize("kind", ["claude", "codex"])
def test_codex_is_inside_it_too(kind: str) -> None:
    assert check(kind, 4) == dc.Check("kernel read boundary", dc.OK, "on, Landlock ABI 4")
    assert check(kind, 7, required=True).status == dc.OK


def test_below_abi_4_it_says_codex_commands_keep_the_network() -> None:
    found = check("codex", 3)
    assert found.status == dc.WARN
    assert found.detail is not None and found.detail.startswith("on, Landlock ABI 3;")
    assert "not kept off the network" in found.detail
    # Claude never relied on its own sandbox for that: its line is the plain one.
    assert check("claude", 3).status == dc.OK
