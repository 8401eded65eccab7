"""`agentcall call` when queued, `agentcall jobs list|get|cancel` and `access --offline`: what
reaches stdout, stderr and the exit status, with the relay's routes in memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentcall.caller import call as caller
from agentcall.caller.call import CallResult, QueuedJob
from agentcall.cli import call as call_cli
from agentcall.cli.jobs import EXIT_PENDING
from agentcall.cli.main import main
from agentcall.client.api import RelayUnreachable
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.local.home import Home
from agentcall.local.keystore import LocalKeys
from agentcall.wire.http import JobFailureReason, JobInfo, JobSide, JobState
from agentcall.wire.payloads import CallFailure, Reply
from tests.unit.cli_helpers import NOW, ORIGIN, install, isolate, run_with_clock
from tests.unit.crypto_helpers import Party, make_party
from tests.unit.mailbox_helpers import (
    ANN,
    EXPIRES,
    JOB_ID,
    KEN,
    OTHER_JOB,
    FakeJobRelay,
    answered,
    job,
    remember,
    seal_answer,
    seal_request,
)
from tests.unit.test_cli_call import FakeFlow

EXPIRES_TEXT = "2025-06-18 15:06 UTC"  # EXPIRES, as people read it


@attrs.define
class World:
    home: Home
    keys: LocalKeys
    relay: FakeJobRelay
    ken: Party

    def answer(self, outcome: Reply | CallFailure) -> None:
        """Ann queued a call to ken (stored here); the relay now holds ken's answer."""
        _sealed, request = seal_request(self.keys, self.ken)
        remember(self.home, request, self.ken)
        self.relay.script = [answered(seal_answer(self.keys, self.ken, request, outcome))]


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> World:
    home, _config, keys = install(isolate(monkeypatch, tmp_path))
    relay = FakeJobRelay()

    def relay_api(reactor: Any, _config: Any) -> FakeJobRelay:
        relay.clock = reactor
        return relay

    monkeypatch.setattr(call_cli, "relay_api", relay_api)
    monkeypatch.setattr(call_cli, "run_on_reactor", run_with_clock)
    return World(home, keys, relay, make_party(KEN, origin=ORIGIN))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- call, queued --------------------------------------------------------------------------------


@pytest.fixture
def flow(world: World, monkeypatch: pytest.MonkeyPatch) -> FakeFlow:
    fake = FakeFlow(CallResult("", None, 0.1, job=QueuedJob(JOB_ID, EXPIRES)))
    monkeypatch.setattr(caller, "place", fake.place)
    return fake


