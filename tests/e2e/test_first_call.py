"""The first real call, end to end: relay, listener and CLI as processes, fake agents on PATH.

ann (admin, caller) and ken (member, callee) each have their own HOME. ken's listener is a real
`twistd agentcall-listen`; his "claude" is tests/fakes/fake_agent.py, whose behaviour each test
picks through a scenario file.

Agents get a generous kill timer, so a loaded machine cannot turn an answer into a timeout; the
kill-timer tests call the task `stuck`, whose own short `timeout_s` applies to them alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.installs import AgentGate, World, two_people

pytestmark = pytest.mark.e2e

# Long enough for the fake agent to start and leave its children behind on a loaded machine.
STUCK_TIMEOUT_S = 8
STUCK_TASK = f"""---
description: An agent that never answers in time
timeout_s: {STUCK_TIMEOUT_S}
---
Answer the caller.
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("world")) as world:
        ken = world.ken
        ken.edit_config(agent_timeout_s=120, kill_grace_s=0.5)
        assert ken.cli("task", "new", "stuck").returncode == 0
        (ken.home / "AgentCall" / "tasks" / "stuck" / "SKILL.md").write_text(STUCK_TASK)
        granted = ken.cli("allow", "ann", "stuck")
        assert granted.returncode == 0, granted.stderr
        ken.start_listener()
        yield world


def test_the_answer_arrives(world: World) -> None:
    """A call by address prints the agent's answer on stdout and the lifecycle on stderr."""
    world.ken.set_scenario("happy")
    before = len(world.ken.agent_runs())
    done = world.ann.cli("call", "@acme/ken", "why did CI fail on main?")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "FAKE-AGENT-ANSWER: why did CI fail on main?"
    for state in ("ringing", "answered", "working"):
        assert state in done.stderr
    runs = world.ken.agent_runs()[before:]
    assert len(runs) == 1
    run = runs[0]
    assert "why did CI fail on main?" in run["prompt"]
    assert "@acme/ann" in run["prompt"]  # the relay-verified caller is named to the agent
    assert not any("why did CI fail" in arg for arg in run["argv"])
    assert run["env"].get("AGENTCALL_CALL_ID")


