"""The call book: routing checks, lifecycle, deadlines and isolation, driven with a Clock."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from agentcall import limits
from agentcall.errors import CallErrorCode, StoreError
from agentcall.relay.audit import AuditEntry
from agentcall.relay.calls import GONE_DETAIL, CallBook, Phase, QueueDesk, restore_windows, when
from agentcall.relay.ratelimit import SlidingWindowLimiter
from agentcall.relay.store import open_relay_store
from agentcall.relay.store_interface import MailboxStatus
from agentcall.relay.switchboard import Switchboard
from agentcall.testing.channels import (
    MemoryDirectory,
    RecordingAudit,
    RecordingChannel,
)
from agentcall.wire.frames import (
    CallAccepted,
    CallCancelled,
    CallError,
    CallNotCancelled,
    CallOutcome,
    CallQueued,
    CallRejected,
    CallRequest,
    CallStarted,
    CallState,
    CallStatus,
    CancelCall,
    CancelPhase,
    Direction,
    Frame,
    IncomingCall,
    NotCancelledReason,
    SealedEnvelope,
    Terminal,
)
from tests.unit.relay_helpers import fired, sealed_looking

ORIGIN = "relay.example.test"
T0 = 1_700_000_000.0
CORRELATION = "c0ffee" + "0" * 26
DEADLINE = limits.CALL_DEADLINE_S
MEMBERS = {("acme", "ana"), ("acme", "ken"), ("acme", "bob"), ("other", "ken"), ("other", "oz")}


def envelope(
    direction: Direction = Direction.REQUEST,
    origin: str = ORIGIN,
    from_: str = "@acme/ana",
    to: str = "@acme/ken",
) -> SealedEnvelope:
    return sealed_looking(direction, from_, to, origin)


def request(**route: Any) -> CallRequest:
    return CallRequest(envelope=envelope(**route), correlation_id=CORRELATION)


def reply(
    call_id: str,
    terminal: Terminal = Terminal.COMPLETED,
    **route: Any,
) -> CallOutcome:
    header: dict[str, Any] = {
        "direction": Direction.RESPONSE,
        "from_": "@acme/ken",
        "to": "@acme/ana",
    }
    header.update(route)
    return CallOutcome(call_id=call_id, terminal=terminal, envelope=envelope(**header))


class RecordingDesk:
    """A mailbox that queues nothing and notes whom the book said may be free for a job."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, str]] = []

    def status(self, org: str, callee: str) -> Deferred[MailboxStatus | None]:
        return succeed(None)

    def enqueue(
        self, org: str, caller: str, callee: str, request: CallRequest
    ) -> Deferred[CallQueued | CallError]:
        raise AssertionError("nothing is queued here")

    def live_call_ended(self, org: str, callee: str) -> None:
        self.ended.append((org, callee))


class Relay:
    """A call book wired to a Clock and recording fakes, with ken listening in acme."""

    def __init__(
        self,
        deadline_s: float = DEADLINE,
        audit: RecordingAudit | None = None,
        mint_call_id: Callable[[], str] | None = None,
        directory: MemoryDirectory | None = None,
        desk: QueueDesk | None = None,
    ) -> None:
        self.clock = Clock()
        self.clock.advance(T0)
        self.board = Switchboard()
        self.directory = directory or MemoryDirectory(MEMBERS)
        self.audit = audit or RecordingAudit()
        self.limiter = SlidingWindowLimiter(limits.CALLS_PER_HOUR_PER_PAIR, limits.RATE_WINDOW_S)
        serial = itertools.count(1)
        self.book = CallBook(
            self.clock,
            self.board,
            self.directory,
            self.audit,
            self.limiter,
            ORIGIN,
            deadline_s=deadline_s,
            mint_call_id=mint_call_id or (lambda: f"00000000-0000-4000-8000-{next(serial):012d}"),
            desk=desk,
        )
        self.ken = self.listen("acme", "ken")

    def listen(self, org: str, handle: str) -> RecordingChannel:
        channel = RecordingChannel(f"{handle}-listener")
        self.board.attach_listener(org, handle, channel)
        return channel

    def call(
        self,
        req: CallRequest | None = None,
        *,
        caller: str = "ana",
        target: str = "ken",
        org: str = "acme",
    ) -> RecordingChannel:
        channel = RecordingChannel(f"{caller}-caller")
        self.book.submit(org, caller, target, channel, req or request())
        return channel

    def ring(self) -> tuple[RecordingChannel, str]:
        """Place ana → ken and return the caller channel and the call id."""
        caller = self.call()
        status = caller.sent[0]
        assert isinstance(status, CallStatus)
        return caller, status.call_id

    def from_ken(self, frame: Frame, channel: RecordingChannel | None = None) -> None:
        self.book.from_listener("acme", "ken", channel or self.ken, frame)


@pytest.fixture
def relay() -> Relay:
    return Relay()


