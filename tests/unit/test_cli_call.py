"""`agentcall call`: what reaches stdout, stderr and the exit status, with the flow faked."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentcall import caller, limits
from agentcall.caller import CallRefused, CallResult
from agentcall.cli import call as call_cli
from agentcall.cli.main import main
from agentcall.contacts import ContactBook
from agentcall.errors import CallErrorCode
from agentcall.wire.frames import CallState, CallStatus
from agentcall.wire.payloads import Reply
from tests.unit.cli_helpers import TOKEN, install, isolate, run_with_clock

CALL_ID = "1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b"


@attrs.define
class FakeFlow:
    """Stands in for caller.place: replays statuses, returns a prepared result."""

    result: CallResult | Exception
    calls: list[dict[str, Any]] = attrs.field(factory=list)

    async def place(
        self,
        reactor: Any,
        home: Any,
        config: Any,
        keys: Any,
        target: str,
        message: str,
        task: str | None,
        on_status: Any,
        **kw: Any,
    ) -> CallResult:
        self.calls.append({"target": target, "message": message, "task": task, **kw})
        for state in (CallState.RINGING, CallState.ANSWERED, CallState.WORKING):
            on_status(CallStatus(call_id=CALL_ID, state=state))
        if isinstance(self.result, Exception):
            raise self.result
        return attrs.evolve(self.result, address=target)


def reply(text: str, task: str | None = None) -> CallResult:
    return CallResult("", CALL_ID, 0.4, reply=Reply(text=text, task=task))


def failed(code: str, detail: str | None = None, offered: tuple[str, ...] = ()) -> CallResult:
    return CallResult("", CALL_ID, 0.4, code=CallErrorCode(code), detail=detail, offered=offered)


@pytest.fixture
def flow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeFlow:
    """An installed @acme/ann whose calls go to a FakeFlow answering "fine"."""
    install(isolate(monkeypatch, tmp_path))
    fake = FakeFlow(reply("fine"))
    monkeypatch.setattr(caller, "place", fake.place)
    monkeypatch.setattr(call_cli, "run_on_reactor", run_with_clock)
    return fake


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["call", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_reply_goes_to_stdout_and_progress_to_stderr(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 0; stdout is the reply alone; stderr shows each state with elapsed time."""
    code, out, err = run(capsys, "@acme/bob", "why", "so", "red?")
    assert (code, out) == (0, "fine\n")
    assert err == "ringing… 0.0s  answered 0.0s  working 0.0s\n"
    assert flow.calls[0]["message"] == "why so red?"
    assert flow.calls[0]["target"] == "@acme/bob"


