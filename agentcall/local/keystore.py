"""keys.json: this installation's private keys, each beside the signed record that publishes it.

The file holds the Ed25519 identity seed and one X25519 private key per retained encryption
epoch, newest last. Loading it checks everything a relay would and more: every record verifies,
every record matches its private key, and the epochs form one unbroken signed chain. Anything
else fails closed; the file is never repaired or replaced behind the user's back.

Rotation mints the next epoch before the current one runs out. The previous private keys stay
for a while, because a caller may have sealed a request to an epoch just before it was replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from agentcall import limits
from agentcall.crypto import records
from agentcall.crypto.keys import EncryptionKey, IdentityKey, b64url_decode, b64url_encode
from agentcall.errors import CryptoError, MalformedFrame
from agentcall.local.home import Home, LocalStateError
from agentcall.wire import codec
from agentcall.wire.keyrecords import SignedEncryptionKeyRecord, SignedIdentityRecord

KEYS_VERSION = 1
MAX_EPOCHS = 8
MAX_KEYS_BYTES = 64 * 1024
LOCK_NAME = "keys.lock"


class KeyStoreError(LocalStateError):
    """keys.json is missing, malformed, or does not match itself. Never names key material."""


@attrs.frozen
class EpochKey:
    """One encryption epoch: the private key and the record that publishes its public half."""

    key: EncryptionKey
    record: SignedEncryptionKeyRecord = attrs.field(repr=False)

    @property
    def epoch(self) -> int:
        return self.record.record.epoch

    @property
    def key_id(self) -> str:
        return self.record.record.key_id


@attrs.frozen(repr=False)
class LocalKeys:
    """The keys of this installation: identity, current epoch, and retained earlier epochs."""

    identity: IdentityKey
    identity_record: SignedIdentityRecord
    # Oldest first; the last one is the current epoch. Never empty.
    epochs: tuple[EpochKey, ...]

    @property
    def current(self) -> EncryptionKey:
        return self.epochs[-1].key

    @property
    def current_record(self) -> SignedEncryptionKeyRecord:
        return self.epochs[-1].record

    @property
    def address(self) -> str:
        return self.identity_record.record.address

    @property
    def relay_origin(self) -> str:
        return self.identity_record.record.relay_origin

    def key_for(self, key_id: str, epoch: int) -> EncryptionKey | None:
        """The private key an envelope names, if it is the current or a retained epoch."""
        for entry in self.epochs:
            if entry.epoch == epoch and entry.key_id == key_id:
                return entry.key
        return None

    def __repr__(self) -> str:
        # Public facts only; the key objects' own reprs are safe, but keep this one short.
        epochs = ",".join(str(entry.epoch) for entry in self.epochs)
        return (
            f"<LocalKeys {self.address} identity={self.identity.key_id} "
            f"current={self.current.key_id} epochs=[{epochs}]>"
        )


# --- validation ------------------------------------------------------------------------------


def _check(keys: LocalKeys) -> None:
    """Every record verifies, matches its private key, and the epochs chain without gaps."""
    identity = keys.identity_record.record
    if keys.identity.public_b64 != identity.identity_pub:
        raise KeyStoreError("the identity record does not match the identity key")
    records.verify_identity_record(keys.identity_record)
    if not 1 <= len(keys.epochs) <= MAX_EPOCHS:
        raise KeyStoreError(f"expected 1..{MAX_EPOCHS} encryption epochs")
    previous: SignedEncryptionKeyRecord | None = None
    for entry in keys.epochs:
        record = entry.record.record
        if (record.relay_origin, record.address) != (identity.relay_origin, identity.address):
            raise KeyStoreError(f"epoch {record.epoch} names another address or relay")
        if entry.key.public_b64 != record.pub:
            raise KeyStoreError(f"the record of epoch {record.epoch} does not match its key")
        records.verify_encryption_record(entry.record, identity.identity_pub)
        # The oldest retained epoch may link to one already pruned; its signature is all
        # that can be checked locally. Every later one must link to the one before it.
        if previous is not None:
            records.verify_chain(previous, entry.record)
        previous = entry.record


# --- the file --------------------------------------------------------------------------------


def _to_json(keys: LocalKeys) -> bytes:
    body = {
        "version": KEYS_VERSION,
        "identity": {
            "seed": b64url_encode(keys.identity.seed_bytes()),
            "record": codec.converter.unstructure(keys.identity_record),
        },
        "encryption": [
            {
                "private": b64url_encode(entry.key.private_bytes()),
                "record": codec.converter.unstructure(entry.record),
            }
            for entry in keys.epochs
        ],
    }
    return (json.dumps(body, indent=2) + "\n").encode("ascii")


def _object(raw: object, what: str, keys: frozenset[str]) -> dict[str, Any]:
    if type(raw) is not dict or set(raw) != keys:
        raise KeyStoreError(f"{what} must be an object with exactly: {', '.join(sorted(keys))}")
    return raw


def _from_json(data: bytes) -> LocalKeys:
    # Messages name the part that is wrong, never its value: values here are secrets.
    try:
        raw = codec.parse_json(data, max_bytes=MAX_KEYS_BYTES)
    except MalformedFrame:
        raise KeyStoreError("not valid JSON") from None
    top = _object(raw, "the file", frozenset({"version", "identity", "encryption"}))
    if type(top["version"]) is not int or top["version"] != KEYS_VERSION:
        raise KeyStoreError(f"version: this agentcall understands version {KEYS_VERSION} only")
    ident = _object(top["identity"], "identity", frozenset({"seed", "record"}))
    try:
        identity = IdentityKey.from_seed(b64url_decode(ident["seed"]))
    except ValueError:
        raise KeyStoreError("identity.seed is not a 32-byte base64url seed") from None
    try:
        identity_record = codec.structure(ident["record"], SignedIdentityRecord)
    except MalformedFrame:
        raise KeyStoreError("identity.record is not a valid signed identity record") from None
    if type(top["encryption"]) is not list:
        raise KeyStoreError("encryption must be a list")
    epochs: list[EpochKey] = []
    for index, item in enumerate(top["encryption"]):
        entry = _object(item, f"encryption[{index}]", frozenset({"private", "record"}))
        try:
            key = EncryptionKey.from_private_bytes(b64url_decode(entry["private"]))
        except ValueError:
            raise KeyStoreError(f"encryption[{index}].private is not a 32-byte key") from None
        try:
            record = codec.structure(entry["record"], SignedEncryptionKeyRecord)
        except MalformedFrame:
            raise KeyStoreError(f"encryption[{index}].record is not a valid record") from None
        epochs.append(EpochKey(key=key, record=record))
    return LocalKeys(identity=identity, identity_record=identity_record, epochs=tuple(epochs))


# The last keys.json this process parsed and verified: its path, its exact bytes, and the
# keys they gave. The service reads the file several times per call it places (load, and the
# re-read under the lock before deciding on a rotation); each read still opens the file and
# checks who may have written it (Home.read_private), but bytes identical to the last ones
# verified need not be parsed and have every signature checked again: the checks depend on
# the bytes alone. Any other bytes are checked in full and replace the entry.
_last_verified: list[tuple[Path, bytes, LocalKeys]] = []


def _parse_and_check(home: Home, data: bytes) -> LocalKeys:
    path = home.keys_path
    if _last_verified:
        last_path, last_data, last_keys = _last_verified[0]
        if last_path == path and last_data == data:
            return last_keys
    try:
        keys = _from_json(data)
        _check(keys)
    except KeyStoreError as exc:
        raise KeyStoreError(f"{path}: {exc}; restore it from a backup") from None
    except CryptoError as exc:
        raise KeyStoreError(f"{path}: {exc}; restore it from a backup") from None
    _last_verified[:] = [(path, data, keys)]
    return keys


def load_keys(home: Home) -> LocalKeys:
    """Read and check keys.json; any fault raises :class:`KeyStoreError` (fail closed)."""
    try:
        data = home.read_private(home.keys_path)
    except FileNotFoundError:
        raise KeyStoreError(
            f"{home.keys_path} is missing; this installation has no keys (run `agentcall setup`)"
        ) from None
    return _parse_and_check(home, data)


def _window(now: float) -> tuple[int, int]:
    # Start a little in the past so a peer whose clock runs behind ours accepts the record
    # at once; the window is the longest allowed, counted from that start.
    not_before = math.floor(now) - int(limits.CLOCK_SKEW_S)
    return not_before, not_before + limits.MAX_KEY_VALIDITY_S


def create_keys(home: Home, relay_origin: str, address: str, now: float) -> LocalKeys:
    """Mint the identity key and epoch 1, and write them; existing keys are never replaced."""
    if os.path.lexists(home.keys_path):
        raise KeyStoreError(f"{home.keys_path} already exists; refusing to replace its keys")
    identity = IdentityKey.generate()
    current = EncryptionKey.generate()
    not_before, not_after = _window(now)
    keys = LocalKeys(
        identity=identity,
        identity_record=records.make_identity_record(identity, relay_origin, address),
        epochs=(
            EpochKey(
                key=current,
                record=records.make_encryption_record(
                    identity,
                    current,
                    relay_origin,
                    address,
                    epoch=1,
                    not_before=not_before,
                    not_after=not_after,
                    previous=None,
                ),
            ),
        ),
    )
    _check(keys)
    try:
        home.write_private(home.keys_path, _to_json(keys), exclusive=True)
    except FileExistsError:
        # Someone else (a second setup) won the race; their keys stay.
        raise KeyStoreError(
            f"{home.keys_path} already exists; refusing to replace its keys"
        ) from None
    return keys


def _retained(entry: EpochKey, now: float) -> bool:
    # A caller may seal a request (or a callee a job's answer) to an epoch until its not_after,
    # and that envelope stays valid for up to MAX_ENVELOPE_VALIDITY_S (a queued job's life);
    # after that the private key can open nothing legitimate.
    return now < entry.record.record.not_after + limits.MAX_ENVELOPE_VALIDITY_S


def _maintained(keys: LocalKeys, now: float) -> LocalKeys:
    """``keys`` with the next epoch minted if due, and spent earlier epochs dropped."""
    epochs = list(keys.epochs)
    last = epochs[-1]
    if last.record.record.not_after - now < limits.KEY_ROTATE_BEFORE_S:
        fresh = EncryptionKey.generate()
        not_before, not_after = _window(now)
        record = records.make_encryption_record(
            keys.identity,
            fresh,
            keys.relay_origin,
            keys.address,
            epoch=last.epoch + 1,
            not_before=not_before,
            not_after=not_after,
            previous=last.record,
        )
        epochs.append(EpochKey(key=fresh, record=record))
    # Drop from the oldest end only, so the retained epochs stay one contiguous chain.
    while len(epochs) > 1 and (len(epochs) > MAX_EPOCHS or not _retained(epochs[0], now)):
        epochs.pop(0)
    return attrs.evolve(keys, epochs=tuple(epochs))


@contextlib.contextmanager
def _locked(home: Home) -> Iterator[None]:
    # The CLI and the listener may both decide to rotate; one at a time, each re-reading the
    # file under the lock, so two processes never mint two different copies of one epoch.
    home.create_private(home.state_dir / LOCK_NAME)
    fd = os.open(home.state_dir / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def rotate_if_needed(home: Home, keys: LocalKeys, now: float) -> LocalKeys | None:
    """Mint the next epoch when less than KEY_ROTATE_BEFORE_S of validity remains, drop
    retained epochs that can no longer be needed (keeping at most MAX_EPOCHS), and save.

    Returns the keys now on disk when they differ from ``keys`` (including a rotation another
    process made meanwhile), or None when nothing changed. The new record still has to be
    published to the relay by the caller.
    """
    with _locked(home):
        on_disk = load_keys(home)
        if on_disk.identity.public_b64 != keys.identity.public_b64:
            raise KeyStoreError(f"{home.keys_path} now holds another identity; restart agentcall")
        updated = _maintained(on_disk, now)
        changed = _epoch_ids(updated) != _epoch_ids(on_disk)
        if changed:
            _check(updated)
            home.write_private(home.keys_path, _to_json(updated))
    if changed or _epoch_ids(updated) != _epoch_ids(keys):
        return updated
    return None


def replace_identity_record(home: Home, record: SignedIdentityRecord) -> LocalKeys:
    """Keep ``record`` (the same identity key, re-signed: it names a new recovery key) in
    keys.json, under the lock; the keys now on disk."""
    with _locked(home):
        on_disk = load_keys(home)
        if record.record.identity_pub != on_disk.identity.public_b64:
            raise KeyStoreError("the record names another identity key than keys.json holds")
        updated = attrs.evolve(on_disk, identity_record=record)
        _check(updated)
        home.write_private(home.keys_path, _to_json(updated))
    return updated


def _epoch_ids(keys: LocalKeys) -> tuple[tuple[int, str], ...]:
    return tuple((entry.epoch, entry.key_id) for entry in keys.epochs)
