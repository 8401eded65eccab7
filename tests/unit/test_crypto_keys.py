"""Keys, base64url, key ids, fingerprints and signatures."""

from __future__ import annotations

import copy
import hashlib
import pickle

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from agentcall import ids
from agentcall.crypto import keys
from agentcall.crypto.keys import EncryptionKey, IdentityKey
from agentcall.errors import SignatureInvalid
from agentcall.wire import canonical
from agentcall.wire.http import IdentityRecord

# RFC 8032 section 7.1, test 1 (empty message).
RFC8032_SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC8032_PUB = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
RFC8032_SIG = bytes.fromhex(
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555"
    "fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
)
# RFC 7748 section 6.1, Alice.
RFC7748_PRIVATE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
RFC7748_PUBLIC = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")


# --- base64url --------------------------------------------------------------------------------


@given(st.binary(max_size=200))
def test_b64url_round_trips(data: bytes) -> None:
    """Any bytes encode to unpadded URL-safe text that decodes back to the same bytes."""
    text = keys.b64url_encode(data)
    assert "=" not in text and "+" not in text and "/" not in text
    assert keys.b64url_decode(text) == data


@pytest.mark.parametrize(
    "text",
    [
        "AA==",  # padding
        "AAA=",
        "a+b/",  # standard alphabet
        "AB",  # non-zero unused bits: a second spelling of b"\x00"
        "AAB",  # same, two bytes
        "A",  # impossible length
        "AAAAA",
        " AA",
        "AA\n",
        "AA\t",
        "ÄA",
    ],
)
def test_b64url_decode_refuses_non_canonical(text: str) -> None:
    """Anything but the single canonical spelling is a ValueError."""
    with pytest.raises(ValueError):
        keys.b64url_decode(text)


def test_b64url_decode_refuses_non_strings() -> None:
    """Bytes are not accepted where text is expected."""
    with pytest.raises(ValueError):
        keys.b64url_decode(b"AA")  # type: ignore[arg-type]


# --- identity keys ----------------------------------------------------------------------------


def test_identity_key_matches_rfc8032_vector() -> None:
    """Our Ed25519 is standard Ed25519: the RFC 8032 seed gives its public key and signature."""
    key = IdentityKey.from_seed(RFC8032_SEED)
    assert key.public_raw == RFC8032_PUB
    assert keys.b64url_decode(key.sign(b"")) == RFC8032_SIG
    keys.verify_signature(key.public_b64, b"", keys.b64url_encode(RFC8032_SIG))


def test_identity_key_seed_round_trips() -> None:
    """A key restored from its seed is the same key."""
    key = IdentityKey.generate()
    again = IdentityKey.from_seed(key.seed_bytes())
    assert again.public_b64 == key.public_b64
    assert len(key.public_b64) == 43


@pytest.mark.parametrize("seed", [b"", b"\x00" * 31, b"\x00" * 33])
def test_identity_key_refuses_wrong_seed_length(seed: bytes) -> None:
    """A seed is exactly 32 bytes."""
    with pytest.raises(ValueError):
        IdentityKey.from_seed(seed)


def test_key_id_is_sha256_prefix() -> None:
    """key_id is the first 16 bytes of SHA-256 of the raw public key, as hex."""
    key = IdentityKey.generate()
    expected = hashlib.sha256(key.public_raw).hexdigest()[:32]
    assert key.key_id == keys.key_id(key.public_raw) == expected
    assert ids.HEX32_RE.match(key.key_id)


def test_signature_verifies_and_binds_message_and_key() -> None:
    """A signature verifies for its message and key, and for nothing else."""
    key, other = IdentityKey.generate(), IdentityKey.generate()
    signature = key.sign(b"hello")
    keys.verify_signature(key.public_b64, b"hello", signature)
    with pytest.raises(SignatureInvalid):
        keys.verify_signature(key.public_b64, b"hellO", signature)
    with pytest.raises(SignatureInvalid):
        keys.verify_signature(other.public_b64, b"hello", signature)


@pytest.mark.parametrize(
    ("pub", "signature"),
    [
        ("A" * 43, "B" * 85),  # short signature text
        ("A" * 42, "A" * 86),  # short key text
        ("A" * 44, "A" * 86),  # long key text
        ("A" * 43 + "=", "A" * 86),  # padded key
        ("A" * 43, "A" * 84),  # 63-byte signature
    ],
)
def test_verify_signature_refuses_malformed_inputs(pub: str, signature: str) -> None:
    """Malformed keys or signatures are SignatureInvalid, never another exception."""
    with pytest.raises(SignatureInvalid):
        keys.verify_signature(pub, b"m", signature)


