"""Sealing and opening request and response envelopes, and every way a forgery is refused."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from cryptography.exceptions import InvalidTag
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcall import limits
from agentcall.crypto import envelope, keys, transcripts
from agentcall.crypto.keys import EncryptionKey
from agentcall.errors import (
    CallErrorCode,
    CryptoError,
    EnvelopeInvalid,
    RequestExpired,
    SignatureInvalid,
)
from agentcall.wire import codec
from agentcall.wire.frames import Direction, SealedEnvelope
from agentcall.wire.payloads import CallFailure, Reply, RequestPayload, ResponsePayload
from tests.hypothesis_profiles import examples
from tests.unit.crypto_helpers import (
    NOW,
    ORIGIN,
    Party,
    make_party,
    reseal_signed,
    route_of,
    seal_raw,
    sign_request,
    sign_response,
)

CALLER, CALLEE, STRANGER = "@acme/ann", "@acme/ken", "@acme/zed"
B64URL_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


@attrs.frozen
class World:
    caller: Party
    callee: Party
    stranger: Party


@pytest.fixture(scope="module")
def world() -> World:
    return World(make_party(CALLER), make_party(CALLEE), make_party(STRANGER))


def seal(
    w: World, message: str = "why is the build red?", **kw: Any
) -> tuple[SealedEnvelope, RequestPayload]:
    args: dict[str, Any] = {
        "sender": w.caller.identity_key,
        "sender_address": CALLER,
        "recipient_identity": w.callee.identity.record,
        "recipient_encryption": w.callee.enc_record,
        "relay_origin": ORIGIN,
        "message": message,
        "task": None,
        "context_id": None,
        "now": NOW,
    }
    args.update(kw)
    return envelope.seal_request(**args)


def open_req(w: World, env: SealedEnvelope, **kw: Any) -> RequestPayload:
    args: dict[str, Any] = {
        "my_key": w.callee.enc_key,
        "my_record": w.callee.enc_record,
        "relay_origin": ORIGIN,
        "expected_from": CALLER,
        "expected_to": CALLEE,
        "sender_identity_pub": w.caller.identity_pub,
        "now": NOW,
    }
    args.update(kw)
    return envelope.open_request(env, **args)


def answer(
    w: World, request: RequestPayload, outcome: Reply | CallFailure, **kw: Any
) -> SealedEnvelope:
    args: dict[str, Any] = {
        "responder": w.callee.identity_key,
        "request": request,
        "outcome": outcome,
        "caller_encryption": w.caller.enc_record,
        "now": NOW + 5,
    }
    args.update(kw)
    return envelope.seal_response(**args)


def open_resp(w: World, env: SealedEnvelope, request: RequestPayload, **kw: Any) -> ResponsePayload:
    args: dict[str, Any] = {
        "my_key": w.caller.enc_key,
        "my_record": w.caller.enc_record,
        "request": request,
        "responder_identity_pub": w.callee.identity_pub,
        "now": NOW + 6,
    }
    args.update(kw)
    return envelope.open_response(env, **args)


def refused(
    w: World, exc_type: type[CryptoError], match: str, call: Any, *args: Any, **kw: Any
) -> None:
    """``call`` raises exactly ``exc_type`` naming the check, and leaks no key material."""
    with pytest.raises(exc_type, match=match) as info:
        call(*args, **kw)
    text = str(info.value)
    for party in (w.caller, w.callee, w.stranger):
        for secret in party.secrets():
            assert secret not in text


# --- round trips ------------------------------------------------------------------------------


def test_request_round_trip(world: World) -> None:
    """The callee opens exactly the payload the caller sealed."""
    env, sent = seal(world, task="review", context_id="ctx_" + "A" * 22)
    got = open_req(world, env)
    assert got == sent
    assert (env.direction, env.from_, env.to) == (Direction.REQUEST, CALLER, CALLEE)
    assert (env.key_id, env.epoch) == (world.callee.enc_record.key_id, 1)
    assert got.expires_at - got.issued_at == limits.CALL_DEADLINE_S
    assert got.sender_key_id == world.caller.identity_key.key_id


def test_request_survives_the_wire(world: World) -> None:
    """An envelope re-decoded from its JSON frame still opens."""
    env, sent = seal(world)
    again = codec.decode(codec.encode(env), SealedEnvelope, max_bytes=limits.MAX_FRAME_BYTES)
    assert open_req(world, again) == sent


def test_request_ids_are_fresh_unless_given(world: World) -> None:
    """Each seal mints a new request id; a given one is used as is."""
    _, first = seal(world)
    _, second = seal(world)
    assert first.request_id != second.request_id
    _, fixed = seal(world, request_id="ab" * 16)
    assert fixed.request_id == "ab" * 16


@pytest.mark.parametrize(
    "outcome",
    [
        Reply(text="it's the cache", context_id="ctx_" + "B" * 22, task="review"),
        Reply(text=""),
        CallFailure(code=CallErrorCode.TASK_NOT_OFFERED, detail="no", offered=("a", "b-2")),
        CallFailure(code=CallErrorCode.BUSY),
    ],
)
def test_response_round_trip(world: World, outcome: Reply | CallFailure) -> None:
    """The caller opens exactly the outcome the callee sealed, bound to its request."""
    _, request = seal(world)
    got = open_resp(world, answer(world, request, outcome), request)
    assert got.outcome == outcome
    assert got.request_id == request.request_id
    assert got.request_transcript_hash == transcripts.request_transcript_hash(request)
    assert (got.from_, got.to) == (CALLEE, CALLER)


@settings(max_examples=examples(40), deadline=None)
@given(message=st.text(min_size=1).filter(lambda m: len(m.encode()) <= limits.MAX_MESSAGE_BYTES))
def test_any_message_round_trips(world: World, message: str) -> None:
    """Any well-formed Unicode message within the limit comes out unchanged."""
    env, _ = seal(world, message=message)
    assert open_req(world, env).message == message


@pytest.mark.parametrize(
    "message",
    [
        "\x01" * limits.MAX_MESSAGE_BYTES,  # worst case for JSON escaping
        "\U0001f600" * (limits.MAX_MESSAGE_BYTES // 4),  # four-byte characters
        '"\\' * (limits.MAX_MESSAGE_BYTES // 2),
    ],
)
def test_largest_messages_round_trip(world: World, message: str) -> None:
    """Messages at the size limit fit in an envelope and open unchanged."""
    env, _ = seal(world, message=message)
    assert open_req(world, env).message == message


def test_largest_reply_round_trips(world: World) -> None:
    """A reply at the size limit, all escaped characters, fits and opens."""
    _, request = seal(world)
    text = "\x1f" * limits.MAX_REPLY_BYTES
    got = open_resp(world, answer(world, request, Reply(text=text)), request)
    assert isinstance(got.outcome, Reply) and got.outcome.text == text


def test_oversize_message_is_refused_at_seal(world: World) -> None:
    """A message one byte over the limit is never sealed."""
    with pytest.raises(ValueError):
        seal(world, message="x" * (limits.MAX_MESSAGE_BYTES + 1))


# --- the header -------------------------------------------------------------------------------

HEADER_CHANGES: list[tuple[str, Any]] = [
    ("relay_origin", "evil.example"),
    ("from_", STRANGER),
    ("to", STRANGER),
    ("key_id", "0" * 32),
    ("epoch", 2),
]


@pytest.mark.parametrize(("field", "value"), HEADER_CHANGES)
def test_changed_header_field_fails_the_route_check(world: World, field: str, value: Any) -> None:
    """A header that differs from the expected route is refused before decryption."""
    env, _ = seal(world)
    refused(
        world,
        EnvelopeInvalid,
        f"header {field.rstrip('_')} does not match",
        open_req,
        world,
        attrs.evolve(env, **{field: value}),
    )


@pytest.mark.parametrize(("field", "value"), [*HEADER_CHANGES, ("direction", Direction.RESPONSE)])
def test_every_header_field_is_bound_into_the_ciphertext(
    world: World, field: str, value: Any
) -> None:
    """Decrypting with the HPKE info of any altered header fails."""
    env, _ = seal(world)
    sealed = keys.b64url_decode(env.ct)
    key = world.callee.enc_key.private_key
    envelope.SUITE.decrypt(sealed, key, info=envelope.hpke_info(env))
    with pytest.raises(InvalidTag):
        tampered = attrs.evolve(env, **{field: value})
        envelope.SUITE.decrypt(sealed, key, info=envelope.hpke_info(tampered))


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        ("relay_origin", "evil.example", {"relay_origin": "evil.example"}),
        ("from_", STRANGER, {"expected_from": STRANGER}),
        ("to", STRANGER, {"expected_to": STRANGER}),
    ],
)
def test_relabelled_envelope_fails_hpke_even_when_expected(
    world: World, field: str, value: Any, expect: dict[str, Any]
) -> None:
    """A relay that rewrites the route, and a receiver that expects the rewrite, still fail."""
    env, _ = seal(world)
    refused(
        world,
        EnvelopeInvalid,
        "HPKE open failed",
        open_req,
        world,
        attrs.evolve(env, **{field: value}),
        **expect,
    )


def test_response_presented_as_request_is_refused(world: World) -> None:
    """A response envelope is never opened as a request."""
    _, request = seal(world)
    env = answer(world, request, Reply(text="hi"))
    refused(world, EnvelopeInvalid, "direction is response, expected request", open_req, world, env)


def test_request_presented_as_response_is_refused(world: World) -> None:
    """A request envelope is never opened as a response."""
    env, request = seal(world)
    refused(
        world,
        EnvelopeInvalid,
        "direction is request, expected response",
        open_resp,
        world,
        env,
        request,
    )


def test_relabelled_direction_fails_hpke(world: World) -> None:
    """Flipping only the direction label of a request makes it unopenable as a response."""
    env, request = seal(world)
    # Address it back to the caller so only the direction (and HPKE) can catch it.
    fake = attrs.evolve(
        env,
        direction=Direction.RESPONSE,
        from_=CALLEE,
        to=CALLER,
        key_id=world.caller.enc_record.key_id,
    )
    refused(world, EnvelopeInvalid, "HPKE open failed", open_resp, world, fake, request)


# --- the ciphertext ---------------------------------------------------------------------------


@pytest.mark.parametrize("position", [0, 16, 31, 32, 33, 100, -17, -1])
def test_flipped_ciphertext_byte_is_refused(world: World, position: int) -> None:
    """Any flipped byte in enc, ciphertext or tag makes the envelope unopenable."""
    env, _ = seal(world)
    sealed = bytearray(keys.b64url_decode(env.ct))
    sealed[position] ^= 0x01
    forged = attrs.evolve(env, ct=keys.b64url_encode(bytes(sealed)))
    refused(world, EnvelopeInvalid, "HPKE open failed", open_req, world, forged)


def test_non_canonical_ciphertext_text_is_refused(world: World) -> None:
    """A second base64url spelling of a ciphertext is refused."""
    env, _ = seal(world)
    blob = keys.b64url_decode(env.ct)
    # A length of 2 (mod 3) leaves two unused bits in the last character; set one of them.
    blob = blob[: len(blob) - len(blob) % 3 - 1]
    text = keys.b64url_encode(blob)
    odd = text[:-1] + B64URL_ALPHABET[B64URL_ALPHABET.index(text[-1]) + 1]
    refused(world, EnvelopeInvalid, "base64url", open_req, world, attrs.evolve(env, ct=odd))


def test_truncated_ciphertext_is_refused(world: World) -> None:
    """A ciphertext shorter than enc + tag is refused by size."""
    env, _ = seal(world)
    short = keys.b64url_encode(keys.b64url_decode(env.ct)[:47])
    refused(world, EnvelopeInvalid, "impossible size", open_req, world, attrs.evolve(env, ct=short))


def test_oversize_request_ciphertext_is_refused(world: World) -> None:
    """A request may not carry a response-sized ciphertext."""
    env, _ = seal(world)
    big = keys.b64url_encode(b"\x00" * (limits.MAX_REQUEST_CIPHERTEXT_BYTES + 49))
    refused(world, EnvelopeInvalid, "impossible size", open_req, world, attrs.evolve(env, ct=big))


def test_wrong_recipient_key_is_refused(world: World) -> None:
    """Only the addressed key opens an envelope."""
    env, _ = seal(world)
    # Someone else trying with their own key: the route names another key.
    refused(
        world,
        EnvelopeInvalid,
        "header key_id",
        open_req,
        world,
        env,
        my_key=world.stranger.enc_key,
        my_record=world.stranger.enc_record,
    )
    # A forger who labels an envelope for the callee's key but encrypts to another one.
    _, request = seal(world)
    signed = sign_request(request, world.caller.identity_key)
    forged = seal_raw(route_of(env), codec.encode(signed), world.stranger.enc_record)
    refused(world, EnvelopeInvalid, "HPKE open failed", open_req, world, forged)


def test_mismatched_local_key_and_record_is_a_programming_error(world: World) -> None:
    """Passing a key that is not the record's key is a ValueError, not a peer error."""
    env, _ = seal(world)
    with pytest.raises(ValueError, match="my_key"):
        open_req(world, env, my_key=EncryptionKey.generate())


