"""`agentcall call`: what reaches stdout, stderr and the exit status, with the flow faked."""

from __future__ import annotations

import gc
import io
import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentcall import limits
from agentcall.caller import call as caller
from agentcall.caller.call import CallRefused, CallResult
from agentcall.cli import call as call_cli
from agentcall.cli.main import main
from agentcall.errors import CallErrorCode
from agentcall.local.contacts import ContactBook
from agentcall.wire.frames import CallState, CallStatus
from agentcall.wire.payloads import Reply
from tests.unit.cli_helpers import NOW, ORIGIN, TOKEN, install, isolate, run_with_clock

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


def test_json_text_is_terminal_safe_once_decoded(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json | jq -r .text` prints no escape: the decoded text holds no ESC, OSC 52, OSC 8,
    C1, CR, backspace or bidi override, even from a callee that did not clean it."""
    flow.result = reply(
        "ok\x1b]52;c;ZXZpbA==\x07 \x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\"
        " \x9b2J\x9d0;t\x9c\x1b[31mred\x1b[0m\rX\x08\u202eY\tdone\n"
    )
    code, out, _err = run(capsys, "bob", "hi", "--json")
    assert code == 0
    text = json.loads(out)["text"]
    assert text == "ok link redX  Y\tdone\n"


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
    # The detail is in the sentence and, for agents that keep it apart, on its own.
    assert body["detail"] == "relay.example refused the connection"
    assert f"({body['detail']})" in body["message"]
    flow.result = failed("busy")
    _code, out, _err = run(capsys, "bob", "hi", "--json")
    assert "detail" not in json.loads(out)


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
    from agentcall.local.home import Home

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


# --- conversations -------------------------------------------------------------------------------

CTX = "ctx_" + "k" * 22
CTX2 = "ctx_" + "r" * 22


def threaded(text: str, context_id: str | None, task: str | None = "ask") -> CallResult:
    return CallResult("", CALL_ID, 0.4, reply=Reply(text=text, context_id=context_id, task=task))


def open_conversations() -> list[tuple[str, str, str]]:
    """What the caller's store holds, as (peer, task, context id)."""
    from agentcall.local.home import Home
    from agentcall.local.statedb import StateDb

    db = StateDb.open(Home.from_environ())
    try:
        rows = db.connection.execute("SELECT peer, task, context_id FROM contexts_out").fetchall()
    finally:
        db.close()
    return sorted(rows)


def seed(peer: str, task: str, context_id: str, at: float = NOW) -> None:
    from agentcall.local.home import Home
    from agentcall.local.statedb import StateDb

    db = StateDb.open(Home.from_environ())
    try:
        db.outbound(ORIGIN).remember(peer, task, context_id, at)
    finally:
        db.close()


def test_an_answer_that_opens_a_conversation_says_how_to_follow_up(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reply on stdout, the hint on stderr, the id remembered for --continue."""
    flow.result = threaded("fine", CTX)
    code, out, err = run(capsys, "bob", "hi")
    assert (code, out) == (0, "fine\n")
    assert "agentcall: conversation open — add --continue to follow up\n" in err
    assert open_conversations() == [("@acme/bob", "ask", CTX)]
    assert flow.calls[0]["context_id"] is None


def test_continue_sends_the_open_conversation(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """--continue picks the one open conversation with that address, id and task."""
    flow.result = threaded("first", CTX, task="review")
    run(capsys, "bob", "hi", "--task", "review")
    flow.result = threaded("second", CTX, task="review")
    code, out, _err = run(capsys, "bob", "and then?", "--continue")
    assert (code, out) == (0, "second\n")
    assert (flow.calls[1]["context_id"], flow.calls[1]["task"]) == (CTX, "review")


def test_continue_with_nothing_open_is_a_clear_error(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing open with that address (or only an expired one): one line, nothing sent."""
    seed("@acme/ken", "ask", CTX)
    seed("@acme/bob", "ask", CTX2, at=NOW - limits.CONTEXT_TTL_S)
    code, out, err = run(capsys, "bob", "more", "--continue", "--json")
    assert (code, flow.calls) == (1, [])
    assert json.loads(out)["code"] == "no_conversation"
    assert "no open conversation with @acme/bob" in err


def test_continue_with_several_open_needs_a_task(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two tasks open with one agent: --continue alone asks for --task; with it, it picks."""
    seed("@acme/bob", "ask", CTX)
    seed("@acme/bob", "review", CTX2)
    code, _out, err = run(capsys, "bob", "more", "--continue")
    assert (code, flow.calls) == (1, [])
    assert "several open conversations" in err and "--task" in err
    flow.result = threaded("ok", CTX2, task="review")
    code, _out, err = run(capsys, "bob", "more", "--continue", "--task", "review")
    assert code == 0
    assert flow.calls[0]["context_id"] == CTX2
    assert "with --task review" in err


def test_context_names_a_conversation_explicitly(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """--context sends that id; a known one brings its task, and --task must agree with it."""
    code, _out, _err = run(capsys, "bob", "more", "--context", CTX, "--task", "deploy")
    assert code == 0
    assert (flow.calls[0]["context_id"], flow.calls[0]["task"]) == (CTX, "deploy")
    seed("@acme/bob", "review", CTX2)
    flow.result = threaded("ok", CTX2, task="review")
    run(capsys, "bob", "more", "--context", CTX2)
    assert (flow.calls[1]["context_id"], flow.calls[1]["task"]) == (CTX2, "review")
    code, _out, err = run(capsys, "bob", "more", "--context", CTX2, "--task", "ask")
    assert (code, len(flow.calls)) == (1, 2)
    assert "about task 'review', not 'ask'" in err


def test_context_unknown_on_a_follow_up_ends_the_conversation(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """The agent no longer knows it: the local entry goes, and the person is told to start anew."""
    seed("@acme/bob", "ask", CTX)
    flow.result = failed("context_unknown")
    code, out, err = run(capsys, "bob", "more", "--continue", "--json")
    assert code == 1
    assert json.loads(out)["code"] == "context_unknown"
    assert "That conversation with @acme/bob has ended" in err
    assert "start a new call without --continue" in err
    assert open_conversations() == []


def test_other_failures_keep_the_conversation(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """A busy agent is worth another --continue later."""
    seed("@acme/bob", "ask", CTX)
    flow.result = failed("busy")
    code, _out, err = run(capsys, "bob", "more", "--continue")
    assert code == 1 and "[busy]" in err
    assert open_conversations() == [("@acme/bob", "ask", CTX)]


def test_a_follow_up_answered_without_an_id_closes_the_conversation(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last turn: the answer is printed and --continue will not offer it again."""
    seed("@acme/bob", "ask", CTX)
    flow.result = threaded("last word", None)
    code, out, err = run(capsys, "bob", "more", "--continue")
    assert (code, out) == (0, "last word\n")
    assert "conversation closed" in err
    assert open_conversations() == []


def test_json_reply_names_the_conversation(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json adds context_id when the answer opened a conversation, still one object."""
    flow.result = threaded("fine", CTX)
    code, out, err = run(capsys, "bob", "hi", "--json")
    assert code == 0 and out.count("\n") == 1
    assert json.loads(out)["context_id"] == CTX
    assert "conversation open" in err


def test_a_store_failure_after_the_answer_costs_only_the_follow_up(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the answer's id cannot be remembered, the answer is still printed, with a warning."""
    from agentcall.local.home import Home

    state = Home.from_environ().state_db_path
    flow.result = threaded("fine", CTX)

    async def place_then_break(*args: Any, **kw: Any) -> CallResult:
        result = await flow.place(*args, **kw)
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_bytes(b"")
        state.chmod(0o644)  # a state file others could read is refused
        return result

    monkeypatch.setattr(caller, "place", place_then_break)
    code, out, err = run(capsys, "bob", "hi")
    assert (code, out) == (0, "fine\n")
    assert "warning: could not update your open conversations" in err
    assert "conversation open" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["bob", "hi", "--continue", "--context", CTX],
        ["bob", "hi", "--context", "ctx_short"],
        ["bob", "hi", "--context", "ctx_" + "k" * 21 + "!"],
    ],
    ids=["both", "short-id", "bad-char"],
)
def test_conversation_usage_errors_exit_two(argv: list[str], flow: FakeFlow) -> None:
    """--continue and --context exclude each other; a malformed id is a usage error."""
    with pytest.raises(SystemExit) as exited:
        main(["call", *argv])
    assert exited.value.code == 2
    assert flow.calls == []


def test_an_unreadable_store_stops_a_follow_up_before_calling(
    flow: FakeFlow, capsys: pytest.CaptureFixture[str]
) -> None:
    """--continue cannot guess without the store: a local error, and nothing is sent."""
    from agentcall.local.home import Home

    seed("@acme/bob", "ask", CTX)
    Home.from_environ().state_db_path.chmod(0o644)
    code, out, err = run(capsys, "bob", "more", "--continue", "--json")
    assert (code, flow.calls) == (1, [])
    assert json.loads(out)["code"] == "local_error"
    assert "cannot read your open conversations" in err


def test_a_call_runs_without_cyclic_collections_and_restores_them(
    flow: FakeFlow, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A one-call process makes next to no garbage; collections would only rescan the
    modules it imported. The collector is off while the call runs, and as before after."""
    seen: list[bool] = []
    place = flow.place

    async def noting(*args: Any, **kw: Any) -> CallResult:
        seen.append(gc.isenabled())
        return await place(*args, **kw)

    monkeypatch.setattr(caller, "place", noting)
    assert gc.isenabled()
    code, out, _err = run(capsys, "@acme/ken", "hello")
    assert (code, out) == (0, "fine\n")
    assert seen == [False]
    assert gc.isenabled()
