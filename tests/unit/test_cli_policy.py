"""`agentcall offer|unoffer|allow|revoke|policy|lint`: checked edits and honest reports."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentcall.cli import owner, policy_report
from agentcall.cli.main import main
from agentcall.listener.ceiling import TEST_OVERRIDE_ENV, Ceiling, load_ceiling
from agentcall.listener.policy import load_policy
from agentcall.local.config import load_config, save_config
from agentcall.local.home import Home
from tests.unit.cli_helpers import install, isolate

ROSTER = "R0ster-id-0000001"


@attrs.define
class Machine:
    """One test machine: a HOME with an installation, its tasks and an optional ceiling."""

    home: Path
    ceiling_path: Path

    @property
    def policy_path(self) -> Path:
        return self.home / ".agentcall" / "policy.json"

    def task(self, task_id: str, front: str = "description: d", body: str = "Do it.") -> Path:
        directory = self.home / "AgentCall" / "tasks" / task_id
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "SKILL.md"
        path.write_text(f"---\n{front}\n---\n{body}\n")
        return path

    def policy(self, document: dict[str, Any]) -> None:
        self.policy_path.parent.mkdir(mode=0o700, exist_ok=True)
        self.policy_path.write_text(json.dumps(document))
        self.policy_path.chmod(0o600)

    def ceiling(self, document: dict[str, Any] | str) -> None:
        text = document if isinstance(document, str) else json.dumps(document)
        self.ceiling_path.write_text(text)
        self.ceiling_path.chmod(0o644)

    def on_disk(self) -> Any:
        return json.loads(self.policy_path.read_text())


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Machine:
    home = isolate(monkeypatch, tmp_path)
    install(home)
    ceiling_path = tmp_path / "admin" / "policy.json"
    ceiling_path.parent.mkdir()

    def test_ceiling() -> Ceiling | None:
        environ = {TEST_OVERRIDE_ENV: str(ceiling_path)}
        return load_ceiling(environ=environ, allow_test_override=True)

    monkeypatch.setattr(owner, "load_admin_ceiling", test_ceiling)
    monkeypatch.setattr(owner, "ceiling_path", lambda: str(ceiling_path))
    return Machine(home, ceiling_path)


Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    def go(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return go


# --- edits -------------------------------------------------------------------------------------


def test_offer_needs_a_task_on_disk(machine: Machine, run: Run) -> None:
    """An unknown task is refused with one line and the policy is not created."""
    code, out, err = run("offer", "review")
    assert (code, out) == (1, "")
    assert "no task review" in err and "agentcall task new review" in err
    assert err.count("\n") == 1
    assert not machine.policy_path.exists()


def test_offer_and_unoffer_change_the_default_offer(machine: Machine, run: Run) -> None:
    """offer adds to default_offer once; unoffer removes; repeats change nothing."""
    machine.task("review")
    code, out, _err = run("offer", "review")
    assert code == 0 and "offered review to every allowed caller" in out
    assert "from the next call" in out
    assert machine.on_disk()["default_offer"] == ["ask", "review"]
    code, out, _err = run("offer", "review")
    assert code == 0 and "already offered" in out and "next call" not in out
    assert run("unoffer", "ask")[0] == 0
    assert machine.on_disk()["default_offer"] == ["review"]
    code, out, _err = run("unoffer", "ask")
    assert code == 0 and "nothing changed" in out


def test_an_invalid_task_is_refused_with_its_file_and_line(machine: Machine, run: Run) -> None:
    """A task with a problem cannot be offered; the error points at the line."""
    path = machine.task("review", front="description: d\ntier: 2")
    code, _out, err = run("allow", "ana", "review")
    assert code == 1
    assert f"{path}:3: unknown key 'tier'" in err and "agentcall lint" in err
    assert not machine.policy_path.exists()


def test_allow_and_revoke_one_callers_grants(machine: Machine, run: Run) -> None:
    """allow grants a task to one caller; revoke takes it back and drops the empty rule."""
    machine.task("deploy-docs")
    code, out, _err = run("allow", "ana", "deploy-docs")
    assert code == 0 and "ana now gets deploy-docs" in out
    assert machine.on_disk()["callers"] == {"ana": {"grants": ["deploy-docs"]}}
    assert run("allow", "ana", "deploy-docs")[1].startswith("ana already has deploy-docs")
    code, out, _err = run("revoke", "ana", "deploy-docs")
    assert code == 0 and "no longer gets deploy-docs" in out
    assert machine.on_disk()["callers"] == {}
    code, out, _err = run("revoke", "ana", "deploy-docs")
    assert code == 0 and "nothing changed" in out


def test_allow_says_when_the_caller_is_blocked(machine: Machine, run: Run) -> None:
    """A grant to a blocked caller is kept, with a note that it does not unblock them."""
    machine.task("review")
    run("block", "bob")
    code, out, _err = run("allow", "bob", "review")
    assert code == 0 and "bob is blocked" in out
    assert machine.on_disk()["callers"]["bob"] == {"access": "blocked", "grants": ["review"]}
    code, out, _err = run("revoke", "bob", "ask")
    assert code == 0 and "nothing changed" in out
    run("allow", "bob", "ask")
    assert "still offered to everyone" in run("revoke", "bob", "ask")[1]


def test_an_edit_that_breaks_an_owner_assertion_is_refused(machine: Machine, run: Run) -> None:
    """The owner's own assertion stops an edit that would contradict it; the file stays."""
    machine.policy({"version": 2, "assertions": [{"caller": "ana", "accept": ["ask"]}]})
    before = machine.policy_path.read_bytes()
    code, _out, err = run("unoffer", "ask")
    assert code == 1 and err.count("\n") == 1
    assert "policy assertion 1 (ana gets ask) fails" in err
    assert run("block", "ana")[0] == 1
    assert machine.policy_path.read_bytes() == before