def test_json_output_is_one_object(world: World) -> None:
    """`--json` prints exactly one JSON object, also for a bare handle in one's own org."""
    import json

    world.ken.set_scenario("happy")
    done = world.ann.cli("call", "ken", "status?", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["ok"] is True
    assert body["text"] == "FAKE-AGENT-ANSWER: status?"


def test_a_blocked_caller_is_refused_and_nothing_spawns(world: World) -> None:
    """The owner's block is decided before any agent runs."""
    world.ken.set_scenario("happy")
    assert world.ken.cli("block", "ann").returncode == 0
    try:
        before = len(world.ken.agent_runs())
        done = world.ann.cli("call", "@acme/ken", "let me in")
        assert done.returncode != 0
        assert "blocked" in done.stderr.lower()
        assert done.stdout == ""
        assert len(world.ken.agent_runs()) == before
    finally:
        assert world.ken.cli("unblock", "ann").returncode == 0


def test_a_concurrent_call_gets_busy(world: World, tmp_path: Path) -> None:
    """One call runs, none waits: a second caller meanwhile is told the agent is busy.

    The first agent is held until the second call has its answer, however slowly it comes.
    """
    gate = AgentGate.make(tmp_path)
    world.ken.set_scenario({"name": "happy", "hold": gate.scenario()})
    first = world.ann.cli_async("call", "@acme/ken", "first question")
    try:
        gate.wait_started()
        second = world.ann.cli("call", "@acme/ken", "second question")
    finally:
        # Never leave an agent held: the listener would stay busy for the next test.
        world.ken.set_scenario("happy")
        released = gate.release()
    assert released, "the first agent was no longer waiting to be released"
    assert second.returncode != 0
    assert "busy" in second.stderr.lower()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert out.strip() == "FAKE-AGENT-ANSWER: first question"


@pytest.mark.parametrize("scenario", ["ignore_term", "hang"])
def test_a_stuck_agent_is_killed_and_the_caller_gets_timeout(world: World, scenario: str) -> None:
    """The kill timer (the task's short one) ends the agent, its group and detached children."""
    world.ken.set_scenario({"name": scenario, "seconds": 600, "leave_children": True})
    before = len(world.ken.agent_runs())
    done = world.ann.cli("call", "@acme/ken", "--task", "stuck", "never answered")
    assert done.returncode != 0
    assert "time" in done.stderr.lower()
    runs = world.ken.agent_runs()[before:]
    assert len(runs) == 1
    children = world.ken.agent_children(runs[0]["pid"])
    assert children, "the fake agent should have left detached children behind"
    pids = [runs[0]["pid"], *children]
    for pid in pids:
        assert not _alive(pid), f"process {pid} of a timed-out agent survived"


@pytest.mark.parametrize(
    ("scenario", "expected", "agents_words"),
    [
        ("unauthenticated", "not logged in", "Please run /login"),
        ("api_error", "without an answer", "Repeated 529 Overloaded"),
        ("usage_error", "too old", "'manual' is invalid"),
    ],
)
def test_agent_failures_give_clear_errors(
    world: World, scenario: str, expected: str, agents_words: str
) -> None:
    """The caller is told how the run failed in the listener's words; what the agent printed
    about it is kept in the owner's calls.log and never sent."""
    world.ken.set_scenario(scenario)
    done = world.ann.cli("call", "@acme/ken", "hello")
    assert done.returncode != 0
    assert expected in done.stderr.lower()
    assert len(done.stderr.strip().splitlines()) <= 2
    assert agents_words not in done.stdout + done.stderr
    logged = json.loads((world.ken.state_dir / "calls.log").read_text().splitlines()[-1])
    assert logged["status"] == "agent_error" and agents_words in logged["error"]


def test_huge_output_is_capped_without_blocking(world: World) -> None:
    """A 1.5 MB answer comes back cut at 256,000 bytes; a flood of stdout does not hang."""
    world.ken.set_scenario("huge_result")
    done = world.ann.cli("call", "@acme/ken", "tell me everything")
    assert done.returncode == 0, done.stderr
    assert 200_000 < len(done.stdout.encode()) <= 256_001
    world.ken.set_scenario("flood_stdout")
    done = world.ann.cli("call", "@acme/ken", "and more")
    assert done.returncode != 0 or len(done.stdout.encode()) <= 256_001


def test_escapes_and_credentials_never_reach_the_caller_raw(world: World) -> None:
    world.ken.set_scenario("escapes")
    done = world.ann.cli("call", "@acme/ken", "colours please")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\r" not in done.stdout and "\x9b" not in done.stdout
    world.ken.set_scenario("secrets")
    done = world.ann.cli("call", "@acme/ken", "keys please")
    assert done.returncode == 0, done.stderr
    for leaked in ("sk-ant-api03", "ghp_FAKE", "AKIAFAKE", "eyJhbGciOiJIUzI1NiJ9", "Bearer FAKE"):
        assert leaked not in done.stdout
    assert "[redacted]" in done.stdout


def test_detached_children_of_a_finished_agent_are_swept(world: World) -> None:
    """An agent that answers but leaves `setsid`/`nohup` children behind: they are killed."""
    world.ken.set_scenario({"name": "orphans", "seconds": 600})
    before = len(world.ken.agent_runs())
    done = world.ann.cli("call", "@acme/ken", "leave nothing behind")
    assert done.returncode == 0, done.stderr
    (run,) = world.ken.agent_runs()[before:]
    children = world.ken.agent_children(run["pid"])
    assert children, "the fake agent should have recorded its detached children"
    for pid in children:
        assert not _alive(pid), f"detached child {pid} survived the sweep"


def test_calls_log_records_metadata_without_the_message(world: World) -> None:
    world.ken.set_scenario({"name": "happy", "answer": "a plain answer"})
    done = world.ann.cli("call", "@acme/ken", "a very private question 4711")
    assert done.returncode == 0
    log = (world.ken.state_dir / "calls.log").read_text()
    assert "a very private question 4711" not in log
    assert '"caller"' in log and "ann" in log
    assert oct((world.ken.state_dir / "calls.log").stat().st_mode & 0o777) == "0o600"


def test_nested_calls_are_refused(world: World) -> None:
    done = world.ann.cli("call", "@acme/ken", "hi", AGENTCALL_CALL_ID="x" * 8)
    assert done.returncode != 0
    assert "nested" in done.stderr.lower() or "inside" in done.stderr.lower()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        return "State:\tZ" not in status.read_text()
    return True
