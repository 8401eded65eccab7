"""The relay's book of calls in flight: routing checks, a forward-only lifecycle, deadlines.

A caller's connection carries exactly one call. The book compares the envelope's clear routing
header with what the relay itself authenticated (org, caller handle, target handle), so a forged
``from`` or a ``to`` outside the caller's org is refused; it never opens an envelope. Listener
frames act only on calls addressed to that listener's own identity: a listener can neither learn
about nor affect anyone else's call. A call ends at its deadline, or at once when the listener
socket it was rung through closes (``callee_gone``).

Audit rows name who caused a transition: ``actor`` is the caller for ``call.submit``, the callee
for ``call.accept``/``call.complete``/``call.fail``/``call.cancel``, and None (the relay itself)
for ``call.timeout``; ``target`` is the other party.

The rate windows are rebuilt from those ``call.submit`` rows when the relay starts
(:func:`restore_windows`): every call that rang was audited the moment its hit was recorded, so
a restart grants no fresh hour.
"""

from __future__ import annotations

import collections
import enum
import functools
import math
from collections.abc import Callable
from typing import Protocol, TypeVar

import attrs
from twisted.internet import defer
from twisted.python.failure import Failure

from agentcall import ids, limits
from agentcall.errors import CallErrorCode, StorageFault
from agentcall.logevents import Logger
from agentcall.relay import audit as events
from agentcall.relay.audit import AuditEntry, AuditSink
from agentcall.relay.callerkeys import attachable_keys
from agentcall.relay.metrics import NO_METRICS, RelayEvents
from agentcall.relay.outgoing import CallPort
from agentcall.relay.ratelimit import SlidingWindowLimiter
from agentcall.relay.store_interface import (
    Directory,
    KeySource,
    MailboxStatus,
    Submission,
    SubmissionLog,
)
from agentcall.relay.storewatch import storage_detail
from agentcall.relay.switchboard import Channel, Switchboard
from agentcall.wire import frames as fr
from agentcall.wire.closecodes import CLOSE_NORMAL
from agentcall.wire.keyrecords import KeysResponse

# How often submissions sweep the rate windows, so keys of pairs that stopped calling go away.
LIMITER_PRUNE_INTERVAL_S = 60.0

_log = Logger(namespace="agentcall.relay.calls")

# (code sent to the caller, detail sent to the caller, reason for the log)
Refusal = tuple[CallErrorCode, str, str]

GONE_DETAIL = "the callee's listener disconnected during the call"

_UNKNOWN_HANDLE: Refusal = (
    CallErrorCode.UNKNOWN_HANDLE,
    "no such handle in your org",
    "unknown_handle",
)


def _log_call_ended(fields: dict[str, object]) -> None:
    _log.info("call_ended", **fields)


def restore_windows(
    log: SubmissionLog, limiter: SlidingWindowLimiter, now: float
) -> defer.Deferred[None]:
    """Count the calls of ``limiter``'s last window into it, from the store's audit rows."""

    def restore(submissions: list[Submission]) -> None:
        kept = limiter.restore((((s.org, s.caller, s.callee), s.at) for s in submissions), now)
        _log.info("rate_windows_restored", calls=kept, pairs=limiter.tracked_keys())

    return log.submissions_since(now - limiter.window_s).addCallback(restore)


T = TypeVar("T")


def when(
    deferred: defer.Deferred[T],
    then: Callable[[T], object],
    failed: Callable[[Failure], object],
) -> object:
    """``then(result)`` or ``failed(failure)`` at once if ``deferred`` has fired, and what it
    returned; otherwise a Deferred of that, once it fires.

    A store that answers at once is then followed synchronously, without a chain of Deferreds
    per step. ``failed`` sees only ``deferred``'s own failure; an exception in ``then`` is
    raised (at once) or fails the returned Deferred (later). ``deferred`` is spent either way.
    """
    box: list[T | Failure] = []
    deferred.addBoth(box.append)
    if box:
        result = box[0]
        return failed(result) if isinstance(result, Failure) else then(result)

    def fired(_: object) -> T | Failure:
        return box[0]

    return deferred.addCallback(fired).addCallbacks(then, failed)


