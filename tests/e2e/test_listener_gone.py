"""A callee's listener that goes away while its agent works (issue 25, items 6 and 7).

Each callee's fake agent holds (``AgentGate``) until the test acts: SIGTERM of the listener
ends a live call and a mailbox job ``indeterminate_execution``; SIGKILL of the listener ends a
live call for its caller at once, ``callee_gone``, not at the 6-minute deadline; a relay that
goes away makes the listener stop the live call's agent. Every wait is for an event (a file, a
log line, a process exit), bounded only as a guard against a hang.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.installs import EVENT_WAIT_S, AgentGate, Install, World, two_people
from tests.e2e.test_mailbox import _audit, _callee, _queue

pytestmark = pytest.mark.e2e

if not hasattr(os, "pidfd_open"):
    pytest.skip("needs pidfd_open (Linux 5.3)", allow_module_level=True)

STOPPED_DETAIL = "the owner's listener stopped before the agent finished"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("gone")) as world:
        yield world


def _held(person: Install, tmp_path: Path) -> AgentGate:
    gate = AgentGate.make(tmp_path / f"{person.name}-gate")
    person.set_scenario({"name": "happy", "hold": gate.scenario()})
    return gate


def _live_callee(world: World, name: str, tmp_path: Path) -> tuple[Install, AgentGate]:
    """A fresh callee (claude, fake agent) that takes live calls only, its agent held."""
    person = Install(name, world.root / name, world.relay.ca_file)
    person.setup(world.invite(), name, "--agent", "claude")
    return person, _held(person, tmp_path)


def _ended_body(caller: subprocess.Popen[str]) -> dict[str, Any]:
    """The caller's exit (waited for; the timeout is only a guard, well under the relay's
    6-minute call deadline) and its --json failure."""
    out, err = caller.communicate(timeout=EVENT_WAIT_S)
    assert caller.returncode == 1, out + err
    body = json.loads(out)
    assert body["ok"] is False, body
    return dict(body)


def _gone(pid: int) -> bool:
    """Wait (bounded, on the event) for ``pid`` to end; False if it is still there."""
    try:
        watch = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([watch], [], [], EVENT_WAIT_S)
        return ready == [watch]
    finally:
        os.close(watch)


def test_a_listener_stopped_mid_run_fails_its_live_call_indeterminate(
    world: World, tmp_path: Path
) -> None:
    uma, gate = _live_callee(world, "uma", tmp_path)
    listener = uma.start_listener()
    caller = world.ann.cli_async("call", "@acme/uma", "a long question", "--json")
    try:
        gate.wait_started()
        (run,) = uma.agent_runs()
        listener.process.send_signal(signal.SIGTERM)
        listener.process.wait(timeout=EVENT_WAIT_S)
        body = _ended_body(caller)
        assert body["code"] == "indeterminate_execution", body
        assert body["detail"] == STOPPED_DETAIL
        assert "[indeterminate_execution]" in body["message"]
        assert _gone(run["pid"]), "the agent outlived its stopped listener"
    finally:
        gate.release()
        if caller.poll() is None:
            caller.kill()
            caller.communicate(timeout=EVENT_WAIT_S)
        uma.stop()


def test_a_listener_stopped_mid_job_fails_the_job_indeterminate(
    world: World, tmp_path: Path
) -> None:
    """The listener's own result ends the job (the callee is the audit's actor), not the
    relay's lease lapsing afterwards; the job never ends answered."""
    vera = _callee(world, "vera")
    gate = _held(vera, tmp_path)
    job_id = _queue(world, "@acme/vera", "a long job")["job_id"]
    listener = vera.start_listener()
    try:
        gate.wait_started()
        (run,) = vera.agent_runs()
        listener.process.send_signal(signal.SIGTERM)
        listener.process.wait(timeout=EVENT_WAIT_S)
        assert _gone(run["pid"]), "the agent outlived its stopped listener"
        got = world.ann.cli("jobs", "get", "@acme/vera", job_id, "--wait", "120", "--json")
        assert got.returncode == 1, got.stdout + got.stderr
        body = json.loads(got.stdout)
        assert body["state"] == "failed" and body["code"] == "indeterminate_execution", body
        assert _audit(world, "job.fail", job_id) == [("vera", "indeterminate_execution")]
        assert _audit(world, "job.complete", job_id) == []
    finally:
        gate.release()
        vera.stop()


def test_a_live_call_ends_callee_gone_at_once_when_the_listener_is_killed(
    world: World, tmp_path: Path
) -> None:
    wyn, gate = _live_callee(world, "wyn", tmp_path)
    listener = wyn.start_listener()
    caller = world.ann.cli_async("call", "@acme/wyn", "are you there?", "--json")
    try:
        gate.wait_started()
        listener.process.send_signal(signal.SIGKILL)
        listener.process.wait(timeout=EVENT_WAIT_S)
        body = _ended_body(caller)
        assert body["code"] == "callee_gone", body
        assert body["detail"] == "the callee's listener disconnected during the call"
        assert "went away during the call" in body["message"]
    finally:
        # Without the kernel boundary the agent outlives a killed listener; let it go.
        gate.release()
        if caller.poll() is None:
            caller.kill()
            caller.communicate(timeout=EVENT_WAIT_S)


def test_a_listener_whose_relay_goes_away_stops_the_live_calls_agent(
    world: World, tmp_path: Path
) -> None:
    """The relay has ended the call for its caller, so nobody can get the answer: the
    listener stops the agent rather than letting it work on for nothing."""
    xan, gate = _live_callee(world, "xan", tmp_path)
    listener = xan.start_listener()
    caller = world.ann.cli_async("call", "@acme/xan", "a long question")
    try:
        gate.wait_started()
        (run,) = xan.agent_runs()
        mark = listener.log.mark()
        world.relay.process.send_signal(signal.SIGKILL)
        world.relay.process.wait(timeout=EVENT_WAIT_S)
        listener.log.wait_for(r"call_orphaned", EVENT_WAIT_S, since=mark)
        assert _gone(run["pid"]), "the agent worked on after its call was lost"
        listener.log.wait_for(r"call_ended .*status='canceled'", EVENT_WAIT_S, since=mark)
        caller.communicate(timeout=EVENT_WAIT_S)
        assert caller.returncode != 0
    finally:
        gate.release()
        if caller.poll() is None:
            caller.kill()
            caller.communicate(timeout=EVENT_WAIT_S)
        world.relay.restart()
        xan.stop()
