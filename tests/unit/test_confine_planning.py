"""How planning decides the kernel boundary of a run: on where Landlock is, refused where the
admin ceiling requires it and it cannot hold, and what the ruleset is built from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentcall.confine.rules import Confinement
from agentcall.errors import CallErrorCode
from agentcall.listener import planning
from agentcall.listener.admission import Admitted
from agentcall.listener.ceiling import Ceiling
from agentcall.listener.tasks import Task
from agentcall.wire.payloads import CallFailure
from tests.unit.test_listener_stages import (
    CODEX,
    ENVIRON,
    GUARD,
    Planner,
    make_config,
    opened_call,
)


def plan(config: Any = None, admitted: Admitted | None = None, **kw: Any) -> Any:
    config = config if config is not None else make_config()
    planner = Planner()
    chosen = admitted or Admitted("ask")
    return planning.plan_run(
        config,
        opened_call(),
        chosen,
        "/srv/shared",
        None,
        guard=GUARD,
        environ=kw.pop("environ", ENVIRON),
        which=planner.which,
        is_dir=planner.is_dir,
        build_prompt=planner.build,
        **kw,
    )


def test_without_landlock_the_guard_is_the_only_boundary() -> None:
    result = plan(kernel_abi=0)
    assert isinstance(result, planning.RunPlan)
    assert result.run.confine is None


CLAUDE = make_config(agent_kind="claude", agent_command=None)


def test_with_landlock_a_read_task_is_confined_to_its_roots_and_writes_nowhere() -> None:
    result = plan(CLAUDE, kernel_abi=7)
    assert isinstance(result, planning.RunPlan)
    confine = result.run.confine
    assert isinstance(confine, Confinement)
    assert "/srv/shared" in confine.read_roots
    assert confine.write_roots == ()
    assert confine.home == "/home/ken"
    assert confine.agent_state == ("/home/ken/.claude",)
    assert confine.agent_files == ("/home/ken/.claude.json",)
    assert confine.append_files == (GUARD.tools_log,)
    assert confine.required is False


def test_a_write_task_may_write_its_working_directory() -> None:
    task = Task(id="edit", name="edit", description="edit", tools=frozenset({"read", "write"}))
    result = plan(admitted=Admitted(task), kernel_abi=7)
    assert isinstance(result, planning.RunPlan)
    assert result.run.confine is not None
    assert result.run.confine.write_roots == ("/srv/shared",)


def test_the_owner_extra_paths_come_from_the_listener_environment() -> None:
    environ = {**ENVIRON, planning.CONFINE_EXTRA_ENV: "/cache/npm:relative:/cache/pip"}
    result = plan(kernel_abi=7, environ=environ)
    assert isinstance(result, planning.RunPlan)
    assert result.run.confine is not None
    assert result.run.confine.extra == ("/cache/npm", "/cache/pip")


def test_a_command_agent_is_confined_with_the_files_its_command_names(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text("print('answer')\n")
    result = plan(make_config(agent_command=["/usr/bin/python3", str(script)]), kernel_abi=7)
    assert isinstance(result, planning.RunPlan)
    assert result.run.confine is not None
    assert result.run.confine.agent_state == ()
    assert result.run.confine.runtime == (str(tmp_path),)


def test_the_ca_files_the_agent_environment_names_are_trusted() -> None:
    environ = {
        **ENVIRON,
        "NODE_EXTRA_CA_CERTS": "/home/ken/certs/corp.pem",
        "SSL_CERT_DIR": "/home/ken/certs/dir:relative:/opt/ca",
        "SSL_CERT_FILE": "",
    }
    result = plan(CLAUDE, kernel_abi=7, environ=environ)
    assert isinstance(result, planning.RunPlan)
    assert result.run.confine is not None
    assert result.run.confine.trust == (
        "/home/ken/certs/dir",
        "/opt/ca",
        "/home/ken/certs/corp.pem",
    )


def test_codex_runs_inside_the_kernel_boundary_without_its_own_sandbox() -> None:
    result = plan(CODEX, kernel_abi=7)
    assert isinstance(result, planning.RunPlan)
    confine = result.run.confine
    assert confine is not None
    assert confine.agent_state[0] == "/home/ken/.codex"
    # Its sandbox cannot start inside Landlock: the ruleset is the boundary now.
    argv = list(result.run.argv)
    assert argv[argv.index("-s") + 1] == "danger-full-access"
    # A task without fetch: TCP is restricted to what Codex needs for its model.
    assert confine.connect_ports == (443,)
    # The guard's preflight is ours, not the agent's: it runs as before.
    assert result.preflight is not None and result.preflight.confine is None


def test_codex_outside_the_boundary_keeps_its_own_sandbox() -> None:
    result = plan(CODEX, kernel_abi=0)
    assert isinstance(result, planning.RunPlan)
    assert result.run.confine is None
    argv = list(result.run.argv)
    assert argv[argv.index("-s") + 1] == "read-only"


def test_codex_ports_add_its_proxy_and_the_owner_ports() -> None:
    environ = {
        **ENVIRON,
        "HTTPS_PROXY": "http://proxy.corp:3128",
        planning.CONFINE_PORTS_ENV: "8443, x, 70000, -1, +22, 9000",
    }
    result = plan(CODEX, kernel_abi=7, environ=environ)
    assert isinstance(result, planning.RunPlan)
    assert result.run.confine is not None
    assert result.run.confine.connect_ports == (443, 3128, 8443, 9000)


@pytest.mark.parametrize(
    ("config", "tools", "abi"),
    [
        (CODEX, {"read", "fetch"}, 7),  # the task may fetch: the network is its to use
        (CODEX, {"read"}, 3),  # no TCP rules below ABI 4
        (CLAUDE, {"read"}, 7),  # Claude's Bash keeps the network it always had
    ],
)
def test_the_network_is_left_alone(config: Any, tools: set[str], abi: int) -> None:
    task = Task(id="t", name="t", description="t", tools=frozenset(tools))
    result = plan(config, admitted=Admitted(task), kernel_abi=abi)
    assert isinstance(result, planning.RunPlan)
    assert result.run.confine is not None
    assert result.run.confine.connect_ports is None


def test_a_required_boundary_refuses_to_run_where_it_cannot_hold() -> None:
    assert plan(kernel_abi=0, boundary_required=True) == CallFailure(
        code=CallErrorCode.AGENT_ERROR, detail=planning.BOUNDARY_MISSING_DETAIL
    )
    for config in (make_config(), CODEX):
        held = plan(config, kernel_abi=7, boundary_required=True)
        assert isinstance(held, planning.RunPlan)
        assert held.run.confine is not None and held.run.confine.required


def test_required_isolation_refuses_to_run_on_a_kernel_without_scopes() -> None:
    """Below Landlock ABI 6 a run could still signal the owner's processes: an admin who
    requires isolation gets no agent there, and one everywhere the kernel has it."""
    for abi in (0, 1, 5):
        assert plan(kernel_abi=abi, isolation_required=True) == CallFailure(
            code=CallErrorCode.AGENT_ERROR, detail=planning.ISOLATION_MISSING_DETAIL
        )
    held = plan(kernel_abi=6, isolation_required=True)
    assert isinstance(held, planning.RunPlan) and held.run.confine is not None
    assert isinstance(plan(kernel_abi=5), planning.RunPlan)
    assert planning.isolation_required(None) is False
    assert planning.isolation_required(Ceiling("x", require_process_isolation=True)) is True


def test_the_ceiling_decides_whether_the_boundary_is_required() -> None:
    assert planning.boundary_required(None) is False
    assert planning.boundary_required(Ceiling("x")) is False
    assert planning.boundary_required(Ceiling("x", require_kernel_boundary=True)) is True
