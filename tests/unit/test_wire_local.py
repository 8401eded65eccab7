"""The local socket's lines (agentcall.wire.local): shapes, round trips, hostile input."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentcall import limits
from agentcall.errors import MalformedFrame
from agentcall.wire import codec, local
from agentcall.wire.local import (
    FROM_SERVICE,
    TO_SERVICE,
    EndKind,
    LocalCall,
    LocalEnded,
    LocalNote,
    LocalStatus,
)

CALL_ID = "1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b"
CONTEXT_ID = "ctx_AbCdEfGhIjKlMnOpQrStUv"


def request(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "call",
        "target": "ken",
        "message": "why is CI red?",
        "task": None,
        "continue": False,
        "context_id": None,
        "queue": True,
        "timeout_ms": 420_000,
    }
    body.update(changes)
    return body


def decode_request(body: object) -> object:
    return local.decode_line(
        json.dumps(body).encode(), TO_SERVICE, max_bytes=limits.MAX_LOCAL_REQUEST_BYTES
    )


def decode_event(body: object) -> object:
    return local.decode_line(
        json.dumps(body).encode(), FROM_SERVICE, max_bytes=limits.MAX_LOCAL_EVENT_BYTES
    )


@pytest.mark.parametrize(
    "value",
    [
        LocalCall(target="@acme/ken", message="hi", task="review", continue_=True),
        LocalCall(target="ken", message="x" * 10, context_id=CONTEXT_ID, queue=False),
        LocalStatus("working", CALL_ID),
        LocalNote("the relay queued the call although it was asked not to"),
        LocalEnded(EndKind.ANSWER, "@acme/ken", CALL_ID, text="fine", task="ask"),
        LocalEnded(
            EndKind.ANSWER,
            "@acme/ken",
            CALL_ID,
            text="fine",
            context_id=CONTEXT_ID,
            conversation_note="conversation open — add --continue to follow up",
        ),
        LocalEnded(EndKind.QUEUED, "@acme/ken", job_id=CALL_ID, expires_at=1_750_000_000),
        LocalEnded(EndKind.FAILED, "@acme/ken", CALL_ID, code="task_not_offered", offered=("ask",)),
        LocalEnded(EndKind.FAILED, "@acme/ken", code="context_unknown", ended=True),
        LocalEnded.refused("bad_target", "'x y' is not a contact"),
    ],
)
def test_every_shape_round_trips(value: object) -> None:
    accept = TO_SERVICE if isinstance(value, LocalCall) else FROM_SERVICE
    data = codec.encode(value)
    assert b"\n" not in data  # one line each
    assert local.decode_line(data, accept, max_bytes=limits.MAX_LOCAL_EVENT_BYTES) == value


def test_the_local_states_are_the_relays_call_states() -> None:
    from agentcall.wire.frames import CallState
    from agentcall.wire.local import CALL_STATES

    assert set(CALL_STATES) == {str(state) for state in CallState}


def test_the_request_is_the_call_as_typed() -> None:
    decoded = decode_request(request(task="review", **{"continue": True}))
    assert decoded == LocalCall(
        target="ken", message="why is CI red?", task="review", continue_=True
    )
    assert isinstance(decoded, LocalCall) and decoded.timeout_s == 420.0


@pytest.mark.parametrize(
    "body",
    [
        request(extra=1),  # unknown key
        request(timeout_ms="5000"),  # a number as a string
        request(timeout_ms=5000.0),  # a float where an integer belongs
        request(timeout_ms=999),  # below the range
        request(timeout_ms=int(limits.CLIENT_CALL_TIMEOUT_S * 1000) + 1),  # above it
        request(**{"continue": "true"}),
        request(queue=1),
        request(message=5),
        request(message=""),
        request(message="x" * (limits.MAX_MESSAGE_BYTES + 1)),
        request(target=""),
        request(target="k" * 201),
        request(task="Not A Task"),
        request(context_id="ctx_short"),
        request(context_id=CONTEXT_ID, **{"continue": True}),  # both at once
        {k: v for k, v in request().items() if k != "target"},  # missing
        request(type="ended"),  # a service line sent to the service
        request(type="nope"),
        ["call"],
        "call",
    ],
)
def test_a_bad_request_is_malformed(body: object) -> None:
    with pytest.raises(MalformedFrame):
        decode_request(body)


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xfe",
        b'{"type": "call", "type": "call"}',
        b"NaN",
        b"[" * 10_000,
        b"x" * (limits.MAX_LOCAL_REQUEST_BYTES + 1),
    ],
)
def test_bytes_that_are_not_a_line_of_json_are_malformed(data: bytes) -> None:
    with pytest.raises(MalformedFrame):
        local.decode_line(data, TO_SERVICE, max_bytes=limits.MAX_LOCAL_REQUEST_BYTES)


def ended(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(
        codec.encode(LocalEnded(EndKind.ANSWER, "@acme/ken", CALL_ID, text="ok"))
    )
    body.update(changes)
    return body


@pytest.mark.parametrize(
    "body",
    [
        ended(kind="shrug"),
        ended(text=None),  # an answer without its text
        ended(kind="failed", text=None, code="no_such_code"),
        ended(kind="failed", text=None, code=None),
        ended(kind="queued", text=None),  # no job id
        ended(kind="refused", text=None, code="bad_target"),  # no message
        ended(kind="refused", text=None, code="Bad Code!", message="x"),
        ended(code="busy"),  # an answer carries no code
        ended(detail="why"),  # nor a detail
        ended(offered=["ask"]),
        ended(address="ken"),  # not an address
        ended(call_id="call-1"),
        ended(text="x" * (limits.MAX_REPLY_BYTES + 1)),
        ended(offered="ask"),
        ended(ended="no"),
        {"type": "status", "state": "dancing", "call_id": CALL_ID},
        {"type": "status", "state": "working"},
        {"type": "note", "text": ""},
        {"type": "note", "text": "x" * 5000},
        request(),  # a request sent to the CLI
    ],
)
def test_a_bad_event_is_malformed(body: object) -> None:
    with pytest.raises(MalformedFrame):
        decode_event(body)


def test_the_lines_are_written_as_before() -> None:
    """The wire form did not change when the lines stopped being attrs classes: every field,
    in order, ``continue`` renamed, tuples as lists (a service and a CLI of either version
    read each other)."""
    from agentcall.wire.local import encode_line

    assert encode_line(LocalCall(target="ken", message="hi", continue_=True)) == (
        b'{"type":"call","target":"ken","message":"hi","task":null,"continue":true,'
        b'"context_id":null,"queue":true,"timeout_ms":420000}'
    )
    failed = LocalEnded(EndKind.FAILED, "@acme/ken", CALL_ID, code="busy", offered=("ask",))
    assert json.loads(encode_line(failed)) == {
        "type": "ended",
        "kind": "failed",
        "address": "@acme/ken",
        "call_id": CALL_ID,
        "text": None,
        "task": None,
        "context_id": None,
        "job_id": None,
        "expires_at": None,
        "code": "busy",
        "detail": None,
        "offered": ["ask"],
        "message": None,
        "ended": False,
        "conversation_note": None,
    }
    assert codec.encode(failed) == encode_line(failed)


def test_a_line_cannot_be_changed_once_made() -> None:
    line = LocalStatus("working", CALL_ID)
    with pytest.raises(AttributeError):
        line.state = "ringing"
    assert line == LocalStatus("working", CALL_ID)


def test_made_lines_are_checked_like_decoded_ones() -> None:
    with pytest.raises(ValueError):
        LocalCall(target="ken", message="hi", continue_=True, context_id=CONTEXT_ID)
    with pytest.raises(ValueError):
        LocalEnded(EndKind.ANSWER, "@acme/ken", CALL_ID)  # an answer without text
    with pytest.raises(ValueError):
        LocalStatus("dancing", CALL_ID)
