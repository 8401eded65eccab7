"""The owner's calls on the listener's own socket: matched by correlation id, then call id."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from agentcall.client.ws import CallAborted, CallTerminal
from agentcall.errors import CallErrorCode
from agentcall.listener.outgoing import OutgoingCalls
from agentcall.wire.frames import (
    CallError,
    CallOutcome,
    CallQueued,
    CallRequest,
    CallState,
    CallStatus,
    CancelCall,
    Direction,
    Frame,
    IncomingCall,
    Terminal,
)
from tests.unit.relay_helpers import sealed_looking

CID_1 = "a1" * 16
CID_2 = "b2" * 16
CALL_1 = "00000000-0000-4000-8000-000000000001"
CALL_2 = "00000000-0000-4000-8000-000000000002"


class Link:
    def __init__(self) -> None:
        self.carries_calls = True
        self.sent: list[Frame] = []
        self.refuse_sends = False

    def send(self, frame: Frame) -> bool:
        if self.refuse_sends or not self.carries_calls:
            return False
        self.sent.append(frame)
        return True


class Fallback:
    """The per-call socket dial, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, CallRequest]] = []
        self.result: defer.Deferred[CallTerminal] = defer.Deferred()

    def __call__(
        self, _reactor: Any, _url: Any, _creds: Any, handle: str, request: CallRequest, **_kw: Any
    ) -> defer.Deferred[CallTerminal]:
        self.calls.append((handle, request))
        return self.result


def request(cid: str = CID_1) -> CallRequest:
    envelope = sealed_looking(Direction.REQUEST, "@acme/ann", "@acme/ken")
    return CallRequest(envelope=envelope, correlation_id=cid, queue=True)


def outcome(call_id: str = CALL_1) -> CallOutcome:
    envelope = sealed_looking(Direction.RESPONSE, "@acme/ken", "@acme/ann")
    return CallOutcome(call_id=call_id, terminal=Terminal.COMPLETED, envelope=envelope)


class World:
    def __init__(self) -> None:
        self.link = Link()
        self.clock = Clock()
        self.fallback = Fallback()
        self.calls = OutgoingCalls(self.link, self.clock, fallback=self.fallback)
        self.statuses: list[CallStatus] = []

    def dial(self, cid: str = CID_1, timeout_s: float = 420.0) -> defer.Deferred[CallTerminal]:
        return self.calls.dial(
            self.clock,
            "relay-url",
            "credentials",
            "ken",
            request(cid),
            ca_file=None,
            on_status=self.statuses.append,
            timeout_s=timeout_s,
        )

    def ring(self, cid: str = CID_1, call_id: str = CALL_1) -> None:
        frame = CallStatus(call_id=call_id, state=CallState.RINGING, correlation_id=cid)
        assert self.calls.on_frame(frame)


def results(deferred: defer.Deferred[CallTerminal]) -> list[object]:
    seen: list[object] = []
    deferred.addBoth(seen.append)
    return seen


def test_a_call_goes_out_on_the_socket_naming_its_target_and_its_answer_ends_it() -> None:
    world = World()
    got = results(world.dial())
    assert world.link.sent == [attrs.evolve(request(), to="ken")]
    world.ring()
    working = CallStatus(call_id=CALL_1, state=CallState.WORKING)
    assert world.calls.on_frame(working)
    # The statuses reach place() as a call socket gives them, without the routing tag.
    assert world.statuses == [CallStatus(call_id=CALL_1, state=CallState.RINGING), working]
    assert world.calls.on_frame(outcome())
    assert got == [outcome()]
    assert world.calls.in_flight() == 0 and world.clock.getDelayedCalls() == []
    assert (world.calls.placed, world.calls.fell_back) == (1, 0)


