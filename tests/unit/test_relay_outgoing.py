"""Outgoing calls on an installation's persistent socket, through the real call book on a Clock.

The ports must make the book's per-call behaviour hold for several calls on one socket: every
answer reaches the socket tagged with its request's correlation id, an ending ends one call and
never the socket, a cancel reaches only the socket's own call, and a closed socket is a caller
that went away for every call still on it.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
from twisted.internet import defer
from twisted.logger import capturedLogs

from agentcall import limits
from agentcall.errors import CallErrorCode
from agentcall.relay.outgoing import SocketCalls
from agentcall.testing.channels import RecordingChannel
from agentcall.wire.frames import (
    CallAccepted,
    CallError,
    CallQueued,
    CallRequest,
    CallState,
    CallStatus,
    CancelCall,
    IncomingCall,
)
from tests.unit.test_relay_calls import Relay, envelope, reply

CID_1 = "a1" * 16
CID_2 = "b2" * 16
JOB_ID = "00000000-0000-4000-8000-0000000000aa"


def outgoing(target: str = "ken", cid: str = CID_1, **route: Any) -> CallRequest:
    """A request from ana to ``target`` on her socket; ``route`` changes the envelope header."""
    return CallRequest(envelope=envelope(**route), correlation_id=cid, to=target)


class Installation:
    """ana's persistent socket (she listens too) on a relay where ken listens."""

    def __init__(self, relay: Relay | None = None, max_calls: int = 8) -> None:
        self.relay = relay or Relay()
        self.socket = self.relay.listen("acme", "ana")
        self.calls = SocketCalls(self.relay.book, self.socket, "acme", "ana", max_calls=max_calls)

    def ringing(self, cid: str = CID_1) -> str:
        [status] = [
            f
            for f in self.socket.of_type(CallStatus)
            if f.correlation_id == cid and f.state is CallState.RINGING
        ]
        return status.call_id


def test_an_outgoing_call_rings_with_its_correlation_id_and_its_answer_comes_back() -> None:
    ana = Installation()
    ana.calls.request(outgoing())
    call_id = ana.ringing()
    [incoming] = ana.relay.ken.of_type(IncomingCall)
    assert (incoming.call_id, incoming.from_, incoming.correlation_id) == (call_id, "ana", CID_1)

    ana.relay.book.from_listener("acme", "ken", ana.relay.ken, CallAccepted(call_id=call_id))
    answer = reply(call_id)
    ana.relay.book.from_listener("acme", "ken", ana.relay.ken, answer)

    assert ana.socket.sent[-2:] == [
        CallStatus(call_id=call_id, state=CallState.ANSWERED, correlation_id=CID_1),
        answer,  # the very object, so the relay can forward the bytes it came in as
    ]
    assert ana.socket.sent[-1] is answer
    assert not ana.socket.closed  # the call ended, the socket did not
    assert ana.calls.in_flight() == 0
    assert ana.relay.book.active_count() == 0


def test_several_calls_at_once_each_keep_their_own_tag() -> None:
    relay = Relay()
    bob = relay.listen("acme", "bob")
    ana = Installation(relay)
    ana.calls.request(outgoing("ken", CID_1))
    ana.calls.request(outgoing("bob", CID_2, to="@acme/bob"))
    to_ken, to_bob = ana.ringing(CID_1), ana.ringing(CID_2)
    assert to_ken != to_bob and ana.calls.in_flight() == 2
    [incoming] = bob.of_type(IncomingCall)
    assert incoming.call_id == to_bob

    bob_answer = reply(to_bob, from_="@acme/bob")
    relay.book.from_listener("acme", "bob", bob, bob_answer)
    assert ana.socket.sent[-1] is bob_answer
    assert ana.calls.in_flight() == 1 and relay.book.get(to_ken) is not None


def test_a_refusal_by_the_book_is_tagged_and_leaves_the_socket_open() -> None:
    ana = Installation()
    ana.calls.request(outgoing("nobody", to="@acme/nobody"))
    [error] = ana.socket.of_type(CallError)
    assert error.code is CallErrorCode.UNKNOWN_HANDLE and error.correlation_id == CID_1
    assert not ana.socket.closed and ana.calls.in_flight() == 0


