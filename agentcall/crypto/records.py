"""Published key records: making them, and verifying what a relay hands us.

The relay distributes records but is not trusted for them: every record is signed by the
identity key, and every encryption epoch links to the one before it.
"""

from __future__ import annotations

from agentcall import limits
from agentcall.errors import KeyRecordExpired, KeyRecordInvalid, SignatureInvalid
from agentcall.wire import canonical
from agentcall.wire.keyrecords import (
    SUITE_X25519,
    SUITES,
    EncryptionKeyRecord,
    IdentityRecord,
    SignedEncryptionKeyRecord,
    SignedIdentityRecord,
)

from . import keys, transcripts
from .keys import EncryptionKey, IdentityKey


def make_identity_record(
    identity_key: IdentityKey, relay_origin: str, address: str
) -> SignedIdentityRecord:
    record = IdentityRecord(
        v=1, relay_origin=relay_origin, address=address, identity_pub=identity_key.public_b64
    )
    signature = identity_key.sign(canonical.encode(transcripts.identity_transcript(record)))
    return SignedIdentityRecord(record=record, signature=signature)


def verify_identity_record(signed: SignedIdentityRecord) -> None:
    """Check the self-signature; raises :class:`KeyRecordInvalid`."""
    record = signed.record
    try:
        keys.decode_public_key(record.identity_pub, what="identity_pub")
    except ValueError as exc:
        raise KeyRecordInvalid(f"identity record: {exc}") from None
    try:
        keys.verify_signature(
            record.identity_pub,
            canonical.encode(transcripts.identity_transcript(record)),
            signed.signature,
        )
    except SignatureInvalid:
        raise KeyRecordInvalid("identity record: self-signature does not verify") from None


def make_encryption_record(
    identity_key: IdentityKey,
    enc_key: EncryptionKey,
    relay_origin: str,
    address: str,
    *,
    epoch: int,
    not_before: int,
    not_after: int,
    previous: SignedEncryptionKeyRecord | None,
) -> SignedEncryptionKeyRecord:
    """Sign the record for one epoch; ``previous`` is the epoch before (None at epoch 1).

    The integers are keyword-only: three of them side by side are too easy to swap.
    """
    if not 0 < not_after - not_before <= limits.MAX_KEY_VALIDITY_S:
        raise ValueError("validity window must be positive and at most 30 days")
    if previous is None:
        if epoch != 1:
            raise ValueError("only epoch 1 has no previous record")
        prev = None
    else:
        if epoch != previous.record.epoch + 1:
            raise ValueError("epoch must be exactly one above the previous record's")
        if (previous.record.relay_origin, previous.record.address) != (relay_origin, address):
            raise ValueError("the previous record belongs to another address or relay")
        prev = transcripts.record_link(previous)
    record = EncryptionKeyRecord(
        v=1,
        relay_origin=relay_origin,
        address=address,
        key_id=enc_key.key_id,
        suite=SUITE_X25519,
        pub=enc_key.public_b64,
        epoch=epoch,
        not_before=not_before,
        not_after=not_after,
        prev=prev,
    )
    signature = identity_key.sign(canonical.encode(transcripts.encryption_key_transcript(record)))
    return SignedEncryptionKeyRecord(record=record, signature=signature)


def verify_encryption_record(
    signed: SignedEncryptionKeyRecord, identity_pub_b64: str, *, now: float | None = None
) -> None:
    """Check suite, key id, the identity signature and (given ``now``) the validity window.

    Raises :class:`KeyRecordInvalid` naming the failed check; past ``not_after``, its subclass
    :class:`KeyRecordExpired`.
    """
    record = signed.record
    # The wire validators refuse these too; repeated so this check stands on its own.
    if record.suite not in SUITES:
        raise KeyRecordInvalid("encryption record: unknown suite")
    if not record.not_before < record.not_after <= record.not_before + limits.MAX_KEY_VALIDITY_S:
        raise KeyRecordInvalid("encryption record: validity window is not 1 s .. 30 days")
    try:
        public_raw = keys.decode_public_key(record.pub, what="pub")
    except ValueError as exc:
        raise KeyRecordInvalid(f"encryption record: {exc}") from None
    if record.key_id != keys.key_id(public_raw):
        raise KeyRecordInvalid("encryption record: key_id does not match pub")
    try:
        keys.verify_signature(
            identity_pub_b64,
            canonical.encode(transcripts.encryption_key_transcript(record)),
            signed.signature,
        )
    except SignatureInvalid:
        raise KeyRecordInvalid(
            "encryption record: signature does not verify against the identity key"
        ) from None
    if now is not None:
        if now < record.not_before:
            raise KeyRecordInvalid("encryption record: not valid yet (not_before)")
        if now >= record.not_after:
            # Its own type: an expired record means an owner who has been away, not forgery.
            raise KeyRecordExpired("encryption record: expired (not_after)", record.not_after)


def verify_chain(previous: SignedEncryptionKeyRecord, nxt: SignedEncryptionKeyRecord) -> None:
    """Check that ``nxt`` is the epoch directly after ``previous`` and links to it."""
    before, after = previous.record, nxt.record
    if (before.relay_origin, before.address) != (after.relay_origin, after.address):
        raise KeyRecordInvalid("encryption record chain: address or relay differs")
    if after.epoch != before.epoch + 1:
        raise KeyRecordInvalid("encryption record chain: epoch is not the next one")
    if after.prev != transcripts.record_link(previous):
        raise KeyRecordInvalid("encryption record chain: prev does not link the previous epoch")
