"""Shared builders for the crypto tests: parties with keys and records, forged envelopes."""

from __future__ import annotations

import attrs

from agentcall.crypto import envelope, keys, records, transcripts
from agentcall.crypto.keys import EncryptionKey, IdentityKey
from agentcall.wire import canonical, codec
from agentcall.wire.frames import SealedEnvelope
from agentcall.wire.http import (
    EncryptionKeyRecord,
    SignedEncryptionKeyRecord,
    SignedIdentityRecord,
)
from agentcall.wire.payloads import RequestPayload, ResponsePayload, SignedRequest, SignedResponse

ORIGIN = "relay.example"
NOW = 1_750_000_000
DAY = 24 * 3600


@attrs.frozen
class Party:
    address: str
    identity_key: IdentityKey
    enc_key: EncryptionKey
    identity: SignedIdentityRecord
    encryption: SignedEncryptionKeyRecord

    @property
    def identity_pub(self) -> str:
        return self.identity_key.public_b64

    @property
    def enc_record(self) -> EncryptionKeyRecord:
        return self.encryption.record

    def secrets(self) -> list[str]:
        """Every spelling of this party's secrets that must never leak into text."""
        out = []
        for raw in (self.identity_key.seed_bytes(), self.enc_key.private_bytes()):
            out += [keys.b64url_encode(raw), raw.hex()]
        return out


def make_party(
    address: str,
    *,
    origin: str = ORIGIN,
    not_before: int = NOW - DAY,
    not_after: int = NOW + 29 * DAY,
) -> Party:
    identity_key = IdentityKey.generate()
    enc_key = EncryptionKey.generate()
    return Party(
        address=address,
        identity_key=identity_key,
        enc_key=enc_key,
        identity=records.make_identity_record(identity_key, origin, address),
        encryption=records.make_encryption_record(
            identity_key,
            enc_key,
            origin,
            address,
            epoch=1,
            not_before=not_before,
            not_after=not_after,
            previous=None,
        ),
    )


def rotate(party: Party, *, not_before: int = NOW - DAY, not_after: int = NOW + 29 * DAY) -> Party:
    """The same identity with its next encryption epoch."""
    enc_key = EncryptionKey.generate()
    encryption = records.make_encryption_record(
        party.identity_key,
        enc_key,
        party.identity.record.relay_origin,
        party.address,
        epoch=party.enc_record.epoch + 1,
        not_before=not_before,
        not_after=not_after,
        previous=party.encryption,
    )
    return attrs.evolve(party, enc_key=enc_key, encryption=encryption)


def sign_request(payload: RequestPayload, signer: IdentityKey) -> SignedRequest:
    signature = signer.sign(canonical.encode(transcripts.request_transcript(payload)))
    return SignedRequest(payload=payload, signature=signature)


def sign_response(payload: ResponsePayload, signer: IdentityKey) -> SignedResponse:
    signature = signer.sign(canonical.encode(transcripts.response_transcript(payload)))
    return SignedResponse(payload=payload, signature=signature)


def seal_raw(
    header: envelope.Route, plaintext: bytes, recipient: EncryptionKeyRecord
) -> SealedEnvelope:
    """Seal any plaintext under any header, as a forger holding no secret key could."""
    sealed = envelope.SUITE.encrypt(
        plaintext, keys.x25519_public_key(recipient.pub), info=envelope.hpke_info(header)
    )
    return SealedEnvelope(
        v=header.v,
        direction=header.direction,
        relay_origin=header.relay_origin,
        from_=header.from_,
        to=header.to,
        key_id=header.key_id,
        epoch=header.epoch,
        ct=keys.b64url_encode(sealed),
    )


def route_of(env: SealedEnvelope) -> envelope.Route:
    return envelope.Route(
        direction=env.direction,
        relay_origin=env.relay_origin,
        from_=env.from_,
        to=env.to,
        key_id=env.key_id,
        epoch=env.epoch,
        v=env.v,
    )


def reseal_signed(
    env: SealedEnvelope, signed: SignedRequest | SignedResponse, recipient: EncryptionKeyRecord
) -> SealedEnvelope:
    """The same header, a different signed payload inside."""
    return seal_raw(route_of(env), codec.encode(signed), recipient)
