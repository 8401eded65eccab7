"""The relay attaches the caller's current key records to incoming_call and job_delivery.

The records come from the same store that serves ``GET /v1/keys``, asked beside the directory
lookup of the target; attaching is never a condition for the call: no records, a caller
without an encryption record, or a store that fails all ring the listener without them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from agentcall import limits
from agentcall.errors import StoreError
from agentcall.relay.calls import CallBook
from agentcall.relay.ratelimit import SlidingWindowLimiter
from agentcall.relay.switchboard import Switchboard
from agentcall.testing.channels import MemoryDirectory, RecordingAudit, RecordingChannel
from agentcall.wire.frames import CallRequest, CallStatus, Direction, IncomingCall, JobDelivery
from agentcall.wire.keyrecords import KeysResponse
from tests.unit.crypto_helpers import make_party
from tests.unit.relay_helpers import fired, sealed_looking
from tests.unit.test_relay_jobs import Desk

ORIGIN = "relay.example"
T0 = 1_750_000_000.0
CORRELATION = "c0ffee" + "0" * 26
ANA = make_party("@acme/ana", origin=ORIGIN)
ANA_KEYS = KeysResponse(identity=ANA.identity, encryption=ANA.encryption)


class Keys:
    """A key source that answers from a dict, at once or when told."""

    def __init__(self, served: dict[tuple[str, str], KeysResponse | None]) -> None:
        self.served = served
        self.asked: list[tuple[str, str]] = []
        self.hold = False
        self.failure: Exception | None = None
        self.pending: list[tuple[Deferred[KeysResponse | None], KeysResponse | None]] = []

    def fetch_keys(self, org: str, handle: str) -> Deferred[KeysResponse | None]:
        self.asked.append((org, handle))
        if self.failure is not None:
            return fail(self.failure)
        found = self.served.get((org, handle))
        if not self.hold:
            return succeed(found)
        answer: Deferred[KeysResponse | None] = Deferred()
        self.pending.append((answer, found))
        return answer

    def release(self) -> None:
        pending, self.pending = self.pending, []
        for answer, found in pending:
            answer.callback(found)


def book(keys: Keys | None) -> tuple[CallBook, RecordingChannel]:
    clock = Clock()
    clock.advance(T0)
    board = Switchboard()
    ken = RecordingChannel("ken-listener")
    board.attach_listener("acme", "ken", ken)
    calls = CallBook(
        clock,
        board,
        MemoryDirectory({("acme", "ana"), ("acme", "ken")}),
        RecordingAudit(),
        SlidingWindowLimiter(limits.CALLS_PER_HOUR_PER_PAIR, limits.RATE_WINDOW_S),
        ORIGIN,
        keys=keys,
    )
    return calls, ken


def call(calls: CallBook) -> RecordingChannel:
    caller = RecordingChannel("ana-caller")
    envelope = sealed_looking(Direction.REQUEST, "@acme/ana", "@acme/ken", ORIGIN)
    calls.submit(
        "acme", "ana", "ken", caller, CallRequest(envelope=envelope, correlation_id=CORRELATION)
    )
    return caller


def test_incoming_call_carries_the_callers_records() -> None:
    keys = Keys({("acme", "ana"): ANA_KEYS})
    calls, ken = book(keys)
    call(calls)
    (incoming,) = ken.of_type(IncomingCall)
    assert incoming.caller_keys == ANA_KEYS
    # The caller's records, looked up in the caller's own organisation; never the callee's.
    assert keys.asked == [("acme", "ana")]


def test_without_a_key_source_nothing_is_attached() -> None:
    calls, ken = book(None)
    call(calls)
    (incoming,) = ken.of_type(IncomingCall)
    assert incoming.caller_keys is None


@pytest.mark.parametrize(
    "served",
    [None, KeysResponse(identity=ANA.identity)],
    ids=["nothing published", "no encryption record"],
)
def test_incomplete_records_are_not_attached(served: KeysResponse | None) -> None:
    """The listener then fetches, and refuses the call for the reason it finds itself."""
    calls, ken = book(Keys({("acme", "ana"): served}))
    call(calls)
    (incoming,) = ken.of_type(IncomingCall)
    assert incoming.caller_keys is None


def test_a_failing_key_lookup_still_rings_without_records() -> None:
    keys = Keys({})
    keys.failure = StoreError("database is locked")
    calls, ken = book(keys)
    with capturedLogs() as events:
        caller = call(calls)
    (incoming,) = ken.of_type(IncomingCall)
    assert incoming.caller_keys is None
    assert isinstance(caller.sent[0], CallStatus)
    assert [e.get("event") for e in events if e.get("event") == "caller_keys_unavailable"] == [
        "caller_keys_unavailable"
    ]


def test_the_call_rings_only_once_the_records_have_come() -> None:
    """A store that answers later: the listener hears of the call with its records, not before
    them and not without them."""
    keys = Keys({("acme", "ana"): ANA_KEYS})
    keys.hold = True
    calls, ken = book(keys)
    caller = call(calls)
    assert ken.sent == [] and caller.sent == []
    keys.release()
    (incoming,) = ken.of_type(IncomingCall)
    assert incoming.caller_keys == ANA_KEYS
    assert isinstance(caller.sent[0], CallStatus)


# --- job_delivery --------------------------------------------------------------------------


def test_a_delivered_job_carries_the_callers_records_as_they_are_at_delivery(
    tmp_path: Path,
) -> None:
    """Queued while ken was away; delivered with ana's records read at delivery."""
    relay = Desk(tmp_path / "relay.sqlite", keys=True)
    relay.opt_in("ken")
    fired(relay.sqlite.publish_identity("acme", "ana", ANA.identity, T0))
    fired(relay.sqlite.publish_encryption("acme", "ana", ANA.encryption, T0))
    job_id = relay.queued()
    ken = relay.listen()
    (delivery,) = ken.of_type(JobDelivery)
    assert delivery.job_id == job_id
    assert delivery.caller_keys == ANA_KEYS


def test_a_job_of_a_caller_without_records_is_delivered_without_them(tmp_path: Path) -> None:
    relay = Desk(tmp_path / "relay.sqlite", keys=True)
    relay.opt_in("ken")
    relay.queued()
    ken = relay.listen()
    (delivery,) = ken.of_type(JobDelivery)
    assert delivery.caller_keys is None