def test_plaintext_that_is_not_a_signed_request_is_refused(world: World) -> None:
    """Correctly sealed junk is refused at strict decoding."""
    env, request = seal(world)
    for junk in (b"{}", b"not json", codec.encode(request)):
        forged = seal_raw(route_of(env), junk, world.callee.enc_record)
        refused(world, EnvelopeInvalid, "malformed", open_req, world, forged)


# --- the signed payload -----------------------------------------------------------------------


def test_payload_signed_by_another_key_is_refused(world: World) -> None:
    """A payload naming the caller but signed by someone else does not verify."""
    env, request = seal(world)
    forged = reseal_signed(
        env, sign_request(request, world.stranger.identity_key), world.callee.enc_record
    )
    refused(world, SignatureInvalid, "does not verify", open_req, world, forged)


def test_payload_naming_another_sender_key_is_refused(world: World) -> None:
    """A payload whose sender_key_id is not the pinned key is refused before verifying."""
    env, request = seal(world)
    relabelled = attrs.evolve(request, sender_key_id=world.stranger.identity_key.key_id)
    forged = reseal_signed(
        env, sign_request(relabelled, world.stranger.identity_key), world.callee.enc_record
    )
    refused(world, SignatureInvalid, "sender_key_id", open_req, world, forged)


