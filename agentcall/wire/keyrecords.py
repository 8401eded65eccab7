"""Published key records: an installation's signed identity and encryption keys.

The same shapes travel in two places: the relay's key routes (``GET /v1/keys/<handle>``, see
:mod:`agentcall.wire.http`, which re-exports them) and the frames that hand a listener its
caller's current records (``incoming_call``, ``job_delivery``; :mod:`agentcall.wire.frames`).
Both import them from here. Whoever receives them verifies them (``agentcall.crypto.pins``);
the relay that serves them is not trusted for them.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from agentcall import limits
from agentcall.wire import fields as f

# Key suites a record may name. A post-quantum hybrid suite can be added as a rotation later.
SUITE_X25519 = "DHKEM(X25519,HKDF-SHA256)/HKDF-SHA256/ChaCha20-Poly1305"
SUITES = frozenset({SUITE_X25519})


# Written only when set (agentcall.wire.codec.OMIT_IF_DEFAULT): a record without a recovery key
# is byte for byte what it was before recovery existed, and so is its signature.
_LATER = {"agentcall.omit_if_default": True}


@attrs.frozen
class IdentityRecord:
    v: int = attrs.field(validator=f.exactly(1))
    relay_origin: str = attrs.field(validator=f.relay_origin)
    address: str = attrs.field(validator=f.address)
    identity_pub: str = attrs.field(validator=f.b64url(43, min_chars=43))  # Ed25519, 32 bytes
    # The public half of the offline recovery key (Ed25519) that `agentcall recovery issue`
    # made, and when: whoever holds the code may move this address to a new identity key.
    # Signed with the rest, so a caller who pins the identity trusts this key through it.
    recovery_pub: str | None = attrs.field(
        default=None, validator=f.optional(f.b64url(43, min_chars=43)), metadata=_LATER
    )
    recovery_issued_at: int | None = attrs.field(
        default=None, validator=f.optional(f.timestamp), metadata=_LATER
    )

    def __attrs_post_init__(self) -> None:
        if (self.recovery_pub is None) != (self.recovery_issued_at is None):
            raise ValueError("a recovery key comes with the time it was issued")


@attrs.frozen
class SignedIdentityRecord:
    record: IdentityRecord
    signature: str = attrs.field(validator=f.b64url(86, min_chars=86))


@attrs.frozen
class EncryptionKeyRecord:
    v: int = attrs.field(validator=f.exactly(1))
    relay_origin: str = attrs.field(validator=f.relay_origin)
    address: str = attrs.field(validator=f.address)
    key_id: str = attrs.field(validator=f.hex32)
    suite: str = attrs.field(validator=attrs.validators.in_(SUITES))
    pub: str = attrs.field(validator=f.b64url(43, min_chars=43))  # X25519, 32 bytes
    epoch: int = attrs.field(validator=f.epoch_number)
    not_before: int = attrs.field(validator=f.timestamp)
    not_after: int = attrs.field(validator=f.timestamp)
    prev: str | None = attrs.field(validator=f.optional(f.hex32))

    def __attrs_post_init__(self) -> None:
        if not self.not_before < self.not_after <= self.not_before + limits.MAX_KEY_VALIDITY_S:
            raise ValueError("validity window must be positive and at most 30 days")
        if (self.epoch == 1) != (self.prev is None):
            raise ValueError("prev is null exactly at epoch 1")


@attrs.frozen
class SignedEncryptionKeyRecord:
    record: EncryptionKeyRecord
    signature: str = attrs.field(validator=f.b64url(86, min_chars=86))


@attrs.frozen
class RecoveryStatement:
    """ "The holder of the recovery key ``recovery_pub`` moves ``address`` to the identity key
    ``new_identity_pub``", signed by that recovery key at ``at``. The identity record that
    published ``recovery_pub`` (signed by the old identity key) is what makes it believable."""

    v: int = attrs.field(validator=f.exactly(1))
    relay_origin: str = attrs.field(validator=f.relay_origin)
    address: str = attrs.field(validator=f.address)
    recovery_pub: str = attrs.field(validator=f.b64url(43, min_chars=43))
    new_identity_pub: str = attrs.field(validator=f.b64url(43, min_chars=43))
    at: int = attrs.field(validator=f.timestamp)


@attrs.frozen
class SignedRecoveryStatement:
    statement: RecoveryStatement
    signature: str = attrs.field(validator=f.b64url(86, min_chars=86))  # by the recovery key


@attrs.frozen
class RecoveryLink:
    """One recovery of an address: the old identity's last record (naming the recovery key),
    then the statement that key signed. Oldest first in :attr:`KeysResponse.recovered`."""

    previous: SignedIdentityRecord
    statement: SignedRecoveryStatement


@attrs.frozen
class KeysResponse:
    # The relay attaches the same (cached) records to every incoming_call of a caller: the
    # codec encodes one object once and splices its text after that (codec.to_json).
    encode_once: ClassVar[bool] = True
    identity: SignedIdentityRecord
    encryption: SignedEncryptionKeyRecord | None = None
    # Every recovery of this address, oldest first: how a caller who pinned an earlier
    # identity key walks to the current one (agentcall.crypto.recovery).
    recovered: tuple[RecoveryLink, ...] = attrs.field(
        default=(),
        validator=f.each(lambda *_: None, max_items=limits.MAX_RECOVERY_LINKS),
        metadata=_LATER,
    )
