"""Trust on first use: pin a peer's identity key, refuse changes and epoch rollbacks.

The relay serves a peer's records; a :class:`PinBook` decides whether to believe them. The first
contact pins the identity key. Afterwards a different identity key is a hard error until the
user checks the fingerprint out of band and resets the pin, and encryption epochs only go up.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

import attrs
from zope.interface import Interface, implementer

from agentcall import ids
from agentcall.errors import EpochRollback, IdentityChanged, KeyRecordInvalid
from agentcall.wire import fields as f
from agentcall.wire.keyrecords import RecoveryLink, SignedEncryptionKeyRecord, SignedIdentityRecord

from . import keys, records, recovery


class PinState(enum.StrEnum):
    UNSEEN = "unseen"
    MATCHED = "matched"
    CHANGED = "changed"


@attrs.frozen
class Pin:
    relay_origin: str = attrs.field(validator=f.relay_origin)
    address: str = attrs.field(validator=f.address)
    identity_pub: str = attrs.field(validator=f.b64url(43, min_chars=43))
    fingerprint: str = attrs.field(validator=f.matches(ids.FINGERPRINT_RE))
    first_seen_at: int = attrs.field(validator=f.timestamp)
    highest_epoch: int = attrs.field(validator=f.epoch_number)


class IPinStorage(Interface):
    """Where pins live. Keyed by (relay_origin, address)."""

    def get(relay_origin: str, address: str) -> Pin | None:
        """The pin for this peer, or None."""

    def put(pin: Pin) -> None:
        """Create or replace the pin for ``(pin.relay_origin, pin.address)``."""

    def remove(relay_origin: str, address: str) -> bool:
        """Forget a pin; True if there was one."""


@implementer(IPinStorage)
class MemoryPinStorage:
    def __init__(self) -> None:
        self._pins: dict[tuple[str, str], Pin] = {}

    def get(self, relay_origin: str, address: str) -> Pin | None:
        return self._pins.get((relay_origin, address))

    def put(self, pin: Pin) -> None:
        self._pins[(pin.relay_origin, pin.address)] = pin

    def remove(self, relay_origin: str, address: str) -> bool:
        return self._pins.pop((relay_origin, address), None) is not None


def _changed_message(address: str, pinned: str, served: str) -> str:
    return (
        f"the identity key of {address} has changed (pinned {pinned}, now {served}); "
        f"verify the new fingerprint out of band, then run `agentcall trust --reset {address}`"
    )


def _check_served(
    address: str,
    identity: SignedIdentityRecord,
    encryption: SignedEncryptionKeyRecord,
    relay_origin: str | None,
) -> None:
    """The served records name ``address`` and one relay (``relay_origin`` when given), and
    the identity record's self-signature verifies; else :class:`KeyRecordInvalid`."""
    served = identity.record
    if served.address != address:
        raise KeyRecordInvalid("served identity record names another address")
    if encryption.record.address != address:
        raise KeyRecordInvalid("served encryption record names another address")
    if encryption.record.relay_origin != served.relay_origin:
        raise KeyRecordInvalid("served records name different relays")
    if relay_origin is not None and served.relay_origin != relay_origin:
        raise KeyRecordInvalid("served records name another relay")
    records.verify_identity_record(identity)


class PinBook:
    """The trust decisions over one :class:`IPinStorage`."""

    def __init__(self, storage: IPinStorage) -> None:
        self._storage = storage

    def check_and_pin(
        self,
        requested_address: str,
        identity: SignedIdentityRecord,
        encryption: SignedEncryptionKeyRecord,
        now: float,
        *,
        relay_origin: str | None = None,
        recovered: Sequence[RecoveryLink] = (),
        on_recovered: Callable[[str, int], None] | None = None,
    ) -> Pin:
        """Believe a peer's served records, or raise; on success the pin is stored.

        ``relay_origin``, when given, is the relay we asked; the records must name it. A new
        identity key that ``recovered`` shows the pinned one vouched for (through its recovery
        key) replaces the pin, and ``on_recovered(address, when)`` is told, this once.
        """
        served = identity.record
        # The pin is compared first. A relay that swaps the identity key and also serves
        # something else wrong (an old epoch, another address, a bad signature) must be
        # reported as the identity change, the one thing the user can check out of band; any
        # other error would hide it.
        origin = served.relay_origin if relay_origin is None else relay_origin
        pin = self._storage.get(origin, requested_address)
        if pin is not None and pin.identity_pub != served.identity_pub:
            return self._follow_recovery(
                pin,
                requested_address,
                identity,
                encryption,
                now,
                relay_origin,
                recovered,
                on_recovered,
            )
        _check_served(requested_address, identity, encryption, relay_origin)
        # A rollback before expiry: a relay replaying an old epoch that has since expired must
        # be reported as the attack it is, not blamed on the callee as "offline too long".
        if pin is not None and encryption.record.epoch < pin.highest_epoch:
            raise EpochRollback(
                f"encryption epoch {encryption.record.epoch} of {requested_address} is below "
                f"the highest seen ({pin.highest_epoch})"
            )
        trusted_pub = served.identity_pub if pin is None else pin.identity_pub
        records.verify_encryption_record(encryption, trusted_pub, now=now)
        if pin is None:
            pin = Pin(
                relay_origin=served.relay_origin,
                address=requested_address,
                identity_pub=served.identity_pub,
                fingerprint=keys.fingerprint(served),
                first_seen_at=int(now),
                highest_epoch=encryption.record.epoch,
            )
        else:
            pin = attrs.evolve(pin, highest_epoch=max(pin.highest_epoch, encryption.record.epoch))
        self._storage.put(pin)
        return pin

    def _follow_recovery(
        self,
        pin: Pin,
        address: str,
        identity: SignedIdentityRecord,
        encryption: SignedEncryptionKeyRecord,
        now: float,
        relay_origin: str | None,
        recovered: Sequence[RecoveryLink],
        on_recovered: Callable[[str, int], None] | None,
    ) -> Pin:
        """Move the pin to a served identity the pinned one vouched for, or refuse the change."""
        served = identity.record
        changed = IdentityChanged(
            _changed_message(address, pin.fingerprint, keys.fingerprint(served))
        )
        if not recovered:
            raise changed
        try:
            # Only sound records are followed; anything wrong with them is still the change.
            _check_served(address, identity, encryption, relay_origin)
            moved_at = recovery.walk(pin.identity_pub, identity, recovered)
        except KeyRecordInvalid:
            raise changed from None
        # A new identity starts its own epochs: the old ones were the old key's.
        pin = attrs.evolve(
            pin,
            identity_pub=served.identity_pub,
            fingerprint=keys.fingerprint(served),
            highest_epoch=encryption.record.epoch,
        )
        records.verify_encryption_record(encryption, pin.identity_pub, now=now)
        self._storage.put(pin)
        if on_recovered is not None:
            on_recovered(address, moved_at)
        return pin

    def reset(self, relay_origin: str, address: str) -> bool:
        """Forget a pin after out-of-band checking; the next contact pins afresh."""
        return self._storage.remove(relay_origin, address)

    def peek_state(self, relay_origin: str, address: str, identity_pub: str) -> PinState:
        """Compare a served identity key with the pin, changing nothing."""
        pin = self._storage.get(relay_origin, address)
        if pin is None:
            return PinState.UNSEEN
        if pin.identity_pub == identity_pub:
            return PinState.MATCHED
        return PinState.CHANGED
