"""Identity and encryption key records: signing, verification, validity and the epoch chain."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from agentcall import limits
from agentcall.crypto import records, transcripts
from agentcall.crypto.keys import EncryptionKey, IdentityKey
from agentcall.errors import KeyRecordExpired, KeyRecordInvalid
from agentcall.wire import canonical, codec
from agentcall.wire.http import SignedEncryptionKeyRecord, SignedIdentityRecord
from tests.unit.crypto_helpers import DAY, NOW, ORIGIN, make_party, rotate

# --- identity records -------------------------------------------------------------------------


def test_identity_record_verifies_after_a_wire_round_trip() -> None:
    """A self-signed identity record survives JSON encoding and still verifies."""
    party = make_party("@acme/ken")
    wire = codec.decode(codec.encode(party.identity), SignedIdentityRecord)
    records.verify_identity_record(wire)
    assert wire.record.identity_pub == party.identity_key.public_b64


@pytest.mark.parametrize(
    "change",
    [
        {"address": "@acme/bob"},
        {"relay_origin": "other.example"},
        {"identity_pub": IdentityKey.generate().public_b64},
    ],
)
def test_identity_record_refuses_any_changed_field(change: dict[str, Any]) -> None:
    """Every field is covered by the self-signature."""
    signed = make_party("@acme/ken").identity
    forged = attrs.evolve(signed, record=attrs.evolve(signed.record, **change))
    with pytest.raises(KeyRecordInvalid, match="self-signature"):
        records.verify_identity_record(forged)


def test_identity_record_refuses_non_canonical_key_text() -> None:
    """An identity_pub with non-zero unused bits is refused before any signature check."""
    signed = make_party("@acme/ken").identity
    pub = signed.record.identity_pub
    last = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".index(pub[-1])
    odd = pub[:-1] + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last ^ 1]
    forged = attrs.evolve(signed, record=attrs.evolve(signed.record, identity_pub=odd))
    with pytest.raises(KeyRecordInvalid, match="identity_pub"):
        records.verify_identity_record(forged)


def test_identity_transcript_layout() -> None:
    """The identity transcript is the domain then every field in order."""
    record = make_party("@acme/ken").identity.record
    assert transcripts.identity_transcript(record) == [
        "agentcall/identity/v1",
        1,
        ORIGIN,
        "@acme/ken",
        record.identity_pub,
    ]


# --- encryption records -----------------------------------------------------------------------


def test_encryption_record_verifies_against_its_identity() -> None:
    """A fresh epoch-1 record verifies, within its window, and only for its own identity."""
    party, stranger = make_party("@acme/ken"), make_party("@acme/bob")
    records.verify_encryption_record(party.encryption, party.identity_pub, now=NOW)
    records.verify_encryption_record(party.encryption, party.identity_pub)
    assert party.enc_record.prev is None
    assert party.enc_record.key_id == party.enc_key.key_id
    with pytest.raises(KeyRecordInvalid, match="signature"):
        records.verify_encryption_record(party.encryption, stranger.identity_pub, now=NOW)


def test_encryption_record_survives_a_wire_round_trip() -> None:
    """JSON encoding does not disturb the signed fields."""
    party = make_party("@acme/ken")
    wire = codec.decode(codec.encode(party.encryption), SignedEncryptionKeyRecord)
    records.verify_encryption_record(wire, party.identity_pub, now=NOW)


@pytest.mark.parametrize(
    "change",
    [
        {"address": "@acme/bob"},
        {"relay_origin": "other.example"},
        {"epoch": 2, "prev": "0" * 32},
        {"not_before": NOW - DAY + 60},
        {"not_after": NOW + 28 * DAY},
    ],
)
def test_encryption_record_refuses_any_changed_field(change: dict[str, Any]) -> None:
    """Every field is covered by the identity signature."""
    party = make_party("@acme/ken")
    forged = attrs.evolve(party.encryption, record=attrs.evolve(party.enc_record, **change))
    with pytest.raises(KeyRecordInvalid, match="signature"):
        records.verify_encryption_record(forged, party.identity_pub, now=NOW)


def test_encryption_record_refuses_a_swapped_public_key() -> None:
    """A pub that does not hash to key_id is refused (before the signature is looked at)."""
    party = make_party("@acme/ken")
    swapped = attrs.evolve(
        party.encryption,
        record=attrs.evolve(party.enc_record, pub=EncryptionKey.generate().public_b64),
    )
    with pytest.raises(KeyRecordInvalid, match="key_id does not match pub"):
        records.verify_encryption_record(swapped, party.identity_pub, now=NOW)


def test_encryption_record_window_is_half_open() -> None:
    """Valid from not_before inclusive to not_after exclusive."""
    party = make_party("@acme/ken", not_before=NOW, not_after=NOW + DAY)
    records.verify_encryption_record(party.encryption, party.identity_pub, now=NOW)
    records.verify_encryption_record(party.encryption, party.identity_pub, now=NOW + DAY - 0.5)
    with pytest.raises(KeyRecordInvalid, match="not valid yet"):
        records.verify_encryption_record(party.encryption, party.identity_pub, now=NOW - 0.5)
    with pytest.raises(KeyRecordInvalid, match="expired"):
        records.verify_encryption_record(party.encryption, party.identity_pub, now=NOW + DAY)


def test_expiry_is_its_own_error_and_says_when() -> None:
    """Expiry is told apart from every other rejection (it means an absent owner, not a
    forgery), and carries not_after so the caller can say when; not-yet-valid is not expiry."""
    party = make_party("@acme/ken", not_before=NOW, not_after=NOW + DAY)
    with pytest.raises(KeyRecordExpired) as expired:
        records.verify_encryption_record(party.encryption, party.identity_pub, now=NOW + 40 * DAY)
    assert expired.value.not_after == NOW + DAY
    with pytest.raises(KeyRecordInvalid) as early:
        records.verify_encryption_record(party.encryption, party.identity_pub, now=NOW - 1)
    assert not isinstance(early.value, KeyRecordExpired)


def test_make_encryption_record_refuses_long_or_empty_windows() -> None:
    """The validity window is positive and at most 30 days."""
    ident, enc = IdentityKey.generate(), EncryptionKey.generate()
    make = records.make_encryption_record
    make(
        ident,
        enc,
        ORIGIN,
        "@acme/ken",
        epoch=1,
        not_before=NOW,
        not_after=NOW + limits.MAX_KEY_VALIDITY_S,
        previous=None,
    )
    for not_after in (NOW + limits.MAX_KEY_VALIDITY_S + 1, NOW, NOW - 1):
        with pytest.raises(ValueError):
            make(
                ident,
                enc,
                ORIGIN,
                "@acme/ken",
                epoch=1,
                not_before=NOW,
                not_after=not_after,
                previous=None,
            )


def test_make_encryption_record_enforces_the_chain() -> None:
    """Epoch 1 has no previous; every later epoch is previous + 1 for the same address."""
    party = make_party("@acme/ken")
    enc = EncryptionKey.generate()

    def make(epoch: int, previous: SignedEncryptionKeyRecord | None, address: str) -> None:
        records.make_encryption_record(
            party.identity_key,
            enc,
            ORIGIN,
            address,
            epoch=epoch,
            not_before=NOW,
            not_after=NOW + DAY,
            previous=previous,
        )

    make(2, party.encryption, "@acme/ken")
    with pytest.raises(ValueError, match="epoch 1"):
        make(2, None, "@acme/ken")
    with pytest.raises(ValueError, match="one above"):
        make(3, party.encryption, "@acme/ken")
    with pytest.raises(ValueError, match="one above"):
        make(1, party.encryption, "@acme/ken")
    with pytest.raises(ValueError, match="another address"):
        make(2, party.encryption, "@acme/bob")


def test_rotation_links_to_the_previous_epoch() -> None:
    """prev is the first 16 bytes of SHA-256 of the previous record's transcript."""
    first = make_party("@acme/ken")
    second = rotate(first)
    digest = canonical.digest(transcripts.encryption_key_transcript(first.enc_record))
    assert second.enc_record.prev == digest[:16].hex() == transcripts.record_link(first.encryption)
    assert second.enc_record.epoch == 2
    records.verify_encryption_record(second.encryption, first.identity_pub, now=NOW)
    records.verify_chain(first.encryption, second.encryption)


