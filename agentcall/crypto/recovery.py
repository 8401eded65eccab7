"""Recovering an address on a new machine: the recovery code, its statement, and the walk.

``agentcall recovery issue`` makes an Ed25519 *recovery key*, shows its seed once as a code,
and re-signs the identity record with the key's public half in it; nothing keeps the seed.
Whoever later holds the code signs a :class:`RecoveryStatement` moving the address to a new
identity key. A peer who pinned the old identity key believes the move because the recovery
key reached it through a record the old identity key signed (:func:`walk`); anyone else gets
the ordinary changed-identity error. Pure: no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence

from agentcall.errors import KeyRecordInvalid, SignatureInvalid
from agentcall.wire import canonical
from agentcall.wire.keyrecords import (
    IdentityRecord,
    RecoveryLink,
    RecoveryStatement,
    SignedIdentityRecord,
    SignedRecoveryStatement,
)

from . import keys, records, transcripts
from .keys import IdentityKey

# "AgentCall recovery, format 1": the code says what it is and which format reads it.
CODE_PREFIX = "ACR1"
_SEED_BYTES = 32
_CHECK_BYTES = 2
_GROUP = 5


class RecoveryCodeInvalid(ValueError):
    """A recovery code that is mistyped, truncated or not one at all."""


def encode_code(seed: bytes) -> str:
    """The code a person writes down: the seed and a short checksum, base32 in groups."""
    if len(seed) != _SEED_BYTES:
        raise ValueError("a recovery key seed is 32 bytes")
    check = hashlib.sha256(seed).digest()[:_CHECK_BYTES]
    text = base64.b32encode(seed + check).decode("ascii").rstrip("=")
    groups = [text[i : i + _GROUP] for i in range(0, len(text), _GROUP)]
    return "-".join([CODE_PREFIX, *groups])


def decode_code(code: str) -> bytes:
    """The seed in ``code``; spaces, dashes and case do not matter. A typo is caught by the
    checksum (:class:`RecoveryCodeInvalid`, which never repeats the code)."""
    text = "".join(code.split()).replace("-", "").upper()
    if not text.startswith(CODE_PREFIX):
        raise RecoveryCodeInvalid("not an AgentCall recovery code (it starts with ACR1-)")
    body = text[len(CODE_PREFIX) :]
    try:
        raw = base64.b32decode(body + "=" * (-len(body) % 8))
    except ValueError:
        raise RecoveryCodeInvalid("the recovery code has characters it cannot hold") from None
    if len(raw) != _SEED_BYTES + _CHECK_BYTES:
        raise RecoveryCodeInvalid("the recovery code is too short or too long")
    seed, check = raw[:_SEED_BYTES], raw[_SEED_BYTES:]
    if hashlib.sha256(seed).digest()[:_CHECK_BYTES] != check:
        raise RecoveryCodeInvalid("the recovery code has a typo (its checksum does not match)")
    return seed


def with_recovery_key(
    identity_key: IdentityKey, current: IdentityRecord, recovery_pub: str, issued_at: int
) -> SignedIdentityRecord:
    """The identity record again, naming a (new) recovery key, signed by the identity key."""
    if current.identity_pub != identity_key.public_b64:
        raise ValueError("the record names another identity key")
    record = IdentityRecord(
        v=current.v,
        relay_origin=current.relay_origin,
        address=current.address,
        identity_pub=current.identity_pub,
        recovery_pub=recovery_pub,
        recovery_issued_at=issued_at,
    )
    signature = identity_key.sign(canonical.encode(transcripts.identity_transcript(record)))
    return SignedIdentityRecord(record=record, signature=signature)


def make_statement(
    recovery_key: IdentityKey, relay_origin: str, address: str, new_identity_pub: str, at: int
) -> SignedRecoveryStatement:
    statement = RecoveryStatement(
        v=1,
        relay_origin=relay_origin,
        address=address,
        recovery_pub=recovery_key.public_b64,
        new_identity_pub=new_identity_pub,
        at=at,
    )
    signature = recovery_key.sign(canonical.encode(transcripts.recovery_transcript(statement)))
    return SignedRecoveryStatement(statement=statement, signature=signature)


def verify_statement(
    signed: SignedRecoveryStatement, previous: SignedIdentityRecord
) -> RecoveryStatement:
    """The statement, once it is shown to be signed by the recovery key that ``previous`` (a
    verified identity record of the same address and relay) names; else
    :class:`KeyRecordInvalid`."""
    statement, old = signed.statement, previous.record
    records.verify_identity_record(previous)
    if old.recovery_pub is None:
        raise KeyRecordInvalid("recovery: the earlier identity named no recovery key")
    if (statement.relay_origin, statement.address) != (old.relay_origin, old.address):
        raise KeyRecordInvalid("recovery: the statement names another address or relay")
    if statement.recovery_pub != old.recovery_pub:
        raise KeyRecordInvalid("recovery: signed by a key the earlier identity did not name")
    try:
        keys.verify_signature(
            statement.recovery_pub,
            canonical.encode(transcripts.recovery_transcript(statement)),
            signed.signature,
        )
    except SignatureInvalid:
        raise KeyRecordInvalid("recovery: the statement's signature does not verify") from None
    return statement


def walk(
    pinned_identity_pub: str, served: SignedIdentityRecord, links: Sequence[RecoveryLink]
) -> int:
    """When the address moved from the pinned identity key to the served one by recoveries the
    pinned key vouched for, the time of the last of them; else :class:`KeyRecordInvalid`.

    Links are oldest first; a peer who pinned after an early recovery starts further along.
    Every step is checked: the earlier identity's own record names the recovery key, and that
    key signed the move to the next identity key.
    """
    current, moved_at = pinned_identity_pub, None
    for link in links:
        if link.previous.record.identity_pub != current:
            continue
        statement = verify_statement(link.statement, link.previous)
        if (statement.relay_origin, statement.address) != (
            served.record.relay_origin,
            served.record.address,
        ):
            raise KeyRecordInvalid("recovery: a link names another address or relay")
        current, moved_at = statement.new_identity_pub, statement.at
    if moved_at is None or current != served.record.identity_pub:
        raise KeyRecordInvalid("recovery: no chain from the pinned identity to the served one")
    return moved_at