def test_a_queued_call_exits_zero_with_the_job_and_the_command(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """stdout: the job id and the exact command that fetches the answer; exit 0."""
    code, out, err = run(capsys, "call", "ken", "why", "so", "red?")
    assert code == 0
    assert out == (
        f"queued as job {JOB_ID} (kept until {EXPIRES_TEXT})\n"
        f"fetch the answer: agentcall jobs get {KEN} {JOB_ID} --wait 600\n"
    )
    assert "offline or busy" in err
    assert flow.calls[0]["queue"] is True


def test_a_queued_call_in_json_is_one_object(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _err = run(capsys, "call", "ken", "hi", "--json")
    assert code == 0
    assert out.count("\n") == 1
    assert json.loads(out) == {
        "ok": True,
        "queued": True,
        "job_id": JOB_ID,
        "address": KEN,
        "expires_at": EXPIRES,
    }


def test_no_queue_asks_the_relay_not_to_keep_the_call(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    flow.result = CallResult("", None, 0.1, code="offline")  # type: ignore[arg-type]
    code, _out, err = run(capsys, "call", "ken", "hi", "--no-queue")
    assert code == 1
    assert flow.calls[0]["queue"] is False
    assert err.rstrip().endswith("[offline]")


# --- jobs list -----------------------------------------------------------------------------------


def listed(world: World) -> None:
    world.relay.listed = [
        job(job_id=OTHER_JOB, created_at=int(NOW) - 7200, state=JobState.QUEUED),
        job(state=JobState.FAILED, reason=JobFailureReason.DELIVERY_FAILED, attempts=3),
        job(
            job_id="2b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b",
            side=JobSide.RECEIVED,
            caller="@acme/bob",
            callee=ANN,
            state=JobState.RUNNING,
            created_at=int(NOW) + 30,
            attempts=1,
        ),
    ]


def test_jobs_list_shows_sent_and_received_newest_first(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """One row per job: id, side, the other party, state with the failure reason, age, expiry."""
    listed(world)
    code, out, _err = run(capsys, "jobs", "list")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["JOB", "ID", "SIDE", "WITH", "STATE", "AGE", "EXPIRES"]
    assert [row.split()[:4] for row in rows] == [
        ["2b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b", "received", "@acme/bob", "running"],
        [JOB_ID, "sent", KEN, "failed"],
        [OTHER_JOB, "sent", KEN, "queued"],
    ]
    assert "failed (delivery_failed)" in rows[1]
    # The clock of the run starts at NOW: the last job is two hours old.
    assert rows[2].split()[4] == "2h"
    assert rows[2].endswith(EXPIRES_TEXT)


def test_jobs_list_json_is_one_array_and_filters_by_address(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    listed(world)
    code, out, _err = run(capsys, "jobs", "list", "@acme/bob", "--json")
    assert code == 0
    assert json.loads(out) == [
        {
            "job_id": "2b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b",
            "side": "received",
            "address": "@acme/bob",
            "caller": "@acme/bob",
            "callee": ANN,
            "state": "running",
            "reason": None,
            "attempts": 1,
            "cancel_requested": False,
            "created_at": int(NOW) + 30,
            "expires_at": EXPIRES,
        }
    ]
    code, out, _err = run(capsys, "jobs", "list", "ken", "--json")
    assert [item["job_id"] for item in json.loads(out)] == [JOB_ID, OTHER_JOB]


def test_an_empty_list_says_so(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "jobs", "list")[:2] == (0, "no jobs\n")
    assert run(capsys, "jobs", "list", "--json")[:2] == (0, "[]\n")


# --- jobs get ------------------------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_an_answer_prints_exactly_as_call_prints_it(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    as_json: bool,
) -> None:
    """Same stdout as a live call's reply (terminal-safe); in JSON, call's object plus job_id
    and state."""
    reply = Reply(text="ok\x1b]52;c;ZXZpbA==\x07 the disk\r\n", task="ask", context_id=None)
    world.answer(reply)
    flag = ["--json"] if as_json else []
    code, out, err = run(capsys, "jobs", "get", KEN, JOB_ID, *flag)
    assert code == 0
    assert f"job {JOB_ID} to {KEN}: answered" in err
    monkeypatch.setattr(caller, "place", FakeFlow(CallResult("", JOB_ID, 0.4, reply=reply)).place)
    call_code, call_out, _err = run(capsys, "call", KEN, "hi", *flag)
    assert call_code == 0
    if as_json:
        assert json.loads(out) == {**json.loads(call_out), "job_id": JOB_ID, "state": "answered"}
        assert json.loads(out)["text"] == "ok the disk\n"
    else:
        assert out == call_out
        assert "\x1b" not in out and "\r" not in out


def test_a_sealed_refusal_is_reported_like_calls(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """ken's policy refused ann meanwhile: the job's answer is `blocked`, exit 1, one line."""
    world.answer(CallFailure(code="blocked"))
    code, out, err = run(capsys, "jobs", "get", KEN, JOB_ID, "--json")
    body = json.loads(out)
    assert code == 1
    assert (body["ok"], body["code"], body["job_id"], body["state"]) == (
        False,
        "blocked",
        JOB_ID,
        "answered",
    )
    assert err.rstrip().endswith("[blocked]")


def test_a_pending_job_exits_with_its_own_status(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Still queued after the wait: exit 75, the command to ask again, ok false, code pending."""
    code, out, err = run(capsys, "jobs", "get", KEN, JOB_ID, "--wait", "45", "--json")
    assert code == EXIT_PENDING == 75
    body = json.loads(out)
    assert (body["ok"], body["pending"], body["code"], body["state"]) == (
        False,
        True,
        "pending",
        "queued",
    )
    assert body["expires_at"] == EXPIRES
    assert f"agentcall jobs get {KEN} {JOB_ID} --wait 600" in err
    assert [int(asked[2]) for asked in world.relay.asked] == [30, 15]


@pytest.mark.parametrize(
    ("state", "reason", "code"),
    [
        (JobState.FAILED, JobFailureReason.DELIVERY_FAILED, "delivery_failed"),
        (JobState.FAILED, JobFailureReason.INDETERMINATE_EXECUTION, "indeterminate_execution"),
        (JobState.FAILED, JobFailureReason.REVOKED, "revoked"),
        (JobState.FAILED, JobFailureReason.REJECTED, "protocol_error"),
        (JobState.CANCELLED, None, "canceled"),
        (JobState.EXPIRED, None, "expired"),
    ],
)
def test_each_way_a_job_ends_unanswered_has_its_code(
    world: World,
    capsys: pytest.CaptureFixture[str],
    state: JobState,
    reason: JobFailureReason | None,
    code: str,
) -> None:
    world.relay.script = [job(state=state, reason=reason, attempts=3)]
    exit_code, out, err = run(capsys, "jobs", "get", KEN, JOB_ID, "--wait", "600", "--json")
    assert exit_code == 1
    body = json.loads(out)
    assert (body["ok"], body["code"], body["state"]) == (False, code, str(state))
    assert body.get("reason") == (None if reason is None else str(reason))
    assert err.rstrip().endswith(f"[{code}]")
    # Ended at once: no waiting.
    assert len(world.relay.asked) == 1


def test_an_unknown_job_is_a_clear_error(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "jobs", "get", KEN, OTHER_JOB, "--json")
    assert code == 1
    assert json.loads(out)["code"] == "not_found"
    assert f"no job {OTHER_JOB} of yours" in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["jobs", "get", KEN, "../../v1/me"], "is not a job id"),
        (["jobs", "get", KEN, JOB_ID, "--wait", "-1"], "the wait must be 0..259200"),
        (["jobs", "get", KEN, JOB_ID, "--wait", "1.5"], "is not a whole number of seconds"),
        (["jobs", "get", KEN, JOB_ID, "--wait", "nan"], "is not a whole number of seconds"),
        (["jobs", "get", KEN, JOB_ID, "--wait", "999999999"], "the wait must be 0..259200"),
        (["jobs", "cancel", KEN, "1b4e28ba"], "is not a job id"),
        (["jobs", "cancel", KEN, JOB_ID, "--wait", "-5"], "the wait must be 0..259200"),
        (["jobs", "cancel", KEN, JOB_ID, "--wait", "1m"], "is not a whole number of seconds"),
        (["jobs", "get", KEN], "required: JOB_ID"),
    ],
)
def test_hostile_arguments_are_usage_errors(
    world: World, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    """Bad job ids and waits never reach the relay: exit 2 with what is wrong."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err
    assert world.relay.asked == []


@pytest.mark.parametrize(
    "target", ["@globex/ken", "@acme/", "not an address!", "@acme/ken\x1b[2J", "@ACME/ken/x"]
)
def test_a_bad_address_is_refused_before_the_relay(
    world: World, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    code, out, err = run(capsys, "jobs", "get", target, JOB_ID, "--json")
    assert code == 1
    assert json.loads(out)["code"] == "bad_target"
    assert "\x1b" not in out and "\x1b" not in err
    assert world.relay.asked == []


def test_an_unreachable_relay_is_connection_failed(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.relay.fail = RelayUnreachable("relay.example refused the connection")
    code, out, _err = run(capsys, "jobs", "get", KEN, JOB_ID, "--json")
    assert code == 1
    assert json.loads(out)["code"] == "connection_failed"


@pytest.mark.parametrize(
    "argv",
    [["jobs", "list"], ["jobs", "get", KEN, JOB_ID], ["jobs", "cancel", KEN, JOB_ID]],
)
def test_jobs_are_refused_inside_an_answering_agent(
    world: World,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
) -> None:
    """As with call: AGENTCALL_CALL_ID set means nothing reaches the relay."""
    monkeypatch.setenv("AGENTCALL_CALL_ID", JOB_ID)
    code, _out, err = run(capsys, *argv)
    assert code == 1
    assert "nested calls are not supported" in err
    assert world.relay.asked == []


# --- jobs cancel ---------------------------------------------------------------------------------


def test_cancel_a_queued_job(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """Removed at once: nothing waited for, nothing said about waiting."""
    code, out, err = run(capsys, "jobs", "cancel", KEN, JOB_ID)
    assert code == 0
    assert out == f"job {JOB_ID} to {KEN}: cancelled\n"
    assert err == ""
    assert world.relay.asked == [("get", JOB_ID, "0"), ("cancel", JOB_ID)]


RUNNING = job(state=JobState.RUNNING, attempts=1)
STOPPING = job(state=JobState.RUNNING, attempts=1, cancel_requested=True)


def stopping(world: World, *then: JobInfo) -> None:
    """A running job whose cancel is accepted; the relay then reports ``then``."""
    world.relay.script = [RUNNING, *then]
    world.relay.cancel_answer = STOPPING


def test_cancel_a_running_job_waits_until_it_is_cancelled(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    stopping(world, STOPPING, job(state=JobState.CANCELLED, attempts=1))
    code, out, err = run(capsys, "jobs", "cancel", KEN, JOB_ID)
    assert code == 0
    assert out == f"job {JOB_ID} to {KEN}: cancelled\n"
    assert err == (
        f"cancelling job {JOB_ID} to {KEN}: it is running; waiting up to 60 s for its "
        "listener to stop it…\n"
    )
    assert [asked[2] for asked in world.relay.asked if asked[0] == "get"] == ["0", "30", "30"]
    stopping(world, job(state=JobState.CANCELLED, attempts=1))
    code, out, _err = run(capsys, "jobs", "cancel", KEN, JOB_ID, "--json")
    assert code == 0
    body = json.loads(out)
    assert (body["ok"], body["state"], body["job_id"]) == (True, "cancelled", JOB_ID)


def test_an_answer_that_wins_the_race_is_not_lost(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Answered before the listener stopped the agent: exit 0, and the command that fetches
    the answer, which then prints it."""
    world.answer(Reply(text="finished first"))
    answer = world.relay.script[0]
    stopping(world, answer)
    code, out, _err = run(capsys, "jobs", "cancel", KEN, JOB_ID)
    assert code == 0
    assert out == (
        f"job {JOB_ID} to {KEN}: answered before the cancel reached it\n"
        f"the answer is kept; fetch it: agentcall jobs get {KEN} {JOB_ID}\n"
    )
    stopping(world, answer)
    code, out, _err = run(capsys, "jobs", "cancel", KEN, JOB_ID, "--json")
    body = json.loads(out)
    assert (code, body["ok"], body["state"]) == (0, True, "answered")
    world.relay.script = [answer]
    code, out, _err = run(capsys, "jobs", "get", KEN, JOB_ID)
    assert (code, out) == (0, "finished first\n")


def test_a_job_that_fails_while_being_cancelled_says_how_it_ended(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = job(state=JobState.FAILED, reason=JobFailureReason.INDETERMINATE_EXECUTION, attempts=1)
    stopping(world, failed)
    code, out, _err = run(capsys, "jobs", "cancel", KEN, JOB_ID)
    assert code == 0
    assert out == (
        f"job {JOB_ID} to {KEN}: failed (indeterminate_execution) before it could be cancelled\n"
    )


def test_cancel_that_outlasts_its_wait_exits_pending(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Still running after the default 60 s: exit 75, the command to check, ok false."""
    stopping(world, STOPPING)
    code, out, err = run(capsys, "jobs", "cancel", KEN, JOB_ID, "--json")
    assert code == EXIT_PENDING == 75
    body = json.loads(out)
    assert (body["ok"], body["code"], body["pending"]) == (False, "pending", True)
    assert (body["state"], body["cancel_requested"], body["job_id"]) == ("running", True, JOB_ID)
    assert body["expires_at"] == EXPIRES
    assert [asked[2] for asked in world.relay.asked if asked[0] == "get"] == ["0", "30", "30"]
    assert err.rstrip().endswith(
        f"is still running after 60 s: its listener has been told to stop it; "
        f"`agentcall jobs get {KEN} {JOB_ID} --wait 600` shows when it has"
    )
    stopping(world, STOPPING)
    code, out, _err = run(capsys, "jobs", "cancel", KEN, JOB_ID, "--wait", "45")
    assert (code, out) == (75, "")
    assert [asked[2] for asked in world.relay.asked if asked[0] == "get"][-2:] == ["30", "15"]


def test_cancel_with_no_wait_returns_at_once(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    stopping(world, job(state=JobState.CANCELLED, attempts=1))
    code, out, err = run(capsys, "jobs", "cancel", KEN, JOB_ID, "--wait", "0")
    assert (code, out) == (EXIT_PENDING, "")
    assert world.relay.asked == [("get", JOB_ID, "0"), ("cancel", JOB_ID)]
    assert "waiting" not in err
    assert err == (
        f"agentcall: job {JOB_ID} to {KEN} is still running: its listener has been told to "
        f"stop it; `agentcall jobs get {KEN} {JOB_ID} --wait 600` shows when it has\n"
    )


def test_cancel_of_an_ended_job_is_an_error(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.relay.cancel_answer = ApiError(409, ApiErrorCode.JOB_ENDED, "ended")
    code, out, _err = run(capsys, "jobs", "cancel", KEN, JOB_ID, "--json")
    assert code == 1
    assert json.loads(out)["code"] == "job_ended"


# --- access --offline ----------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["enabled", "disabled"])
def test_access_offline_reaches_the_relay_at_once(
    world: World, capsys: pytest.CaptureFixture[str], setting: str
) -> None:
    world.relay.offline_delivery = setting == "disabled"
    code, out, _err = run(capsys, "access", "--offline", setting)
    assert code == 0
    assert world.relay.asked == [("offline", str(setting == "enabled"))]
    assert out.startswith(f"offline delivery: {setting}")
    code, out, _err = run(capsys, "access")
    assert code == 0
    assert f"offline delivery: {setting}" in out.splitlines()[-1]


def test_access_offline_fails_clearly_when_the_relay_cannot_be_reached(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.relay.fail = RelayUnreachable("relay.example refused the connection")
    code, out, err = run(capsys, "access", "--offline", "enabled")
    assert (code, out) == (1, "")
    assert err == (
        "agentcall: cannot change offline delivery: cannot reach the relay "
        "(relay.example refused the connection)\n"
    )
    # Showing the policy still works, and says the setting is unknown and why.
    code, out, _err = run(capsys, "access")
    assert code == 0
    assert out.splitlines()[-1].startswith("offline delivery: unknown (cannot read")


def test_access_offline_and_default_together_change_both(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _err = run(capsys, "access", "--offline", "enabled", "--default", "blocked")
    assert code == 0
    assert world.relay.offline_delivery is True
    assert "default access is now blocked" in out


def test_access_offline_needs_an_installation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    isolate(monkeypatch, tmp_path)
    code, _out, err = run(capsys, "access", "--offline", "enabled")
    assert code == 1
    assert "setup" in err
    code, out, _err = run(capsys, "access")
    assert code == 0
    assert out.splitlines()[-1] == "offline delivery: unknown (this installation is not set up)"
