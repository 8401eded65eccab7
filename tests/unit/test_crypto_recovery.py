"""Recovery codes, statements and the walk from a pinned identity to a recovered one."""

from __future__ import annotations

import attrs
import pytest

from agentcall.crypto import recovery
from agentcall.crypto.keys import IdentityKey
from agentcall.crypto.pins import MemoryPinStorage, PinBook
from agentcall.errors import IdentityChanged, KeyRecordInvalid
from agentcall.wire.keyrecords import RecoveryLink, SignedIdentityRecord
from tests.unit.crypto_helpers import NOW, ORIGIN, Party, make_party

KEN = "@acme/ken"


def with_code(party: Party, issued_at: int = int(NOW)) -> tuple[Party, IdentityKey]:
    """``party`` after `recovery issue`: its record names a fresh recovery key."""
    key = IdentityKey.generate()
    identity = recovery.with_recovery_key(
        party.identity_key, party.identity.record, key.public_b64, issued_at
    )
    return attrs.evolve(party, identity=identity), key


def recover(old: Party, key: IdentityKey, at: int = int(NOW)) -> tuple[Party, RecoveryLink]:
    """A new machine for the same address, moved there by the recovery key."""
    new = make_party(old.address)
    statement = recovery.make_statement(key, ORIGIN, old.address, new.identity_pub, at)
    return new, RecoveryLink(previous=old.identity, statement=statement)


# --- the code ------------------------------------------------------------------------------------


def test_a_code_gives_back_its_seed_however_it_is_typed() -> None:
    seed = bytes(range(32))
    code = recovery.encode_code(seed)
    assert code.startswith("ACR1-") and all(len(g) <= 5 for g in code.split("-")[1:])
    assert recovery.decode_code(code) == seed
    assert recovery.decode_code(code.lower().replace("-", " ")) == seed
    assert recovery.decode_code(f"  {code}\n") == seed


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda c: c.replace("ACR1", "ACR2"), "not an AgentCall recovery code"),
        (lambda c: c[:-3], "too short"),
        (lambda c: c + "AAAAA", "too short or too long"),
        (lambda c: c[:7] + ("B" if c[7] != "B" else "C") + c[8:], "typo"),
        (lambda c: c[:-1] + "1", "characters"),
    ],
)
def test_a_mangled_code_is_refused_without_repeating_it(mangle: object, message: str) -> None:
    code = recovery.encode_code(bytes(range(32)))
    bad = mangle(code)  # type: ignore[operator]
    with pytest.raises(recovery.RecoveryCodeInvalid) as exc:
        recovery.decode_code(bad)
    assert message in str(exc.value) and bad not in str(exc.value)


def test_a_recovery_key_record_still_verifies_and_an_old_one_is_unchanged() -> None:
    ken = make_party(KEN)
    coded, key = with_code(ken)
    assert coded.identity.record.recovery_pub == key.public_b64
    from agentcall.crypto import records

    records.verify_identity_record(coded.identity)
    records.verify_identity_record(ken.identity)  # no recovery key: the old bytes, old signature
    forged = attrs.evolve(
        coded.identity,
        record=attrs.evolve(coded.identity.record, recovery_pub=IdentityKey.generate().public_b64),
    )
    with pytest.raises(KeyRecordInvalid):
        records.verify_identity_record(forged)


# --- the walk ------------------------------------------------------------------------------------


def test_one_recovery_is_walked_from_the_pinned_identity() -> None:
    old, key = with_code(make_party(KEN))
    new, link = recover(old, key, at=int(NOW) + 60)
    assert recovery.walk(old.identity_pub, new.identity, [link]) == int(NOW) + 60


def test_two_recoveries_are_walked_from_either_pin() -> None:
    first, key1 = with_code(make_party(KEN))
    second, link1 = recover(first, key1, at=100)
    second, key2 = with_code(second, issued_at=150)
    third, link2 = recover(second, key2, at=200)
    links = [link1, link2]
    assert recovery.walk(first.identity_pub, third.identity, links) == 200
    assert recovery.walk(second.identity_pub, third.identity, links) == 200


@pytest.mark.parametrize(
    "forge",
    ["another_key", "record_without_key", "other_address", "other_identity", "edited_record"],
)
def test_a_chain_that_does_not_hold_is_refused(forge: str) -> None:
    old, key = with_code(make_party(KEN))
    new, link = recover(old, key)
    served = new.identity
    if forge == "another_key":  # signed by a key the old record did not name
        link = RecoveryLink(
            previous=old.identity,
            statement=recovery.make_statement(
                IdentityKey.generate(), ORIGIN, KEN, new.identity_pub, 1
            ),
        )
    elif forge == "record_without_key":  # the old identity's record from before the code
        link = RecoveryLink(previous=old_without_key(old), statement=link.statement)
    elif forge == "other_address":
        link = RecoveryLink(
            previous=old.identity,
            statement=recovery.make_statement(key, ORIGIN, "@acme/ann", new.identity_pub, 1),
        )
    elif forge == "other_identity":  # the served identity is not where the chain leads
        served = make_party(KEN).identity
    else:  # the old record edited to name the attacker's key (its signature breaks)
        attacker = IdentityKey.generate()
        edited = attrs.evolve(
            old.identity,
            record=attrs.evolve(old.identity.record, recovery_pub=attacker.public_b64),
        )
        link = RecoveryLink(
            previous=edited,
            statement=recovery.make_statement(attacker, ORIGIN, KEN, new.identity_pub, 1),
        )
    with pytest.raises(KeyRecordInvalid):
        recovery.walk(old.identity_pub, served, [link])


def old_without_key(old: Party) -> SignedIdentityRecord:
    from agentcall.crypto import records

    return records.make_identity_record(old.identity_key, ORIGIN, KEN)


# --- pins ----------------------------------------------------------------------------------------


def test_a_pin_follows_a_recovery_once_and_says_so() -> None:
    book = PinBook(MemoryPinStorage())
    old, key = with_code(make_party(KEN))
    book.check_and_pin(KEN, old.identity, old.encryption, NOW)
    new, link = recover(old, key, at=int(NOW) + 5)
    told: list[tuple[str, int]] = []

    moved = book.check_and_pin(
        KEN,
        new.identity,
        new.encryption,
        NOW + 10,
        recovered=[link],
        on_recovered=lambda address, at: told.append((address, at)),
    )

    assert moved.identity_pub == new.identity_pub and told == [(KEN, int(NOW) + 5)]
    again = book.check_and_pin(
        KEN,
        new.identity,
        new.encryption,
        NOW + 20,
        recovered=[link],
        on_recovered=lambda address, at: told.append((address, at)),
    )
    assert again.identity_pub == new.identity_pub and len(told) == 1  # told once


def test_without_a_chain_a_changed_identity_is_still_refused() -> None:
    book = PinBook(MemoryPinStorage())
    old, key = with_code(make_party(KEN))
    book.check_and_pin(KEN, old.identity, old.encryption, NOW)
    stranger = make_party(KEN)
    _, link_elsewhere = recover(old, key)  # a genuine link, but to someone else's identity
    with pytest.raises(IdentityChanged):
        book.check_and_pin(
            KEN, stranger.identity, stranger.encryption, NOW, recovered=[link_elsewhere]
        )
    with pytest.raises(IdentityChanged):
        book.check_and_pin(KEN, stranger.identity, stranger.encryption, NOW)
