"""WebSocket frames and sealed payloads: round trips, wire names, receiver sets, size budgets."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcall import limits
from agentcall.errors import CallErrorCode, MalformedFrame
from agentcall.wire import codec, frames, payloads
from tests.hypothesis_profiles import examples
from tests.unit import wire_strategies as ws

FRAME_CLASSES = sorted(frames.FRAME_TYPES.values(), key=lambda cls: cls.type)
RECEIVER_SETS = {
    "FROM_CALLER": frames.FROM_CALLER,
    "FROM_LISTENER": frames.FROM_LISTENER,
    "TO_CALLER": frames.TO_CALLER,
    "TO_LISTENER": frames.TO_LISTENER,
}
PAYLOAD_MAX = limits.MAX_RESPONSE_CIPHERTEXT_BYTES


def _keys(tree: Any) -> Iterator[str]:
    """Every object key anywhere in a parsed JSON tree."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield key
            yield from _keys(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from _keys(item)


def _attrs_classes(module: Any) -> set[type[Any]]:
    return {
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and attrs.has(obj) and obj.__module__ == module.__name__
    }


def test_every_frame_and_payload_class_has_a_strategy() -> None:
    """A frame or payload class added without a strategy would escape the round trip tests."""
    assert set(ws.FRAME_STRATEGIES) == set(frames.FRAME_TYPES.values())
    assert set(ws.FRAME_STRATEGIES) | {frames.SealedEnvelope} == _attrs_classes(frames)
    assert set(ws.PAYLOAD_STRATEGIES) | {payloads.Reply, payloads.CallFailure} == _attrs_classes(
        payloads
    )


def test_frame_types_are_keyed_by_their_wire_type() -> None:
    """FRAME_TYPES maps each ``type`` string to the class that declares it."""
    assert all(frames.FRAME_TYPES[cls.type] is cls for cls in FRAME_CLASSES)
    assert len(FRAME_CLASSES) == 22


def test_every_frame_has_some_receiver() -> None:
    """A frame that no receiver set accepts could never be delivered."""
    received = {cls for group in RECEIVER_SETS.values() for cls in group}
    assert received == set(frames.FRAME_TYPES.values())


# pytest-twisted re-wraps a hypothesis test once per parametrized case and then fails, so each
# property below draws one value of every class per example instead of being parametrized.
@settings(max_examples=examples(30), deadline=None)
@given(data=st.data())
def test_frame_round_trip(data: st.DataObject) -> None:
    """decode_frame(encode(frame)) gives back an equal frame of the same class, for every type."""
    for cls in FRAME_CLASSES:
        frame = data.draw(ws.FRAME_STRATEGIES[cls], label=cls.type)
        wire = codec.encode(frame)
        decoded = codec.decode_frame(wire)
        assert type(decoded) is cls
        assert decoded == frame
        assert codec.decode_frame(wire, accept=(cls,)) == frame
        assert codec.encode(decoded) == wire


@settings(max_examples=examples(100), deadline=None)
@given(frame=ws.any_frame)
def test_frame_wire_form(frame: Any) -> None:
    """A frame is one compact JSON object led by its ``type``, with wire names, not Python's."""
    wire = codec.encode(frame)
    tree = json.loads(wire)
    assert next(iter(tree)) == "type"
    assert tree["type"] == type(frame).type
    assert not any(key.endswith("_") for key in _keys(tree))
    assert wire == json.dumps(tree, ensure_ascii=False, separators=(",", ":")).encode()


@settings(max_examples=examples(30), deadline=None)
@given(frame=ws.FRAME_STRATEGIES[frames.IncomingCall])
def test_incoming_call_carries_from_under_its_wire_name(frame: frames.IncomingCall) -> None:
    """``from_`` travels as ``from``, at the frame and inside its envelope."""
    tree = json.loads(codec.encode(frame))
    assert tree["from"] == frame.from_
    assert tree["envelope"]["from"] == frame.envelope.from_


PAYLOAD_CASES: list[tuple[type[Any], Any]] = [
    (payloads.RequestPayload, ws.request_payloads),
    (payloads.ResponsePayload, ws.response_payloads(ws.replies)),
    (payloads.ResponsePayload, ws.response_payloads(ws.failures)),
    (payloads.SignedRequest, ws.PAYLOAD_STRATEGIES[payloads.SignedRequest]),
    (payloads.SignedResponse, ws.PAYLOAD_STRATEGIES[payloads.SignedResponse]),
]


@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_payload_round_trip(data: st.DataObject) -> None:
    """Sealed payloads (both outcome kinds) survive encode → decode, with wire names only."""
    for cls, strategy in PAYLOAD_CASES:
        value = data.draw(strategy, label=cls.__name__)
        wire = codec.encode(value)
        assert codec.decode(wire, cls, max_bytes=PAYLOAD_MAX) == value
        assert not any(key.endswith("_") for key in _keys(json.loads(wire)))


@settings(max_examples=examples(30), deadline=None)
@given(signed=ws.PAYLOAD_STRATEGIES[payloads.SignedResponse])
def test_signed_response_nests_the_same_payload_encoding(signed: payloads.SignedResponse) -> None:
    """The payload inside a SignedResponse is encoded exactly as a standalone ResponsePayload."""
    tree = json.loads(codec.encode(signed))
    assert tree["payload"] == json.loads(codec.encode(signed.payload))
    assert codec.decode(json.dumps(tree["payload"]), payloads.ResponsePayload) == signed.payload


@settings(max_examples=examples(40), deadline=None)
@given(response=ws.any_response_payload)
def test_outcome_is_tagged_by_kind(response: payloads.ResponsePayload) -> None:
    """The outcome object names its kind, which selects Reply or CallFailure on decode."""
    outcome = json.loads(codec.encode(response))["outcome"]
    assert outcome["kind"] == type(response.outcome).kind


def test_outcome_kind_cannot_be_swapped() -> None:
    """A reply body labelled as a failure (and the reverse) is refused."""
    reply = payloads.Reply(text="done")
    response = payloads.ResponsePayload(
        v=1,
        direction=frames.Direction.RESPONSE,
        relay_origin="relay.example.com",
        from_="@acme/ken",
        to="@acme/ann",
        request_id="ab" * 16,
        sender_key_id="cd" * 16,
        recipient_key_id="ef" * 16,
        recipient_epoch=1,
        issued_at=1_700_000_000,
        expires_at=1_700_000_360,
        request_transcript_hash="12" * 32,
        outcome=reply,
    )
    tree = json.loads(codec.encode(response))
    assert codec.decode(json.dumps(tree), payloads.ResponsePayload) == response
    for kind in ("failure", "Reply", "", None):
        tree["outcome"]["kind"] = kind
        with pytest.raises(MalformedFrame):
            codec.decode(json.dumps(tree), payloads.ResponsePayload)
    del tree["outcome"]["kind"]
    with pytest.raises(MalformedFrame):
        codec.decode(json.dumps(tree), payloads.ResponsePayload)


# --- size budgets: the worst legal content fits the limits the decoders enforce ----------------

# Control characters are the worst case for JSON: one UTF-8 byte becomes six (\u0000).
_WORST_ORIGIN = "r" * 253 + ":65535"
_WORST_ADDRESS = "@" + "o" * 20 + "/" + "h" * 31
_CALL_ID = "0b7e3f1e-2c4d-4a5b-9c6d-7e8f90a1b2c3"


def _worst_header() -> dict[str, Any]:
    return {
        "v": 1,
        "relay_origin": _WORST_ORIGIN,
        "from_": _WORST_ADDRESS,
        "to": _WORST_ADDRESS,
        "request_id": "f" * 32,
        "sender_key_id": "f" * 32,
        "recipient_key_id": "f" * 32,
        "recipient_epoch": 2**31,
        "issued_at": 2**40,
        "expires_at": 2**40,
    }


def _sealed_ct(plaintext: bytes) -> str:
    """The ct field for this plaintext: base64url of enc (32) || ciphertext || tag (16)."""
    return "A" * math.ceil((32 + len(plaintext) + 16) * 4 / 3)


def _envelope(direction: frames.Direction, ct: str) -> frames.SealedEnvelope:
    return frames.SealedEnvelope(
        v=1,
        direction=direction,
        relay_origin=_WORST_ORIGIN,
        from_=_WORST_ADDRESS,
        to=_WORST_ADDRESS,
        key_id="f" * 32,
        epoch=2**31,
        ct=ct,
    )


def test_worst_request_fits_the_request_budgets() -> None:
    """A 64,000-byte message of control characters fits the ciphertext and frame caps."""
    request = payloads.SignedRequest(
        payload=payloads.RequestPayload(
            direction=frames.Direction.REQUEST,
            task="t" * 64,
            context_id="ctx_" + "x" * 22,
            message="\x01" * limits.MAX_MESSAGE_BYTES,
            **_worst_header(),
        ),
        signature="s" * 86,
    )
    plaintext = codec.encode(request)
    assert len(plaintext) > 6 * limits.MAX_MESSAGE_BYTES
    assert len(plaintext) + 48 <= limits.MAX_REQUEST_CIPHERTEXT_BYTES
    envelope = _envelope(frames.Direction.REQUEST, _sealed_ct(plaintext))
    incoming = frames.IncomingCall(
        call_id=_CALL_ID,
        from_="h" * 31,
        envelope=envelope,
        correlation_id="f" * 32,
        groups=tuple("g" * 64 for _ in range(50)),
    )
    for frame in (frames.CallRequest(envelope=envelope, correlation_id="f" * 32), incoming):
        wire = codec.encode(frame)
        assert len(wire) <= limits.MAX_REQUEST_FRAME_BYTES
        assert codec.decode_frame(wire, max_bytes=limits.MAX_REQUEST_FRAME_BYTES) == frame


def test_worst_response_fits_the_response_budgets() -> None:
    """A 256,000-byte reply of control characters fits the ciphertext and frame caps."""
    response = payloads.SignedResponse(
        payload=payloads.ResponsePayload(
            direction=frames.Direction.RESPONSE,
            request_transcript_hash="f" * 64,
            outcome=payloads.Reply(
                text="\x01" * limits.MAX_REPLY_BYTES, context_id="ctx_" + "x" * 22, task="t" * 64
            ),
            **_worst_header(),
        ),
        signature="s" * 86,
    )
    plaintext = codec.encode(response)
    assert len(plaintext) + 48 <= limits.MAX_RESPONSE_CIPHERTEXT_BYTES
    assert codec.decode(plaintext, payloads.SignedResponse, max_bytes=PAYLOAD_MAX) == response
    frame = frames.CallOutcome(
        call_id=_CALL_ID,
        terminal=frames.Terminal.COMPLETED,
        envelope=_envelope(frames.Direction.RESPONSE, _sealed_ct(plaintext)),
    )
    wire = codec.encode(frame)
    assert len(wire) <= limits.MAX_RESPONSE_FRAME_BYTES <= limits.MAX_FRAME_BYTES
    assert codec.decode_frame(wire) == frame


def test_control_frames_fit_the_control_budget() -> None:
    """The largest status, error and cancel frames stay under MAX_CONTROL_FRAME_BYTES."""
    largest = [
        frames.CallError(
            code=CallErrorCode.PROTOCOL_ERROR,
            call_id=_CALL_ID,
            detail="\x01" * limits.MAX_DETAIL_CHARS,
        ),
        frames.CallStatus(call_id=_CALL_ID, state=frames.CallState.WORKING),
        frames.CallNotCancelled(
            call_id=_CALL_ID, reason=frames.NotCancelledReason.ALREADY_TERMINAL
        ),
        frames.Ready(role=frames.Role.LISTEN, address=_WORST_ADDRESS, relay_origin=_WORST_ORIGIN),
    ]
    for frame in largest:
        wire = codec.encode(frame)
        assert len(wire) <= limits.MAX_CONTROL_FRAME_BYTES
        assert codec.decode_frame(wire, max_bytes=limits.MAX_CONTROL_FRAME_BYTES) == frame


@given(
    call_id=ws.call_ids,
    state=st.sampled_from(frames.CallState),
    correlation_id=st.none() | ws.correlation_ids,
)
def test_call_status_is_written_by_hand_as_the_generic_encoder_writes_it(
    call_id: str, state: frames.CallState, correlation_id: str | None
) -> None:
    """The relay sends three call_status frames a call; they skip the converter and json.dumps
    (a hand-written encoder) and come out byte for byte the same."""
    status = frames.CallStatus(call_id=call_id, state=state, correlation_id=correlation_id)
    assert getattr(frames.CallStatus, codec.HAND_WRITTEN) is not None
    assert codec.encode(status) == codec.to_json(status)
    assert codec.decode_frame(codec.encode(status)) == status


@given(call=ws.FRAME_STRATEGIES[frames.IncomingCall])
def test_incoming_call_is_written_by_hand_as_the_generic_encoder_writes_it(
    call: frames.IncomingCall,
) -> None:
    """The relay's largest frame on a request's path skips the converter and json.dumps for
    everything but the caller's key records, and comes out byte for byte the same."""
    assert getattr(frames.IncomingCall, codec.HAND_WRITTEN) is not None
    assert codec.encode(call) == codec.to_json(call)
    assert codec.decode_frame(codec.encode(call)) == call


# --- jobs_held: what a mailbox listener holds -------------------------------------------------

_JOB = "5e3f8a1b-2c4d-4e6f-8a0b-1c2d3e4f5a6b"
_READY = {"type": "ready", "role": "listen", "address": "@acme/ken", "relay_origin": "r.example"}


def test_a_ready_without_jobs_held_reads_and_writes_as_before() -> None:
    """A relay that predates jobs_held sends a ready without it: it decodes as not asking; a
    ready that does not ask is written byte for byte as before, one that asks says so."""
    frame = codec.decode_frame(json.dumps(_READY).encode(), frames.TO_LISTENER)
    assert isinstance(frame, frames.Ready) and frame.jobs_held is False
    assert b"jobs_held" not in codec.encode(frame)
    asking = attrs.evolve(frame, jobs_held=True)
    assert b'"jobs_held":true' in codec.encode(asking)
    assert codec.decode_frame(codec.encode(asking)) == asking


@pytest.mark.parametrize("value", ["true", 1, 0, None, [], {}])
def test_a_ready_with_a_jobs_held_that_is_not_a_boolean_is_malformed(value: Any) -> None:
    with pytest.raises(MalformedFrame):
        codec.decode_frame(json.dumps({**_READY, "jobs_held": value}).encode())


@pytest.mark.parametrize("count", [0, 1, limits.MAILBOX_MAX_JOBS_HELD])
def test_jobs_held_lists_up_to_the_cap_of_job_ids(count: int) -> None:
    job_ids = [f"{_JOB[:-6]}{n:06x}" for n in range(count)]
    wire = json.dumps({"type": "jobs_held", "job_ids": job_ids}).encode()
    frame = codec.decode_frame(wire, frames.FROM_LISTENER, max_bytes=limits.MAX_FRAME_BYTES)
    assert frame == frames.JobsHeld(job_ids=tuple(job_ids))


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"job_ids": None},
        {"job_ids": _JOB},
        {"job_ids": {_JOB: True}},
        {"job_ids": [5]},
        {"job_ids": [None]},
        {"job_ids": ["not-a-job"]},
        {"job_ids": [_JOB.upper()]},
        {"job_ids": [_JOB + "\n"]},
        {"job_ids": ["00000000-0000-0000-0000-000000000000"]},
        {"job_ids": [_JOB] * (limits.MAILBOX_MAX_JOBS_HELD + 1)},
        {"job_ids": [], "extra": 1},
    ],
    ids=[
        "missing",
        "null",
        "a string",
        "an object",
        "a number",
        "a null id",
        "not a job id",
        "uppercase",
        "trailing newline",
        "not version 4",
        "one too many",
        "unknown field",
    ],
)
def test_a_malformed_jobs_held_is_refused(body: dict[str, Any]) -> None:
    wire = json.dumps({"type": "jobs_held", **body}).encode()
    with pytest.raises(MalformedFrame):
        codec.decode_frame(wire, max_bytes=limits.MAX_FRAME_BYTES)


def test_jobs_held_goes_from_a_listener_to_the_relays_job_desk_only() -> None:
    assert frames.JobsHeld in frames.FROM_LISTENER
    assert frames.JobsHeld in frames.JOB_FRAMES_FROM_LISTENER
    assert frames.JobsHeld not in frames.TO_LISTENER + frames.FROM_CALLER + frames.TO_CALLER
    # The largest report still fits what a relay reads from a listener.
    most = frames.JobsHeld(job_ids=(_JOB,) * limits.MAILBOX_MAX_JOBS_HELD)
    assert len(codec.encode(most)) <= limits.MAX_RESPONSE_FRAME_BYTES
