"""keys.json: creation, checked loading, rotation with a signed chain, retention and pruning."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agentcall import limits
from agentcall.crypto import records
from agentcall.crypto.keys import EncryptionKey, IdentityKey, b64url_encode
from agentcall.local.home import Home, PrivateFileError
from agentcall.local.keystore import (
    MAX_EPOCHS,
    KeyStoreError,
    LocalKeys,
    create_keys,
    load_keys,
    rotate_if_needed,
)
from agentcall.wire import codec
from agentcall.wire.http import SignedEncryptionKeyRecord

ORIGIN = "relay.example"
ADDRESS = "@acme/ken"
NOW = 1_750_000_000.25
DAY = 24 * 3600


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home.from_environ({"HOME": str(tmp_path)})


@pytest.fixture
def keys(home: Home) -> LocalKeys:
    return create_keys(home, ORIGIN, ADDRESS, NOW)


def secrets_of(keys: LocalKeys) -> list[str]:
    """Every spelling of the private keys that must never appear in text."""
    raws = [keys.identity.seed_bytes()] + [entry.key.private_bytes() for entry in keys.epochs]
    return [b64url_encode(raw) for raw in raws] + [raw.hex() for raw in raws]


def read_json(home: Home) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(home.keys_path.read_bytes())
    return body


def write_json(home: Home, body: object) -> None:
    home.write_private(home.keys_path, json.dumps(body).encode())


def test_create_then_load_round_trip(home: Home, keys: LocalKeys) -> None:
    """Loaded keys are the created ones: same identity, same epoch-1 key and records."""
    loaded = load_keys(home)
    assert loaded.identity.seed_bytes() == keys.identity.seed_bytes()
    assert loaded.current.private_bytes() == keys.current.private_bytes()
    assert loaded.identity_record == keys.identity_record
    assert loaded.current_record == keys.current_record
    assert loaded.address == ADDRESS and loaded.relay_origin == ORIGIN
    assert os.stat(home.keys_path).st_mode & 0o777 == 0o600


def test_created_records_verify_and_match_the_keys(keys: LocalKeys) -> None:
    """The records are signed by the identity key and publish the right public keys."""
    records.verify_identity_record(keys.identity_record)
    assert keys.identity_record.record.identity_pub == keys.identity.public_b64
    record = keys.current_record.record
    assert (record.epoch, record.prev, record.pub) == (1, None, keys.current.public_b64)
    records.verify_encryption_record(keys.current_record, keys.identity.public_b64, now=NOW)


def test_new_records_are_valid_now_for_the_longest_window(keys: LocalKeys) -> None:
    """Validity starts a skew before now (for peers whose clocks lag) and lasts 30 days."""
    record = keys.current_record.record
    assert record.not_after - record.not_before == limits.MAX_KEY_VALIDITY_S
    records.verify_encryption_record(
        keys.current_record, keys.identity.public_b64, now=NOW - limits.CLOCK_SKEW_S
    )


def test_create_never_overwrites(home: Home, keys: LocalKeys) -> None:
    """A second create refuses and the first keys stay on disk."""
    before = home.keys_path.read_bytes()
    with pytest.raises(KeyStoreError, match="already exists"):
        create_keys(home, ORIGIN, ADDRESS, NOW)
    assert home.keys_path.read_bytes() == before


def test_key_for_finds_only_held_epochs(keys: LocalKeys) -> None:
    """key_for needs both the key id and the epoch of a held key."""
    key_id = keys.current.key_id
    assert keys.key_for(key_id, 1) is keys.current
    assert keys.key_for(key_id, 2) is None
    assert keys.key_for("0" * 32, 1) is None


def test_reprs_show_no_key_material(keys: LocalKeys) -> None:
    """Neither the keys object nor its epochs print a private key."""
    text = repr(keys) + repr(keys.epochs) + str(keys)
    assert ADDRESS in text
    for secret in secrets_of(keys):
        assert secret not in text


def test_missing_file_is_an_error(home: Home) -> None:
    """Without keys.json there is nothing to load (setup has not run)."""
    with pytest.raises(KeyStoreError, match="missing"):
        load_keys(home)


def test_no_rotation_while_enough_validity_remains(home: Home, keys: LocalKeys) -> None:
    """With at least KEY_ROTATE_BEFORE_S left, nothing changes."""
    not_after = keys.current_record.record.not_after
    before = home.keys_path.read_bytes()
    assert rotate_if_needed(home, keys, not_after - limits.KEY_ROTATE_BEFORE_S) is None
    assert home.keys_path.read_bytes() == before


def test_rotation_mints_the_next_linked_epoch(home: Home, keys: LocalKeys) -> None:
    """Inside the window a new epoch is minted, chained to the old one, and saved."""
    now = keys.current_record.record.not_after - limits.KEY_ROTATE_BEFORE_S + 1
    rotated = rotate_if_needed(home, keys, now)
    assert rotated is not None
    new = rotated.current_record
    assert new.record.epoch == 2
    records.verify_chain(keys.current_record, new)
    records.verify_encryption_record(new, keys.identity.public_b64, now=now)
    assert new.record.not_after - new.record.not_before == limits.MAX_KEY_VALIDITY_S
    assert rotated.current.private_bytes() != keys.current.private_bytes()
    assert rotated.identity_record == keys.identity_record
    loaded = load_keys(home)
    assert [entry.record for entry in loaded.epochs] == [keys.current_record, new]


def test_previous_key_kept_until_its_last_request_could_arrive(home: Home, keys: LocalKeys) -> None:
    """The old epoch still opens envelopes until not_after + MAX_ENVELOPE_VALIDITY_S (a queued
    job sealed to it at the last moment), then goes."""
    old_id = keys.current.key_id
    old_not_after = keys.current_record.record.not_after
    rotated = rotate_if_needed(home, keys, old_not_after - DAY)
    assert rotated is not None
    assert rotated.key_for(old_id, 1) is not None
    just_before = old_not_after + limits.MAX_ENVELOPE_VALIDITY_S - 1
    assert rotate_if_needed(home, rotated, just_before) is None
    pruned = rotate_if_needed(home, rotated, old_not_after + limits.MAX_ENVELOPE_VALIDITY_S)
    assert pruned is not None
    assert pruned.key_for(old_id, 1) is None
    assert [entry.epoch for entry in pruned.epochs] == [2]
    assert [entry.epoch for entry in load_keys(home).epochs] == [2]


def test_long_expired_keys_rotate_and_drop_the_spent_epoch(home: Home, keys: LocalKeys) -> None:
    """After months offline, one fresh epoch replaces the dead one and still chains."""
    later = NOW + 90 * DAY
    rotated = rotate_if_needed(home, keys, later)
    assert rotated is not None
    assert [entry.epoch for entry in rotated.epochs] == [2]
    assert rotated.current_record.record.prev is not None
    records.verify_chain(keys.current_record, rotated.current_record)
    records.verify_encryption_record(rotated.current_record, keys.identity.public_b64, now=later)


def build_chain(home: Home, count: int, not_after: int) -> LocalKeys:
    """Write keys.json by hand with ``count`` chained epochs, all live until ``not_after``."""
    identity = IdentityKey.generate()
    identity_record = records.make_identity_record(identity, ORIGIN, ADDRESS)
    entries: list[dict[str, Any]] = []
    previous: SignedEncryptionKeyRecord | None = None
    for epoch in range(1, count + 1):
        key = EncryptionKey.generate()
        previous = records.make_encryption_record(
            identity,
            key,
            ORIGIN,
            ADDRESS,
            epoch=epoch,
            not_before=not_after - limits.MAX_KEY_VALIDITY_S + epoch,
            not_after=not_after + epoch,
            previous=previous,
        )
        entries.append(
            {
                "private": b64url_encode(key.private_bytes()),
                "record": codec.converter.unstructure(previous),
            }
        )
    write_json(
        home,
        {
            "version": 1,
            "identity": {
                "seed": b64url_encode(identity.seed_bytes()),
                "record": codec.converter.unstructure(identity_record),
            },
            "encryption": entries,
        },
    )
    return load_keys(home)


def test_at_most_eight_epochs_are_kept(home: Home) -> None:
    """Rotating with eight live epochs drops the oldest, keeping a contiguous chain."""
    end = int(NOW) + 10 * DAY
    keys = build_chain(home, MAX_EPOCHS, end)
    assert [entry.epoch for entry in keys.epochs] == list(range(1, 9))
    rotated = rotate_if_needed(home, keys, end - DAY)
    assert rotated is not None
    assert [entry.epoch for entry in rotated.epochs] == list(range(2, 10))
    assert [entry.epoch for entry in load_keys(home).epochs] == list(range(2, 10))
    for epoch_key in rotated.epochs:
        assert rotated.key_for(epoch_key.key_id, epoch_key.epoch) is epoch_key.key


def test_rotation_by_another_process_is_picked_up(home: Home, keys: LocalKeys) -> None:
    """A stale in-memory copy gets the rotation already on disk, not a second epoch 2."""
    now = keys.current_record.record.not_after - DAY
    first = rotate_if_needed(home, keys, now)
    assert first is not None
    second = rotate_if_needed(home, keys, now + 1)
    assert second is not None
    assert second.current_record == first.current_record


def test_nine_epochs_on_disk_are_refused(home: Home) -> None:
    """A file holding more epochs than allowed is not trusted."""
    build_chain(home, MAX_EPOCHS, int(NOW))
    body = read_json(home)
    body["encryption"].append(body["encryption"][-1])
    write_json(home, body)
    with pytest.raises(KeyStoreError, match=r"1\.\.8"):
        load_keys(home)


def tamper_seed(body: dict[str, Any]) -> None:
    body["identity"]["seed"] = b64url_encode(IdentityKey.generate().seed_bytes())


def tamper_private(body: dict[str, Any]) -> None:
    body["encryption"][0]["private"] = b64url_encode(EncryptionKey.generate().private_bytes())


def tamper_record_field(body: dict[str, Any]) -> None:
    body["encryption"][-1]["record"]["record"]["not_after"] -= 1


def drop_middle_epoch(body: dict[str, Any]) -> None:
    del body["encryption"][1]


def swap_epochs(body: dict[str, Any]) -> None:
    body["encryption"].reverse()


TAMPERINGS = {
    "seed replaced": tamper_seed,
    "private key replaced": tamper_private,
    "record field changed": tamper_record_field,
    "gap in the chain": drop_middle_epoch,
    "epochs out of order": swap_epochs,
    "unknown key": lambda body: body.update(extra=1),
    "missing identity": lambda body: body.pop("identity"),
    "newer version": lambda body: body.update(version=2),
    "no epochs": lambda body: body.update(encryption=[]),
    "seed not base64url": lambda body: body["identity"].update(seed="!!"),
    "short private key": lambda body: body["encryption"][0].update(private="AAAA"),
    "record not a record": lambda body: body["encryption"][0].update(record={"x": 1}),
    "identity record of another address": lambda body: body["identity"]["record"]["record"].update(
        address="@acme/bob"
    ),
}


@pytest.mark.parametrize("tamper", TAMPERINGS.values(), ids=TAMPERINGS.keys())
def test_tampered_file_fails_closed_and_is_left_alone(home: Home, tamper: Any) -> None:
    """Every inconsistency is a KeyStoreError; the file is not rewritten; no secret leaks."""
    keys = build_chain(home, 3, int(NOW) + DAY)
    body = read_json(home)
    tamper(body)
    write_json(home, body)
    before = home.keys_path.read_bytes()
    with pytest.raises(KeyStoreError) as info:
        load_keys(home)
    assert str(home.keys_path) in str(info.value)
    for secret in secrets_of(keys):
        assert secret not in str(info.value)
    with pytest.raises(KeyStoreError):
        rotate_if_needed(home, keys, NOW)
    assert home.keys_path.read_bytes() == before


def test_signature_tampering_fails_closed(home: Home, keys: LocalKeys) -> None:
    """A record whose signature no longer verifies is refused."""
    body = read_json(home)
    signature = body["encryption"][0]["record"]["signature"]
    body["encryption"][0]["record"]["signature"] = (
        "B" if signature[0] == "A" else "A"
    ) + signature[1:]
    write_json(home, body)
    with pytest.raises(KeyStoreError, match="signature"):
        load_keys(home)


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b'{"version": 1, "version": 1}'])
def test_unparseable_file_fails_closed(home: Home, data: bytes) -> None:
    """Bytes that are not a keys object are refused."""
    home.write_private(home.keys_path, data)
    with pytest.raises(KeyStoreError, match=str(home.keys_path)):
        load_keys(home)


def test_readable_by_others_is_refused(home: Home, keys: LocalKeys) -> None:
    """keys.json that is not 0600 is not used."""
    os.chmod(home.keys_path, 0o640)
    with pytest.raises(PrivateFileError, match="chmod 600"):
        load_keys(home)


# --- the same bytes are verified once per process -------------------------------------------


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[LocalKeys]:
    """Every full check load_keys runs (the parse and every signature)."""
    from agentcall.local import keystore

    seen: list[LocalKeys] = []
    real = keystore._check

    def counting(keys: LocalKeys) -> None:
        seen.append(keys)
        real(keys)

    monkeypatch.setattr(keystore, "_check", counting)
    monkeypatch.setattr(keystore, "_last_verified", [])
    return seen


def test_unchanged_keys_are_verified_once(home: Home, keys: LocalKeys, checks: list[Any]) -> None:
    first = load_keys(home)
    assert load_keys(home) is first
    assert rotate_if_needed(home, keys, NOW) is None  # reads the file again, under the lock
    assert len(checks) == 1


def test_changed_bytes_are_verified_again(home: Home, keys: LocalKeys, checks: list[Any]) -> None:
    load_keys(home)
    now = keys.current_record.record.not_after - limits.KEY_ROTATE_BEFORE_S + 1
    rotated = rotate_if_needed(home, keys, now)
    assert rotated is not None
    assert [e.key_id for e in load_keys(home).epochs] == [e.key_id for e in rotated.epochs]
    # The first load, the rotation's check of what it writes, then the new bytes read back.
    assert len(checks) >= 3


def test_tampering_after_a_good_load_is_still_refused(
    home: Home, keys: LocalKeys, checks: list[Any]
) -> None:
    load_keys(home)
    body = read_json(home)
    tamper_seed(body)
    write_json(home, body)
    with pytest.raises(KeyStoreError):
        load_keys(home)


def test_a_file_others_may_read_is_refused_though_its_bytes_were_verified(
    home: Home, keys: LocalKeys, checks: list[Any]
) -> None:
    load_keys(home)
    home.keys_path.chmod(0o644)
    with pytest.raises(PrivateFileError):
        load_keys(home)
