"""Sealing and opening envelopes: HPKE to the recipient, Ed25519 by the sender.

The plaintext is the JSON of a signed payload; the signature covers the payload's canonical
transcript; the clear routing header is bound through HPKE ``info``. Opening runs its checks in
a fixed order and stops at the first failure, raising the most specific :class:`CryptoError`.
Time is always passed in: nothing here reads a clock.
"""

from __future__ import annotations

import attrs
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke

from agentcall import ids, limits
from agentcall.errors import (
    EnvelopeInvalid,
    KeyRecordInvalid,
    MalformedFrame,
    RequestExpired,
    SignatureInvalid,
)
from agentcall.wire import canonical, codec
from agentcall.wire.frames import Direction, SealedEnvelope
from agentcall.wire.keyrecords import SUITE_X25519, EncryptionKeyRecord, IdentityRecord
from agentcall.wire.payloads import (
    CallFailure,
    Reply,
    RequestPayload,
    ResponsePayload,
    SignedRequest,
    SignedResponse,
)

from . import keys, transcripts
from .keys import EncryptionKey, IdentityKey

SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
ENC_BYTES = 32  # X25519 encapsulated key, first in the HPKE output
TAG_BYTES = 16  # Poly1305
# Largest plaintext (the signed payload's JSON) each direction may carry.
MAX_PLAINTEXT_BYTES = {
    Direction.REQUEST: limits.MAX_REQUEST_CIPHERTEXT_BYTES,
    Direction.RESPONSE: limits.MAX_RESPONSE_CIPHERTEXT_BYTES,
}


@attrs.frozen
class Route:
    """An envelope header without its ciphertext: what is sealed to, or expected on open."""

    direction: Direction
    relay_origin: str
    from_: str
    to: str
    key_id: str
    epoch: int
    v: int = 1


def hpke_info(header: transcripts.RouteHeader) -> bytes:
    """The HPKE ``info`` that binds a routing header into the ciphertext."""
    return canonical.encode(transcripts.hpke_info_transcript(header))


# --- requests ---------------------------------------------------------------------------------


def seal_request(
    *,
    sender: IdentityKey,
    sender_address: str,
    recipient_identity: IdentityRecord,
    recipient_encryption: EncryptionKeyRecord,
    relay_origin: str,
    message: str,
    task: str | None,
    context_id: str | None,
    now: float,
    validity_s: float = limits.CALL_DEADLINE_S,
    request_id: str | None = None,
) -> tuple[SealedEnvelope, RequestPayload]:
    """Sign and seal a request to the recipient's current (already pinned) encryption key."""
    if recipient_identity.address != recipient_encryption.address:
        raise ValueError("identity and encryption records name different addresses")
    if not relay_origin == recipient_identity.relay_origin == recipient_encryption.relay_origin:
        raise ValueError("the recipient's records belong to another relay")
    lifetime = int(validity_s)
    if not 0 < lifetime <= limits.MAX_ENVELOPE_VALIDITY_S:
        raise ValueError("validity_s must be within 1 .. MAX_ENVELOPE_VALIDITY_S seconds")
    issued_at = int(now)
    payload = RequestPayload(
        v=1,
        direction=Direction.REQUEST,
        relay_origin=relay_origin,
        from_=sender_address,
        to=recipient_identity.address,
        request_id=request_id if request_id is not None else ids.mint_request_id(),
        sender_key_id=sender.key_id,
        recipient_key_id=recipient_encryption.key_id,
        recipient_epoch=recipient_encryption.epoch,
        issued_at=issued_at,
        expires_at=issued_at + lifetime,
        task=task,
        context_id=context_id,
        message=message,
    )
    signature = sender.sign(canonical.encode(transcripts.request_transcript(payload)))
    plaintext = codec.encode(SignedRequest(payload=payload, signature=signature))
    return _seal(_route_of(payload), plaintext, recipient_encryption), payload


