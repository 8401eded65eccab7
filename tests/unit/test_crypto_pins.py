"""Trust on first use: what gets pinned, and every way a served record is refused."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
from zope.interface.verify import verifyObject

from agentcall.crypto import keys, records
from agentcall.crypto.pins import IPinStorage, MemoryPinStorage, Pin, PinBook, PinState
from agentcall.errors import CryptoError, EpochRollback, IdentityChanged, KeyRecordInvalid
from agentcall.wire.keyrecords import SignedEncryptionKeyRecord, SignedIdentityRecord
from tests.unit.crypto_helpers import DAY, NOW, ORIGIN, Party, make_party, rotate

KEN = "@acme/ken"


@pytest.fixture
def storage() -> MemoryPinStorage:
    return MemoryPinStorage()


@pytest.fixture
def book(storage: MemoryPinStorage) -> PinBook:
    return PinBook(storage)


def pin(book: PinBook, party: Party, now: float = NOW, address: str = KEN) -> Pin:
    return book.check_and_pin(address, party.identity, party.encryption, now)


def test_memory_storage_provides_the_interface(storage: MemoryPinStorage) -> None:
    """The in-memory store is a complete IPinStorage."""
    assert verifyObject(IPinStorage, storage)


def test_first_contact_pins_the_served_identity(book: PinBook, storage: MemoryPinStorage) -> None:
    """An unseen peer with valid records is pinned with its fingerprint and epoch."""
    ken = make_party(KEN)
    got = pin(book, ken, now=NOW + 0.7)
    assert got == Pin(
        relay_origin=ORIGIN,
        address=KEN,
        identity_pub=ken.identity_pub,
        fingerprint=keys.fingerprint(ken.identity.record),
        first_seen_at=NOW,
        highest_epoch=1,
    )
    assert storage.get(ORIGIN, KEN) == got


def test_later_contacts_match_and_raise_the_epoch(book: PinBook) -> None:
    """The same identity is accepted again, and a newer epoch is remembered."""
    ken = make_party(KEN)
    first = pin(book, ken)
    assert pin(book, ken, now=NOW + 60) == first
    newer = pin(book, rotate(ken), now=NOW + 120)
    assert newer.highest_epoch == 2
    assert newer.first_seen_at == first.first_seen_at


def test_served_identity_for_another_address_is_refused(book: PinBook) -> None:
    """The relay cannot answer a lookup for ken with bob's records."""
    bob = make_party("@acme/bob")
    with pytest.raises(KeyRecordInvalid, match="identity record names another address"):
        pin(book, bob, address=KEN)


def test_encryption_record_for_another_address_is_refused(book: PinBook) -> None:
    """Ken's identity with bob's (validly signed by bob) encryption record is refused."""
    ken, bob = make_party(KEN), make_party("@acme/bob")
    with pytest.raises(KeyRecordInvalid, match="encryption record names another address"):
        book.check_and_pin(KEN, ken.identity, bob.encryption, NOW)


def test_records_naming_another_relay_are_refused(book: PinBook) -> None:
    """Records must name the relay they were fetched from."""
    ken = make_party(KEN)
    with pytest.raises(KeyRecordInvalid, match="another relay"):
        book.check_and_pin(KEN, ken.identity, ken.encryption, NOW, relay_origin="other.example")
    elsewhere = make_party(KEN, origin="other.example")
    with pytest.raises(KeyRecordInvalid, match="different relays"):
        book.check_and_pin(KEN, ken.identity, elsewhere.encryption, NOW)


def test_bad_self_signature_is_refused(book: PinBook) -> None:
    """An identity record whose signature does not verify is never pinned."""
    ken, other = make_party(KEN), make_party(KEN)
    forged = attrs.evolve(ken.identity, signature=other.identity.signature)
    with pytest.raises(KeyRecordInvalid, match="self-signature"):
        book.check_and_pin(KEN, forged, ken.encryption, NOW)


def test_encryption_record_by_another_identity_is_refused_at_first_contact(
    book: PinBook, storage: MemoryPinStorage
) -> None:
    """A relay cannot pair ken's identity with an encryption key it controls."""
    ken, relay_made = make_party(KEN), make_party(KEN)
    with pytest.raises(KeyRecordInvalid, match="signature"):
        book.check_and_pin(KEN, ken.identity, relay_made.encryption, NOW)
    assert storage.get(ORIGIN, KEN) is None


