"""The offline mailbox end to end: real relay and listener processes, the real CLI, SQLite files.

A callee who opted in (`agentcall access --offline enabled`) and is offline or busy gets the
sealed request kept by the relay; their listener runs it when it comes back; the caller fetches
the answer with `agentcall jobs get`. The relay is killed with SIGKILL after acknowledging a job
and loses nothing; a listener killed with SIGKILL while the agent runs never runs the job again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentcall import limits
from tests.e2e.installs import AgentGate, Install, World, two_people

pytestmark = pytest.mark.e2e

PENDING_EXIT = 75  # `jobs get` when the job has not ended yet


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("mailbox")) as world:
        yield world


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.stdout.strip(), done.stderr
    return json.loads(done.stdout)


def _callee(world: World, name: str) -> Install:
    """A fresh callee (claude, fake agent) that opted in to offline delivery, not listening."""
    person = Install(name, world.root / name, world.relay.ca_file)
    person.setup(world.invite(), name, "--agent", "claude")
    person.set_scenario("happy")
    done = person.cli("access", "--offline", "enabled")
    assert done.returncode == 0, done.stderr
    return person


def _queue(world: World, address: str, message: str) -> dict[str, Any]:
    done = world.ann.cli("call", address, message, "--json")
    assert done.returncode == 0, done.stderr
    body = _json(done)
    assert body["ok"] is True and body["queued"] is True, body
    assert body["address"] == address
    return dict(body)


def _audit(world: World, event: str, job_id: str) -> list[tuple[str | None, str | None]]:
    """The relay's audit rows of one event about one job: (actor, detail)."""
    uri = f"file:{world.relay.database}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        rows = db.execute(
            "SELECT actor, detail FROM audit WHERE event = ? AND call_id = ? ORDER BY id",
            (event, job_id),
        ).fetchall()
    return [(actor, detail) for actor, detail in rows]


def _relay_files(world: World) -> list[Path]:
    database = world.relay.database
    return [p for p in database.parent.iterdir() if p.name.startswith(database.name)]


def test_offline_delivery_is_off_by_default_and_shown(world: World) -> None:
    shown = world.ken.cli("access")
    assert shown.returncode == 0, shown.stderr
    assert "offline delivery: disabled" in shown.stdout.lower()
    done = world.ann.cli("call", "@acme/ken", "anyone there?", "--json")
    assert done.returncode == 1
    assert _json(done)["code"] == "offline"


def test_a_queued_call_survives_a_relay_kill_and_is_answered_when_the_callee_returns(
    world: World, tmp_path: Path
) -> None:
    rita = _callee(world, "rita")
    assert "offline delivery: enabled" in rita.cli("access").stdout.lower()
    queued = _queue(world, "@acme/rita", "what broke on main?")
    job_id = queued["job_id"]
    created = int(time.time())
    assert created + limits.MAILBOX_TTL_S - 600 < queued["expires_at"] <= created + 72 * 3600 + 5

    listed = _json(world.ann.cli("jobs", "list", "--json"))
    (mine,) = [job for job in listed if job["job_id"] == job_id]
    assert mine["state"] == "queued" and mine["address"] == "@acme/rita"
    waiting = _json(rita.cli("jobs", "list", "--json"))
    assert [job["job_id"] for job in waiting] == [job_id]

    pending = world.ann.cli("jobs", "get", "@acme/rita", job_id)
    assert pending.returncode == PENDING_EXIT, pending.stderr

    # Acknowledged means committed: SIGKILL gives the relay no chance to flush anything.
    world.relay.process.send_signal(signal.SIGKILL)
    world.relay.process.wait(timeout=30)
    world.relay.restart()

    rita.start_listener()
    try:
        done = world.ann.cli("jobs", "get", "@acme/rita", job_id, "--wait", "120", "--json")
        assert done.returncode == 0, done.stderr
        body = _json(done)
        assert body["ok"] is True and body["state"] == "answered" and body["job_id"] == job_id
        assert body["text"] == "FAKE-AGENT-ANSWER: what broke on main?"
        # Printed exactly as a synchronous call prints an answer.
        plain = world.ann.cli("jobs", "get", "@acme/rita", job_id)
        assert plain.returncode == 0, plain.stderr
        assert plain.stdout == "FAKE-AGENT-ANSWER: what broke on main?\n"
        assert len(rita.agent_runs()) == 1
    finally:
        rita.stop()

    # The relay kept ciphertext and metadata only.
    for path in _relay_files(world):
        data = path.read_bytes()
        assert b"what broke on main?" not in data, path
        assert b"FAKE-AGENT-ANSWER" not in data, path


def test_without_opt_in_or_with_no_queue_nothing_changes(world: World) -> None:
    sam = Install("sam", world.root / "sam", world.relay.ca_file)
    sam.setup(world.invite(), "sam", "--agent", "claude")
    done = world.ann.cli("call", "@acme/sam", "hello?", "--json")
    assert done.returncode == 1 and _json(done)["code"] == "offline"
    tess = _callee(world, "tess")
    done = world.ann.cli("call", "@acme/tess", "hello?", "--no-queue", "--json")
    assert done.returncode == 1 and _json(done)["code"] == "offline"
    assert _json(tess.cli("jobs", "list", "--json")) == []


