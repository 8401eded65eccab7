"""The local socket's jobs lines: what they carry, and the hostile ones refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentcall import limits
from agentcall.errors import MalformedFrame
from agentcall.wire import codec, local
from agentcall.wire.local import (
    FROM_SERVICE,
    FROM_SERVICE_JOBS,
    TO_SERVICE,
    EndKind,
    LocalEnded,
    LocalJobs,
    LocalJobsEnded,
    LocalProgress,
)
from tests.unit.mailbox_helpers import JOB_ID, KEN, job

NOW = 1_750_000_000
ANSWER = LocalEnded(EndKind.ANSWER, KEN, JOB_ID, text="because")


def decode_request(raw: dict[str, Any]) -> object:
    return local.decode_line(json.dumps(raw), TO_SERVICE, max_bytes=limits.MAX_LOCAL_REQUEST_BYTES)


def decode_event(raw: dict[str, Any]) -> object:
    return local.decode_line(
        json.dumps(raw), FROM_SERVICE_JOBS, max_bytes=limits.MAX_LOCAL_EVENT_BYTES
    )


@pytest.mark.parametrize(
    "value",
    [
        LocalJobs("list"),
        LocalJobs("list", "ken"),
        LocalJobs("get", "ken", JOB_ID, wait_s=int(limits.MAILBOX_TTL_S)),
        LocalJobs("cancel", KEN, JOB_ID),
    ],
)
def test_requests_round_trip(value: LocalJobs) -> None:
    line = codec.encode(value)
    assert json.loads(line)["type"] == "jobs"
    assert local.decode_line(line, TO_SERVICE, max_bytes=limits.MAX_LOCAL_REQUEST_BYTES) == value


@pytest.mark.parametrize(
    "value",
    [
        LocalProgress("waiting up to 5 s…"),
        LocalJobsEnded(NOW, jobs=(job(), job(state="running"))),
        LocalJobsEnded(NOW, KEN, info=job(state="answered"), result=ANSWER),
        LocalJobsEnded(NOW, KEN, info=job()),
        LocalJobsEnded.trouble(NOW, "connection_failed", "cannot reach the relay", KEN),
    ],
)
def test_service_lines_round_trip(value: object) -> None:
    line = codec.encode(value)
    assert local.decode_line(line, FROM_SERVICE_JOBS, max_bytes=limits.MAX_LOCAL_EVENT_BYTES) == (
        value
    )


GOOD_GET = {"type": "jobs", "command": "get", "target": "ken", "job_id": JOB_ID, "wait_s": 0}


@pytest.mark.parametrize(
    "changes",
    [
        {"command": "delete"},
        {"command": "list"},  # a list names no job
        {"command": "list", "job_id": None, "wait_s": 5},  # nor waits
        {"job_id": None},
        {"target": None},
        {"target": ""},
        {"target": "k" * 201},
        {"job_id": "../../v1/me"},
        {"wait_s": -1},
        {"wait_s": int(limits.MAILBOX_TTL_S) + 1},
        {"wait_s": 1.5},
        {"wait_s": True},
        {"extra": 1},
    ],
)
def test_hostile_requests_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(MalformedFrame):
        decode_request({**GOOD_GET, **changes})


def _raw(value: object) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(codec.encode(value))
    return raw


@pytest.mark.parametrize(
    "changes",
    [
        {"code": "not_found"},  # a code without its message
        {"message": "no"},  # a message without its code
        {"code": "Not Found!", "message": "no"},
        {"info": None},  # a result without its job
        {"result": {**_raw(ANSWER), "type": "status"}},  # a nested line of another type
        {"result": _raw(LocalEnded(EndKind.QUEUED, KEN, job_id=JOB_ID, expires_at=NOW))},
        {"result": _raw(LocalEnded.refused("bad_target", "no"))},
        {"jobs": [_raw(job())]},  # a list and one job at once
        {"now": -1},
        {"address": "ken"},
    ],
)
def test_hostile_endings_are_refused(changes: dict[str, Any]) -> None:
    good = _raw(LocalJobsEnded(NOW, KEN, info=job(state="answered"), result=ANSWER))
    decode_event(good)
    with pytest.raises(MalformedFrame):
        decode_event({**good, **changes})


def test_trouble_carries_no_job() -> None:
    good = _raw(LocalJobsEnded.trouble(NOW, "not_found", "no such job"))
    decode_event(good)
    with pytest.raises(MalformedFrame):
        decode_event({**good, "info": _raw(job())})


def test_a_sealed_answer_never_crosses_the_local_socket() -> None:
    from tests.unit.mailbox_helpers import answered

    sealed = _raw(answered(_envelope()))
    for changes in ({"info": sealed}, {"info": None, "result": None, "jobs": [sealed]}):
        raw = {**_raw(LocalJobsEnded(NOW, KEN, info=job())), **changes}
        with pytest.raises(MalformedFrame):
            decode_event(raw)


def _envelope() -> Any:
    from agentcall.wire import frames
    from fuzz.seeds import envelope

    return envelope(frames.Direction.RESPONSE)


def test_too_many_jobs_are_refused() -> None:
    raw = _raw(LocalJobsEnded(NOW, jobs=(job(),)))
    raw["jobs"] = raw["jobs"] * (limits.MAX_JOBS_LISTED + 1)
    with pytest.raises(MalformedFrame):
        decode_event(raw)


def test_a_call_client_does_not_accept_jobs_lines() -> None:
    line = codec.encode(LocalJobsEnded(NOW, jobs=()))
    with pytest.raises(MalformedFrame):
        local.decode_line(line, FROM_SERVICE, max_bytes=limits.MAX_LOCAL_EVENT_BYTES)
