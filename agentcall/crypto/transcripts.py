"""Canonical transcripts: the exact item lists that are signed, hashed or bound through HPKE.

Each list starts with its own domain string, so a signature made for one purpose can never be
presented as another. The bytes themselves are always built by :mod:`agentcall.wire.canonical`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from agentcall.wire import canonical
from agentcall.wire.canonical import Item
from agentcall.wire.frames import Direction
from agentcall.wire.keyrecords import (
    EncryptionKeyRecord,
    IdentityRecord,
    RecoveryStatement,
    SignedEncryptionKeyRecord,
)

if TYPE_CHECKING:
    # The HTTP bodies are built only where a card is signed or checked: a call does neither.
    from agentcall.wire.http import CardRecord
from agentcall.wire.payloads import CallFailure, Reply, RequestPayload, ResponsePayload

IDENTITY_DOMAIN = "agentcall/identity/v1"
RECOVERY_KEY_TAG = "recovery-key"
RECOVERY_DOMAIN = "agentcall/recovery/v1"
ENCRYPTION_KEY_DOMAIN = "agentcall/encryption-key/v1"
HPKE_INFO_DOMAIN = "agentcall/hpke-info/v1"
REQUEST_DOMAIN = "agentcall/request/v1"
RESPONSE_DOMAIN = "agentcall/response/v1"
CARD_DOMAIN = "agentcall/card/v1"


class RouteHeader(Protocol):
    """The clear routing header of an envelope (a :class:`SealedEnvelope` is one)."""

    @property
    def v(self) -> int: ...
    @property
    def direction(self) -> Direction: ...
    @property
    def relay_origin(self) -> str: ...
    @property
    def from_(self) -> str: ...
    @property
    def to(self) -> str: ...
    @property
    def key_id(self) -> str: ...
    @property
    def epoch(self) -> int: ...


def identity_transcript(record: IdentityRecord) -> list[Item]:
    items: list[Item] = [
        IDENTITY_DOMAIN,
        record.v,
        record.relay_origin,
        record.address,
        record.identity_pub,
    ]
    if record.recovery_pub is not None:
        # Appended, so a record without one signs exactly the bytes it always signed.
        items += [RECOVERY_KEY_TAG, record.recovery_pub, record.recovery_issued_at]
    return items


def recovery_transcript(statement: RecoveryStatement) -> list[Item]:
    return [
        RECOVERY_DOMAIN,
        statement.v,
        statement.relay_origin,
        statement.address,
        statement.recovery_pub,
        statement.new_identity_pub,
        statement.at,
    ]


def encryption_key_transcript(record: EncryptionKeyRecord) -> list[Item]:
    return [
        ENCRYPTION_KEY_DOMAIN,
        record.v,
        record.relay_origin,
        record.address,
        record.key_id,
        record.suite,
        record.pub,
        record.epoch,
        record.not_before,
        record.not_after,
        record.prev,
    ]


def card_transcript(record: CardRecord) -> list[Item]:
    """The card's signed items; the task count first, so no task list can pass for another."""
    items: list[Item] = [
        CARD_DOMAIN,
        record.v,
        record.relay_origin,
        record.address,
        record.identity_pub,
        record.issued_at,
        None if record.agent_kind is None else str(record.agent_kind),
        record.omitted,
        len(record.tasks),
    ]
    for task in record.tasks:
        items += [task.id, task.name, task.summary]
    return items


def hpke_info_transcript(header: RouteHeader) -> list[Item]:
    return [
        HPKE_INFO_DOMAIN,
        header.v,
        Direction(header.direction).value,
        header.relay_origin,
        header.from_,
        header.to,
        header.key_id,
        header.epoch,
    ]


def _base(payload: RequestPayload | ResponsePayload) -> list[Item]:
    return [
        payload.v,
        payload.direction.value,
        payload.relay_origin,
        payload.from_,
        payload.to,
        payload.request_id,
        payload.sender_key_id,
        payload.recipient_key_id,
        payload.recipient_epoch,
        payload.issued_at,
        payload.expires_at,
    ]


def request_transcript(payload: RequestPayload) -> list[Item]:
    # The message goes last: it is the only field whose size the sender chooses freely.
    return [
        REQUEST_DOMAIN,
        *_base(payload),
        payload.task,
        payload.context_id,
        payload.message,
    ]


def response_transcript(payload: ResponsePayload) -> list[Item]:
    items: list[Item] = [RESPONSE_DOMAIN, *_base(payload), payload.request_transcript_hash]
    outcome = payload.outcome
    if isinstance(outcome, Reply):
        items += [Reply.kind, outcome.text, outcome.context_id, outcome.task]
    elif isinstance(outcome, CallFailure):
        # The count makes the variable-length tail unambiguous.
        items += [
            CallFailure.kind,
            outcome.code.value,
            outcome.detail,
            len(outcome.offered),
            *outcome.offered,
        ]
    else:
        raise TypeError(f"unknown outcome {type(outcome).__name__}")
    return items


def request_transcript_hash(payload: RequestPayload) -> str:
    """Hex SHA-256 of the request transcript: what a response binds itself to."""
    return canonical.hexdigest(request_transcript(payload))


def record_link(signed: SignedEncryptionKeyRecord) -> str:
    """The ``prev`` value the next epoch's record must carry (32 hex)."""
    return canonical.digest(encryption_key_transcript(signed.record))[:16].hex()