class Pending(Protocol):
    """What the book needs of an ``IDelayedCall``."""

    def active(self) -> bool: ...

    def cancel(self) -> None: ...


class Timer(Protocol):
    """What the book needs of an ``IReactorTime`` (a reactor, or ``Clock`` in tests)."""

    def seconds(self) -> float: ...

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Pending: ...


class QueueDesk(Protocol):
    """What the book needs of the offline mailbox (:class:`agentcall.relay.jobs.JobDesk`)."""

    def status(self, org: str, callee: str) -> defer.Deferred[MailboxStatus | None]: ...

    def enqueue(
        self, org: str, caller: str, callee: str, request: fr.CallRequest
    ) -> defer.Deferred[fr.CallQueued | fr.CallError]: ...

    def live_call_ended(self, org: str, callee: str) -> None: ...


class Phase(enum.IntEnum):
    """Where a call is; it only ever moves to a higher value.

    A call that reaches TERMINAL is forgotten at once, so live records never hold it.
    """

    RINGING = 0
    ANSWERED = 1
    WORKING = 2
    TERMINAL = 3


_STATUS_OF = {
    Phase.RINGING: fr.CallState.RINGING,
    Phase.ANSWERED: fr.CallState.ANSWERED,
    Phase.WORKING: fr.CallState.WORKING,
}

_LISTENER_FRAMES = (
    fr.CallAccepted,
    fr.CallStarted,
    fr.CallRejected,
    fr.CallCancelled,
    fr.CallNotCancelled,
    fr.CallOutcome,
)


@attrs.frozen
class Call:
    """One call in flight, as the relay knows it (metadata only, never the envelope)."""

    call_id: str
    org: str
    caller: str
    target: str
    correlation_id: str
    submitted_at: float
    phase: Phase
    caller_channel: Channel | None  # None once the caller's connection went away
    deadline: Pending = attrs.field(eq=False, repr=False)
    # The listener session it was rung through: when that socket closes, the call ends.
    callee_channel: Channel = attrs.field(eq=False, repr=False)
    cancel_sent: bool = False
    # Placed on the caller's persistent (listener) socket rather than a socket of its own.
    shared_socket: bool = False


def route_problem(
    envelope: fr.SealedEnvelope,
    direction: fr.Direction,
    *,
    origin: str,
    org: str,
    sender: str,
    to: str,
) -> str | None:
    """Which routing header field disagrees with what the relay knows, or None."""
    try:
        sender_address = ids.format_address(org, sender)
        recipient_address = ids.format_address(org, to)
    except ids.AddressError:
        return "address"
    if envelope.direction is not direction:
        return "direction"
    if envelope.relay_origin != origin:
        return "relay_origin"
    if envelope.from_ != sender_address:
        return "from"
    if envelope.to != recipient_address:
        return "to"
    return None