def status(call_id: str, state: CallState) -> CallStatus:
    return CallStatus(call_id=call_id, state=state)


# --- happy paths ---------------------------------------------------------------------------


def test_submit_rings_caller_and_delivers_to_listener(relay: Relay) -> None:
    """A valid request rings the caller and reaches the listener with the verified caller."""
    req = request()
    caller = relay.call(req)
    call_id = "00000000-0000-4000-8000-000000000001"
    assert caller.sent == [status(call_id, CallState.RINGING)]
    assert not caller.closed
    assert relay.ken.sent == [
        IncomingCall(
            call_id=call_id, from_="ana", envelope=req.envelope, correlation_id=CORRELATION
        )
    ]
    assert relay.book.active_count() == 1
    call = relay.book.get(call_id)
    assert call is not None
    assert (call.org, call.caller, call.target, call.phase) == ("acme", "ana", "ken", Phase.RINGING)
    assert relay.audit.rows == [AuditEntry("call.submit", "acme", "ana", "ken", call_id, T0, None)]


def test_the_listener_is_sent_its_call_before_the_caller_hears_ringing(relay: Relay) -> None:
    """The reactor writes sockets in the order they were written to: the listener's frame,
    which the call waits on, goes first."""
    order: list[str] = []

    class Ordered(RecordingChannel):
        def send(self, frame: object) -> None:
            order.append(self.peer)
            super().send(frame)

    relay.ken = Ordered("ken-listener")
    relay.board.attach_listener("acme", "ken", relay.ken)
    caller = Ordered("ana-caller")
    relay.book.submit("acme", "ana", "ken", caller, request())
    assert order == ["ken-listener", "ana-caller"]
    assert isinstance(relay.ken.sent[0], IncomingCall) and isinstance(caller.sent[0], CallStatus)


def test_accepted_then_started_then_outcome(relay: Relay) -> None:
    """ringing → answered → working → the outcome, then the caller socket closes with done."""
    caller, call_id = relay.ring()
    relay.clock.advance(1)
    relay.from_ken(CallAccepted(call_id=call_id))
    relay.clock.advance(1)
    relay.from_ken(CallStarted(call_id=call_id))
    relay.clock.advance(1)
    outcome = reply(call_id)
    relay.from_ken(outcome)
    assert caller.sent == [
        status(call_id, CallState.RINGING),
        status(call_id, CallState.ANSWERED),
        status(call_id, CallState.WORKING),
        outcome,
    ]
    assert caller.sent[-1] is outcome
    assert caller.events[-1] == ("close", (1000, "done"))
    assert relay.audit.rows == [
        AuditEntry("call.submit", "acme", "ana", "ken", call_id, T0, None),
        AuditEntry("call.accept", "acme", "ken", "ana", call_id, T0 + 1, None),
        AuditEntry("call.complete", "acme", "ken", "ana", call_id, T0 + 3, "completed"),
    ]
    assert relay.book.active_count() == 0
    assert relay.book.get(call_id) is None
    relay.clock.advance(0)  # the call's log line, put off to the next turn
    assert relay.clock.getDelayedCalls() == []


def test_started_straight_from_ringing_also_accepts(relay: Relay) -> None:
    """call_started without call_accepted moves to working and still audits call.accept."""
    caller, call_id = relay.ring()
    relay.from_ken(CallStarted(call_id=call_id))
    relay.from_ken(reply(call_id, Terminal.FAILED))
    assert [type(f) for f in caller.sent] == [CallStatus, CallStatus, CallOutcome]
    assert caller.sent[1] == status(call_id, CallState.WORKING)
    assert relay.audit.events() == ["call.submit", "call.accept", "call.fail"]
    assert relay.audit.rows[-1].detail == "failed"
    assert caller.closes == [(1000, "done")]


def test_lifecycle_only_moves_forward(relay: Relay) -> None:
    """Repeated or backward lifecycle frames change nothing and send nothing."""
    caller, call_id = relay.ring()
    relay.from_ken(CallStarted(call_id=call_id))
    relay.from_ken(CallAccepted(call_id=call_id))
    relay.from_ken(CallStarted(call_id=call_id))
    assert caller.sent == [status(call_id, CallState.RINGING), status(call_id, CallState.WORKING)]
    assert relay.audit.events() == ["call.submit", "call.accept"]
    call = relay.book.get(call_id)
    assert call is not None and call.phase is Phase.WORKING


def test_repeated_accept_is_ignored(relay: Relay) -> None:
    """A second call_accepted neither re-sends answered nor audits again."""
    caller, call_id = relay.ring()
    relay.from_ken(CallAccepted(call_id=call_id))
    relay.from_ken(CallAccepted(call_id=call_id))
    assert caller.of_type(CallStatus)[1:] == [status(call_id, CallState.ANSWERED)]
    assert relay.audit.events().count("call.accept") == 1


# --- deadline ------------------------------------------------------------------------------