def test_a_forged_route_is_refused_as_on_a_call_socket() -> None:
    ana = Installation()
    ana.calls.request(outgoing(from_="@acme/bob"))  # the envelope claims another sender
    [error] = ana.socket.of_type(CallError)
    assert error.code is CallErrorCode.PROTOCOL_ERROR and error.correlation_id == CID_1
    assert ana.relay.ken.of_type(IncomingCall) == []


def test_a_request_without_a_target_or_with_a_correlation_id_in_flight_is_refused() -> None:
    ana = Installation()
    ana.calls.request(CallRequest(envelope=envelope(), correlation_id=CID_1))
    ana.calls.request(outgoing())
    ana.calls.request(outgoing())  # the same correlation id while the first is in flight
    errors = ana.socket.of_type(CallError)
    assert [(e.code, e.correlation_id) for e in errors] == [
        (CallErrorCode.PROTOCOL_ERROR, CID_1),
        (CallErrorCode.PROTOCOL_ERROR, CID_1),
    ]
    assert len(ana.relay.ken.of_type(IncomingCall)) == 1 and ana.calls.in_flight() == 1


def test_calls_in_flight_on_one_socket_are_capped() -> None:
    relay = Relay()
    ana = Installation(relay, max_calls=2)
    for n in range(3):
        ana.calls.request(outgoing(cid=f"{n + 1:032x}"))
    [error] = ana.socket.of_type(CallError)
    assert error.code is CallErrorCode.RATE_LIMITED and error.correlation_id == f"{3:032x}"
    assert ana.calls.in_flight() == 2
    # One ends: there is room again.
    relay.book.from_listener("acme", "ken", relay.ken, reply(ana.ringing(f"{1:032x}")))
    ana.calls.request(outgoing(cid=f"{4:032x}"))
    assert ana.calls.in_flight() == 2 and len(ana.socket.of_type(CallError)) == 1


def test_a_cancel_reaches_only_the_sockets_own_call() -> None:
    relay = Relay()
    ana = Installation(relay)
    bob_socket = relay.listen("acme", "bob")
    bob = SocketCalls(relay.book, bob_socket, "acme", "bob")
    bob.request(outgoing(cid=CID_2, from_="@acme/bob"))
    [bob_ringing] = bob_socket.of_type(CallStatus)
    ana.calls.request(outgoing())
    ana_call = ana.ringing()

    ana.calls.cancel(CancelCall(call_id=bob_ringing.call_id))  # not ana's call
    assert relay.ken.of_type(CancelCall) == []
    ana.calls.cancel(CancelCall(call_id=ana_call))
    assert relay.ken.of_type(CancelCall) == [CancelCall(call_id=ana_call)]


def test_a_closed_socket_hangs_up_every_call_still_on_it() -> None:
    relay = Relay()
    relay.listen("acme", "bob")
    ana = Installation(relay)
    ana.calls.request(outgoing("ken", CID_1))
    ana.calls.request(outgoing("bob", CID_2, to="@acme/bob"))
    to_ken = ana.ringing(CID_1)
    ana.calls.socket_gone()
    assert relay.ken.of_type(CancelCall) == [CancelCall(call_id=to_ken)]
    sent_before = len(ana.socket.sent)
    # A late answer is recognised and dropped: nothing is sent on the dead socket.
    relay.book.from_listener("acme", "ken", relay.ken, reply(to_ken))
    assert len(ana.socket.sent) == sent_before
    ana.calls.request(outgoing(cid="c3" * 16))
    [error] = ana.socket.of_type(CallError)
    assert error.code is CallErrorCode.PROTOCOL_ERROR  # the socket is closing


def test_a_call_that_times_out_is_told_so_on_the_socket() -> None:
    relay = Relay()
    ana = Installation(relay)
    ana.calls.request(outgoing())
    call_id = ana.ringing()
    relay.clock.advance(limits.CALL_DEADLINE_S)
    [error] = ana.socket.of_type(CallError)
    assert (error.code, error.call_id, error.correlation_id) == (
        CallErrorCode.TIMEOUT,
        call_id,
        CID_1,
    )
    assert not ana.socket.closed and ana.calls.in_flight() == 0


