"""Owner control through the real listener: tasks and grants, the tool guard on every tool
call, the admin ceiling and assertions at start-up, and follow-up turns of a conversation.

The agent is the fake `claude`, which runs the PreToolUse hook from the `--settings` the
listener passes, exactly as the real CLI does; the guard is the real `agentcall guard`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.installs import Install, World, two_people
from tests.e2e.processes import BIN

pytestmark = pytest.mark.e2e

SSH_KEY_TEXT = "PRIVATE-KEY-MATERIAL-3141"
TASK = """---
description: Explain why the last CI run failed
name: CI triage
tools: [read]
timeout_s: 60
---
Look at the CI logs in the working directory and explain the first failure.
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("owner")) as world:
        ken = world.ken
        (ken.home / ".ssh").mkdir(mode=0o700)
        (ken.home / ".ssh" / "id_ed25519").write_text(SSH_KEY_TEXT)
        (ken.home / "notes.txt").write_text("the build broke on step 3")
        assert ken.cli("task", "new", "ci").returncode == 0
        (ken.home / "AgentCall" / "tasks" / "ci" / "SKILL.md").write_text(TASK)
        (ken.home / "AgentCall" / "tasks" / "hidden").mkdir()
        (ken.home / "AgentCall" / "tasks" / "hidden" / "SKILL.md").write_text(
            "---\ndescription: not for callers\n---\nSecret instructions.\n"
        )
        granted = ken.cli("allow", "ann", "ci")
        assert granted.returncode == 0, granted.stderr
        ken.start_listener()
        yield world


def _last_run(install: Install) -> dict[str, Any]:
    return install.agent_runs()[-1]


def test_a_granted_task_runs_with_its_instructions(world: World) -> None:
    world.ken.set_scenario("happy")
    done = world.ann.cli("call", "ken", "--task", "ci", "why red?")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "FAKE-AGENT-ANSWER: why red?"
    prompt = _last_run(world.ken)["prompt"]
    assert "explain the first failure" in prompt
    assert "Secret instructions" not in prompt


def test_tasks_not_offered_or_unknown_are_refused_with_the_menu(world: World) -> None:
    before = len(world.ken.agent_runs())
    done = world.ann.cli("call", "ken", "--task", "hidden", "let me in", "--json")
    assert done.returncode != 0
    body = json.loads(done.stdout)
    assert body["code"] == "task_not_offered"
    done = world.ann.cli("call", "ken", "--task", "nope", "hello")
    assert done.returncode != 0
    assert "task_unknown" in done.stderr
    assert len(world.ken.agent_runs()) == before


def test_the_guard_sees_every_tool_call_and_refuses_credentials(world: World) -> None:
    """The fake claude runs the listener's hook; ~/.ssh is refused, the notes are read."""
    ssh = str(world.ken.home / ".ssh" / "id_ed25519")
    notes = str(world.ken.home / "notes.txt")
    world.ken.set_scenario(
        {
            "name": "happy",
            "perform": True,
            "tools": [
                {"tool_name": "Read", "tool_input": {"file_path": ssh}},
                {"tool_name": "Read", "tool_input": {"file_path": notes}},
                {"tool_name": "Read", "tool_input": {"file_path": "/etc/hostname"}},
            ],
        }
    )
    done = world.ann.cli("call", "ken", "read my key please")
    assert done.returncode == 0, done.stderr
    assert SSH_KEY_TEXT not in done.stdout
    tools_log = (world.ken.state_dir / "tools.log").read_text().splitlines()
    mine = [json.loads(line) for line in tools_log][-3:]
    assert [e["tool"] for e in mine] == ["Read", "Read", "Read"]
    assert [e["decision"] for e in mine] == ["deny", "allow", "deny"], mine
    calls = [e for e in world.ken._agent_log() if "tool_calls" in e][-1]["tool_calls"]
    assert [c["outcome"] for c in calls] == ["denied", "ran", "denied"]


def test_a_follow_up_reaches_the_same_agent_session(world: World) -> None:
    world.ken.set_scenario("happy")
    first = world.ann.cli("call", "ken", "first turn")
    assert first.returncode == 0, first.stderr
    assert "--continue" in first.stderr
    # The ci task's call earlier left a conversation open too: --continue must ask which.
    ambiguous = world.ann.cli("call", "ken", "--continue", "second turn")
    assert ambiguous.returncode != 0
    assert "--task" in ambiguous.stderr
    second = world.ann.cli("call", "ken", "--continue", "--task", "ask", "second turn")
    assert second.returncode == 0, second.stderr
    runs = world.ken.agent_runs()
    assert "--resume" in runs[-1]["argv"]
    assert "--resume" not in runs[-2]["argv"]
    bogus = world.ann.cli("call", "ken", "--context", "ctx_" + "A" * 22, "third")
    assert bogus.returncode != 0
    assert "context_unknown" in bogus.stderr or "conversation" in bogus.stderr.lower()


def _start_refused(install: Install, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(BIN / "twistd"),
            "-n",
            "--pidfile=",
            "--logfile=-",
            "agentcall-listen",
            "--test-ceiling-override",
        ],
        env=install.env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=install.root,
    )


def test_a_broken_ceiling_or_failing_assertion_stops_start_up(world: World) -> None:
    zed = Install("zed", world.root / "zed", world.relay.ca_file)
    zed.setup(world.invite(), "zed", "--agent", "claude")
    ceiling = world.root / "ceiling.json"
    ceiling.write_text('{"version": 1, "allowed_tasks": "everything"}')
    ceiling.chmod(0o600)
    done = _start_refused(zed, AGENTCALL_TEST_CEILING_PATH=str(ceiling))
    assert done.returncode != 0
    assert "ceiling" in (done.stdout + done.stderr).lower()

    ceiling.write_text('{"version": 1, "blocked_callers": ["ann"]}')
    policy = zed.state_dir / "policy.json"
    policy.write_text(
        json.dumps(
            {
                "version": 2,
                "default_access": "allowed",
                "default_offer": ["ask"],
                "assertions": [{"caller": "ann", "accept": ["ask"]}],
            }
        )
    )
    policy.chmod(0o600)
    done = _start_refused(zed, AGENTCALL_TEST_CEILING_PATH=str(ceiling))
    assert done.returncode != 0
    assert "assertion" in (done.stdout + done.stderr).lower()