def test_deadline_times_out_cancels_and_audits(relay: Relay) -> None:
    """Nothing happens before the deadline; at it: timeout to caller, cancel to listener."""
    caller, call_id = relay.ring()
    relay.from_ken(CallAccepted(call_id=call_id))
    relay.clock.advance(DEADLINE - 0.001)
    assert len(caller.sent) == 2 and not caller.closed
    assert relay.ken.of_type(CancelCall) == []
    relay.clock.advance(0.001)
    assert caller.sent[-1] == CallError(code=CallErrorCode.TIMEOUT, call_id=call_id)
    assert caller.closes == [(1000, "timeout")]
    assert relay.ken.sent[-1] == CancelCall(call_id=call_id)
    assert relay.audit.rows[-1] == AuditEntry(
        "call.timeout", "acme", None, "ken", call_id, T0 + DEADLINE, "answered"
    )
    assert relay.book.active_count() == 0


def test_outcome_after_deadline_is_ignored(relay: Relay) -> None:
    """Once timed out, a late outcome is a stray frame: nothing reaches the caller."""
    caller, call_id = relay.ring()
    relay.clock.advance(DEADLINE)
    sent = list(caller.sent)
    relay.from_ken(reply(call_id))
    assert caller.sent == sent
    assert relay.book.ignored_frames == 1
    assert relay.audit.events() == ["call.submit", "call.timeout"]


def test_deadline_is_the_configured_one() -> None:
    """A shorter injected deadline is the one armed."""
    relay = Relay(deadline_s=5.0)
    caller, _ = relay.ring()
    relay.clock.advance(4.999)
    assert not caller.closed
    relay.clock.advance(0.001)
    assert caller.closes == [(1000, "timeout")]


def test_deadline_with_listener_offline_only_tells_caller(relay: Relay) -> None:
    """With no listener online at the deadline, the caller still gets timeout: the call's
    session was replaced (its teardown still to come), and the newer one went away."""
    caller, call_id = relay.ring()
    newer = relay.listen("acme", "ken")
    relay.board.detach_listener("acme", "ken", newer)
    relay.book.listener_gone("acme", "ken", newer)
    assert relay.book.get(call_id) is not None
    relay.clock.advance(DEADLINE)
    assert relay.ken.of_type(CancelCall) == []
    assert caller.of_type(CallError) == [CallError(code=CallErrorCode.TIMEOUT, call_id=call_id)]


# --- routing checks on submit --------------------------------------------------------------


def assert_refused(relay: Relay, caller: RecordingChannel, code: CallErrorCode) -> None:
    assert len(caller.sent) == 1
    error = caller.sent[0]
    assert isinstance(error, CallError)
    assert error.code is code
    assert error.call_id is None
    assert caller.closes == [(1000, str(code))]
    assert relay.ken.sent == []
    assert relay.audit.rows == []
    assert relay.book.active_count() == 0
    assert relay.clock.getDelayedCalls() == []


@pytest.mark.parametrize(
    "route",
    [
        pytest.param({"from_": "@acme/bob"}, id="forged-from"),
        pytest.param({"from_": "@other/ana"}, id="from-other-org"),
        pytest.param({"to": "@other/ken"}, id="cross-org-to"),
        pytest.param({"to": "@acme/bob"}, id="to-other-handle"),
        pytest.param({"origin": "evil.example.test"}, id="wrong-relay-origin"),
        pytest.param({"direction": Direction.RESPONSE}, id="wrong-direction"),
    ],
)
def test_route_mismatch_is_protocol_error(relay: Relay, route: dict[str, Any]) -> None:
    """A header that disagrees with the authenticated caller, target, org or relay is refused."""
    caller = relay.call(request(**route))
    assert_refused(relay, caller, CallErrorCode.PROTOCOL_ERROR)
    assert relay.limiter.count(("acme", "ana", "ken"), T0) == 0


@pytest.mark.parametrize("target", ["zed", "oz", "Bad!", "k", "x" * 40])
def test_unknown_or_invalid_target_handle(relay: Relay, target: str) -> None:
    """A handle that is invalid, or not enrolled in the caller's own org, is unknown_handle."""
    caller = relay.call(target=target)
    assert_refused(relay, caller, CallErrorCode.UNKNOWN_HANDLE)


def test_enrolled_but_not_listening_is_offline(relay: Relay) -> None:
    """An enrolled target with no live session gets offline, and costs no budget."""
    caller = relay.call(request(to="@acme/bob"), target="bob")
    assert_refused(relay, caller, CallErrorCode.OFFLINE)
    assert relay.limiter.count(("acme", "ana", "bob"), T0) == 0


