"""Step 2 with the caller's records attached by the relay (incoming_call.caller_keys).

Attached records spare the listener a fetch and are believed exactly as fetched ones would be:
they must name the caller in our organisation and our relay, match the pin (or become it),
verify from the pinned identity and be inside their window. Records that fail are refused
(call_rejected), never replaced by a fetch; a call without them (an older relay) is fetched.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from agentcall.crypto import records
from agentcall.listener.callermessage import open_for_prompt
from agentcall.listener.calllog import CallStatus
from agentcall.listener.mailboxdesk import incoming_of
from agentcall.wire.frames import CallAccepted, CallRejected, CallStarted, IncomingCall, JobDelivery
from agentcall.wire.keyrecords import KeysResponse
from tests.unit.crypto_helpers import DAY, NOW, ORIGIN, Party, make_party, rotate
from tests.unit.test_listener_core import Harness
from tests.unit.test_listener_stages import (
    ANN,
    CALL_ID,
    MALLORY,
    MESSAGE,
    Opener,
    call_from,
)


def keys_of(party: Party) -> KeysResponse:
    return KeysResponse(identity=party.identity, encryption=party.encryption)


def attached(call: IncomingCall, keys: KeysResponse | None) -> IncomingCall:
    return attrs.evolve(call, caller_keys=keys)


def test_attached_records_are_used_and_nothing_is_fetched() -> None:
    opener = Opener()
    opened = opener.open(attached(call_from(ANN), keys_of(ANN)))
    assert open_for_prompt(opened.message) == MESSAGE
    assert opened.facts.caller_encryption == ANN.enc_record
    assert opener.directory.asked == []
    pin = opener.pin_storage.get(ORIGIN, "@acme/ann")
    assert pin is not None and pin.identity_pub == ANN.identity_pub


def test_without_attached_records_the_caller_is_fetched() -> None:
    """From an older relay: exactly today's behaviour."""
    opener = Opener()
    opener.open(call_from(ANN))
    assert opener.directory.asked == ["ann"]


def test_attached_records_of_a_newer_epoch_raise_the_pin() -> None:
    """The caller rotated since we pinned it: the attached epoch chains from the pinned
    identity and becomes the highest seen."""
    opener = Opener()
    opener.open(attached(call_from(ANN), keys_of(ANN)))
    newer = rotate(ANN)
    opener.open(
        attached(call_from(newer, call_id="2d8f2e3f-9c73-4d73-9c5f-4b2f8b3e1f33"), keys_of(newer))
    )
    pin = opener.pin_storage.get(ORIGIN, "@acme/ann")
    assert pin is not None and pin.highest_epoch == 2
    assert opener.directory.asked == []


# --- refused: each as a forged fetched record would be --------------------------------------


def _pin_ann(opener: Opener) -> None:
    opener.open(attached(call_from(ANN), keys_of(ANN)))


def _mallorys_own(_opener: Opener) -> KeysResponse:
    # Genuine records, of someone else.
    return keys_of(MALLORY)


def _other_org(_opener: Opener) -> KeysResponse:
    twin = make_party("@other/ann")
    return keys_of(twin)


def _other_relay(_opener: Opener) -> KeysResponse:
    return keys_of(make_party("@acme/ann", origin="evil.example"))


def _identity_swapped(opener: Opener) -> KeysResponse:
    """After ann is pinned: an identity of the relay's making under her address."""
    _pin_ann(opener)
    return keys_of(make_party("@acme/ann"))


def _identity_swapped_and_rolled_back(opener: Opener) -> KeysResponse:
    """After ann's epoch 2 is pinned: an identity of the relay's making, at epoch 1."""
    newer = rotate(ANN)
    opener.open(attached(call_from(newer), keys_of(newer)))
    return keys_of(make_party("@acme/ann"))


def _encryption_signed_by_another(_opener: Opener) -> KeysResponse:
    """Ann's identity, with an encryption record Mallory signed for ann's address."""
    forged = make_party("@acme/ann")
    record = records.make_encryption_record(
        MALLORY.identity_key,
        forged.enc_key,
        ORIGIN,
        "@acme/ann",
        epoch=1,
        not_before=NOW - DAY,
        not_after=NOW + 29 * DAY,
        previous=None,
    )
    return KeysResponse(identity=ANN.identity, encryption=record)