def test_payload_verified_against_the_pinned_key_only(world: World) -> None:
    """The same envelope fails when the receiver has pinned a different key for the sender."""
    env, _ = seal(world)
    refused(
        world,
        SignatureInvalid,
        "sender_key_id",
        open_req,
        world,
        env,
        sender_identity_pub=world.stranger.identity_pub,
    )


@pytest.mark.parametrize(
    "field", ["message", "task", "context_id", "issued_at", "expires_at", "request_id"]
)
def test_changed_payload_body_breaks_the_signature(world: World, field: str) -> None:
    """Every payload field is covered by the signature."""
    env, request = seal(world, task="review")
    values: dict[str, Any] = {
        "message": "rm -rf /",
        "task": "deploy",
        "context_id": "ctx_" + "C" * 22,
        "issued_at": request.issued_at - 1,
        "expires_at": request.expires_at - 1,
        "request_id": "cd" * 16,
    }
    changed = attrs.evolve(request, **{field: values[field]})
    original = sign_request(request, world.caller.identity_key)
    forged = reseal_signed(env, attrs.evolve(original, payload=changed), world.callee.enc_record)
    refused(world, SignatureInvalid, "does not verify", open_req, world, forged)


@pytest.mark.parametrize(
    ("field", "value", "name"),
    [
        ("relay_origin", "evil.example", "relay_origin"),
        ("from_", STRANGER, "from"),
        ("to", STRANGER, "to"),
        ("recipient_key_id", "0" * 32, "recipient_key_id"),
        ("recipient_epoch", 2, "recipient_epoch"),
    ],
)
def test_payload_header_must_equal_envelope_header(
    world: World, field: str, value: Any, name: str
) -> None:
    """A validly signed payload under an envelope with another route is refused."""
    env, request = seal(world)
    inner = attrs.evolve(request, **{field: value})
    forged = reseal_signed(
        env, sign_request(inner, world.caller.identity_key), world.callee.enc_record
    )
    refused(world, EnvelopeInvalid, f"payload {name} does not match", open_req, world, forged)