def test_thirty_first_call_in_an_hour_is_rate_limited(relay: Relay) -> None:
    """Thirty calls to one callee pass; the thirty-first is refused until the window slides."""
    for i in range(30):
        relay.clock.advance(1)
        assert not relay.call().closed, i
    relay.ken.clear()
    relay.audit.rows.clear()
    caller = relay.call()
    assert caller.sent[0] == CallError(
        code=CallErrorCode.RATE_LIMITED, detail="too many calls to this handle; retry in 3571 s"
    )
    assert caller.closes == [(1000, "rate_limited")]
    assert relay.ken.sent == []
    assert relay.audit.rows == []
    # Another callee, and the same callee from another caller, are separate budgets.
    relay.listen("acme", "bob")
    assert not relay.call(request(to="@acme/bob"), target="bob").closed
    assert not relay.call(request(from_="@acme/bob"), caller="bob").closed
    # The first of the thirty was at T0 + 1; it leaves the window at exactly T0 + 1 + 3600.
    relay.clock.advance(limits.RATE_WINDOW_S - 30)
    assert relay.call().of_type(CallError)[0].code is CallErrorCode.RATE_LIMITED
    relay.clock.advance(1)
    assert not relay.call().closed


def test_offline_attempts_do_not_use_the_budget(relay: Relay) -> None:
    """Calling an offline handle many times leaves the full budget once it comes online."""
    for _ in range(40):
        relay.call(request(to="@acme/bob"), target="bob")
    relay.listen("acme", "bob")
    assert not relay.call(request(to="@acme/bob"), target="bob").closed


def test_second_request_on_one_connection_is_protocol_error(relay: Relay) -> None:
    """A caller connection carries one call; a second request is refused and not delivered."""
    caller, _ = relay.ring()
    relay.book.submit("acme", "ana", "ken", caller, request())
    assert caller.sent[-1] == CallError(
        code=CallErrorCode.PROTOCOL_ERROR, detail="one call per connection"
    )
    assert caller.closes == [(1000, "protocol_error")]
    assert relay.ken.of_type(IncomingCall) == [relay.ken.sent[0]]
    assert relay.book.active_count() == 1


def test_second_request_after_a_refusal_is_protocol_error(relay: Relay) -> None:
    """A refused request still uses up the connection."""
    caller = relay.call(request(to="@acme/bob"), target="bob")
    relay.book.submit("acme", "ana", "ken", caller, request())
    assert [e.code for e in caller.of_type(CallError)] == [
        CallErrorCode.OFFLINE,
        CallErrorCode.PROTOCOL_ERROR,
    ]
    assert relay.ken.sent == []


# --- listener frames -----------------------------------------------------------------------


def test_outcome_is_forwarded_verbatim(relay: Relay) -> None:
    """The caller receives the very frame object the listener sent."""
    caller, call_id = relay.ring()
    outcome = reply(call_id)
    relay.from_ken(outcome)
    assert caller.of_type(CallOutcome) == [outcome]
    assert caller.of_type(CallOutcome)[0] is outcome


@pytest.mark.parametrize(
    "route",
    [
        pytest.param({"from_": "@acme/bob"}, id="forged-from"),
        pytest.param({"to": "@acme/bob"}, id="to-someone-else"),
        pytest.param({"to": "@other/ana"}, id="to-other-org"),
        pytest.param({"origin": "evil.example.test"}, id="wrong-relay-origin"),
        pytest.param({"direction": Direction.REQUEST}, id="wrong-direction"),
    ],
)
def test_outcome_with_bad_route_is_protocol_error(relay: Relay, route: dict[str, Any]) -> None:
    """An outcome whose header does not run callee → caller on this relay fails the call."""
    caller, call_id = relay.ring()
    relay.from_ken(reply(call_id, **route))
    assert caller.of_type(CallOutcome) == []
    assert caller.sent[-1] == CallError(code=CallErrorCode.PROTOCOL_ERROR, call_id=call_id)
    assert caller.closes == [(1000, "protocol_error")]
    assert relay.audit.events() == ["call.submit", "call.fail"]
    assert relay.book.active_count() == 0


def test_rejected_call_fails_with_protocol_error(relay: Relay) -> None:
    """call_rejected: the caller gets protocol_error and the call is audited as failed."""
    caller, call_id = relay.ring()
    relay.from_ken(CallRejected(call_id=call_id))
    assert caller.sent[-1] == CallError(code=CallErrorCode.PROTOCOL_ERROR, call_id=call_id)
    assert caller.closes == [(1000, "protocol_error")]
    assert relay.audit.rows[-1] == AuditEntry(
        "call.fail", "acme", "ken", "ana", call_id, T0, "rejected"
    )
    relay.clock.advance(0)  # the call's log line, put off to the next turn
    assert relay.clock.getDelayedCalls() == []


def test_cancelled_call_gives_caller_canceled(relay: Relay) -> None:
    """call_cancelled: the caller gets canceled and the call is audited as cancelled."""
    caller, call_id = relay.ring()
    relay.from_ken(CallCancelled(call_id=call_id, phase=CancelPhase.RUNNING))
    assert caller.sent[-1] == CallError(code=CallErrorCode.CANCELED, call_id=call_id)
    assert caller.closes == [(1000, "canceled")]
    assert relay.audit.rows[-1] == AuditEntry(
        "call.cancel", "acme", "ken", "ana", call_id, T0, "running"
    )
    assert relay.book.active_count() == 0


