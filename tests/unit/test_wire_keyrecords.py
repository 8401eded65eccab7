"""The caller's key records on incoming_call and job_delivery: optional, bounded, and a frame
without them reads exactly as before."""

from __future__ import annotations

import json

from agentcall import limits
from agentcall.wire import codec, frames, http, keyrecords

ORIGIN = "r" * 245 + ".example"  # the longest relay origin the grammar allows (with a port)
ADDRESS = "@" + "o" * 20 + "/" + "h" * 31
CALL_ID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def _largest_keys() -> keyrecords.KeysResponse:
    origin = ORIGIN + ":65535"
    identity = keyrecords.SignedIdentityRecord(
        record=keyrecords.IdentityRecord(
            v=1, relay_origin=origin, address=ADDRESS, identity_pub="P" * 43
        ),
        signature="S" * 86,
    )
    encryption = keyrecords.SignedEncryptionKeyRecord(
        record=keyrecords.EncryptionKeyRecord(
            v=1,
            relay_origin=origin,
            address=ADDRESS,
            key_id="ab" * 16,
            suite=keyrecords.SUITE_X25519,
            pub="Q" * 43,
            epoch=2**31,
            not_before=2**40 - limits.MAX_KEY_VALIDITY_S,
            not_after=2**40,
            prev="cd" * 16,
        ),
        signature="T" * 86,
    )
    return keyrecords.KeysResponse(identity=identity, encryption=encryption)


def _envelope() -> frames.SealedEnvelope:
    return frames.SealedEnvelope(
        v=1,
        direction=frames.Direction.REQUEST,
        relay_origin="relay.example",
        from_="@acme/ann",
        to="@acme/ken",
        key_id="ab" * 16,
        epoch=1,
        ct="Q" * 60,
    )


def test_http_still_names_the_key_records() -> None:
    """Existing imports from agentcall.wire.http keep working: the same classes."""
    assert http.KeysResponse is keyrecords.KeysResponse
    assert http.SignedIdentityRecord is keyrecords.SignedIdentityRecord
    assert http.SignedEncryptionKeyRecord is keyrecords.SignedEncryptionKeyRecord
    assert http.SUITES is keyrecords.SUITES


def test_a_frame_without_caller_keys_is_written_as_before() -> None:
    """No caller_keys key at all when there are none: an older listener reads it unchanged."""
    incoming = frames.IncomingCall(
        call_id=CALL_ID, from_="ann", envelope=_envelope(), correlation_id="12" * 16
    )
    raw = json.loads(codec.encode(incoming))
    assert list(raw) == ["type", "call_id", "from", "envelope", "correlation_id", "groups"]
    delivery = frames.JobDelivery(
        job_id=CALL_ID, from_="ann", envelope=_envelope(), expires_at=10, attempt=1
    )
    raw = json.loads(codec.encode(delivery))
    assert list(raw) == ["type", "job_id", "from", "envelope", "expires_at", "attempt"]


def test_caller_keys_round_trip_on_both_frames() -> None:
    keys = _largest_keys()
    for frame in (
        frames.IncomingCall(
            call_id=CALL_ID,
            from_="ann",
            envelope=_envelope(),
            correlation_id="12" * 16,
            caller_keys=keys,
        ),
        frames.JobDelivery(
            job_id=CALL_ID,
            from_="ann",
            envelope=_envelope(),
            expires_at=10,
            attempt=1,
            caller_keys=keys,
        ),
    ):
        assert codec.decode_frame(codec.encode(frame), frames.TO_LISTENER) == frame


def test_the_largest_records_fit_the_room_the_listener_makes_for_them() -> None:
    """The listener's byte cap leaves at least MAX_CALLER_KEYS_BYTES above the largest request:
    the largest records the wire allows, with their JSON key, fit in that room."""
    encoded = codec.encode(_largest_keys())
    assert len(encoded) + len(',"caller_keys":') < limits.MAX_CALLER_KEYS_BYTES
    assert (
        limits.MAX_TO_LISTENER_FRAME_BYTES
        >= limits.MAX_REQUEST_FRAME_BYTES + limits.MAX_CALLER_KEYS_BYTES
    )
    # ... and it also takes the answer to an outgoing call on the persistent socket.
    assert limits.MAX_TO_LISTENER_FRAME_BYTES >= limits.MAX_RESPONSE_FRAME_BYTES


def test_attached_records_are_encoded_once_per_object_and_spliced_as_the_same_bytes() -> None:
    """The relay attaches one caller's cached records to each of its incoming_calls: the codec
    encodes a KeysResponse object once and splices that text afterwards. The bytes are those
    of a plain encoding; new records (a new object, as after a publish) are encoded anew."""
    from tests.unit.crypto_helpers import make_party

    def plain(value: object) -> bytes:
        raw = codec.converter.unstructure(value)
        return json.dumps(raw, ensure_ascii=False, separators=(",", ":")).encode()

    def incoming(keys: keyrecords.KeysResponse) -> frames.IncomingCall:
        envelope = frames.SealedEnvelope(
            v=1,
            direction=frames.Direction.REQUEST,
            relay_origin="relay.example",
            from_="@acme/ann",
            to="@acme/ken",
            key_id="a" * 32,
            epoch=1,
            ct="Zm9vYmFy-_" * 20,
        )
        return frames.IncomingCall(
            call_id="7d1b0d2e-5bd1-4b8a-9a43-3f8d2c3e0a11",
            from_="ann",
            envelope=envelope,
            correlation_id="b" * 32,
            caller_keys=keys,
        )

    ann = make_party("@acme/ann")
    keys = keyrecords.KeysResponse(identity=ann.identity, encryption=ann.encryption)
    first = codec.encode(incoming(keys))
    assert codec._ENCODED_ONCE[id(keys)][0] is keys
    assert first == plain(incoming(keys)) == codec.encode(incoming(keys))
    assert codec.decode_frame(first) == incoming(keys)
    # Outside the encoder the shape unstructures as ever (a dict, not text).
    assert isinstance(codec.converter.unstructure(keys), dict)

    renewed = keyrecords.KeysResponse(identity=make_party("@acme/ann").identity)
    again = codec.encode(incoming(renewed))
    assert again == plain(incoming(renewed)) != first
    assert codec.decode_frame(again) == incoming(renewed)