# --- time -------------------------------------------------------------------------------------


def test_request_valid_until_just_before_expiry(world: World) -> None:
    """A request opens up to, not at, its expires_at."""
    env, sent = seal(world)
    open_req(world, env, now=sent.expires_at - 0.001)
    refused(world, RequestExpired, "expired", open_req, world, env, now=sent.expires_at)


def test_future_dated_request_is_refused(world: World) -> None:
    """issued_at may be at most CLOCK_SKEW_S ahead of the receiver's clock."""
    env, _ = seal(world, now=NOW + limits.CLOCK_SKEW_S)
    open_req(world, env, now=NOW)
    env, _ = seal(world, now=NOW + limits.CLOCK_SKEW_S + 1)
    refused(world, RequestExpired, "future", open_req, world, env, now=NOW)


def test_seal_refuses_validity_beyond_the_deadline(world: World) -> None:
    """The sender cannot ask for more than a queued job's life, nor for nothing."""
    seal(world, validity_s=limits.MAX_ENVELOPE_VALIDITY_S)
    for bad in (limits.MAX_ENVELOPE_VALIDITY_S + 1, 0, 0.5, -5):
        with pytest.raises(ValueError, match="validity_s"):
            seal(world, validity_s=bad)


@pytest.mark.parametrize(
    ("issued", "expires", "match"),
    [
        (NOW, NOW + int(limits.MAX_ENVELOPE_VALIDITY_S) + 1, "longer than any envelope"),
        (NOW, NOW, "not after issued_at"),
        (NOW, NOW - 10, "not after issued_at"),
    ],
)
def test_forged_validity_windows_are_refused(
    world: World, issued: int, expires: int, match: str
) -> None:
    """A signed payload with a window that is too long or inverted is refused."""
    env, request = seal(world)
    inner = attrs.evolve(request, issued_at=issued, expires_at=expires)
    forged = reseal_signed(
        env, sign_request(inner, world.caller.identity_key), world.callee.enc_record
    )
    refused(world, RequestExpired, match, open_req, world, forged, now=NOW - 20)