def test_not_cancelled_is_not_terminal(relay: Relay) -> None:
    """call_not_cancelled sends nothing and the call still completes normally."""
    caller, call_id = relay.ring()
    relay.from_ken(CallNotCancelled(call_id=call_id, reason=NotCancelledReason.UNKNOWN))
    assert caller.sent == [status(call_id, CallState.RINGING)]
    assert relay.book.active_count() == 1
    relay.from_ken(reply(call_id))
    assert caller.closes == [(1000, "done")]


def isolation_frames(call_id: str) -> list[Frame]:
    return [
        CallAccepted(call_id=call_id),
        CallStarted(call_id=call_id),
        CallNotCancelled(call_id=call_id, reason=NotCancelledReason.UNKNOWN),
        CallCancelled(call_id=call_id, phase=CancelPhase.PENDING),
        CallRejected(call_id=call_id),
        reply(call_id),
    ]


@pytest.mark.parametrize(("org", "handle"), [("acme", "bob"), ("other", "ken")])
def test_other_listener_cannot_touch_the_call(relay: Relay, org: str, handle: str) -> None:
    """Another identity's session sending frames for this call id changes and learns nothing."""
    caller, call_id = relay.ring()
    intruder = relay.listen(org, handle)
    frames = isolation_frames(call_id)
    for frame in frames:
        relay.book.from_listener(org, handle, intruder, frame)
    assert caller.sent == [status(call_id, CallState.RINGING)]
    assert not caller.closed
    assert intruder.sent == []
    assert relay.audit.events() == ["call.submit"]
    assert relay.book.ignored_frames == len(frames)
    call = relay.book.get(call_id)
    assert call is not None and call.phase is Phase.RINGING
    # The real callee is unaffected and can still finish the call.
    relay.from_ken(reply(call_id))
    assert caller.closes == [(1000, "done")]


def test_unknown_call_id_is_ignored_and_counted(relay: Relay) -> None:
    """Frames about a call id the relay does not know are dropped and counted."""
    caller, _ = relay.ring()
    relay.from_ken(CallAccepted(call_id="00000000-0000-4000-8000-999999999999"))
    assert len(caller.sent) == 1
    assert relay.book.ignored_frames == 1


def test_replaced_listener_new_session_delivers_before_the_old_teardown(relay: Relay) -> None:
    """A reconnect replaces the session mid-call; the listener's kept outcome arrives on the
    new session before the old socket's teardown, and finishes the call."""
    caller, call_id = relay.ring()
    relay.from_ken(CallStarted(call_id=call_id))
    new = relay.listen("acme", "ken")
    assert relay.ken.closes == [(4000, "replaced by a newer connection")]
    outcome = reply(call_id)
    relay.book.from_listener("acme", "ken", new, outcome)
    assert relay.board.detach_listener("acme", "ken", relay.ken) is False
    relay.book.listener_gone("acme", "ken", relay.ken)
    assert caller.of_type(CallOutcome) == [outcome]
    assert caller.of_type(CallError) == []
    assert relay.audit.events() == ["call.submit", "call.accept", "call.complete"]


def test_a_replaced_sessions_teardown_ends_its_calls_callee_gone(relay: Relay) -> None:
    """Calls rung through the old socket end when it goes, even though a newer session of
    the same identity is online: the old socket's calls are nobody else's to answer."""
    caller, call_id = relay.ring()
    new = relay.listen("acme", "ken")
    relay.board.detach_listener("acme", "ken", relay.ken)
    relay.book.listener_gone("acme", "ken", relay.ken)
    assert caller.sent[-1] == CallError(
        code=CallErrorCode.CALLEE_GONE, call_id=call_id, detail=GONE_DETAIL
    )
    assert relay.book.active_count() == 0
    assert new.sent == []  # nothing to cancel there: the call never reached it


def test_listener_gone_ends_its_calls_at_once_callee_gone() -> None:
    """A callee's listener socket closing mid-call ends that call for its caller now, with a
    clear code, an audit row and the mailbox told; calls on other sockets carry on."""
    desk = RecordingDesk()
    relay = Relay(desk=desk)
    bob = relay.listen("acme", "bob")
    caller, call_id = relay.ring()
    relay.from_ken(CallStarted(call_id=call_id))
    other = relay.call(request(to="@acme/bob"), target="bob")
    relay.clock.advance(12)
    relay.board.detach_listener("acme", "ken", relay.ken)
    relay.book.listener_gone("acme", "ken", relay.ken)
    assert caller.sent[-1] == CallError(
        code=CallErrorCode.CALLEE_GONE, call_id=call_id, detail=GONE_DETAIL
    )
    assert caller.closes == [(1000, "callee_gone")]
    assert relay.audit.rows[-1] == AuditEntry(
        "call.fail", "acme", "ken", "ana", call_id, T0 + 12, "listener_gone"
    )
    assert desk.ended == [("acme", "ken")]
    assert relay.book.get(call_id) is None and not relay.book.has_call_to("acme", "ken")
    # bob's call, on another socket, is untouched; nothing is left armed for ken's.
    assert not other.closed and relay.book.active_count() == 1
    assert bob.of_type(CancelCall) == []
    relay.clock.advance(DEADLINE)
    assert caller.of_type(CallError) == [caller.sent[-1]]