def open_request(
    envelope: SealedEnvelope,
    *,
    my_key: EncryptionKey,
    my_record: EncryptionKeyRecord,
    relay_origin: str,
    expected_from: str,
    expected_to: str,
    sender_identity_pub: str,
    now: float,
) -> RequestPayload:
    """Open a request addressed to us and verify it against the sender's pinned identity."""
    expected = Route(
        direction=Direction.REQUEST,
        relay_origin=relay_origin,
        from_=expected_from,
        to=expected_to,
        key_id=my_record.key_id,
        epoch=my_record.epoch,
    )
    plaintext = _open(envelope, expected, my_key)
    try:
        signed = codec.decode(
            plaintext, SignedRequest, max_bytes=MAX_PLAINTEXT_BYTES[Direction.REQUEST]
        )
    except MalformedFrame:
        raise EnvelopeInvalid("signed request payload is malformed") from None
    payload = signed.payload
    _check_payload_header(payload, envelope)
    _check_sender(
        payload.sender_key_id,
        sender_identity_pub,
        canonical.encode(transcripts.request_transcript(payload)),
        signed.signature,
    )
    _check_times(payload.issued_at, payload.expires_at, now)
    return payload


# --- responses --------------------------------------------------------------------------------


def seal_response(
    *,
    responder: IdentityKey,
    request: RequestPayload,
    outcome: Reply | CallFailure,
    caller_encryption: EncryptionKeyRecord,
    now: float,
    validity_s: float = limits.CALL_DEADLINE_S,
) -> SealedEnvelope:
    """Sign and seal the outcome of ``request`` back to the caller's (pinned) encryption key.

    A live call's answer is read at once; a mailbox job's may be fetched days later, so it is
    sealed with ``validity_s`` up to :data:`~agentcall.limits.MAX_ENVELOPE_VALIDITY_S`.
    """
    lifetime = int(validity_s)
    if not 0 < lifetime <= limits.MAX_ENVELOPE_VALIDITY_S:
        raise ValueError("validity_s must be within 1 .. MAX_ENVELOPE_VALIDITY_S seconds")
    if (caller_encryption.relay_origin, caller_encryption.address) != (
        request.relay_origin,
        request.from_,
    ):
        raise ValueError("the caller's encryption record does not belong to the request's sender")
    issued_at = int(now)
    payload = ResponsePayload(
        v=1,
        direction=Direction.RESPONSE,
        relay_origin=request.relay_origin,
        from_=request.to,
        to=request.from_,
        request_id=request.request_id,
        sender_key_id=responder.key_id,
        recipient_key_id=caller_encryption.key_id,
        recipient_epoch=caller_encryption.epoch,
        issued_at=issued_at,
        expires_at=issued_at + lifetime,
        request_transcript_hash=transcripts.request_transcript_hash(request),
        outcome=outcome,
    )
    signature = responder.sign(canonical.encode(transcripts.response_transcript(payload)))
    plaintext = codec.encode(SignedResponse(payload=payload, signature=signature))
    return _seal(_route_of(payload), plaintext, caller_encryption)


def open_response(
    envelope: SealedEnvelope,
    *,
    my_key: EncryptionKey,
    my_record: EncryptionKeyRecord,
    request: RequestPayload,
    responder_identity_pub: str,
    now: float,
) -> ResponsePayload:
    """Open the answer to ``request`` (which we sent) and verify the responder and the binding."""
    expected = Route(
        direction=Direction.RESPONSE,
        relay_origin=request.relay_origin,
        from_=request.to,
        to=request.from_,
        key_id=my_record.key_id,
        epoch=my_record.epoch,
    )
    plaintext = _open(envelope, expected, my_key)
    try:
        signed = codec.decode(
            plaintext, SignedResponse, max_bytes=MAX_PLAINTEXT_BYTES[Direction.RESPONSE]
        )
    except MalformedFrame:
        raise EnvelopeInvalid("signed response payload is malformed") from None
    payload = signed.payload
    _check_payload_header(payload, envelope)
    _check_sender(
        payload.sender_key_id,
        responder_identity_pub,
        canonical.encode(transcripts.response_transcript(payload)),
        signed.signature,
    )
    _check_times(payload.issued_at, payload.expires_at, now)
    if payload.request_id != request.request_id:
        raise EnvelopeInvalid("response request_id does not match the request")
    if payload.request_transcript_hash != transcripts.request_transcript_hash(request):
        raise EnvelopeInvalid("response request_transcript_hash does not match the request")
    return payload


# --- shared steps -----------------------------------------------------------------------------


def _route_of(payload: RequestPayload | ResponsePayload) -> Route:
    return Route(
        direction=payload.direction,
        relay_origin=payload.relay_origin,
        from_=payload.from_,
        to=payload.to,
        key_id=payload.recipient_key_id,
        epoch=payload.recipient_epoch,
        v=payload.v,
    )