def test_expired_response_is_refused(world: World) -> None:
    """A response is refused once its own window has passed."""
    _, request = seal(world)
    env = answer(world, request, Reply(text="late"))
    refused(
        world,
        RequestExpired,
        "expired",
        open_resp,
        world,
        env,
        request,
        now=NOW + 5 + limits.CALL_DEADLINE_S,
    )


# --- responses --------------------------------------------------------------------------------


def test_response_bound_to_another_request_is_refused(world: World) -> None:
    """An answer to one request cannot be passed off as the answer to another."""
    _, first = seal(world)
    _, second = seal(world)
    env = answer(world, first, Reply(text="for the first"))
    refused(world, EnvelopeInvalid, "request_id", open_resp, world, env, second)


def test_response_to_an_altered_request_is_refused(world: World) -> None:
    """Same request id, different request content: the transcript hash gives it away."""
    _, request = seal(world)
    env = answer(world, request, Reply(text="ok"))
    altered = attrs.evolve(request, message="something else")
    refused(world, EnvelopeInvalid, "request_transcript_hash", open_resp, world, env, altered)


def test_response_signed_by_another_key_is_refused(world: World) -> None:
    """Only the pinned responder key is accepted on a response."""
    _, request = seal(world)
    env = answer(world, request, Reply(text="ok"))
    refused(
        world,
        SignatureInvalid,
        "sender_key_id",
        open_resp,
        world,
        env,
        request,
        responder_identity_pub=world.stranger.identity_pub,
    )
    genuine = open_resp(world, env, request)
    forged = reseal_signed(
        env, sign_response(genuine, world.stranger.identity_key), world.caller.enc_record
    )
    refused(world, SignatureInvalid, "does not verify", open_resp, world, forged, request)