def test_encryption_record_outside_its_window_is_refused(book: PinBook) -> None:
    """An expired or not-yet-valid key is not used."""
    ken = make_party(KEN, not_before=NOW, not_after=NOW + DAY)
    with pytest.raises(KeyRecordInvalid, match="expired"):
        pin(book, ken, now=NOW + DAY)
    with pytest.raises(KeyRecordInvalid, match="not valid yet"):
        pin(book, ken, now=NOW - 1)


def test_epoch_rollback_is_refused(book: PinBook, storage: MemoryPinStorage) -> None:
    """After seeing epoch 2, a still-valid epoch 1 record is refused."""
    ken = make_party(KEN)
    pin(book, rotate(ken))
    with pytest.raises(EpochRollback, match="below the highest seen"):
        pin(book, ken, now=NOW + 1)
    got = storage.get(ORIGIN, KEN)
    assert got is not None and got.highest_epoch == 2


def test_a_replayed_expired_epoch_is_a_rollback_not_an_expiry(book: PinBook) -> None:
    """A relay replaying an old epoch that has since expired is reported as the rollback it
    is, not as a callee who has been offline too long."""
    ken = make_party(KEN)
    pin(book, rotate(ken))
    with pytest.raises(EpochRollback, match="below the highest seen"):
        pin(book, ken, now=NOW + 60 * DAY)


def test_changed_identity_is_a_hard_error(book: PinBook, storage: MemoryPinStorage) -> None:
    """A new identity key (e.g. a reinstall, back at epoch 1) is refused, with instructions."""
    old, new = make_party(KEN), make_party(KEN)
    first = pin(book, rotate(old))
    with pytest.raises(IdentityChanged) as info:
        pin(book, new, now=NOW + 1)
    message = str(info.value)
    assert f"agentcall trust --reset {KEN}" in message
    assert "out of band" in message
    assert keys.fingerprint(new.identity.record) in message
    for secret in old.secrets() + new.secrets():
        assert secret not in message
    assert storage.get(ORIGIN, KEN) == first


def test_changed_identity_stays_refused_until_reset(book: PinBook) -> None:
    """Refusal repeats on every contact; after reset the new key is pinned afresh."""
    old, new = make_party(KEN), make_party(KEN)
    pin(book, old)
    for _ in range(2):
        with pytest.raises(IdentityChanged):
            pin(book, new)
    assert book.reset(ORIGIN, KEN) is True
    assert book.reset(ORIGIN, KEN) is False
    assert pin(book, new).identity_pub == new.identity_pub


@pytest.mark.parametrize(
    ("swapped", "rolled_back", "refusal"),
    [
        (True, True, IdentityChanged),
        (True, False, IdentityChanged),
        (False, True, EpochRollback),
        (False, False, None),
    ],
    ids=["swapped and rolled back", "swapped", "rolled back", "neither"],
)
def test_the_pin_is_compared_before_the_epoch(
    book: PinBook,
    storage: MemoryPinStorage,
    swapped: bool,
    rolled_back: bool,
    refusal: type[CryptoError] | None,
) -> None:
    """A relay that swaps the identity key and serves an old epoch is reported as the identity
    change, with both fingerprints; the rollback message is for the pinned identity only."""
    ken, relays = make_party(KEN), make_party(KEN)
    pinned = pin(book, rotate(ken))  # epoch 2
    party = relays if swapped else ken
    served = party if rolled_back else rotate(rotate(party))  # epoch 1, or 3
    if refusal is None:
        assert pin(book, served, now=NOW + 1).highest_epoch == 3
        return
    with pytest.raises(refusal) as info:
        pin(book, served, now=NOW + 1)
    message = str(info.value)
    if swapped:
        assert pinned.fingerprint in message
        assert keys.fingerprint(relays.identity.record) in message
    else:
        assert "epoch 1 of @acme/ken is below the highest seen (2)" in message
    assert storage.get(ORIGIN, KEN) == pinned


def _forged_signature(party: Party) -> tuple[SignedIdentityRecord, SignedEncryptionKeyRecord]:
    stranger = make_party(party.address, origin=party.identity.record.relay_origin)
    return attrs.evolve(party.identity, signature=stranger.identity.signature), party.encryption