# --- caller side ---------------------------------------------------------------------------


def test_cancel_is_forwarded_to_current_listener_once(relay: Relay) -> None:
    """A caller's cancel of its own call reaches the listener, once, and ends nothing yet."""
    caller, call_id = relay.ring()
    relay.book.from_caller(caller, CancelCall(call_id=call_id))
    relay.book.from_caller(caller, CancelCall(call_id=call_id))
    assert relay.ken.of_type(CancelCall) == [CancelCall(call_id=call_id)]
    assert relay.book.active_count() == 1
    assert not caller.closed


def test_cancel_for_another_call_is_ignored(relay: Relay) -> None:
    """A caller cannot cancel a call its connection does not carry."""
    caller, call_id = relay.ring()
    other_caller = relay.call(request(from_="@acme/bob"), caller="bob")
    relay.book.from_caller(other_caller, CancelCall(call_id=call_id))
    relay.book.from_caller(caller, CancelCall(call_id="00000000-0000-4000-8000-999999999999"))
    assert relay.ken.of_type(CancelCall) == []


def test_caller_gone_cancels_listener_and_drops_late_outcome(relay: Relay) -> None:
    """A vanished caller stops the agent; the later outcome is audited but sent to nobody."""
    caller, call_id = relay.ring()
    relay.from_ken(CallStarted(call_id=call_id))
    relay.book.caller_gone(caller)
    assert relay.ken.sent[-1] == CancelCall(call_id=call_id)
    call = relay.book.get(call_id)
    assert call is not None and call.caller_channel is None
    sent = list(caller.sent)
    relay.from_ken(reply(call_id))
    assert caller.sent == sent
    assert not caller.closed
    assert relay.book.ignored_frames == 0
    assert relay.audit.events() == ["call.submit", "call.accept", "call.complete"]
    assert relay.book.active_count() == 0
    relay.clock.advance(0)  # the call's log line, put off to the next turn
    assert relay.clock.getDelayedCalls() == []


def test_caller_gone_after_cancel_sends_no_second_cancel(relay: Relay) -> None:
    """A cancel already forwarded is not repeated when the caller then disconnects."""
    caller, call_id = relay.ring()
    relay.book.from_caller(caller, CancelCall(call_id=call_id))
    relay.book.caller_gone(caller)
    assert relay.ken.of_type(CancelCall) == [CancelCall(call_id=call_id)]


def test_caller_gone_after_terminal_sends_nothing(relay: Relay) -> None:
    """The caller's close after its outcome is routine: no cancel reaches the listener."""
    caller, call_id = relay.ring()
    relay.from_ken(reply(call_id))
    relay.book.caller_gone(caller)
    assert relay.ken.of_type(CancelCall) == []


def test_caller_gone_then_deadline_cancels_again_and_audits(relay: Relay) -> None:
    """A caller-less call still ends at its deadline, with call.timeout and a final cancel."""
    caller, call_id = relay.ring()
    relay.book.caller_gone(caller)
    relay.clock.advance(DEADLINE)
    assert relay.ken.of_type(CancelCall) == [CancelCall(call_id=call_id)] * 2
    assert caller.of_type(CallError) == []
    assert relay.audit.events() == ["call.submit", "call.timeout"]


# --- robustness ----------------------------------------------------------------------------


def test_audit_failure_does_not_break_routing() -> None:
    """A failing audit sink is logged; the caller still gets its outcome."""

    class Broken(RecordingAudit):
        def record(self, entry: AuditEntry) -> Deferred[None]:
            raise OSError("disk full")

    relay = Relay(audit=Broken())
    caller, call_id = relay.ring()
    relay.from_ken(reply(call_id))
    assert caller.closes == [(1000, "done")]
    assert relay.book.active_count() == 0


def test_call_ids_never_collide() -> None:
    """A minter that repeats itself is refused rather than cross-wiring two calls."""
    relay = Relay(mint_call_id=lambda: "00000000-0000-4000-8000-000000000001")
    relay.ring()
    with pytest.raises(RuntimeError, match="minter"):
        fired(relay.book.submit("acme", "ana", "ken", RecordingChannel("ana-caller"), request()))


def test_rate_windows_are_pruned_as_calls_flow(relay: Relay) -> None:
    """Budget state of pairs that stopped calling is dropped on a later submission."""
    relay.ring()
    assert relay.limiter.tracked_keys() == 1
    relay.clock.advance(limits.RATE_WINDOW_S)
    relay.call(request(to="@acme/bob"), target="bob")
    assert relay.limiter.tracked_keys() == 0


