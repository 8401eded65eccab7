"""Our HPKE is RFC 9180 HPKE: an independent implementation (pyhpke) reads and writes it."""

from __future__ import annotations

import attrs
import pytest
from pyhpke import AEADId, CipherSuite, KDFId, KEMId, OpenError

from agentcall.crypto import envelope, keys
from agentcall.errors import EnvelopeInvalid
from agentcall.wire import codec
from agentcall.wire.frames import Direction, SealedEnvelope
from agentcall.wire.payloads import SignedRequest
from tests.unit.crypto_helpers import NOW, ORIGIN, Party, make_party, sign_request

PYHPKE = CipherSuite.new(
    KEMId.DHKEM_X25519_HKDF_SHA256, KDFId.HKDF_SHA256, AEADId.CHACHA20_POLY1305
)


def _pair() -> tuple[Party, Party]:
    return make_party("@acme/ann"), make_party("@acme/ken")


def _seal(caller: Party, callee: Party, message: str) -> tuple[SealedEnvelope, SignedRequest]:
    env, payload = envelope.seal_request(
        sender=caller.identity_key,
        sender_address=caller.address,
        recipient_identity=callee.identity.record,
        recipient_encryption=callee.enc_record,
        relay_origin=ORIGIN,
        message=message,
        task="review",
        context_id=None,
        now=NOW,
    )
    return env, sign_request(payload, caller.identity_key)


def _pyhpke_open(env: SealedEnvelope, callee: Party, info: bytes) -> bytes:
    sealed = keys.b64url_decode(env.ct)
    skr = PYHPKE.kem.deserialize_private_key(callee.enc_key.private_bytes())
    context = PYHPKE.create_recipient_context(sealed[: envelope.ENC_BYTES], skr, info=info)
    opened: bytes = context.open(sealed[envelope.ENC_BYTES :])
    return opened


def test_our_envelope_opens_with_pyhpke() -> None:
    """pyhpke, given the recipient key and the header's info, recovers the signed payload."""
    caller, callee = _pair()
    env, expected = _seal(caller, callee, "héllo, wörld \U0001f600")
    plaintext = _pyhpke_open(env, callee, envelope.hpke_info(env))
    assert codec.decode(plaintext, SignedRequest) == expected


def test_pyhpke_refuses_our_envelope_under_another_info() -> None:
    """pyhpke agrees that the header is bound: a different info does not open."""
    caller, callee = _pair()
    env, _ = _seal(caller, callee, "x")
    other = attrs.evolve(
        envelope.Route(
            direction=env.direction,
            relay_origin=env.relay_origin,
            from_=env.from_,
            to=env.to,
            key_id=env.key_id,
            epoch=env.epoch,
        ),
        relay_origin="evil.example",
    )
    with pytest.raises(OpenError):
        _pyhpke_open(env, callee, envelope.hpke_info(other))


def _pyhpke_envelope(callee: Party, route: envelope.Route, plaintext: bytes) -> SealedEnvelope:
    pkr = PYHPKE.kem.deserialize_public_key(keys.b64url_decode(callee.enc_record.pub))
    enc, context = PYHPKE.create_sender_context(pkr, info=envelope.hpke_info(route))
    ct: bytes = context.seal(plaintext)
    return SealedEnvelope(
        v=1,
        direction=route.direction,
        relay_origin=route.relay_origin,
        from_=route.from_,
        to=route.to,
        key_id=route.key_id,
        epoch=route.epoch,
        ct=keys.b64url_encode(enc + ct),
    )


def _route(caller: Party, callee: Party) -> envelope.Route:
    return envelope.Route(
        direction=Direction.REQUEST,
        relay_origin=ORIGIN,
        from_=caller.address,
        to=callee.address,
        key_id=callee.enc_record.key_id,
        epoch=callee.enc_record.epoch,
    )


def _open(env: SealedEnvelope, caller: Party, callee: Party) -> object:
    return envelope.open_request(
        env,
        my_key=callee.enc_key,
        my_record=callee.enc_record,
        relay_origin=ORIGIN,
        expected_from=caller.address,
        expected_to=callee.address,
        sender_identity_pub=caller.identity_pub,
        now=NOW + 1,
    )


def test_pyhpke_envelope_opens_here() -> None:
    """A signed request sealed by pyhpke under the same info opens and verifies here."""
    caller, callee = _pair()
    _, signed = _seal(caller, callee, "sealed elsewhere")
    env = _pyhpke_envelope(callee, _route(caller, callee), codec.encode(signed))
    assert _open(env, caller, callee) == signed.payload


def test_pyhpke_envelope_under_another_info_is_refused_here() -> None:
    """What pyhpke sealed for one header does not open here under another header."""
    caller, callee = _pair()
    _, signed = _seal(caller, callee, "x")
    other_sender = attrs.evolve(_route(caller, callee), from_="@acme/zed")
    sealed = _pyhpke_envelope(callee, other_sender, codec.encode(signed))
    relabelled = attrs.evolve(sealed, from_=caller.address)
    with pytest.raises(EnvelopeInvalid, match="HPKE open failed"):
        _open(relabelled, caller, callee)
