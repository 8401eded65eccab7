"""What an AgentCall call becomes in A2A: states, the answer artifact, contexts."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from agentcall.a2a import tasks
from agentcall.a2a.tasks import Finish, TaskState
from agentcall.errors import CallErrorCode
from agentcall.wire.local import EndKind, LocalEnded

NOW = 1_780_000_000.25
KEN = "@acme/ken"
CTX = "ctx_" + "A" * 22
CALL_ID = "5f0c3a5e-1b2c-4d3e-8f4a-0123456789ab"


def _describe(code: CallErrorCode) -> str:
    return f"described {code}."


def _record(**changes: Any) -> tasks.TaskRecord:
    message = tasks.text_message("m1", "c1", "t1", "hello", role="ROLE_USER")
    record = tasks.new_task("t1", "c1", KEN, message, NOW)
    return attrs.evolve(record, **changes)


def test_call_states_map_to_task_states() -> None:
    assert tasks.state_of_call("ringing") is TaskState.SUBMITTED
    assert tasks.state_of_call("answered") is TaskState.WORKING
    assert tasks.state_of_call("working") is TaskState.WORKING
    assert KEN in tasks.call_state_text("working", KEN)


def test_timestamps_are_iso_with_milliseconds() -> None:
    assert tasks.timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert tasks.timestamp(NOW) == "2026-05-28T20:26:40.250Z"
    assert tasks.timestamp(1.9996) == "1970-01-01T00:00:02.000Z"


def test_an_answer_completes_with_the_text_cleaned() -> None:
    ended = LocalEnded(
        EndKind.ANSWER, KEN, CALL_ID, text="\x1b[31mred\x1b[0m\rok", task="ask", context_id=CTX
    )
    end = tasks.finish(ended, _describe)
    assert end.state is TaskState.COMPLETED
    assert end.answer == "redok"
    assert end.conversation == CTX
    assert end.call_id == CALL_ID
    assert end.task == "ask"


@pytest.mark.parametrize(
    ("code", "state"),
    [
        (CallErrorCode.BLOCKED, TaskState.REJECTED),
        (CallErrorCode.TASK_UNKNOWN, TaskState.REJECTED),
        (CallErrorCode.TASK_NOT_OFFERED, TaskState.REJECTED),
        (CallErrorCode.UNKNOWN_HANDLE, TaskState.REJECTED),
        (CallErrorCode.CANCELED, TaskState.CANCELED),
        (CallErrorCode.TIMEOUT, TaskState.FAILED),
        (CallErrorCode.OFFLINE, TaskState.FAILED),
        (CallErrorCode.BUSY, TaskState.FAILED),
        (CallErrorCode.AGENT_ERROR, TaskState.FAILED),
    ],
)
def test_failures_map_to_terminal_states(code: CallErrorCode, state: TaskState) -> None:
    end = tasks.finish(LocalEnded(EndKind.FAILED, KEN, code=str(code)), _describe)
    assert end.state is state
    assert end.text == f"described {code}. [{code}]"
    assert end.code == str(code)
    assert end.answer is None


def test_a_failure_says_its_detail_and_offered_tasks_safely() -> None:
    ended = LocalEnded(
        EndKind.FAILED,
        KEN,
        CALL_ID,
        code="task_not_offered",
        detail="no\x1b]0;title\x07 such\ntask",
        offered=("ask", "review"),
    )
    end = tasks.finish(ended, _describe)
    assert "\x1b" not in end.text and "\n" not in end.text
    assert "(no such task)" in end.text
    assert "Tasks offered to you: ask, review." in end.text
    assert end.call_id == CALL_ID


def test_an_ended_conversation_says_so() -> None:
    ended = LocalEnded(EndKind.FAILED, KEN, code="context_unknown", ended=True)
    end = tasks.finish(ended, _describe)
    assert "without this contextId" in end.text
    assert end.code == "context_unknown"


def test_a_long_reason_is_cut() -> None:
    ended = LocalEnded(EndKind.FAILED, KEN, code="agent_error", detail="x" * 3000)
    end = tasks.finish(ended, _describe)
    assert len(end.text) <= tasks.MAX_REASON_CHARS + len(" [agent_error]")
    assert end.text.endswith("… [agent_error]")


def test_a_local_refusal_fails_with_its_code() -> None:
    ended = LocalEnded.refused("identity_changed", "the key changed", KEN)
    end = tasks.finish(ended, _describe)
    assert end.state is TaskState.FAILED
    assert end.text == "the key changed [identity_changed]"
    assert end.code == "identity_changed"


def test_a_queued_call_fails_naming_the_job() -> None:
    job = "0c1f7b7e-9a3d-4c1b-8e2f-0123456789ab"
    ended = LocalEnded(EndKind.QUEUED, KEN, job_id=job, expires_at=2_000_000_000)
    end = tasks.finish(ended, _describe)
    assert end.state is TaskState.FAILED
    assert end.code == "queued"
    assert f"agentcall jobs get {KEN} {job}" in end.text


def test_a_task_advances_then_finishes_once() -> None:
    record = _record()
    assert record.state is TaskState.SUBMITTED and not record.done
    ringing = tasks.advanced(record, "ringing", NOW + 1)
    assert ringing is not None and ringing.state is TaskState.SUBMITTED
    assert tasks.advanced(ringing, "ringing", NOW + 2) is None  # nothing new to show
    working = tasks.advanced(ringing, "working", NOW + 3)
    assert working is not None and working.state is TaskState.WORKING
    end = Finish(TaskState.COMPLETED, "answered", answer="hi")
    done = tasks.finished(working, end, "a1", NOW + 4)
    assert done.done and done.artifact_id == "a1" and done.updated == NOW + 4
    assert tasks.advanced(done, "answered", NOW + 5) is None
    again = tasks.finished(done, Finish(TaskState.CANCELED, "late"), "a2", NOW + 6)
    assert again is done


def test_a_failed_task_has_no_artifact() -> None:
    done = tasks.finished(_record(), Finish(TaskState.FAILED, "x [busy]", "busy"), "a1", NOW)
    assert done.artifact_id is None
    assert tasks.answer_artifact(done) is None
    assert tasks.artifact_update(done) is None
    assert "artifacts" not in tasks.task_json(done)
    meta = tasks.status(done)["message"]["metadata"]["agentcall"]
    assert meta["code"] == "busy"


def test_the_task_as_clients_see_it() -> None:
    working = tasks.advanced(_record(), "working", NOW)
    assert working is not None
    end = Finish(TaskState.COMPLETED, "answered", answer="the answer", call_id=CALL_ID, task="ask")
    done = tasks.finished(working, end, "a1", NOW + 1)
    shown = tasks.task_json(done)
    assert shown["id"] == "t1" and shown["contextId"] == "c1"
    assert shown["status"]["state"] == "TASK_STATE_COMPLETED"
    assert shown["status"]["message"]["role"] == "ROLE_AGENT"
    (artifact,) = shown["artifacts"]
    assert artifact["parts"] == [{"text": "the answer", "mediaType": "text/plain"}]
    assert artifact["metadata"]["agentcall"] == {
        "from": KEN,
        "untrusted": True,
        "callId": CALL_ID,
        "task": "ask",
    }
    assert "another person" in artifact["description"]
    assert shown["history"][0]["parts"] == [{"text": "hello"}]
    assert "history" not in tasks.task_json(done, 0)
    assert len(tasks.task_json(done, 5)["history"]) == 1
    update = tasks.artifact_update(done)
    assert update is not None and update["artifactUpdate"]["lastChunk"] is True
    assert tasks.status_update(done)["statusUpdate"]["status"]["state"] == ("TASK_STATE_COMPLETED")


def test_a_new_task_shows_no_status_message() -> None:
    assert "message" not in tasks.status(_record())


def test_the_sdk_reads_what_the_bridge_writes() -> None:
    """Every shape parses as A2A's own messages (ProtoJSON), none of its fields lost."""
    pb = pytest.importorskip("a2a.types.a2a_pb2")
    ParseDict = pytest.importorskip("google.protobuf.json_format").ParseDict

    working = tasks.advanced(_record(), "working", NOW)
    assert working is not None
    done = tasks.finished(working, Finish(TaskState.COMPLETED, "ok", answer="x"), "a1", NOW)
    task = ParseDict(tasks.task_json(done), pb.Task())
    assert task.status.state == pb.TASK_STATE_COMPLETED
    assert task.artifacts[0].parts[0].text == "x"
    stream = ParseDict(tasks.status_update(working), pb.StreamResponse())
    assert stream.status_update.status.state == pb.TASK_STATE_WORKING
    update = tasks.artifact_update(done)
    assert update is not None
    assert ParseDict(update, pb.StreamResponse()).artifact_update.artifact.artifact_id == "a1"


def test_the_task_book_forgets_old_finished_tasks_only() -> None:
    book = tasks.TaskBook(limit=2)
    running = book.put(_record(task_id="run"))
    finished_one = tasks.finished(_record(task_id="old"), Finish(TaskState.FAILED, "x"), "a", NOW)
    book.put(finished_one)
    book.put(_record(task_id="new"))
    assert book.get("old") is None
    assert book.get("run") == running and book.get("new") is not None
    book.put(_record(task_id="newer"))
    assert len(book) == 3  # nothing finished left to forget
