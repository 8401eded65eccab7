"""The kernel read boundary through the real relay and listener: a shell cannot leave the roots.

ken's fake agent, `claude` and then `codex`, runs each shell command as a real `/bin/sh -c`
child process, inside the Landlock ruleset the listener applied before it exec'd the agent, and
answers with what the commands printed (scenario option ``report``), so the caller sees exactly
what a model would have been told. The guard lets every command through (the task grants
``exec``): whatever is refused here is refused by the kernel. Codex runs there without its own
sandbox (``danger-full-access``), which the listener's argv shows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcall.confine.landlock import probe
from tests.e2e.installs import World, two_people

pytestmark = pytest.mark.e2e

ABI, WHY_NOT = probe()
if ABI < 1:
    pytest.skip(f"no Landlock on this kernel: {WHY_NOT}", allow_module_level=True)

SSH_TEXT = "SSH-KEY-MATERIAL-2718"
OUTSIDE_TEXT = "OUTSIDE-EVERY-ROOT-1618"
NOTES_TEXT = "NOTES-INSIDE-THE-ROOT-1414"
CA_TEXT = "PRIVATE-CA-CERTIFICATE-1732"
TASK = """---
description: {description}
tools: {tools}
timeout_s: 60
workdir: {workdir}
---
Use the shell.
"""


def _task(world: World, name: str, tools: str, workdir: Path) -> None:
    ken = world.ken
    assert ken.cli("task", "new", name).returncode == 0
    text = TASK.format(description=f"{name} with a shell", tools=tools, workdir=workdir)
    (ken.home / "AgentCall" / "tasks" / name / "SKILL.md").write_text(text)
    granted = ken.cli("allow", "ann", name)
    assert granted.returncode == 0, granted.stderr


@pytest.fixture(scope="module", params=["claude", "codex"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("boundary")) as world:
        ken = world.ken
        chosen = ken.cli("config", "set", "agent", request.param)
        assert chosen.returncode == 0, chosen.stderr
        (ken.home / ".ssh").mkdir(mode=0o700)
        (ken.home / ".ssh" / "id_ed25519").write_text(SSH_TEXT)
        project = ken.home / "project"
        project.mkdir()
        (project / "notes.txt").write_text(NOTES_TEXT)
        outside = world.root / "outside"
        outside.mkdir()
        (outside / "secret.txt").write_text(OUTSIDE_TEXT)
        ken.edit_config(read_roots=[str(project)])
        _task(world, "shell", "[read, exec]", project)
        _task(world, "edit", "[read, write, exec]", project)
        # Only the fake agent's own two files, not the whole test tree the other e2e files
        # open to it: here the outside file must stay outside.
        # A private CA outside every root, as a company's proxy needs: the agent must read it.
        (ken.home / "certs").mkdir()
        (ken.home / "certs" / "corp-ca.pem").write_text(CA_TEXT)
        ken.start_listener(
            AGENTCALL_CONFINE_EXTRA=f"{ken.agent_log}{os.pathsep}{ken.scenario_file}",
            NODE_EXTRA_CA_CERTS=str(ken.home / "certs" / "corp-ca.pem"),
        )
        yield world


def _bash(*commands: str) -> dict[str, object]:
    tools = [{"tool_name": "Bash", "tool_input": {"command": c}} for c in commands]
    return {"name": "happy", "perform": True, "report": True, "tools": tools}


def _answer(world: World, task: str, *commands: str) -> str:
    world.ken.set_scenario(_bash(*commands))
    done = world.ann.cli("call", "ken", "--task", task, "run the commands")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_shell_reads_inside_the_root_and_nothing_else(world: World) -> None:
    """`cat` of ~/.ssh and of a file outside every root fails with a permission error and
    their text never reaches the caller; the same `cat` inside the root works."""
    ssh = world.ken.home / ".ssh" / "id_ed25519"
    outside = world.root / "outside" / "secret.txt"
    notes = world.ken.home / "project" / "notes.txt"
    answer = _answer(world, "shell", f"cat {ssh}", f"cat {outside}", f"cat {notes}")
    assert SSH_TEXT not in answer
    assert OUTSIDE_TEXT not in answer
    assert NOTES_TEXT in answer
    assert f"cat: {ssh}: Permission denied" in answer
    assert f"cat: {outside}: Permission denied" in answer
    run = world.ken.agent_runs()[-1]
    if run["kind"] == "codex":
        argv = run["argv"]
        assert argv[argv.index("-s") + 1] == "danger-full-access"
    # The guard let all three through (flagging the one that names ~/.ssh): the refusals
    # were the kernel's.
    lines = (world.ken.state_dir / "tools.log").read_text().splitlines()[-3:]
    decisions = [json.loads(line)["decision"] for line in lines]
    assert decisions == ["flag", "allow", "allow"], lines


def test_the_agent_reads_the_ca_file_its_environment_names(world: World) -> None:
    """NODE_EXTRA_CA_CERTS names a file outside every root: the agent (and so its TLS to its
    vendor) can read it, and nothing else in that directory."""
    certs = world.ken.home / "certs"
    (certs / "other.txt").write_text("NOT-THE-CA")
    answer = _answer(world, "shell", 'cat "$NODE_EXTRA_CA_CERTS"', f"cat {certs / 'other.txt'}")
    assert CA_TEXT in answer
    assert "NOT-THE-CA" not in answer
    assert f"cat: {certs / 'other.txt'}: Permission denied" in answer


def test_a_read_task_writes_nowhere(world: World) -> None:
    """Without the write tool even the working directory refuses a shell's write."""
    target = world.ken.home / "project" / "made-by-shell.txt"
    answer = _answer(world, "shell", f"echo x > {target}")
    assert "Permission denied" in answer
    assert not target.exists()


def test_a_write_task_writes_only_in_its_working_directory(world: World) -> None:
    """With write: the workdir takes the write; outside it, and ~/.bashrc, refuse it."""
    inside = world.ken.home / "project" / "written.txt"
    outside = world.root / "outside" / "written.txt"
    bashrc = world.ken.home / ".bashrc"
    answer = _answer(
        world, "edit", f"echo in > {inside}", f"echo out > {outside}", f"echo evil >> {bashrc}"
    )
    assert inside.read_text() == "in\n"
    assert not outside.exists()
    assert not bashrc.exists()
    assert answer.count("Permission denied") == 2, answer


def test_the_private_temp_dir_is_writable_and_gone_afterwards(world: World) -> None:
    """The agent gets its own TMPDIR, which it may write, removed once the run ends."""
    answer = _answer(
        world, "shell", 'echo t > "$TMPDIR/scratch" && cat "$TMPDIR/scratch"', "echo $TMPDIR"
    )
    lines = answer.splitlines()
    assert lines[0] == "t"
    assert not os.path.exists(lines[-1])