class CallBook:
    """Every call in flight on this relay, keyed by call id."""

    def __init__(
        self,
        clock: Timer,
        switchboard: Switchboard,
        directory: Directory,
        audit: AuditSink,
        limiter: SlidingWindowLimiter,
        relay_origin: str,
        deadline_s: float = limits.CALL_DEADLINE_S,
        mint_call_id: Callable[[], str] = ids.mint_call_id,
        desk: QueueDesk | None = None,
        keys: KeySource | None = None,
        metrics: RelayEvents = NO_METRICS,
    ) -> None:
        self._clock = clock
        self._metrics = metrics
        self._switchboard = switchboard
        self._directory = directory
        self._audit_sink = audit
        self._limiter = limiter
        self._relay_origin = relay_origin
        self._deadline_s = deadline_s
        self._mint_call_id = mint_call_id
        self._calls: dict[str, Call] = {}
        # Live calls per callee: a callee with one is busy for the mailbox.
        self._live_to: collections.Counter[tuple[str, str]] = collections.Counter()
        self._desk = desk
        # Where the caller's records come from, to attach to incoming_call (None: not attached).
        self._keys = keys
        # Every caller connection that has sent a request, with the call it carries (None when
        # the request was refused). Kept until caller_gone, so a second request on the same
        # connection is refused even after the first call has ended.
        self._caller_channels: dict[Channel, str | None] = {}
        # Caller connections whose request waits for the directory, with what they sent since.
        self._held: dict[Channel, list[Callable[[], object]]] = {}
        self._last_prune: float | None = None
        self.ignored_frames = 0

    def get(self, call_id: str) -> Call | None:
        """The live (non-terminal) call with this id, if any."""
        return self._calls.get(call_id)

    def active_count(self) -> int:
        return len(self._calls)

    def has_call_to(self, org: str, handle: str) -> bool:
        """True while a live call to ``@org/handle`` is in flight on this relay."""
        return self._live_to[(org, handle)] > 0

    # --- caller side -------------------------------------------------------------------------

    def submit(
        self,
        caller_org: str,
        caller_handle: str,
        target_handle: str,
        channel: Channel,
        request: fr.CallRequest,
    ) -> defer.Deferred[None]:
        """Route one authenticated caller's request to the target's listener, or refuse it.

        The directory answers asynchronously; until it has, whatever else arrives on this
        connection waits behind the request (see :meth:`_hold`).
        """
        org, caller, target = caller_org, caller_handle, target_handle
        if self._hold(channel, self.submit, org, caller, target, channel, request):
            return defer.succeed(None)
        if channel in self._caller_channels:
            reused = (CallErrorCode.PROTOCOL_ERROR, "one call per connection", "channel_reused")
            self._refuse(channel, org, caller, reused)
            return defer.succeed(None)
        self._caller_channels[channel] = None
        if not ids.is_handle(target):
            self._refuse(channel, org, caller, _UNKNOWN_HANDLE)
            return defer.succeed(None)
        self._held[channel] = []

        desk = self._desk
        # Asked beside the directory, in the same stage; it never fails (None: not attached).
        caller_keys = attachable_keys(self._keys, org, caller)

        def lookup_failed(failure: Failure) -> None:
            # Nothing is said about the target; the caller may try again.
            self._store_failed(failure, "directory_failed", channel, org, caller)

        def ring(exists: bool, status: MailboxStatus | None) -> object:
            def go(keys: KeysResponse | None) -> object:
                return self._ring(exists, status, org, caller, target, channel, request, keys)

            return when(caller_keys, go, lookup_failed)

        def mailbox(exists: bool) -> object:
            # Only a call that may be queued asks about the callee's mailbox.
            if not exists or not request.queue or desk is None:
                return ring(exists, None)

            def queued(status: MailboxStatus | None) -> object:
                return ring(exists, status)

            return when(desk.status(org, target), queued, lookup_failed)

        def release(result: object) -> object:
            self._release(channel)
            return result

        # A store that has already answered (SQLite does) is followed at once, with no chain
        # of Deferreds; one that answers later is waited for.
        try:
            routed = when(self._directory.handle_exists(org, target), mailbox, lookup_failed)
        except Exception:
            # A failure of the routing itself (a bug, not the directory) goes to the caller of
            # submit, once what the connection sent meanwhile has been replayed.
            failure = Failure()
            self._release(channel)
            return defer.fail(failure)
        if isinstance(routed, defer.Deferred):
            return routed.addBoth(release).addCallback(lambda _: None)
        self._release(channel)
        return defer.succeed(None)

    def _ring(
        self,
        exists: bool,
        status: MailboxStatus | None,
        org: str,
        caller: str,
        target: str,
        channel: Channel,
        request: fr.CallRequest,
        caller_keys: KeysResponse | None = None,
    ) -> defer.Deferred[None] | None:
        """The directory has answered: run the remaining checks, then ring the listener, or
        queue the call for a callee who opted in and is offline or busy."""
        now = self._clock.seconds()
        admitted = self._admit(org, caller, target, request, now=now) if exists else _UNKNOWN_HANDLE
        if status is not None and status.offline_delivery and request.queue:
            offline = isinstance(admitted, tuple) and admitted[0] is CallErrorCode.OFFLINE
            busy = not isinstance(admitted, tuple) and (
                self.has_call_to(org, target) or status.job_out
            )
            if offline or busy:
                return self._enqueue(org, caller, target, channel, request)
        if isinstance(admitted, tuple):
            self._refuse(channel, org, caller, admitted)
            return None
        if not self._limiter.hit((org, caller, target), now):
            limited = (CallErrorCode.RATE_LIMITED, "too many calls to this handle", "rate_limited")
            self._refuse(channel, org, caller, limited)
            return None
        listener = admitted
        call_id = self._new_call_id()
        call = Call(
            call_id=call_id,
            org=org,
            caller=caller,
            target=target,
            correlation_id=request.correlation_id,
            submitted_at=now,
            phase=Phase.RINGING,
            caller_channel=channel,
            deadline=self._clock.callLater(self._deadline_s, self._expire, call_id),
            callee_channel=listener,
            shared_socket=isinstance(channel, CallPort),
        )
        self._calls[call.call_id] = call
        self._live_to[(org, target)] += 1
        self._caller_channels[channel] = call.call_id
        _log.debug("call_ringing", call_id=call.call_id, org=org, caller=caller, target=target)
        # The listener's frame first: the reactor writes the sockets in the order they asked
        # to be written, and the call waits on the listener, not on the caller's ringing.
        listener.send(
            fr.IncomingCall(
                call_id=call.call_id,
                from_=caller,
                envelope=request.envelope,
                correlation_id=request.correlation_id,
                caller_keys=caller_keys,
            )
        )
        channel.send(fr.CallStatus(call_id=call.call_id, state=fr.CallState.RINGING))
        self._audit(events.CALL_SUBMIT, call, actor=caller, target=target)
        return None

    def _enqueue(
        self, org: str, caller: str, target: str, channel: Channel, request: fr.CallRequest
    ) -> defer.Deferred[None]:
        """Keep the call as a job; the caller hears ``call_queued`` only once it is stored."""
        if self._desk is None:  # pragma: no cover - _ring queues only with a desk
            raise RuntimeError("no mailbox to queue in")

        def answered(frame: fr.CallQueued | fr.CallError) -> None:
            if isinstance(frame, fr.CallQueued):
                # Stored: it counts against the pair's hour like a call that rang.
                self._limiter.hit((org, caller, target), self._clock.seconds())
                channel.send(frame)
                channel.close(CLOSE_NORMAL, "queued")
            else:
                detail = frame.detail or ""
                self._refuse(channel, org, caller, (frame.code, detail, "mailbox_refused"))

        def failed(failure: Failure) -> None:
            # Nothing was acknowledged; the caller may try again.
            self._store_failed(failure, "job_enqueue_failed", channel, org, caller)

        return self._desk.enqueue(org, caller, target, request).addCallbacks(answered, failed)

    def _store_failed(
        self, failure: Failure, event: str, channel: Channel, org: str, caller: str
    ) -> None:
        """The store could not answer for a call: a storage fault (a full disk) is said to the
        caller in words (the watch logs the episode); anything else is a bug, logged in full,
        and the socket ends so the caller does not wait for its deadline."""
        fault = failure.value
        if isinstance(fault, StorageFault):
            self._refuse(channel, org, caller, (fault.code, storage_detail(fault), "storage"))
            return
        _log.failure(event, failure=failure, org=org, caller=caller)
        channel.close(CLOSE_NORMAL, "internal error")

    def _refuse(self, channel: Channel, org: str, caller: str, refusal: Refusal) -> None:
        code, detail, reason = refusal
        _log.info("call_refused", code=str(code), org=org, caller=caller, reason=reason)
        self._metrics.call_refused(str(code))
        channel.send(fr.CallError(code=code, detail=detail))
        channel.close(CLOSE_NORMAL, str(code))

    def _hold(self, channel: Channel, method: Callable[..., object], *args: object) -> bool:
        """Keep what a caller connection sends while its request waits for the directory.

        A request is refused or rung before anything that followed it on the same connection
        is looked at: a second request, a cancel or a close never overtakes it.
        """
        held = self._held.get(channel)
        if held is None:
            return False
        held.append(functools.partial(method, *args))
        return True

    def _release(self, channel: Channel) -> None:
        """Replay, in order, what the connection sent while its request was pending."""
        for step in self._held.pop(channel, []):
            try:
                step()
            except Exception:
                _log.failure("held_frame_failed")

    def _admit(
        self,
        org: str,
        caller: str,
        target: str,
        request: fr.CallRequest,
        *,
        now: float,
    ) -> Refusal | Channel:
        """The routing checks after the directory's, in order; the target's listener, or why
        not."""
        problem = route_problem(
            request.envelope,
            fr.Direction.REQUEST,
            origin=self._relay_origin,
            org=org,
            sender=caller,
            to=target,
        )
        if problem is not None:
            return (CallErrorCode.PROTOCOL_ERROR, "envelope route does not match", problem)
        self._prune_limiter(now)
        key = (org, caller, target)
        # Peek first and record the hit only once the call really rings (or is queued), so that
        # attempts refused as offline do not use up the pair's budget.
        wait = self._limiter.retry_after(key, now)
        if wait > 0:
            detail = f"too many calls to this handle; retry in {math.ceil(wait)} s"
            return (CallErrorCode.RATE_LIMITED, detail, "rate_limited")
        listener = self._switchboard.listener_for(org, target)
        if listener is None:
            return (CallErrorCode.OFFLINE, "that handle is not listening", "offline")
        return listener

    def from_caller(self, channel: Channel, frame: fr.Frame) -> None:
        """A caller's frame after its request: only a cancel of its own call means anything."""
        if self._hold(channel, self.from_caller, channel, frame):
            return
        call_id = self._caller_channels.get(channel)
        if not isinstance(frame, fr.CancelCall) or call_id is None or frame.call_id != call_id:
            _log.debug("caller_frame_ignored", call_id=call_id, frame_type=frame.type)
            return
        call = self._calls.get(call_id)
        if call is not None:
            _log.debug("call_cancel_requested", call_id=call_id, org=call.org)
            self._send_cancel(call)

    def caller_gone(self, channel: Channel) -> None:
        """The caller's connection closed; stop the listener's work if the call is still on."""
        if self._hold(channel, self.caller_gone, channel):
            return
        call_id = self._caller_channels.pop(channel, None)
        call = self._calls.get(call_id) if call_id is not None else None
        if call is None:
            return
        _log.debug("caller_gone", call_id=call.call_id, org=call.org, caller=call.caller)
        # The record stays until a terminal frame or the deadline: a late outcome is then
        # recognised, audited and dropped instead of being counted as a stray frame.
        call = self._store(attrs.evolve(call, caller_channel=None))
        self._send_cancel(call)

    # --- listener side -----------------------------------------------------------------------

    def from_listener(self, org: str, handle: str, channel: Channel, frame: fr.Frame) -> None:
        """A frame from the listener session of ``@org/handle`` about one of its calls."""
        if not isinstance(frame, _LISTENER_FRAMES):
            self._ignore(org, handle, None, "unexpected_frame")
            return
        call = self._calls.get(frame.call_id)
        if call is None:
            self._ignore(org, handle, frame.call_id, "unknown_call")
            return
        if (call.org, call.target) != (org, handle):
            # Treated exactly like an unknown id: nothing tells the sender the call exists.
            self._ignore(org, handle, frame.call_id, "not_the_target")
            return
        if isinstance(frame, fr.CallAccepted):
            self._advance(call, Phase.ANSWERED)
        elif isinstance(frame, fr.CallStarted):
            self._advance(call, Phase.WORKING)
        elif isinstance(frame, fr.CallOutcome):
            self._outcome(call, frame)
        elif isinstance(frame, fr.CallRejected):
            self._fail(call, events.CALL_FAIL, CallErrorCode.PROTOCOL_ERROR, "rejected")
        elif isinstance(frame, fr.CallCancelled):
            self._fail(call, events.CALL_CANCEL, CallErrorCode.CANCELED, str(frame.phase))
        else:
            # call_not_cancelled only answers a cancel; the call goes on toward its outcome.
            _log.debug(
                "call_not_cancelled", call_id=call.call_id, org=org, reason=str(frame.reason)
            )

    def listener_gone(self, org: str, handle: str, channel: Channel) -> None:
        """A listener session ended: every live call rung through that very socket ends now,
        ``callee_gone``, rather than leaving its caller waiting for the deadline.

        A session replaced by a newer one of the same identity (4000) ends its calls the same
        way when its socket's teardown arrives. A listener stops a live call's agent when its
        socket drops, so the new session does not answer them; an outcome an older listener
        kept and sends on the new session before that teardown still finishes its call.
        """
        ending = [call for call in self._calls.values() if call.callee_channel is channel]
        # listener_detached (relay/protocol.py) is the session's info line; calls it cut short
        # are worth one of their own.
        emit = _log.info if ending else _log.debug
        emit("listener_gone", org=org, handle=handle, in_flight=len(ending))
        for call in ending:
            self._fail(
                call, events.CALL_FAIL, CallErrorCode.CALLEE_GONE, "listener_gone", told=GONE_DETAIL
            )

    def member_removed(self, org: str, handle: str) -> int:
        """An admin removed ``@org/handle``: every live call they placed or would answer ends
        now, ``revoked`` (a removed callee is never coming back to finish it). The callee of a
        call the removed member placed is told to stop. How many calls ended."""
        ending = [
            call
            for call in self._calls.values()
            if call.org == org and handle in (call.caller, call.target)
        ]
        for call in ending:
            if call.caller == handle:
                self._send_cancel(call)
            self._fail(call, events.CALL_FAIL, CallErrorCode.REVOKED, "member_removed")
        return len(ending)

    # --- transitions -------------------------------------------------------------------------

    def _advance(self, call: Call, to: Phase) -> None:
        if to <= call.phase:
            _log.debug(
                "lifecycle_ignored",
                call_id=call.call_id,
                phase=call.phase.name.lower(),
                requested=to.name.lower(),
            )
            return
        if call.phase is Phase.RINGING:
            # call_started straight from ringing implies the listener accepted the call.
            self._audit(events.CALL_ACCEPT, call, actor=call.target, target=call.caller)
        call = self._store(attrs.evolve(call, phase=to))
        _log.debug("call_progress", call_id=call.call_id, org=call.org, phase=to.name.lower())
        if call.caller_channel is not None:
            call.caller_channel.send(fr.CallStatus(call_id=call.call_id, state=_STATUS_OF[to]))

    def _outcome(self, call: Call, frame: fr.CallOutcome) -> None:
        problem = route_problem(
            frame.envelope,
            fr.Direction.RESPONSE,
            origin=self._relay_origin,
            org=call.org,
            sender=call.target,
            to=call.caller,
        )
        if problem is not None:
            _log.debug("outcome_route_refused", call_id=call.call_id, org=call.org, field=problem)
            self._fail(call, events.CALL_FAIL, CallErrorCode.PROTOCOL_ERROR, f"route:{problem}")
            return
        event = (
            events.CALL_COMPLETE if frame.terminal is fr.Terminal.COMPLETED else events.CALL_FAIL
        )
        # The frame object itself goes on: the relay neither opens nor rebuilds the answer.
        self._finish(call, event, frame, "done", detail=str(frame.terminal))

    def _fail(
        self, call: Call, event: str, code: CallErrorCode, detail: str, *, told: str | None = None
    ) -> None:
        """End ``call`` with ``code`` (``told``: the detail the caller reads, if any)."""
        error = fr.CallError(code=code, call_id=call.call_id, detail=told)
        self._finish(call, event, error, str(code), detail=detail)

    def _finish(
        self, call: Call, event: str, to_caller: fr.Frame, close_reason: str, *, detail: str
    ) -> None:
        """Make the call terminal: forget it, then tell the caller, then audit."""
        # Forgetting first means anything the caller's close triggers synchronously (such as
        # caller_gone) already finds no live call and sends no cancel.
        self._forget(call)
        channel = call.caller_channel
        # The call's one info line (everything else about it is at debug), written once the
        # reactor is done with this turn: the outcome goes out first.
        self._log_ended(call, event, detail, caller_present=channel is not None, later=True)
        if channel is not None:
            channel.send(to_caller)
            channel.close(CLOSE_NORMAL, close_reason)
        self._audit(event, call, actor=call.target, target=call.caller, detail=detail)
        self._ended(call)

    def _expire(self, call_id: str) -> None:
        call = self._calls.pop(call_id, None)
        if call is None:
            return
        detail = call.phase.name.lower()
        self._log_ended(call, events.CALL_TIMEOUT, detail, call.caller_channel is not None)
        if call.caller_channel is not None:
            call.caller_channel.send(fr.CallError(code=CallErrorCode.TIMEOUT, call_id=call_id))
            call.caller_channel.close(CLOSE_NORMAL, str(CallErrorCode.TIMEOUT))
        # Sent even after an earlier cancel: from here on nobody is waiting for the work.
        listener = self._switchboard.listener_for(call.org, call.target)
        if listener is not None:
            listener.send(fr.CancelCall(call_id=call_id))
        self._audit(events.CALL_TIMEOUT, call, actor=None, target=call.target, detail=detail)
        self._ended(call)

    def _ended(self, call: Call) -> None:
        """A live call is over: once a callee has none left, the mailbox may deliver to them."""
        key = (call.org, call.target)
        self._live_to[key] -= 1
        if self._live_to[key] > 0:
            return
        del self._live_to[key]
        if self._desk is not None:
            self._desk.live_call_ended(call.org, call.target)

    # --- helpers -----------------------------------------------------------------------------

    def _send_cancel(self, call: Call) -> None:
        """Ask the target's current listener to stop this call, once."""
        if call.cancel_sent:
            return
        listener = self._switchboard.listener_for(call.org, call.target)
        if listener is None:
            # Left unsent so a later trigger can try again; the deadline bounds the call anyway.
            _log.debug("cancel_undeliverable", call_id=call.call_id, org=call.org)
            return
        listener.send(fr.CancelCall(call_id=call.call_id))
        self._store(attrs.evolve(call, cancel_sent=True))

    def _store(self, call: Call) -> Call:
        self._calls[call.call_id] = call
        return call

    def _forget(self, call: Call) -> None:
        self._calls.pop(call.call_id, None)
        if call.deadline.active():
            call.deadline.cancel()

    def _log_ended(
        self, call: Call, event: str, detail: str, caller_present: bool, *, later: bool = False
    ) -> None:
        """The one info line of a call that rang: who, what ended it, and how long it took.

        ``later``: at the reactor's next turn (``callLater(0)``), with the same fields.
        """
        seconds = self._clock.seconds() - call.submitted_at
        self._metrics.call_ended(event, seconds)
        fields = {
            "call_id": call.call_id,
            "org": call.org,
            "caller": call.caller,
            "target": call.target,
            # Not "event": that key is the log event's own name.
            "audit_event": event,
            "outcome": detail,
            "duration_ms": round(seconds * 1000, 1),
            "caller_present": caller_present,
            "caller_socket": "shared" if call.shared_socket else "own",
        }
        if later:
            self._clock.callLater(0, _log_call_ended, fields)
        else:
            _log_call_ended(fields)

    def _ignore(self, org: str, handle: str, call_id: str | None, reason: str) -> None:
        self.ignored_frames += 1
        _log.debug("listener_frame_ignored", org=org, handle=handle, call_id=call_id, reason=reason)

    def _new_call_id(self) -> str:
        # A uuid4 never collides in practice; the check keeps a bad injected minter from
        # silently cross-wiring two calls.
        for _ in range(3):
            call_id = self._mint_call_id()
            if call_id not in self._calls:
                return call_id
        raise RuntimeError("call id minter keeps returning ids already in use")

    def _prune_limiter(self, now: float) -> None:
        if self._last_prune is None or now - self._last_prune >= LIMITER_PRUNE_INTERVAL_S:
            self._last_prune = now
            self._limiter.prune(now)

    def _audit(
        self, event: str, call: Call, *, actor: str | None, target: str, detail: str | None = None
    ) -> None:
        # Fire and forget: routing has already moved on, and a failed audit write must not
        # leave a call half-finished or tear down the connection whose frame triggered it.
        at = self._clock.seconds()
        entry = AuditEntry(event, call.org, actor, target, call.call_id, at, detail)
        try:
            written = self._audit_sink.record(entry)
        except Exception:
            written = defer.fail()
        written.addErrback(self._audit_failed, event, call.call_id)

    def _audit_failed(self, failure: Failure, event: str, call_id: str) -> None:
        _log.failure("audit_failed", failure=failure, audit_event=event, call_id=call_id)