def test_changed_outcome_breaks_the_response_signature(world: World) -> None:
    """The outcome is covered by the signature, down to each offered task."""
    _, request = seal(world)
    outcome = CallFailure(code=CallErrorCode.TASK_NOT_OFFERED, offered=("a", "b"))
    env = answer(world, request, outcome)
    genuine = sign_response(open_resp(world, env, request), world.callee.identity_key)
    for other in (
        CallFailure(code=CallErrorCode.TASK_NOT_OFFERED, offered=("a",)),
        CallFailure(code=CallErrorCode.BLOCKED, offered=("a", "b")),
        Reply(text="a"),
    ):
        changed = attrs.evolve(genuine, payload=attrs.evolve(genuine.payload, outcome=other))
        forged = reseal_signed(env, changed, world.caller.enc_record)
        refused(world, SignatureInvalid, "does not verify", open_resp, world, forged, request)


def test_response_header_is_checked_against_the_request(world: World) -> None:
    """A response must come from the callee to the caller over the same relay."""
    _, request = seal(world)
    env = answer(world, request, Reply(text="ok"))
    refused(
        world,
        EnvelopeInvalid,
        "header from",
        open_resp,
        world,
        attrs.evolve(env, from_=STRANGER),
        request,
    )
    refused(
        world,
        EnvelopeInvalid,
        "header relay_origin",
        open_resp,
        world,
        attrs.evolve(env, relay_origin="evil.example"),
        request,
    )


def test_seal_response_refuses_a_record_of_someone_else(world: World) -> None:
    """The outcome is only ever sealed to the request's sender."""
    _, request = seal(world)
    with pytest.raises(ValueError, match="sender"):
        answer(world, request, Reply(text="ok"), caller_encryption=world.stranger.enc_record)


def test_seal_request_refuses_mismatched_records(world: World) -> None:
    """Identity and encryption records of different people, or another relay, are refused."""
    with pytest.raises(ValueError, match="different addresses"):
        seal(world, recipient_encryption=world.stranger.enc_record)
    with pytest.raises(ValueError, match="another relay"):
        seal(world, relay_origin="other.example")


# --- transcripts ------------------------------------------------------------------------------


def test_request_transcript_layout(world: World) -> None:
    """Domain, the base fields, task and context (null when absent), message last."""
    _, request = seal(world)
    items = transcripts.request_transcript(request)
    assert items[0] == "agentcall/request/v1"
    assert items[1:6] == [1, "request", ORIGIN, CALLER, CALLEE]
    assert items[-3:] == [None, None, request.message]
    assert len(items) == 15


def test_response_transcript_layout(world: World) -> None:
    """Replies and failures end in their own tagged, counted tails."""
    _, request = seal(world)
    reply = open_resp(world, answer(world, request, Reply(text="t")), request)
    items = transcripts.response_transcript(reply)
    assert items[0] == "agentcall/response/v1"
    assert items[12:] == [transcripts.request_transcript_hash(request), "reply", "t", None, None]
    failure = attrs.evolve(
        reply, outcome=CallFailure(code=CallErrorCode.TASK_UNKNOWN, offered=("x", "y"))
    )
    tail = transcripts.response_transcript(failure)[13:]
    assert tail == ["failure", "task_unknown", None, 2, "x", "y"]


def test_info_transcript_layout(world: World) -> None:
    """The HPKE info names every header field after its own domain."""
    env, _ = seal(world)
    assert transcripts.hpke_info_transcript(env) == [
        "agentcall/hpke-info/v1",
        1,
        "request",
        ORIGIN,
        CALLER,
        CALLEE,
        world.callee.enc_record.key_id,
        1,
    ]