def test_call_record_holds_no_envelope(relay: Relay) -> None:
    """The relay keeps metadata only: no field of a call record is an envelope."""
    _, call_id = relay.ring()
    call = relay.book.get(call_id)
    assert call is not None
    values = attrs.asdict(call, recurse=False).values()
    assert not any(isinstance(v, SealedEnvelope | CallRequest) for v in values)


def test_a_relay_restart_does_not_grant_a_fresh_hour(tmp_path: Path) -> None:
    """Thirty calls audited in the store; the call book built after a restart, with its
    limiter rebuilt from that store, refuses the thirty-first until the hour has slid."""
    store = open_relay_store(tmp_path / "relay.sqlite")
    fired(store.ensure_org("acme", T0))
    directory = MemoryDirectory({("acme", "ana"), ("acme", "ken")})
    clock = Clock()
    clock.advance(T0)

    def start_relay() -> tuple[CallBook, Switchboard]:
        board = Switchboard()
        board.attach_listener("acme", "ken", RecordingChannel("ken-listener"))
        limiter = SlidingWindowLimiter(limits.CALLS_PER_HOUR_PER_PAIR, limits.RATE_WINDOW_S)
        fired(restore_windows(store, limiter, clock.seconds()))
        return CallBook(clock, board, directory, store, limiter, ORIGIN), board

    def call(book: CallBook) -> RecordingChannel:
        channel = RecordingChannel("ana-caller")
        book.submit("acme", "ana", "ken", channel, request())
        return channel

    book, _ = start_relay()
    for _ in range(30):
        clock.advance(1)
        assert not call(book).closed
    clock.advance(60)
    book, _ = start_relay()  # the restart
    refused = call(book)
    assert refused.sent[0] == CallError(
        code=CallErrorCode.RATE_LIMITED, detail="too many calls to this handle; retry in 3511 s"
    )
    # The first of the thirty left the window at T0 + 1 + 3600; one call fits again.
    clock.advance(limits.RATE_WINDOW_S - 89)
    assert not call(book).closed
    assert call(book).closed
    store.close()


# --- a directory that answers later --------------------------------------------------------


class LateDirectory(MemoryDirectory):
    """Answers ``handle_exists`` only when the test says so, as a remote database would."""

    def __init__(self) -> None:
        super().__init__(MEMBERS)
        self.pending: list[tuple[Deferred[bool], bool]] = []

    def handle_exists(self, org: str, handle: str) -> Deferred[bool]:
        answer: Deferred[bool] = Deferred()
        self.pending.append((answer, (org, handle) in self.members))
        return answer

    def release(self) -> None:
        pending, self.pending = self.pending, []
        for answer, exists in pending:
            answer.callback(exists)

    def fail(self, exc: Exception) -> None:
        pending, self.pending = self.pending, []
        for answer, _exists in pending:
            answer.errback(exc)


def test_frames_behind_a_pending_request_wait_for_it() -> None:
    """A cancel, a second request and the close that follow a request on its connection are
    looked at only once the directory has answered and the call rang, in the order sent."""
    late = LateDirectory()
    relay = Relay(directory=late)
    req = request()
    caller = relay.call(req)
    call_id = "00000000-0000-4000-8000-000000000001"
    relay.book.from_caller(caller, CancelCall(call_id=call_id))
    relay.book.submit("acme", "ana", "ken", caller, request())
    relay.book.caller_gone(caller)
    assert caller.events == [] and relay.ken.sent == []
    # Another connection's request is not held behind this one's.
    other = relay.call(request(from_="@acme/bob"), caller="bob")
    assert len(late.pending) == 2
    late.release()
    assert caller.sent == [
        status(call_id, CallState.RINGING),
        CallError(code=CallErrorCode.PROTOCOL_ERROR, detail="one call per connection"),
    ]
    assert relay.ken.sent[:2] == [
        IncomingCall(
            call_id=call_id, from_="ana", envelope=req.envelope, correlation_id=CORRELATION
        ),
        CancelCall(call_id=call_id),
    ]
    call = relay.book.get(call_id)
    assert call is not None and call.caller_channel is None and call.cancel_sent
    assert other.sent == [status("00000000-0000-4000-8000-000000000002", CallState.RINGING)]


def test_a_failing_directory_closes_the_caller_and_rings_nobody() -> None:
    """A store failure during the lookup is logged; the caller's socket closes, no call rings."""
    late = LateDirectory()
    relay = Relay(directory=late)
    caller = relay.call()
    relay.book.caller_gone(caller)
    with capturedLogs() as captured:
        late.fail(StoreError("database error: disk I/O error"))
    assert caller.sent == [] and caller.closes == [(1000, "internal error")]
    assert relay.ken.sent == [] and relay.book.active_count() == 0
    assert [e for e in captured if e.get("event") == "directory_failed"]


