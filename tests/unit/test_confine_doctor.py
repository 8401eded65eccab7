"""``agentcall doctor``'s line on the kernel read boundary."""

from __future__ import annotations

from typing import Any

import pytest

from agentcall.cli import doctor_checks as dc
from tests.unit.test_listener_stages import make_config


def check(
    kind: str, abi: int, why: str = "", required: bool = False, isolated: bool = False
) -> dc.Check:
    config: Any = make_config(agent_kind=kind, agent_command=None)
    return dc.kernel_boundary(
        config, probe=lambda: (abi, why), required=lambda: required, isolated=lambda: isolated
    )


FULL = "on, Landlock ABI 7; no UNIX sockets, signals or abstract sockets outside the run"


@pytest.mark.parametrize("kind", ["claude", "command"])
def test_on_where_landlock_is(kind: str) -> None:
    if kind == "command":
        config: Any = make_config()
        found = dc.kernel_boundary(
            config, probe=lambda: (7, ""), required=lambda: False, isolated=lambda: False
        )
    else:
        found = check(kind, 7)
    assert found == dc.Check("kernel read boundary", dc.OK, FULL)


@pytest.mark.parametrize("abi", [1, 5])
def test_below_abi_6_signals_and_abstract_sockets_are_named_as_open(abi: int) -> None:
    found = check("claude", abi)
    assert found.status == dc.WARN
    assert found.detail is not None and "signals and abstract UNIX sockets" in found.detail
    assert "ABI 6, Linux 6.12" in found.detail


def test_a_ceiling_that_requires_isolation_fails_where_the_kernel_cannot() -> None:
    found = check("claude", 5, isolated=True)
    assert found.status == dc.FAIL and found.hint is not None
    assert found.detail is not None and "the admin ceiling requires more" in found.detail
    assert check("claude", 7, isolated=True).status == dc.OK


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
    assert check(kind, 7) == dc.Check("kernel read boundary", dc.OK, FULL)
    assert check(kind, 7, required=True, isolated=True).status == dc.OK
    at_4 = check(kind, 4)
    assert at_4.status == dc.WARN and at_4.detail is not None
    assert "network" not in at_4.detail


def test_below_abi_4_it_says_codex_commands_keep_the_network() -> None:
    found = check("codex", 3)
    assert found.status == dc.WARN
    assert found.detail is not None and found.detail.startswith("on, Landlock ABI 3;")
    assert "not kept off the network" in found.detail
    # Claude never relied on its own sandbox for that: its line names only the scopes.
    claude = check("claude", 3).detail
    assert claude is not None and "network" not in claude and "signals" in claude
