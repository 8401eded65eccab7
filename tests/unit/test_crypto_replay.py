"""The replay window: duplicates, lifetimes, bounds, and its use after opening a request."""

from __future__ import annotations

import pytest
from zope.interface.verify import verifyObject

from agentcall import limits
from agentcall.crypto import envelope, keys
from agentcall.crypto.replay import (
    IReplayStorage,
    MemoryReplayStorage,
    ReplayWindow,
    ReplayWindowFull,
)
from agentcall.errors import ReplayDetected, RequestExpired
from tests.unit.crypto_helpers import NOW, ORIGIN, make_party

FP_A = "SHA256:" + "a" * 32
FP_B = "SHA256:" + "b" * 32
RID = "0123456789abcdef" * 2
SKEW = limits.CLOCK_SKEW_S


def test_memory_storage_provides_the_interface() -> None:
    """The in-memory store is a complete IReplayStorage."""
    assert verifyObject(IReplayStorage, MemoryReplayStorage())


def test_duplicate_request_id_is_refused() -> None:
    """The same sender cannot use a request id twice while it is live."""
    window = ReplayWindow()
    window.reserve(FP_A, RID, NOW + 360, NOW)
    with pytest.raises(ReplayDetected, match="already used") as info:
        window.reserve(FP_A, RID, NOW + 360, NOW + 10)
    assert not isinstance(info.value, ReplayWindowFull)


def test_request_ids_are_per_sender() -> None:
    """Two senders may happen to use the same request id."""
    window = ReplayWindow()
    window.reserve(FP_A, RID, NOW + 360, NOW)
    window.reserve(FP_B, RID, NOW + 360, NOW)
    assert window.live_count(NOW) == 2


def test_reservation_lives_until_expiry_plus_skew() -> None:
    """A duplicate is refused until expires_at + CLOCK_SKEW_S, then the slot is free."""
    window = ReplayWindow()
    expires_at = NOW + 360
    window.reserve(FP_A, RID, expires_at, NOW)
    with pytest.raises(ReplayDetected):
        window.reserve(FP_A, RID, expires_at, expires_at + SKEW - 0.001)
    window.reserve(FP_A, RID, expires_at + SKEW + 360, expires_at + SKEW)


def test_far_future_expiry_is_refused() -> None:
    """No reservation may outlive the longest legitimate request (a queued job's 72 h + skew)."""
    window = ReplayWindow()
    window.reserve(FP_A, RID, NOW + limits.MAX_ENVELOPE_VALIDITY_S + SKEW, NOW)
    with pytest.raises(RequestExpired, match="further ahead"):
        window.reserve(FP_B, RID, NOW + limits.MAX_ENVELOPE_VALIDITY_S + SKEW + 0.5, NOW)
    assert window.live_count(NOW) == 1


def test_full_window_refuses_then_recovers() -> None:
    """At capacity new ids are refused (ReplayWindowFull); expired entries free the room."""
    window = ReplayWindow(max_entries=3)
    for index in range(3):
        window.reserve(FP_A, f"{index:032x}", NOW + 100, NOW)
    with pytest.raises(ReplayWindowFull, match="full"):
        window.reserve(FP_A, "f" * 32, NOW + 100, NOW + 1)
    assert issubclass(ReplayWindowFull, ReplayDetected)
    window.reserve(FP_A, "f" * 32, NOW + 100 + SKEW + 300, NOW + 100 + SKEW)


def test_duplicate_in_a_full_window_is_reported_as_a_replay() -> None:
    """A replay is named as such even when the window is also full."""
    window = ReplayWindow(max_entries=1)
    window.reserve(FP_A, RID, NOW + 100, NOW)
    with pytest.raises(ReplayDetected) as info:
        window.reserve(FP_A, RID, NOW + 100, NOW)
    assert not isinstance(info.value, ReplayWindowFull)


def test_prune_drops_only_dead_entries() -> None:
    """prune removes entries whose keep-until has passed and reports how many."""
    window = ReplayWindow()
    window.reserve(FP_A, "1" * 32, NOW + 10, NOW)
    window.reserve(FP_A, "2" * 32, NOW + 300, NOW)
    assert window.prune(NOW + 10 + SKEW - 1) == 0
    assert window.prune(NOW + 10 + SKEW) == 1
    assert window.live_count(NOW + 10 + SKEW) == 1


def test_window_needs_room_for_one() -> None:
    """A window of size zero is a configuration error."""
    with pytest.raises(ValueError):
        ReplayWindow(max_entries=0)


def test_window_uses_the_storage_it_is_given() -> None:
    """A supplied storage holds the reservations (so a SQLite one can stand in later)."""
    storage = MemoryReplayStorage()
    window = ReplayWindow(storage=storage)
    window.reserve(FP_A, RID, NOW + 60, NOW)
    assert storage.keep_until(FP_A, RID) == NOW + 60 + SKEW
    with pytest.raises(ReplayDetected):
        ReplayWindow(storage=storage).reserve(FP_A, RID, NOW + 60, NOW)


def test_replayed_envelope_is_refused_after_opening() -> None:
    """A captured request envelope opens again, but its id cannot be reserved twice."""
    caller, callee = make_party("@acme/ann"), make_party("@acme/ken")
    env, _ = envelope.seal_request(
        sender=caller.identity_key,
        sender_address=caller.address,
        recipient_identity=callee.identity.record,
        recipient_encryption=callee.enc_record,
        relay_origin=ORIGIN,
        message="deploy please",
        task=None,
        context_id=None,
        now=NOW,
    )
    window = ReplayWindow()
    sender_fp = keys.fingerprint(caller.identity.record)
    for attempt, now in enumerate((NOW + 1.0, NOW + 30.0)):
        payload = envelope.open_request(
            env,
            my_key=callee.enc_key,
            my_record=callee.enc_record,
            relay_origin=ORIGIN,
            expected_from=caller.address,
            expected_to=callee.address,
            sender_identity_pub=caller.identity_pub,
            now=now,
        )
        if attempt == 0:
            window.reserve(sender_fp, payload.request_id, payload.expires_at, now)
        else:
            with pytest.raises(ReplayDetected):
                window.reserve(sender_fp, payload.request_id, payload.expires_at, now)