def _seal(route: Route, plaintext: bytes, recipient: EncryptionKeyRecord) -> SealedEnvelope:
    if recipient.suite != SUITE_X25519:
        raise KeyRecordInvalid("recipient encryption record names an unsupported suite")
    try:
        public_key = keys.x25519_public_key(recipient.pub)
    except ValueError as exc:
        raise KeyRecordInvalid(f"recipient encryption record: {exc}") from None
    if keys.key_id(public_key.public_bytes_raw()) != recipient.key_id:
        raise KeyRecordInvalid("recipient encryption record: key_id does not match pub")
    if len(plaintext) > MAX_PLAINTEXT_BYTES[route.direction]:
        raise ValueError("signed payload is larger than the envelope limit")
    sealed = SUITE.encrypt(plaintext, public_key, info=hpke_info(route))
    return SealedEnvelope(
        v=route.v,
        direction=route.direction,
        relay_origin=route.relay_origin,
        from_=route.from_,
        to=route.to,
        key_id=route.key_id,
        epoch=route.epoch,
        ct=keys.b64url_encode(sealed),
    )


def _open(envelope: SealedEnvelope, expected: Route, my_key: EncryptionKey) -> bytes:
    """Direction, route, then HPKE; returns the plaintext."""
    if my_key.key_id != expected.key_id:
        raise ValueError("my_key is not the key my_record describes")
    if envelope.direction != expected.direction:
        raise EnvelopeInvalid(
            f"envelope direction is {envelope.direction.value}, expected {expected.direction.value}"
        )
    for name in ("v", "relay_origin", "from_", "to", "key_id", "epoch"):
        if getattr(envelope, name) != getattr(expected, name):
            raise EnvelopeInvalid(
                f"envelope header {name.rstrip('_')} does not match the expected route"
            )
    try:
        sealed = keys.b64url_decode(envelope.ct)
    except ValueError:
        raise EnvelopeInvalid("envelope ct is not canonical base64url") from None
    if (
        not ENC_BYTES + TAG_BYTES
        <= len(sealed)
        <= (ENC_BYTES + TAG_BYTES + MAX_PLAINTEXT_BYTES[expected.direction])
    ):
        raise EnvelopeInvalid("envelope ct has an impossible size")
    try:
        return SUITE.decrypt(sealed, my_key.private_key, info=hpke_info(envelope))
    except (InvalidTag, ValueError):
        raise EnvelopeInvalid(
            "HPKE open failed: wrong recipient key, or the header or ciphertext was altered"
        ) from None


def _check_payload_header(
    payload: RequestPayload | ResponsePayload, envelope: SealedEnvelope
) -> None:
    pairs = (
        ("v", payload.v, envelope.v),
        ("direction", payload.direction, envelope.direction),
        ("relay_origin", payload.relay_origin, envelope.relay_origin),
        ("from", payload.from_, envelope.from_),
        ("to", payload.to, envelope.to),
        ("recipient_key_id", payload.recipient_key_id, envelope.key_id),
        ("recipient_epoch", payload.recipient_epoch, envelope.epoch),
    )
    for name, inside, outside in pairs:
        if inside != outside:
            raise EnvelopeInvalid(f"payload {name} does not match the envelope header")


def _check_sender(
    sender_key_id: str, pinned_identity_pub: str, transcript: bytes, signature: str
) -> None:
    try:
        pinned_raw = keys.decode_public_key(pinned_identity_pub, what="pinned identity key")
    except ValueError as exc:
        raise SignatureInvalid(str(exc)) from None
    if sender_key_id != keys.key_id(pinned_raw):
        raise SignatureInvalid("payload sender_key_id is not the pinned identity key")
    keys.verify_signature(pinned_identity_pub, transcript, signature)


def _check_times(issued_at: int, expires_at: int, now: float) -> None:
    if expires_at <= issued_at:
        raise RequestExpired("validity: expires_at is not after issued_at")
    if expires_at - issued_at > limits.MAX_ENVELOPE_VALIDITY_S:
        raise RequestExpired("validity: window is longer than any envelope may live")
    if now >= expires_at:
        raise RequestExpired("validity: expired (now >= expires_at)")
    if issued_at > now + limits.CLOCK_SKEW_S:
        raise RequestExpired("validity: issued_at is further in the future than the clock skew")