def test_a_failed_audit_deferred_is_logged_not_unhandled() -> None:
    """An audit write that fails later (a failed Deferred) is logged; routing goes on."""

    class Failing(RecordingAudit):
        def record(self, entry: AuditEntry) -> Deferred[None]:
            return fail(OSError("disk full"))

    relay = Relay(audit=Failing())
    with capturedLogs() as captured:
        caller, call_id = relay.ring()
        relay.from_ken(reply(call_id))
    assert caller.closes == [(1000, "done")]
    # Both writes (call.submit, call.complete) failed, and each failure was logged under its
    # own event name, with the audit event it was writing beside it.
    logged = [e for e in captured if "log_failure" in e]
    assert [(e["event"], e["audit_event"]) for e in logged] == [
        ("audit_failed", "call.submit"),
        ("audit_failed", "call.complete"),
    ]


# --- log lines ---------------------------------------------------------------------------------


def _at(events: Sequence[Any], level: Any) -> list[str]:
    return [e["event"] for e in events if e.get("log_level") is level and "event" in e]


def test_a_completed_call_logs_one_info_line_at_its_end(relay: Relay) -> None:
    """Ringing and progress are debug; the end carries who, what, and how long."""
    from twisted.logger import LogLevel

    with capturedLogs() as events:
        _caller, call_id = relay.ring()
        relay.from_ken(CallAccepted(call_id=call_id))
        relay.from_ken(CallStarted(call_id=call_id))
        relay.clock.advance(2.5)
        relay.from_ken(reply(call_id))
        # Written at the next turn, after the outcome has gone to the caller.
        assert _at(events, LogLevel.info) == []
        relay.clock.advance(0)
    assert _at(events, LogLevel.info) == ["call_ended"]
    assert {"call_ringing", "call_progress"} <= set(_at(events, LogLevel.debug))
    (ended,) = [e for e in events if e.get("event") == "call_ended"]
    assert {
        k: ended[k] for k in ("call_id", "org", "caller", "target", "audit_event", "outcome")
    } == {
        "call_id": call_id,
        "org": "acme",
        "caller": "ana",
        "target": "ken",
        "audit_event": "call.complete",
        "outcome": "completed",
    }
    assert ended["duration_ms"] == 2500.0
    assert ended["caller_present"] is True
    assert ended["caller_socket"] == "own"


def test_a_timed_out_call_logs_one_info_line_too(relay: Relay) -> None:
    from twisted.logger import LogLevel

    with capturedLogs() as events:
        caller, _call_id = relay.ring()
        relay.book.caller_gone(caller)
        relay.clock.advance(DEADLINE)
    assert _at(events, LogLevel.info) == ["call_ended"]
    (ended,) = [e for e in events if e.get("event") == "call_ended"]
    assert (ended["audit_event"], ended["outcome"]) == ("call.timeout", "ringing")
    assert ended["duration_ms"] == DEADLINE * 1000
    assert ended["caller_present"] is False


def test_with_debug_off_a_call_reaches_the_observers_once(relay: Relay) -> None:
    """The level gate drops debug lines before any observer sees them."""
    from twisted.logger import LogLevel

    from agentcall import logevents

    logevents.set_level(LogLevel.info)
    with capturedLogs() as events:
        _caller, call_id = relay.ring()
        relay.from_ken(CallStarted(call_id=call_id))
        relay.from_ken(reply(call_id))
        relay.clock.advance(0)
    assert [e.get("event") for e in events] == ["call_ended"]


def test_a_store_answer_already_given_is_followed_at_once_and_a_later_one_waited_for() -> None:
    """``when`` (how submit follows its store): with the answer in hand the next step runs now
    and its own value comes back, no Deferred; a pending answer gives a Deferred of the same."""
    steps: list[object] = []

    def then(value: int) -> str:
        steps.append(value)
        return f"rang {value}"

    def failed(failure: Any) -> str:
        steps.append(failure.type)
        return "refused"

    assert when(succeed(7), then, failed) == "rang 7" and steps == [7]
    assert when(fail(StoreError("down")), then, failed) == "refused" and steps[-1] is StoreError

    later: Deferred[int] = Deferred()
    pending = when(later, then, failed)
    assert isinstance(pending, Deferred) and len(steps) == 2
    later.callback(9)
    assert fired(pending) == "rang 9" and steps == [7, StoreError, 9]

    def broken(_value: int) -> str:
        raise RuntimeError("a bug in routing")

    # A bug in the next step is not the store's failure: it is raised, or fails the Deferred.
    with pytest.raises(RuntimeError):
        when(succeed(1), broken, failed)
    waiting: Deferred[int] = Deferred()
    result = when(waiting, broken, failed)
    waiting.callback(1)
    with pytest.raises(RuntimeError):
        fired(result)  # type: ignore[arg-type]
    assert len(steps) == 3
