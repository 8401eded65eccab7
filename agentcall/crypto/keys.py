"""Key material: the Ed25519 identity key, the X25519 encryption key, ids and fingerprints.

Public keys travel as unpadded base64url of their 32 raw bytes. Decoding is strict: a string
has exactly one accepted spelling, so two different strings never name the same key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import NoReturn

import nacl.exceptions
import nacl.signing
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from agentcall.errors import SignatureInvalid
from agentcall.wire import canonical
from agentcall.wire.keyrecords import IdentityRecord

from . import transcripts

KEY_BYTES = 32
SIGNATURE_BYTES = 64
_B64URL_RE = re.compile(r"^[A-Za-z0-9_-]*\Z")


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Decode unpadded base64url; anything but the one canonical spelling raises ValueError."""
    if not isinstance(text, str) or _B64URL_RE.match(text) is None:
        raise ValueError("not unpadded base64url")
    if len(text) % 4 == 1:
        raise ValueError("impossible base64url length")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error as exc:
        raise ValueError("not unpadded base64url") from exc
    # Non-zero unused bits in the last character would give a second spelling of the same bytes.
    if b64url_encode(data) != text:
        raise ValueError("non-canonical base64url")
    return data


def key_id(public_raw: bytes) -> str:
    """The first 16 bytes of SHA-256 of a raw public key, as 32 hex characters."""
    return hashlib.sha256(public_raw).digest()[:16].hex()


def fingerprint(identity: IdentityRecord) -> str:
    """What a person compares out of band: ``SHA256:`` + 32 hex of the identity transcript."""
    return "SHA256:" + canonical.digest(transcripts.identity_transcript(identity))[:16].hex()


def decode_public_key(text: str, *, what: str) -> bytes:
    """A 32-byte raw public key from base64url; ValueError names ``what`` but not the value."""
    try:
        raw = b64url_decode(text)
    except ValueError as exc:
        raise ValueError(f"{what} is not canonical base64url") from exc
    if len(raw) != KEY_BYTES:
        raise ValueError(f"{what} is not {KEY_BYTES} bytes")
    return raw


class IdentityKey:
    """An installation's long-term Ed25519 signing key."""

    __slots__ = ("_signing",)

    def __init__(self, signing: nacl.signing.SigningKey) -> None:
        self._signing = signing

    @classmethod
    def generate(cls) -> IdentityKey:
        return cls(nacl.signing.SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> IdentityKey:
        if not isinstance(seed, bytes) or len(seed) != KEY_BYTES:
            raise ValueError(f"an identity seed is {KEY_BYTES} bytes")
        return cls(nacl.signing.SigningKey(seed))

    def seed_bytes(self) -> bytes:
        """The 32-byte secret seed, for persistence in a 0600 file only."""
        return bytes(self._signing)

    @property
    def public_raw(self) -> bytes:
        return bytes(self._signing.verify_key)

    @property
    def public_b64(self) -> str:
        return b64url_encode(self.public_raw)

    @property
    def key_id(self) -> str:
        return key_id(self.public_raw)

    def sign(self, message: bytes) -> str:
        """A detached Ed25519 signature over ``message``, as base64url."""
        return b64url_encode(self._signing.sign(message).signature)

    def __repr__(self) -> str:
        return f"<IdentityKey key_id={self.key_id}>"

    def __reduce__(self) -> NoReturn:
        # Pickling would copy the secret somewhere we never decided to put it.
        raise TypeError("identity keys are not picklable")


def verify_signature(identity_pub_b64: str, message: bytes, signature_b64: str) -> None:
    """Check a detached Ed25519 signature; any failure is :class:`SignatureInvalid`."""
    try:
        public_raw = decode_public_key(identity_pub_b64, what="identity key")
        signature = b64url_decode(signature_b64)
    except ValueError as exc:
        raise SignatureInvalid(f"signature check failed: {exc}") from None
    if len(signature) != SIGNATURE_BYTES:
        raise SignatureInvalid("signature check failed: signature is not 64 bytes")
    try:
        nacl.signing.VerifyKey(public_raw).verify(message, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError):
        raise SignatureInvalid("signature does not verify against the identity key") from None


class EncryptionKey:
    """An X25519 HPKE recipient key (one per epoch)."""

    __slots__ = ("_private",)

    def __init__(self, private: X25519PrivateKey) -> None:
        self._private = private

    @classmethod
    def generate(cls) -> EncryptionKey:
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> EncryptionKey:
        if not isinstance(raw, bytes) or len(raw) != KEY_BYTES:
            raise ValueError(f"an encryption private key is {KEY_BYTES} bytes")
        return cls(X25519PrivateKey.from_private_bytes(raw))

    def private_bytes(self) -> bytes:
        """The 32-byte secret, for persistence in a 0600 file only."""
        return self._private.private_bytes_raw()

    @property
    def private_key(self) -> X25519PrivateKey:
        """The key object HPKE decrypts with."""
        return self._private

    @property
    def public_raw(self) -> bytes:
        return self._private.public_key().public_bytes_raw()

    @property
    def public_b64(self) -> str:
        return b64url_encode(self.public_raw)

    @property
    def key_id(self) -> str:
        return key_id(self.public_raw)

    def __repr__(self) -> str:
        return f"<EncryptionKey key_id={self.key_id}>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("encryption keys are not picklable")


def x25519_public_key(pub_b64: str) -> X25519PublicKey:
    """The HPKE recipient public key named by a record's ``pub`` field."""
    return X25519PublicKey.from_public_bytes(decode_public_key(pub_b64, what="encryption key"))