def test_two_calls_at_once_are_told_apart() -> None:
    world = World()
    first, second = results(world.dial(CID_1)), results(world.dial(CID_2))
    world.ring(CID_2, CALL_2)
    world.ring(CID_1, CALL_1)
    world.calls.on_frame(outcome(CALL_2))
    assert first == [] and second == [outcome(CALL_2)]
    error = CallError(code=CallErrorCode.TIMEOUT, call_id=CALL_1, correlation_id=CID_1)
    world.calls.on_frame(error)
    assert first == [CallError(code=CallErrorCode.TIMEOUT, call_id=CALL_1)]


def test_a_refusal_and_a_queued_call_are_matched_by_correlation_id() -> None:
    world = World()
    refused, queued = results(world.dial(CID_1)), results(world.dial(CID_2))
    world.calls.on_frame(
        CallError(code=CallErrorCode.OFFLINE, detail="not listening", correlation_id=CID_1)
    )
    job = CallQueued(
        job_id="00000000-0000-4000-8000-0000000000aa",
        expires_at=1_700_000_000,
        correlation_id=CID_2,
    )
    world.calls.on_frame(job)
    assert refused == [CallError(code=CallErrorCode.OFFLINE, detail="not listening")]
    assert queued == [attrs.evolve(job, correlation_id=None)]


def test_without_a_usable_socket_a_call_takes_its_own() -> None:
    world = World()
    world.link.carries_calls = False  # down, or a relay that did not offer to take calls
    assert world.dial() is world.fallback.result
    world.link.carries_calls = True
    world.link.refuse_sends = True  # gone between the check and the send
    assert world.dial(CID_2) is world.fallback.result
    assert [handle for handle, _ in world.fallback.calls] == ["ken", "ken"]
    assert world.calls.in_flight() == 0 and world.calls.fell_back == 2


def test_a_lost_socket_ends_every_call_on_it() -> None:
    world = World()
    first, second = results(world.dial(CID_1)), results(world.dial(CID_2))
    world.ring()
    world.calls.socket_lost()
    for got in (first, second):
        [failure] = got
        assert isinstance(failure, Failure) and failure.check(CallAborted)
    assert world.calls.in_flight() == 0
    # A late answer after the loss is taken and dropped.
    assert world.calls.on_frame(outcome())


def test_no_answer_in_time_hangs_up_and_fails() -> None:
    world = World()
    got = results(world.dial(timeout_s=30))
    world.ring()
    world.clock.advance(30)
    assert world.link.sent[-1] == CancelCall(call_id=CALL_1)
    [failure] = got
    assert "no answer within 30 s" in str(failure.value)  # type: ignore[attr-defined]


def test_a_caller_that_stops_waiting_hangs_up_once_the_call_has_an_id() -> None:
    world = World()
    before = world.dial()
    before.addErrback(lambda _f: None)
    before.cancel()  # before the relay named the call
    assert world.link.sent == [attrs.evolve(request(), to="ken")]
    world.ring()
    assert world.link.sent[1:] == [CancelCall(call_id=CALL_1)]
    assert world.statuses == []  # nobody is listening for them any more

    after = world.dial(CID_2)
    after.addErrback(lambda _f: None)
    world.ring(CID_2, CALL_2)
    after.cancel()
    assert world.link.sent[3:] == [CancelCall(call_id=CALL_2)]


def test_frames_that_are_not_about_outgoing_calls_are_left_alone() -> None:
    world = World()
    incoming = IncomingCall(
        call_id=CALL_1,
        from_="ann",
        envelope=sealed_looking(Direction.REQUEST, "@acme/ann", "@acme/ken"),
        correlation_id=CID_1,
    )
    assert not world.calls.on_frame(incoming)
    assert not world.calls.on_frame(CancelCall(call_id=CALL_1))


@pytest.mark.parametrize("late", [outcome(), CallStatus(call_id=CALL_2, state=CallState.WORKING)])
def test_a_frame_for_no_call_of_ours_is_dropped(late: Frame) -> None:
    world = World()
    assert world.calls.on_frame(late)
    assert world.statuses == [] and world.link.sent == []