def test_verify_chain_refuses_skips_forks_and_strangers() -> None:
    """Only the direct successor of the very same record chains."""
    first = make_party("@acme/ken")
    second = rotate(first)
    third = rotate(second)
    with pytest.raises(KeyRecordInvalid, match="epoch"):
        records.verify_chain(first.encryption, third.encryption)
    with pytest.raises(KeyRecordInvalid, match="epoch"):
        records.verify_chain(second.encryption, first.encryption)
    fork = rotate(make_party("@acme/ken"))  # epoch 2 of another epoch-1 record
    with pytest.raises(KeyRecordInvalid, match="prev"):
        records.verify_chain(first.encryption, fork.encryption)
    stranger = rotate(make_party("@acme/bob"))
    with pytest.raises(KeyRecordInvalid, match="address"):
        records.verify_chain(first.encryption, stranger.encryption)


def test_encryption_transcript_layout() -> None:
    """The record transcript is the domain then every field, prev last (null at epoch 1)."""
    record = make_party("@acme/ken").enc_record
    items = transcripts.encryption_key_transcript(record)
    assert items[0] == "agentcall/encryption-key/v1"
    assert items[1:] == [
        1,
        ORIGIN,
        "@acme/ken",
        record.key_id,
        record.suite,
        record.pub,
        1,
        record.not_before,
        record.not_after,
        None,
    ]