def _bad_identity_signature(_opener: Opener) -> KeysResponse:
    flipped = ANN.identity.signature[:-2] + ("AA" if ANN.identity.signature[-2:] != "AA" else "BB")
    return KeysResponse(
        identity=attrs.evolve(ANN.identity, signature=flipped), encryption=ANN.encryption
    )


def _expired(_opener: Opener) -> KeysResponse:
    old = make_party("@acme/ann", not_before=NOW - 31 * DAY, not_after=NOW - DAY)
    return keys_of(old)


def _rolled_back(opener: Opener) -> KeysResponse:
    """Ann's epoch 2 is pinned; the relay attaches her epoch 1 again."""
    newer = rotate(ANN)
    opener.open(attached(call_from(newer), keys_of(newer)))
    return keys_of(ANN)


def _no_encryption(_opener: Opener) -> KeysResponse:
    return KeysResponse(identity=ANN.identity)


REFUSED: list[tuple[str, Callable[[Opener], KeysResponse], str]] = [
    ("another member's records", _mallorys_own, "caller_keys_untrusted:KeyRecordInvalid"),
    ("records from another organisation", _other_org, "caller_keys_untrusted:KeyRecordInvalid"),
    ("records for another relay", _other_relay, "caller_keys_untrusted:KeyRecordInvalid"),
    ("a changed identity", _identity_swapped, "caller_keys_untrusted:IdentityChanged"),
    (
        "a changed identity at an older epoch",
        _identity_swapped_and_rolled_back,
        "caller_keys_untrusted:IdentityChanged",
    ),
    (
        "an encryption record signed by another",
        _encryption_signed_by_another,
        "caller_keys_untrusted:KeyRecordInvalid",
    ),
    (
        "a forged identity signature",
        _bad_identity_signature,
        "caller_keys_untrusted:KeyRecordInvalid",
    ),
    ("an expired encryption record", _expired, "caller_keys_untrusted:KeyRecordExpired"),
    ("an epoch below the pin", _rolled_back, "caller_keys_untrusted:EpochRollback"),
    ("no encryption record", _no_encryption, "caller_has_no_encryption_key"),
]


@pytest.mark.parametrize(("case", "make", "reason"), REFUSED, ids=[c for c, _, _ in REFUSED])
def test_untrustworthy_attached_records_are_refused_and_never_refetched(
    case: str, make: Callable[[Opener], KeysResponse], reason: str
) -> None:
    opener = Opener()
    keys = make(opener)
    asked_before = list(opener.directory.asked)
    reserved_before = opener.replay_storage.count_live(opener.clock.seconds())
    call = attached(call_from(ANN, call_id=CALL_ID), keys)
    assert opener.rejection(call) == reason
    # No second opinion from the relay: a refused record is not swapped for a fetched one.
    assert opener.directory.asked == asked_before
    # Nothing was reserved for a request that was not opened.
    assert opener.replay_storage.count_live(opener.clock.seconds()) == reserved_before


def test_a_mailbox_delivery_hands_its_attached_records_to_the_pipeline() -> None:
    call = call_from(ANN)
    delivery = JobDelivery(
        job_id=CALL_ID,
        from_="ann",
        envelope=call.envelope,
        expires_at=int(NOW) + 3600,
        attempt=1,
        caller_keys=keys_of(ANN),
    )
    assert incoming_of(delivery).caller_keys == keys_of(ANN)
    assert incoming_of(attrs.evolve(delivery, caller_keys=None)).caller_keys is None


# --- through the pipeline --------------------------------------------------------------------


def test_the_pipeline_answers_a_call_with_attached_records_without_fetching() -> None:
    h = Harness()
    h.pipeline.handle_incoming(attached(call_from(ANN), keys_of(ANN)))
    assert [type(frame) for frame in h.sent] == [CallAccepted, CallStarted]
    assert h.directory.asked == []


def test_forged_attached_records_end_in_call_rejected_with_nothing_spawned() -> None:
    """The relay attaches mallory's genuine records to ann's call: rejected before admission,
    no prompt, no run, no fetch to be talked round by."""
    h = Harness()
    h.pipeline.handle_incoming(attached(call_from(ANN), keys_of(MALLORY)))
    assert h.sent == [CallRejected(call_id=CALL_ID)]
    assert (h.prompts, h.runs, h.admissions) == ([], [], 0)
    assert [r.status for r in h.records] == [CallStatus.PROTOCOL_ERROR]
    assert h.directory.asked == []
