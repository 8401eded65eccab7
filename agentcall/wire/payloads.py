"""What travels inside a sealed envelope: signed request and response payloads.

The relay never sees these. Their canonical transcripts (the bytes that are signed) are built in
:mod:`agentcall.crypto.transcripts`, from exactly these fields.
"""

from __future__ import annotations

import enum
from typing import ClassVar

import attrs

from agentcall import limits
from agentcall.errors import PEER_FAILURE_CODES, CallErrorCode
from agentcall.wire import fields as f
from agentcall.wire.frames import Direction


def _peer_code(_inst: object, attribute: attrs.Attribute[CallErrorCode], value: object) -> None:
    if value not in PEER_FAILURE_CODES:
        raise ValueError(f"{attribute.name}: not a peer failure code")


def _direction_is(expected: Direction) -> f.Validator:
    return attrs.validators.in_({expected})


class DeliveryMode(enum.StrEnum):
    SYNC = "sync"
    DURABLE = "durable"


@attrs.frozen
class RequestPayload:
    v: int = attrs.field(validator=f.exactly(1))
    direction: Direction = attrs.field(
        converter=Direction, validator=_direction_is(Direction.REQUEST)
    )
    relay_origin: str = attrs.field(validator=f.relay_origin)
    from_: str = attrs.field(validator=f.address)
    to: str = attrs.field(validator=f.address)
    request_id: str = attrs.field(validator=f.hex32)
    sender_key_id: str = attrs.field(validator=f.hex32)  # key id of the sender's identity key
    recipient_key_id: str = attrs.field(validator=f.hex32)
    recipient_epoch: int = attrs.field(validator=f.epoch_number)
    issued_at: int = attrs.field(validator=f.timestamp)
    expires_at: int = attrs.field(validator=f.timestamp)
    task: str | None = attrs.field(validator=f.optional(f.task_id))
    context_id: str | None = attrs.field(validator=f.optional(f.context_id))
    message: str = attrs.field(validator=f.utf8_bytes(limits.MAX_MESSAGE_BYTES, min_bytes=1))


@attrs.frozen
class Reply:
    kind: ClassVar[str] = "reply"
    text: str = attrs.field(validator=f.utf8_bytes(limits.MAX_REPLY_BYTES))
    context_id: str | None = attrs.field(default=None, validator=f.optional(f.context_id))
    task: str | None = attrs.field(default=None, validator=f.optional(f.task_id))


@attrs.frozen
class CallFailure:
    """A call that ended without an answer, as the caller is told (kind ``failure`` on the wire)."""

    kind: ClassVar[str] = "failure"
    code: CallErrorCode = attrs.field(converter=CallErrorCode, validator=_peer_code)
    detail: str | None = attrs.field(
        default=None, validator=f.optional(f.text(limits.MAX_DETAIL_CHARS))
    )
    offered: tuple[str, ...] = attrs.field(
        default=(), validator=f.each(f.task_id, max_items=limits.MAX_OFFERED_TASKS)
    )


Outcome = Reply | CallFailure


@attrs.frozen
class ResponsePayload:
    v: int = attrs.field(validator=f.exactly(1))
    direction: Direction = attrs.field(
        converter=Direction, validator=_direction_is(Direction.RESPONSE)
    )
    relay_origin: str = attrs.field(validator=f.relay_origin)
    from_: str = attrs.field(validator=f.address)
    to: str = attrs.field(validator=f.address)
    request_id: str = attrs.field(validator=f.hex32)
    sender_key_id: str = attrs.field(validator=f.hex32)
    recipient_key_id: str = attrs.field(validator=f.hex32)
    recipient_epoch: int = attrs.field(validator=f.epoch_number)
    issued_at: int = attrs.field(validator=f.timestamp)
    expires_at: int = attrs.field(validator=f.timestamp)
    request_transcript_hash: str = attrs.field(validator=f.hex64)
    outcome: Outcome


@attrs.frozen
class SignedRequest:
    """The plaintext sealed into a request envelope."""

    payload: RequestPayload
    signature: str = attrs.field(validator=f.b64url(86, min_chars=86))  # Ed25519, 64 bytes


@attrs.frozen
class SignedResponse:
    payload: ResponsePayload
    signature: str = attrs.field(validator=f.b64url(86, min_chars=86))