def test_the_eleventh_outstanding_job_is_refused_busy(world: World) -> None:
    lou = _callee(world, "lou")
    assert _json(lou.cli("jobs", "list", "--json")) == []
    for n in range(limits.MAILBOX_MAX_OUTSTANDING_PER_CALLER):
        _queue(world, "@acme/lou", f"question {n}")
    done = world.ann.cli("call", "@acme/lou", "one too many", "--json")
    assert done.returncode == 1, done.stdout
    body = _json(done)
    assert body["code"] == "busy"
    assert "10" in body["message"]
    # Cancelling frees a place at once.
    first = _json(world.ann.cli("jobs", "list", "@acme/lou", "--json"))[-1]
    cancelled = world.ann.cli("jobs", "cancel", "@acme/lou", first["job_id"])
    assert cancelled.returncode == 0, cancelled.stderr
    _queue(world, "@acme/lou", "now there is room")
    # The callee sees every job waiting for them.
    waiting = _json(lou.cli("jobs", "list", "--json"))
    assert sum(job["state"] == "queued" for job in waiting) == 10
    for job in waiting:
        if job["state"] == "queued":
            done = world.ann.cli("jobs", "cancel", "@acme/lou", job["job_id"])
            assert done.returncode == 0, done.stderr


def test_cancel_a_queued_job(world: World) -> None:
    vic = _callee(world, "vic")
    job_id = _queue(world, "@acme/vic", "never mind")["job_id"]
    done = world.ann.cli("jobs", "cancel", "@acme/vic", job_id, "--json")
    assert done.returncode == 0, done.stderr
    assert _json(done)["state"] == "cancelled"
    vic.start_listener()
    try:
        got = world.ann.cli("jobs", "get", "@acme/vic", job_id, "--json")
        assert got.returncode == 1
        body = _json(got)
        assert body["state"] == "cancelled" and body["code"] == "canceled"
        assert vic.agent_runs() == []
    finally:
        vic.stop()


def _held_callee(world: World, name: str, tmp_path: Path) -> tuple[Install, AgentGate]:
    person = _callee(world, name)
    gate = AgentGate.make(tmp_path / f"{name}-gate")
    person.set_scenario({"name": "happy", "hold": gate.scenario()})
    return person, gate


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_cancel_a_running_job_kills_the_agent(world: World, tmp_path: Path) -> None:
    wes, gate = _held_callee(world, "wes", tmp_path)
    job_id = _queue(world, "@acme/wes", "a long job")["job_id"]
    wes.start_listener()
    try:
        gate.wait_started()
        (run,) = wes.agent_runs()
        done = world.ann.cli("jobs", "cancel", "@acme/wes", job_id)
        assert done.returncode == 0, done.stderr
        got = world.ann.cli("jobs", "get", "@acme/wes", job_id, "--wait", "120", "--json")
        assert got.returncode == 1
        body = _json(got)
        assert body["state"] == "cancelled" and body["code"] == "canceled"
        assert _pid_gone(run["pid"])
    finally:
        gate.release()
        wes.stop()


def test_a_listener_killed_mid_run_never_runs_the_job_again(world: World, tmp_path: Path) -> None:
    xia, gate = _held_callee(world, "xia", tmp_path)
    job_id = _queue(world, "@acme/xia", "do this exactly once")["job_id"]
    listener = xia.start_listener()
    try:
        gate.wait_started()
        listener.process.send_signal(signal.SIGKILL)
        listener.process.wait(timeout=30)
    finally:
        # The orphaned agent is let go; its answer has nowhere to go.
        gate.release()
    xia.set_scenario("happy")
    xia.start_listener()
    try:
        got = world.ann.cli("jobs", "get", "@acme/xia", job_id, "--wait", "120", "--json")
        assert got.returncode == 1, got.stdout
        body = _json(got)
        assert body["state"] == "failed" and body["code"] == "indeterminate_execution"
        assert len(xia.agent_runs()) == 1
        # The restarted listener's journal said so (the relay's lease lapse would also end it
        # indeterminate, but with the relay as actor): the at-most-once record did its work.
        assert _audit(world, "job.fail", job_id) == [("xia", "indeterminate_execution")]
    finally:
        xia.stop()


def test_a_call_to_a_busy_callee_is_queued_and_runs_next(world: World, tmp_path: Path) -> None:
    yan, gate = _held_callee(world, "yan", tmp_path)
    yan.start_listener()
    try:
        first = world.ann.cli_async("call", "@acme/yan", "first, live")
        gate.wait_started()
        job_id = _queue(world, "@acme/yan", "second, queued")["job_id"]
        yan.set_scenario("happy")
        assert gate.release()
        _out, err = first.communicate(timeout=120)
        assert first.returncode == 0, err
        got = world.ann.cli("jobs", "get", "@acme/yan", job_id, "--wait", "120", "--json")
        assert got.returncode == 0, got.stderr
        assert _json(got)["text"] == "FAKE-AGENT-ANSWER: second, queued"
    finally:
        gate.release()
        yan.stop()


def test_an_answer_finished_while_the_relay_was_down_still_arrives(
    world: World, tmp_path: Path
) -> None:
    """SIGKILL of the relay while a job runs; the agent finishes while the relay is down; the
    listener keeps the sealed answer in its journal and sends it once the relay is back."""
    zoe, gate = _held_callee(world, "zoe", tmp_path)
    job_id = _queue(world, "@acme/zoe", "finish while the relay is away")["job_id"]
    listener = zoe.start_listener()
    try:
        gate.wait_started()
        world.relay.process.send_signal(signal.SIGKILL)
        world.relay.process.wait(timeout=30)
        mark = listener.log.mark()
        assert gate.release()
        listener.log.wait_for(r"call_ended", since=mark)
        world.relay.restart()
        got = world.ann.cli("jobs", "get", "@acme/zoe", job_id, "--wait", "180", "--json")
        assert got.returncode == 0, got.stdout + got.stderr
        body = _json(got)
        assert body["state"] == "answered"
        assert body["text"] == "FAKE-AGENT-ANSWER: finish while the relay is away"
        assert len(zoe.agent_runs()) == 1
    finally:
        gate.release()
        zoe.stop()