def test_a_call_to_oneself_rides_the_same_socket_both_ways() -> None:
    relay = Relay()
    ken_calls = SocketCalls(relay.book, relay.ken, "acme", "ken")
    ken_calls.request(outgoing(cid=CID_1, from_="@acme/ken", to="@acme/ken"))
    [ringing] = relay.ken.of_type(CallStatus)
    [incoming] = relay.ken.of_type(IncomingCall)
    assert ringing.correlation_id == CID_1 and incoming.call_id == ringing.call_id
    answer = reply(ringing.call_id, from_="@acme/ken", to="@acme/ken")
    relay.book.from_listener("acme", "ken", relay.ken, answer)
    assert relay.ken.sent[-1] is answer and not relay.ken.closed


class _Failing:
    """A book whose routing fails (a bug), to see that only that call ends, and says so."""

    def __init__(self) -> None:
        self.gone: list[object] = []

    def submit(self, *_args: object) -> defer.Deferred[None]:
        return defer.fail(RuntimeError("a bug in routing"))

    def from_caller(self, *_args: object) -> None:
        raise AssertionError("not reached")

    def caller_gone(self, channel: object) -> None:
        self.gone.append(channel)


def test_a_routing_bug_ends_only_that_call_and_tells_the_client() -> None:
    socket = RecordingChannel()
    book = _Failing()
    calls = SocketCalls(book, socket, "acme", "ana")
    calls.request(outgoing())
    [error] = socket.of_type(CallError)
    assert error.code is CallErrorCode.PROTOCOL_ERROR and error.correlation_id == CID_1
    assert error.detail == "internal error"
    assert not socket.closed and calls.in_flight() == 0 and len(book.gone) == 1


def test_a_queued_call_is_tagged() -> None:
    """call_queued carries the correlation id: it has no call id to be known by."""
    from agentcall.relay.outgoing import CallPort

    socket = RecordingChannel()
    ended: list[CallPort] = []
    port = CallPort(socket, CID_1, ended.append)
    port.send(CallQueued(job_id=JOB_ID, expires_at=1_700_000_000))
    port.close(1000, "queued")
    assert socket.sent == [
        CallQueued(job_id=JOB_ID, expires_at=1_700_000_000, correlation_id=CID_1)
    ]
    assert ended == [port]
    port.send(CallError(code=CallErrorCode.TIMEOUT))  # nothing after the end
    assert len(socket.sent) == 1


def test_frames_of_a_per_call_socket_are_unchanged_by_the_new_fields() -> None:
    """The later fields are not written when unset: old peers read the frames as before."""
    from agentcall.wire import codec

    status = CallStatus(call_id="00000000-0000-4000-8000-000000000001", state=CallState.RINGING)
    assert b"correlation_id" not in codec.encode(status)
    plain = CallRequest(envelope=envelope(), correlation_id=CID_1)
    assert set(json.loads(codec.encode(plain))) == {"type", "envelope", "correlation_id", "queue"}
    tagged = attrs.evolve(status, correlation_id=CID_1)
    assert codec.decode_frame(codec.encode(tagged)) == tagged


def test_the_relays_line_for_the_call_says_it_rode_a_shared_socket() -> None:
    ana = Installation()
    with capturedLogs() as events:
        ana.calls.request(outgoing())
        ana.relay.book.from_listener("acme", "ken", ana.relay.ken, reply(ana.ringing()))
        ana.relay.clock.advance(0)
    [ended] = [e for e in events if e.get("event") == "call_ended"]
    assert ended["caller_socket"] == "shared" and ended["caller"] == "ana"


def test_a_status_is_retagged_with_every_field_it_had() -> None:
    """CallPort builds the tagged call_status itself (not attrs.evolve): a field added to the
    frame later must be carried too, or this fails."""
    from agentcall.relay.outgoing import CallPort

    assert [a.name for a in attrs.fields(CallStatus)] == ["call_id", "state", "correlation_id"]
    socket = RecordingChannel()
    port = CallPort(socket, CID_1, lambda _port: None)
    for state in CallState:
        status = CallStatus(call_id="00000000-0000-4000-8000-000000000001", state=state)
        port.send(status)
        assert socket.sent[-1] == attrs.evolve(status, correlation_id=CID_1)
    assert port.call_id == "00000000-0000-4000-8000-000000000001"
