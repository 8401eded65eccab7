"""The listener under attack and under churn: tampered and replayed requests never reach the
agent; a malformed policy stops it starting; it reconnects after the relay restarts; the
codex and command agent kinds answer too."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import pytest_twisted

from agentcall.confine.landlock import probe
from agentcall.errors import CallErrorCode
from agentcall.wire import frames, payloads
from tests.e2e.installs import Install, World, two_people
from tests.e2e.parties import Party, enrol
from tests.e2e.processes import REPO

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("robust")) as world:
        world.ken.start_listener()
        yield world


async def _intruder(world: World, handle: str) -> Party:
    party = await enrol(world.relay.url, world.relay.ca_file, world.invite(), handle)
    await party.publish_keys()
    return party


@pytest_twisted.ensureDeferred
async def test_a_tampered_request_never_reaches_the_agent(world: World) -> None:
    """One flipped ciphertext character: the listener rejects, the caller gets protocol_error."""
    mallory = await _intruder(world, "mallory")
    before = len(world.ken.agent_runs())
    sealed, _ = await mallory.seal_to(await mallory.keys_of("ken"), "open sesame")
    flipped = ("B" if sealed.ct[60] == "A" else "A").join((sealed.ct[:60], sealed.ct[61:]))
    terminal, _ = await mallory.call("ken", attrs.evolve(sealed, ct=flipped))
    assert isinstance(terminal, frames.CallError)
    assert terminal.code is CallErrorCode.PROTOCOL_ERROR
    assert len(world.ken.agent_runs()) == before


@pytest_twisted.ensureDeferred
async def test_a_replayed_request_never_reaches_the_agent_twice(world: World) -> None:
    """The same sealed request sent again (a captured envelope) is refused as a replay."""
    trudy = await _intruder(world, "trudy")
    world.ken.set_scenario("happy")
    before = len(world.ken.agent_runs())
    sealed, request = await trudy.seal_to(await trudy.keys_of("ken"), "pay me once")
    terminal, _ = await trudy.call("ken", sealed)
    assert isinstance(terminal, frames.CallOutcome)
    ken_keys = await trudy.keys_of("ken")
    opened = trudy.open_outcome_with(terminal, request, ken_keys.identity.record.identity_pub)
    assert isinstance(opened.outcome, payloads.Reply)
    terminal, _ = await trudy.call("ken", sealed)
    assert isinstance(terminal, frames.CallError)
    assert terminal.code is CallErrorCode.PROTOCOL_ERROR
    assert len(world.ken.agent_runs()) == before + 1


def test_the_listener_reconnects_after_the_relay_restarts(world: World) -> None:
    assert world.ken.listener is not None
    mark = world.ken.listener.log.mark()
    world.relay.restart()
    world.ken.listener.log.wait_for(r"relay_connected", timeout=60, since=mark)
    world.ken.set_scenario("happy")
    done = world.ann.cli("call", "@acme/ken", "still there after the restart?")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "FAKE-AGENT-ANSWER: still there after the restart?"


def test_a_malformed_policy_stops_the_listener_from_starting(world: World) -> None:
    zed = Install("zed", world.root / "zed", world.relay.ca_file)
    zed.setup(world.invite(), "zed", "--agent", "claude")
    policy = zed.state_dir / "policy.json"
    policy.write_text('{"version": 1, "default_access": "sometimes"}')
    policy.chmod(0o600)
    done = subprocess.run(
        [
            str(Path(zed.env()["PATH"].split(":")[1]) / "twistd"),
            "-n",
            "--pidfile=",
            "--logfile=-",
            "agentcall-listen",
        ],
        env=zed.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=zed.root,
    )
    assert done.returncode != 0
    assert "policy" in (done.stdout + done.stderr).lower()


def test_codex_and_command_agents_answer(world: World) -> None:
    """The same call path drives `codex exec` and a plain command. Codex keeps its read-only
    sandbox only where there is no kernel boundary to run inside."""
    cody = Install("cody", world.root / "cody", world.relay.ca_file)
    cody.setup(world.invite(), "cody", "--agent", "codex")
    cody.set_scenario("happy")
    cody.start_listener()
    try:
        done = world.ann.cli("call", "@acme/cody", "what does codex say?")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "FAKE-AGENT-ANSWER: what does codex say?"
        (run,) = cody.agent_runs()
        assert run["kind"] == "codex" and "--json" in run["argv"]
        mode = "danger-full-access" if probe()[0] >= 1 else "read-only"
        assert run["argv"][run["argv"].index("-s") + 1] == mode
    finally:
        cody.stop()

    cmd = Install("cmd", world.root / "cmd", world.relay.ca_file)
    agent = f"{REPO / '.venv' / 'bin' / 'python'} {REPO / 'scripts' / 'demo_agent.py'}"
    cmd.setup(world.invite(), "cmd", "--agent", "command", "--agent-command", agent)
    cmd.start_listener()
    try:
        done = world.ann.cli("call", "@acme/cmd", "hello script")
        assert done.returncode == 0, done.stderr
        assert "You asked: 'hello script'" in done.stdout
    finally:
        cmd.stop()