def test_the_reply_is_made_terminal_safe(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """Escape sequences and carriage returns from the remote agent never reach the terminal."""
    flow.result = reply("ok\x1b]52;c;ZXZpbA==\x07 done\r\n")
    code, out, _err = run(capsys, "bob", "hi")
    assert code == 0
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert out.startswith("ok") and out.endswith("done\n")


def test_json_reply_is_one_object(flow: FakeFlow, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints exactly one JSON object with the documented keys."""
    flow.result = reply("fine", task="review")
    code, out, _err = run(capsys, "bob", "hi", "--json")
    assert code == 0
    assert out.count("\n") == 1
    assert json.loads(out) == {
        "ok": True,
        "address": "@acme/bob",
        "call_id": CALL_ID,
        "text": "fine",
        "task": "review",
    }


def test_a_failure_is_one_line_and_exit_one(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """A peer failure prints its plain description and detail on one stderr line."""
    flow.result = failed("busy", detail="another call\x1b[2J is running")
    code, out, err = run(capsys, "bob", "hi")
    assert (code, out) == (1, "")
    progress, last = err.splitlines()
    assert progress.startswith("ringing…")
    assert last.startswith("agentcall: The agent you called is busy")
    assert "another call" in last and "\x1b" not in err
    assert last.endswith("[busy]")


def test_offered_tasks_are_named(flow: FakeFlow, capsys: pytest.CaptureFixture[str]) -> None:
    """A task_not_offered failure tells the caller which tasks they may ask for."""
    flow.result = failed("task_not_offered", offered=("review", "ask"))
    code, _out, err = run(capsys, "bob", "hi", "--task", "deploy")
    assert code == 1
    assert "Tasks offered to you: review, ask." in err
    assert flow.calls[0]["task"] == "deploy"


def test_json_failure_is_one_object_and_exit_one(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json failures still print one object (ok false, code, message, call id) and exit 1."""
    flow.result = failed("connection_failed", detail="relay.example refused the connection")
    code, out, err = run(capsys, "bob", "hi", "--json")
    body = json.loads(out)
    assert code == 1
    assert body["ok"] is False
    assert body["code"] == "connection_failed"
    assert body["address"] == "@acme/bob"
    assert body["call_id"] == CALL_ID
    assert body["message"].startswith("Could not reach the relay")
    assert err.splitlines()[-1].startswith("agentcall: Could not reach the relay")


def test_a_local_refusal_names_its_code(flow: FakeFlow, capsys: pytest.CaptureFixture[str]) -> None:
    """A changed identity is a failure with the pin's fix in the message."""
    flow.result = CallRefused("identity_changed", "the identity key of @acme/bob has changed")
    code, out, err = run(capsys, "bob", "hi", "--json")
    assert code == 1
    assert json.loads(out)["code"] == "identity_changed"
    assert "has changed" in err


def test_nested_calls_are_refused(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside an answering agent (AGENTCALL_CALL_ID set) nothing is called."""
    monkeypatch.setenv("AGENTCALL_CALL_ID", CALL_ID)
    code, out, err = run(capsys, "bob", "hi")
    assert (code, out, flow.calls) == (1, "", [])
    assert "nested calls are not supported" in err


def test_an_oversize_message_is_refused_locally(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """One byte over the limit is refused with the numbers; the call is never placed."""
    code, _out, err = run(capsys, "bob", "x" * (limits.MAX_MESSAGE_BYTES + 1))
    assert (code, flow.calls) == (1, [])
    assert "64001 bytes; the limit is 64000 bytes" in err


def test_stdin_is_read_with_a_dash(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-` reads the message from stdin; exactly the limit is accepted."""
    text = "é" * (limits.MAX_MESSAGE_BYTES // 2)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    code, _out, _err = run(capsys, "bob", "-")
    assert code == 0
    assert flow.calls[0]["message"] == text


def test_oversize_stdin_is_refused(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """More than the limit on stdin is refused without reading it all."""
    data = b"y" * (limits.MAX_MESSAGE_BYTES + 10)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, _out, err = run(capsys, "bob", "-")
    assert (code, flow.calls) == (1, [])
    assert "more than 64000 bytes" in err


@pytest.mark.parametrize("data", [b"", b"  \n", b"\xff\xfe"])
def test_empty_or_undecodable_stdin_is_refused(
    data: bytes,
    flow: FakeFlow,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An empty message or one that is not UTF-8 is not sent."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, _out, _err = run(capsys, "bob", "-")
    assert (code, flow.calls) == (1, [])


def test_targets_resolve_through_contacts(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A contact name becomes its address; an address elsewhere is refused before calling."""
    from agentcall.home import Home

    ContactBook(Home.from_environ()).add("kenny", "@acme/ken")
    assert run(capsys, "Kenny", "hi")[0] == 0
    assert flow.calls[-1]["target"] == "@acme/ken"
    code, _out, err = run(capsys, "@globex/ken", "hi")
    assert code == 1
    assert "only calls within its own organisation" in err
    assert len(flow.calls) == 1


def test_not_set_up_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before setup, call says what to run instead of failing obscurely."""
    isolate(monkeypatch, tmp_path)
    code, out, err = run(capsys, "bob", "hi")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and "agentcall setup --invite" in err


def test_the_token_is_never_printed(flow: FakeFlow, capsys: pytest.CaptureFixture[str]) -> None:
    """Neither success nor failure output contains the bearer token."""
    first = run(capsys, "bob", "hi", "--json")
    flow.result = failed("unauthorized")
    second = run(capsys, "bob", "hi")
    assert TOKEN not in "".join(str(part) for part in (*first, *second))


@pytest.mark.parametrize(
    "argv",
    [["bob"], ["bob", "hi", "--task", "Bad Task"], ["bob", "hi", "--timeout", "0"]],
)
def test_usage_errors_exit_two(argv: list[str], flow: FakeFlow) -> None:
    """A missing message, a bad task id or timeout is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        main(["call", *argv])
    assert exited.value.code == 2
    assert flow.calls == []
