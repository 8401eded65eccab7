"""`agentcall call` through the running listener service, and without one, as real processes.

bob has a listener (`twistd agentcall-listen`), so his `agentcall call` hands the call to it
over the private socket in his state directory; ann is caller-only, so hers dials the relay
itself. ken answers with the fake agent, held at a gate where a test must act mid-call.
Which path a call took is read from bob's listener log (``local_call_ended``), never guessed.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.installs import AgentGate, Install, World, two_people
from tests.unit.localstub import imported, run_probed

pytestmark = pytest.mark.e2e

# The relay's one line per call says which socket the caller's side rode.
SHARED = r"call_ended .*caller='{caller}'.*caller_socket='shared'"
OWN = r"call_ended .*caller='{caller}'.*caller_socket='own'"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("thin")) as world:
        world.ken.edit_config(agent_timeout_s=120, kill_grace_s=0.5)
        world.ken.start_listener()
        yield world


@pytest.fixture(scope="module")
def bob(world: World) -> Iterator[Install]:
    bob = Install("bob", world.root / "bob", world.relay.ca_file)
    bob.setup(world.invite(), "bob", "--agent", "claude")
    bob.set_scenario("happy")
    bob.start_listener()
    bob.listener.log.wait_for(r"local_socket_listening")  # type: ignore[union-attr]
    try:
        yield bob
    finally:
        bob.stop()


def _log(person: Install) -> object:
    assert person.listener is not None
    return person.listener.log


def _probe(person: Install, *args: str) -> subprocess.CompletedProcess[str]:
    return run_probed(args, person.env(), person.root)


def _held(person: Install, tmp_path: Path) -> AgentGate:
    gate = AgentGate.make(tmp_path / f"{person.name}-gate")
    person.set_scenario({"name": "happy", "hold": gate.scenario()})
    return gate


def _release(person: Install, gate: AgentGate) -> bool:
    person.set_scenario("happy")
    return gate.release()


def test_a_call_goes_through_the_running_service(world: World, bob: Install) -> None:
    """The answer, the lifecycle and the exit status are as ever; the service placed the call,
    and the CLI process imported no Twisted, autobahn or crypto."""
    assert bob.listener is not None
    mark = bob.listener.log.mark()
    relay_mark = world.relay.log.mark()
    done = _probe(bob, "call", "ken", "why did CI fail on main?")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "FAKE-AGENT-ANSWER: why did CI fail on main?\n"
    progress = done.stderr.splitlines()[0]
    for state in ("ringing…", "answered", "working"):
        assert state in progress
    bob.listener.log.wait_for(r"local_call_ended .*kind='answer'", since=mark)
    assert imported(done) == set()
    # The service placed it on its own relay socket, not a socket dialled for the call.
    world.relay.log.wait_for(SHARED.format(caller="bob"), since=relay_mark)


def test_json_through_the_service_is_the_same_object(world: World, bob: Install) -> None:
    assert bob.listener is not None
    mark = bob.listener.log.mark()
    done = bob.cli("call", "@acme/ken", "status?", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert set(body) - {"context_id"} == {"ok", "address", "call_id", "text", "task"}
    assert body["ok"] is True and body["address"] == "@acme/ken"
    assert body["text"] == "FAKE-AGENT-ANSWER: status?"
    bob.listener.log.wait_for(r"local_call_ended", since=mark)
    failed = bob.cli("call", "nobody-here", "hello?", "--json")
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["code"] == "unknown_handle"


def test_without_a_service_the_cli_dials_the_relay_itself(world: World) -> None:
    """A caller-only installation has no socket: the call is placed from the CLI process."""
    ann = world.ann
    assert not (ann.state_dir / "service.sock").exists()
    relay_mark = world.relay.log.mark()
    done = _probe(ann, "call", "ken", "direct?")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "FAKE-AGENT-ANSWER: direct?\n"
    assert {"twisted", "autobahn"} <= imported(done)
    world.relay.log.wait_for(OWN.format(caller="ann"), since=relay_mark)


def test_two_concurrent_thin_calls_from_one_installation(
    world: World, bob: Install, tmp_path: Path
) -> None:
    """While one call through bob's service waits on ken's agent, a second one (to bob's own
    agent) goes through the same service and comes back first."""
    assert bob.listener is not None
    mark = bob.listener.log.mark()
    relay_mark = world.relay.log.mark()
    gate = _held(world.ken, tmp_path)
    first = bob.cli_async("call", "ken", "first question")
    try:
        gate.wait_started()
        second = bob.cli("call", "@acme/bob", "second question")
    finally:
        released = _release(world.ken, gate)
    assert released, "ken's agent was no longer waiting"
    assert second.returncode == 0, second.stderr
    assert second.stdout == "FAKE-AGENT-ANSWER: second question\n"
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert out == "FAKE-AGENT-ANSWER: first question\n"
    bob.listener.log.wait_for(r"local_call_ended", since=mark)
    ended = [
        line for line in bob.listener.log.lines[mark:] if "local_call_ended" in line
    ]  # both calls, whatever the order they were logged in
    assert len(ended) == 2
    # Both rode bob's one relay socket.
    since = relay_mark
    for _ in range(2):
        world.relay.log.wait_for(SHARED.format(caller="bob"), since=since)
        since = 1 + next(
            i
            for i in range(since, len(world.relay.log.lines))
            if re.search(SHARED.format(caller="bob"), world.relay.log.lines[i])
        )


def test_an_interrupted_thin_client_hangs_up(world: World, bob: Install, tmp_path: Path) -> None:
    """SIGTERM to the CLI ends it as Ctrl-C would (130), and the service cancels the call."""
    assert bob.listener is not None
    mark = bob.listener.log.mark()
    gate = _held(world.ken, tmp_path)
    waiting = bob.cli_async("call", "ken", "never mind")
    try:
        gate.wait_started()
        waiting.send_signal(signal.SIGTERM)
        _out, err = waiting.communicate(timeout=60)
        bob.listener.log.wait_for(r"local_call_hung_up", since=mark)
    finally:
        _release(world.ken, gate)
    assert waiting.returncode == 130
    assert err.splitlines()[-1] == "agentcall: interrupted"


def test_the_service_stopping_mid_call_is_a_clear_error(
    world: World, bob: Install, tmp_path: Path
) -> None:
    """A thin client whose service stops while it waits exits 1 with one line saying so (no
    hang); a service killed outright leaves a stale socket that neither fools the next call
    (it dials directly) nor stops the next start."""
    assert bob.listener is not None
    gate = _held(world.ken, tmp_path)
    waiting = bob.cli_async("call", "ken", "are you there?")
    try:
        gate.wait_started()
        bob.listener.stop()
        _out, err = waiting.communicate(timeout=60)
    finally:
        _release(world.ken, gate)
    assert waiting.returncode == 1
    assert "the local AgentCall service stopped during the call" in err.splitlines()[-1]
    assert not (bob.state_dir / "service.sock").exists()

    # Killed outright: the socket file stays behind, with nothing listening on it.
    bob.start_listener()
    assert bob.listener is not None
    bob.listener.log.wait_for(r"local_socket_listening")
    bob.listener.process.send_signal(signal.SIGKILL)
    bob.listener.process.wait(timeout=30)
    assert (bob.state_dir / "service.sock").exists()
    direct = _probe(bob, "call", "ken", "anyone?")
    assert direct.returncode == 0, direct.stderr
    assert direct.stdout == "FAKE-AGENT-ANSWER: anyone?\n"
    assert "twisted" in imported(direct)

    bob.start_listener()
    assert bob.listener is not None
    mark = bob.listener.log.mark()
    bob.listener.log.wait_for(r"local_socket_listening")
    again = bob.cli("call", "ken", "back?")
    assert again.returncode == 0, again.stderr
    bob.listener.log.wait_for(r"local_call_ended", since=mark)


def test_a_queued_jobs_answer_is_fetched_through_the_service(world: World, bob: Install) -> None:
    """bob's call to an offline callee is kept as a job; once she is back, `jobs list` and
    `jobs get --wait` go through bob's service (its log says so), print what the direct path
    prints, and the CLI process imports no Twisted, autobahn or crypto."""
    uma = Install("uma", world.root / "uma", world.relay.ca_file)
    uma.setup(world.invite(), "uma", "--agent", "claude")
    uma.set_scenario("happy")
    enabled = uma.cli("access", "--offline", "enabled")
    assert enabled.returncode == 0, enabled.stderr
    assert bob.listener is not None
    queued = bob.cli("call", "@acme/uma", "what broke?", "--json")
    assert queued.returncode == 0, queued.stderr
    job_id = json.loads(queued.stdout)["job_id"]

    mark = bob.listener.log.mark()
    listed = _probe(bob, "jobs", "list", "uma", "--json")
    assert listed.returncode == 0, listed.stderr
    [mine] = json.loads(listed.stdout)
    assert (mine["job_id"], mine["state"], mine["address"]) == (job_id, "queued", "@acme/uma")
    assert imported(listed) == set()
    bob.listener.log.wait_for(r"local_jobs_ended .*command='list'.*address='@acme/uma'", since=mark)

    pending = bob.cli("jobs", "get", "uma", job_id)
    assert pending.returncode == 75, pending.stderr

    uma.start_listener()
    try:
        mark = bob.listener.log.mark()
        done = _probe(bob, "jobs", "get", "uma", job_id, "--wait", "120")
        assert done.returncode == 0, done.stderr
        assert done.stdout == "FAKE-AGENT-ANSWER: what broke?\n"
        assert f"waiting up to 120 s for job {job_id}…" in done.stderr
        assert imported(done) == set()
        bob.listener.log.wait_for(r"local_jobs_ended .*command='get'", since=mark)
        # The same command from bob's own process (no service for this run) prints the same.
        direct = bob.cli("jobs", "get", "uma", job_id, AGENTCALL_RELAY=str(world.relay.url))
        assert (direct.returncode, direct.stdout) == (0, done.stdout)
    finally:
        uma.stop()


def test_a_queued_job_is_cancelled_through_the_service(world: World, bob: Install) -> None:
    """`jobs cancel --wait` goes through bob's service too, and says how the job ended."""
    vic = Install("vic", world.root / "vic", world.relay.ca_file)
    vic.setup(world.invite(), "vic", "--agent", "claude")
    enabled = vic.cli("access", "--offline", "enabled")
    assert enabled.returncode == 0, enabled.stderr
    assert bob.listener is not None
    queued = bob.cli("call", "@acme/vic", "never mind", "--json")
    assert queued.returncode == 0, queued.stderr
    job_id = json.loads(queued.stdout)["job_id"]

    mark = bob.listener.log.mark()
    cancelled = _probe(bob, "jobs", "cancel", "vic", job_id, "--wait", "30", "--json")

    assert cancelled.returncode == 0, cancelled.stderr
    ended = json.loads(cancelled.stdout)
    assert (ended["ok"], ended["state"], ended["job_id"]) == (True, "cancelled", job_id)
    assert imported(cancelled) == set()
    bob.listener.log.wait_for(r"local_jobs_ended .*command='cancel'", since=mark)
    again = bob.cli("jobs", "cancel", "vic", job_id)
    assert again.returncode == 1  # it had already ended