def test_an_edit_that_breaks_an_admin_assertion_is_refused(machine: Machine, run: Run) -> None:
    """The administrator's assertions bind owner edits too, including unblock."""
    machine.ceiling({"version": 1, "assertions": [{"caller": "bob", "deny": ["*"]}]})
    assert run("block", "bob")[0] == 0
    code, _out, err = run("unblock", "bob")
    assert code == 1 and "ceiling assertion 1 (bob gets nothing) fails: bob gets ask" in err
    assert machine.on_disk()["callers"] == {"bob": {"access": "blocked"}}


def test_offering_a_task_the_ceiling_forbids_warns(machine: Machine, run: Run) -> None:
    """The offer is saved (the owner may mean it for later) with a clear note."""
    machine.task("deploy")
    machine.ceiling({"version": 1, "allowed_tasks": ["ask"]})
    code, out, _err = run("offer", "deploy")
    assert code == 0 and "the admin ceiling does not let deploy run" in out


def test_a_broken_ceiling_or_policy_stops_every_edit(machine: Machine, run: Run) -> None:
    """An unusable layer is reported in one line and nothing is written."""
    machine.ceiling("{not json")
    code, _out, err = run("block", "bob")
    assert code == 1 and "admin ceiling is unusable" in err and err.count("\n") == 1
    assert not machine.policy_path.exists()
    machine.ceiling_path.unlink()
    machine.policy({"version": 2, "default_offer": "ask"})
    code, _out, err = run("offer", "ask")
    assert code == 1 and "never overwritten" in err


@pytest.mark.parametrize(
    "argv",
    [["offer"], ["offer", "Bad!"], ["allow", "ana"], ["allow", "-x-", "ask"], ["revoke", "ana"]],
)
def test_usage_errors_exit_two(machine: Machine, argv: list[str]) -> None:
    """A missing or malformed task or handle is a usage error."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert not machine.policy_path.exists()


@pytest.mark.parametrize("command", ["offer", "unoffer", "allow", "revoke", "policy", "lint"])
def test_help_has_an_example(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each command explains itself with a runnable example."""
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert f"agentcall {command}" in capsys.readouterr().out.split("example", 1)[1]


# --- policy --------------------------------------------------------------------------------------