def test_verify_signature_refuses_flipped_signature_bits() -> None:
    """Any flipped bit in a signature fails."""
    key = IdentityKey.generate()
    raw = bytearray(keys.b64url_decode(key.sign(b"m")))
    for index in (0, 31, 32, 63):
        flipped = bytearray(raw)
        flipped[index] ^= 1
        with pytest.raises(SignatureInvalid):
            keys.verify_signature(key.public_b64, b"m", keys.b64url_encode(bytes(flipped)))


def test_identity_key_never_shows_its_secret() -> None:
    """repr shows only the key id, and the key refuses to be pickled or copied."""
    key = IdentityKey.generate()
    text = repr(key)
    assert key.key_id in text
    for secret in (keys.b64url_encode(key.seed_bytes()), key.seed_bytes().hex()):
        assert secret not in text
    with pytest.raises(TypeError):
        pickle.dumps(key)
    with pytest.raises(TypeError):
        copy.copy(key)


# --- encryption keys --------------------------------------------------------------------------


def test_encryption_key_matches_rfc7748_vector() -> None:
    """Our X25519 public key derivation is standard X25519."""
    key = EncryptionKey.from_private_bytes(RFC7748_PRIVATE)
    assert key.public_raw == RFC7748_PUBLIC
    assert key.private_bytes() == RFC7748_PRIVATE


def test_encryption_key_round_trips_and_names_its_public_key() -> None:
    """private_bytes restores the same key; public_b64 decodes to the X25519 public key."""
    key = EncryptionKey.generate()
    again = EncryptionKey.from_private_bytes(key.private_bytes())
    assert again.public_b64 == key.public_b64
    assert keys.x25519_public_key(key.public_b64).public_bytes_raw() == key.public_raw
    assert key.key_id == hashlib.sha256(key.public_raw).hexdigest()[:32]
    assert isinstance(key.private_key, X25519PrivateKey)


@pytest.mark.parametrize("raw", [b"", b"\x01" * 31, b"\x01" * 33])
def test_encryption_key_refuses_wrong_length(raw: bytes) -> None:
    """A private key is exactly 32 bytes."""
    with pytest.raises(ValueError):
        EncryptionKey.from_private_bytes(raw)


def test_x25519_public_key_refuses_bad_text() -> None:
    """A record's pub must be 32 bytes of canonical base64url."""
    with pytest.raises(ValueError):
        keys.x25519_public_key("A" * 42)
    with pytest.raises(ValueError):
        keys.x25519_public_key("A" * 42 + "B")  # non-zero unused bits


def test_encryption_key_never_shows_its_secret() -> None:
    """repr shows only the key id, and the key refuses to be pickled."""
    key = EncryptionKey.generate()
    text = repr(key)
    assert key.key_id in text
    assert keys.b64url_encode(key.private_bytes()) not in text
    assert key.private_bytes().hex() not in text
    with pytest.raises(TypeError):
        pickle.dumps(key)


# --- fingerprints -----------------------------------------------------------------------------


def _identity(address: str, pub: str) -> IdentityRecord:
    return IdentityRecord(v=1, relay_origin="relay.example", address=address, identity_pub=pub)


def test_fingerprint_is_sha256_of_the_identity_transcript() -> None:
    """SHA256: + 32 hex of SHA-256 over the canonical identity transcript."""
    pub = IdentityKey.generate().public_b64
    record = _identity("@acme/ken", pub)
    items: list[canonical.Item] = ["agentcall/identity/v1", 1, "relay.example", "@acme/ken", pub]
    expected = "SHA256:" + hashlib.sha256(canonical.encode(items)).hexdigest()[:32]
    assert keys.fingerprint(record) == expected
    assert ids.FINGERPRINT_RE.match(expected)


def test_fingerprint_changes_with_every_field() -> None:
    """Key, address and relay all change the fingerprint."""
    pub, other_pub = IdentityKey.generate().public_b64, IdentityKey.generate().public_b64
    base = keys.fingerprint(_identity("@acme/ken", pub))
    assert keys.fingerprint(_identity("@acme/ken", other_pub)) != base
    assert keys.fingerprint(_identity("@acme/bob", pub)) != base
    moved = IdentityRecord(v=1, relay_origin="other.example", address="@acme/ken", identity_pub=pub)
    assert keys.fingerprint(moved) != base