# Each way served records can be wrong besides the identity key, applied to a party's own.
FAULTS: dict[str, Callable[[Party], tuple[SignedIdentityRecord, SignedEncryptionKeyRecord]]] = {
    "an encryption record for another address": lambda p: (
        p.identity,
        make_party("@acme/bob").encryption,
    ),
    "records naming two relays": lambda p: (
        p.identity,
        make_party(KEN, origin="other.example").encryption,
    ),
    "a forged self-signature": _forged_signature,
    "an encryption record signed by another key": lambda p: (
        p.identity,
        make_party(KEN).encryption,
    ),
    "an expired encryption record": lambda p: (
        p.identity,
        rotate(p, not_before=NOW - 40 * DAY, not_after=NOW - 11 * DAY).encryption,
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_swapped_identity_is_reported_whatever_else_is_wrong(
    book: PinBook, storage: MemoryPinStorage, fault: str
) -> None:
    """The identity change is what the user can check out of band, so nothing hides it; the
    same fault under the pinned identity is refused for what it is."""
    ken, relays = make_party(KEN), make_party(KEN)
    pinned = pin(book, ken)
    identity, encryption = FAULTS[fault](relays)
    with pytest.raises(IdentityChanged) as info:
        book.check_and_pin(KEN, identity, encryption, NOW + 1, relay_origin=ORIGIN)
    assert pinned.fingerprint in str(info.value)
    assert keys.fingerprint(relays.identity.record) in str(info.value)
    identity, encryption = FAULTS[fault](ken)
    with pytest.raises(KeyRecordInvalid):
        book.check_and_pin(KEN, identity, encryption, NOW + 1, relay_origin=ORIGIN)
    assert storage.get(ORIGIN, KEN) == pinned


@pytest.mark.parametrize(
    "failure",
    ["rollback", "changed", "expired", "forged_encryption"],
)
def test_failed_checks_leave_the_pin_untouched(
    book: PinBook, storage: MemoryPinStorage, failure: str
) -> None:
    """No refusal writes to the store."""
    ken = make_party(KEN)
    later = rotate(ken)
    before = pin(book, later)
    identity, encryption, now = ken.identity, later.encryption, float(NOW)
    if failure == "rollback":
        encryption = ken.encryption
    elif failure == "changed":
        other = make_party(KEN)
        identity, encryption = other.identity, rotate(rotate(other)).encryption
    elif failure == "expired":
        now = NOW + 40 * DAY
    else:
        encryption = rotate(rotate(make_party(KEN))).encryption
    with pytest.raises(CryptoError):
        book.check_and_pin(KEN, identity, encryption, now)
    assert storage.get(ORIGIN, KEN) == before


def test_peek_state_reads_without_writing(book: PinBook, storage: MemoryPinStorage) -> None:
    """peek_state reports unseen, matched or changed and never pins."""
    ken, impostor = make_party(KEN), make_party(KEN)
    assert book.peek_state(ORIGIN, KEN, ken.identity_pub) is PinState.UNSEEN
    assert storage.get(ORIGIN, KEN) is None
    pin(book, ken)
    assert book.peek_state(ORIGIN, KEN, ken.identity_pub) is PinState.MATCHED
    assert book.peek_state(ORIGIN, KEN, impostor.identity_pub) is PinState.CHANGED
    assert book.peek_state("other.example", KEN, ken.identity_pub) is PinState.UNSEEN


def test_pins_are_per_relay(book: PinBook) -> None:
    """The same address on two relays is two independent pins."""
    here, there = make_party(KEN), make_party(KEN, origin="other.example")
    pin(book, here)
    assert pin(book, there).relay_origin == "other.example"


def test_memory_storage_put_get_remove(storage: MemoryPinStorage) -> None:
    """put replaces by (relay, address); remove reports whether anything went."""
    ken = make_party(KEN)
    first = PinBook(storage).check_and_pin(KEN, ken.identity, ken.encryption, NOW)
    storage.put(attrs.evolve(first, highest_epoch=7))
    got = storage.get(ORIGIN, KEN)
    assert got is not None and got.highest_epoch == 7
    assert storage.remove(ORIGIN, KEN) is True
    assert storage.remove(ORIGIN, KEN) is False
    assert storage.get(ORIGIN, KEN) is None


def test_pin_refuses_malformed_fields() -> None:
    """A pin cannot hold a fingerprint or key of the wrong shape."""
    ken = make_party(KEN)
    good = PinBook(MemoryPinStorage()).check_and_pin(KEN, ken.identity, ken.encryption, NOW)
    with pytest.raises(ValueError):
        attrs.evolve(good, fingerprint="SHA256:xyz")
    with pytest.raises(ValueError):
        attrs.evolve(good, identity_pub="short")
    records.verify_identity_record(ken.identity)