def test_policy_shows_what_callers_meet(
    machine: Machine, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Managed or not, the default menu, each caller, each task's tools and workdir, limits."""
    src = machine.home / "src"
    src.mkdir()
    machine.task("review", front=f"description: d\ntools: [fetch]\nworkdir: {src}")
    machine.task("deploy", front="description: d\ntools: [exec]\ntimeout_s: 60")
    machine.policy(
        {
            "version": 2,
            "default_offer": ["ask", "review"],
            "callers": {"ana": {"grants": ["deploy"]}, "bob": {"access": "blocked"}},
            "groups": {"eng": {"roster_id": ROSTER, "grants": ["deploy"]}},
        }
    )
    code, out, _err = run("policy")
    assert code == 0
    home = os.path.realpath(machine.home)
    expected_lines = [
        f"managed: no (no {machine.ceiling_path})",
        "default access: allowed",
        "default menu: ask, review",
        "  ana: allowed (by default); gets ask, deploy, review",
        "  bob: blocked (individually)",
        f"  eng (roster {ROSTER}): grants deploy",
        f"  ask: tools read; workdir {home}",
        f"  deploy: tools exec, read; workdir {home}; timeout 60 s",
        f"  review: tools fetch, read; workdir {os.path.realpath(src)}",
        "agent: claude",
        "  reads outside the working directory and read roots are refused by Claude itself",
        "  the tool guard refuses credential paths inside them",
        "  Bash is recorded, not bounded",
    ]
    # On a kernel without Landlock: what the guard alone leaves open.
    monkeypatch.setattr(policy_report, "kernel_abi", lambda: 0)
    code, out, _err = run("policy")
    assert code == 0
    for line in expected_lines:
        assert line in out.splitlines(), line
    # Where the kernel boundary holds, Bash is bounded too, and the network stays open.
    monkeypatch.setattr(policy_report, "kernel_abi", lambda: 7)
    _code, out, _err = run("policy")
    bounded = out.splitlines()
    assert "  Bash is recorded, not bounded" not in bounded
    for line in (
        "  the kernel bounds every read and write, Bash included, to the task's roots and workdir",
        "  Bash keeps the network (it may connect to any host and port)",
        "  no signal and no abstract socket outside the run",
    ):
        assert line in bounded, line


def test_policy_under_a_ceiling(machine: Machine, run: Run) -> None:
    """The ceiling's blocks, allowed tasks and tool cap show up as callers would meet them."""
    machine.task("review", front="description: d\ntools: [fetch]")
    machine.task("deploy", front="description: d\ntools: [exec]")
    machine.policy({"version": 2, "default_offer": ["ask", "review", "deploy"]})
    machine.ceiling(
        {
            "version": 1,
            "allowed_tasks": ["ask", "review"],
            "blocked_callers": ["mallory"],
            "max_tools": ["read"],
        }
    )
    code, out, _err = run("policy", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["managed"] is True and report["ceiling_path"] == str(machine.ceiling_path)
    assert report["default_menu"] == ["ask", "review"]
    assert report["callers"]["mallory"] == {
        "access": "blocked",
        "why": "blocked by the admin ceiling",
        "menu": [],
    }
    assert report["tasks"]["review"]["tools"] == ["read"]
    assert report["not_runnable"] == {"deploy": "not allowed by the admin ceiling"}
    text = run("policy")[1]
    assert f"managed: yes ({machine.ceiling_path})" in text
    assert "  deploy: cannot run: not allowed by the admin ceiling" in text


def test_policy_names_codex_limits_honestly(
    machine: Machine, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For Codex the report says reads are not restricted without the kernel boundary, and
    what the kernel bounds (its ports) with it."""
    home = Home.from_environ({"HOME": str(machine.home)})
    save_config(home, attrs.evolve(load_config(home, apply_override=False), agent_kind="codex"))
    monkeypatch.setattr(policy_report, "kernel_abi", lambda: 0)
    out = run("policy")[1]
    assert "Codex's read-only sandbox does not restrict reads (no read floor)" in out
    assert "tool calls are logged where Codex runs the hook" in out
    assert "Claude" not in out
    monkeypatch.setattr(policy_report, "kernel_abi", lambda: 4)
    out = run("policy")[1]
    assert "the kernel bounds every read and write to the task's roots and workdir" in out
    assert "Codex may connect only to the ports of its model and proxy" in out
    assert "no read floor" not in out and "Claude" not in out
    assert "signals and abstract UNIX sockets outside the run are not bounded" in out


def test_policy_with_default_blocked_and_not_set_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, run: Run
) -> None:
    """Without an installation, the report still works and says so."""
    home = isolate(monkeypatch, tmp_path)
    monkeypatch.setattr(owner, "load_admin_ceiling", lambda: None)
    assert run("access", "--default", "blocked")[0] == 0
    code, out, _err = run("policy")
    assert code == 0
    assert "default menu: none" in out
    assert "not set up" in out
    assert f"ask: tools read; workdir {os.path.realpath(home)}" in out


def test_policy_fails_on_an_unusable_layer(machine: Machine, run: Run) -> None:
    """A broken ceiling makes `policy` exit 1 with one line."""
    machine.ceiling({"version": 9})
    code, out, err = run("policy")
    assert (code, out) == (1, "") and '"version" must be 1' in err


def test_the_real_ceiling_loader_ignores_the_test_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The CLI's own loader reads the machine path, whatever AGENTCALL_TEST_CEILING_PATH says."""
    decoy = tmp_path / "decoy.json"
    decoy.write_text('{"version": 1, "allowed_tasks": []}')
    monkeypatch.setenv(TEST_OVERRIDE_ENV, str(decoy))
    if os.path.lexists("/etc/agentcall/policy.json"):
        pytest.skip("this machine has a real ceiling")
    assert owner.load_admin_ceiling() is None


# --- lint ----------------------------------------------------------------------------------------


def test_lint_passes_a_clean_setup(machine: Machine, run: Run) -> None:
    """No problems: exit 0 and a one-line summary; notes do not fail the run."""
    machine.task("review")
    machine.policy(
        {
            "version": 2,
            "callers": {"ana": {"grants": ["review", "gone"]}},
            "assertions": [{"caller": "ana", "accept": ["review"]}],
        }
    )
    code, out, _err = run("lint")
    assert code == 0
    assert "note: callers.ana.grants names gone, which is not a task on disk" in out
    assert out.splitlines()[-1] == "lint: ok (2 task(s), 1 assertion(s) hold, unmanaged)"


def test_lint_reports_every_problem_and_exits_one(machine: Machine, run: Run) -> None:
    """Task problems with file:line, failing assertions and notes, then a count."""
    bad = machine.task("broken", front="description: d\ntools: [sudo]")
    machine.task("lonely")
    machine.policy({"version": 2, "assertions": [{"caller": "ana", "accept": ["lonely"]}]})
    machine.ceiling(
        {"version": 1, "assertions": [{"caller": "bob", "deny": ["*"]}], "max_tools": ["read"]}
    )
    code, out, _err = run("lint")
    assert code == 1
    lines = out.splitlines()
    assert f"problem: {bad}:3: unknown tool 'sudo' (tools are exec, fetch, read, write)" in lines
    assert "problem: policy assertion 1 (ana gets lonely) fails: ana does not get lonely" in lines
    assert "problem: ceiling assertion 1 (bob gets nothing) fails: bob gets ask" in lines
    assert "note: task lonely is offered to no one" in lines
    assert lines[-1] == "lint: 3 problem(s)"


@pytest.mark.parametrize(
    ("policy", "ceiling", "expected"),
    [
        ('{"version": 2, "callers": []}', None, '"callers" must be an object'),
        (None, '{"version": 1, "max_tools": "all"}', "max_tools must be a list"),
    ],
)
def test_lint_reports_unusable_files(
    machine: Machine, run: Run, policy: str | None, ceiling: str | None, expected: str
) -> None:
    """A policy or ceiling that cannot be used is a problem, and lint exits 1."""
    if policy is not None:
        machine.policy_path.parent.mkdir(mode=0o700, exist_ok=True)
        machine.policy_path.write_text(policy)
    if ceiling is not None:
        machine.ceiling(ceiling)
    code, out, _err = run("lint")
    assert code == 1 and expected in out and out.splitlines()[-1] == "lint: 1 problem(s)"


def test_lint_reports_a_broken_config(machine: Machine, run: Run) -> None:
    """config.json is where the read roots come from; if it is broken, lint says so."""
    config = machine.home / ".agentcall" / "config.json"
    config.write_text("{}")
    code, out, _err = run("lint")
    assert code == 1 and out.startswith("problem: ") and "config.json" in out


def test_policy_written_by_the_cli_loads_in_the_listener(machine: Machine, run: Run) -> None:
    """Every edit leaves a policy the listener's loader accepts."""
    machine.task("review")
    for argv in (["offer", "review"], ["allow", "ana", "review"], ["block", "bob"]):
        assert run(*argv)[0] == 0
    policy = load_policy(machine.policy_path)
    assert policy.default_offer == ("ask", "review")
    assert policy.rule_for("ana") is not None and policy.rule_for("bob") is not None
