"""Calls this installation places, carried on the listener's own socket to the relay.

The running service already holds one socket to the relay; a call its owner places rides that
socket instead of a new TLS WebSocket per call (no dial, no upgrade, no authentication round
trips). :meth:`OutgoingCalls.dial` has the shape of :func:`agentcall.client.ws.place_call`, so
:func:`agentcall.caller.call.place` runs unchanged over it: it sends the sealed
``call_request`` (with ``to``, as the relay expects on this socket), reports each
``call_status``, and fires with the terminal ``call_outcome``, ``call_error`` or
``call_queued``. Several calls are in flight at once, told apart by the request's
``correlation_id`` until the relay's ringing names the call id.

When the socket is not up (the relay is restarting, the listener is reconnecting), or its relay
did not say in its ``ready`` that it takes calls there (a relay older than the persistent
socket), a call falls back to its own per-call socket, exactly as an installation without a
service places it. A socket lost mid-call ends every call on it with
:class:`~agentcall.client.ws.CallAborted`:
the relay hangs up on the callee's side as it would for a caller that went away.

Nothing here opens or seals anything: trust stays with ``place()``, which opens the answer and
verifies it against the pinned identity and the hash of the request it sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall

from agentcall.client.ws import CallAborted, CallTerminal, place_call
from agentcall.logevents import Logger
from agentcall.wire import frames as fr

_log = Logger(namespace="agentcall.listener.outgoing")

StatusHandler = Callable[[fr.CallStatus], None]


class Link(Protocol):
    """What the calls need of :class:`~agentcall.listener.connection.RelayLink`."""

    @property
    def carries_calls(self) -> bool: ...

    def send(self, frame: fr.Frame) -> bool: ...


class Timer(Protocol):
    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> IDelayedCall: ...


@attrs.define(eq=False)
class _Pending:
    correlation_id: str
    result: defer.Deferred[CallTerminal]
    on_status: StatusHandler
    timer: IDelayedCall | None = None
    call_id: str | None = None
    # The caller gave up before the relay named the call: cancel it once it does.
    abandoned: bool = False


class OutgoingCalls:
    """The outgoing calls in flight on the current socket, and the dial that places them."""

    def __init__(
        self,
        link: Link,
        clock: Timer,
        *,
        fallback: Callable[..., defer.Deferred[CallTerminal]] = place_call,
    ) -> None:
        self._link = link
        self._clock = clock
        self._fallback = fallback
        self._by_correlation: dict[str, _Pending] = {}
        self._by_call_id: dict[str, _Pending] = {}
        self.placed = 0  # calls sent on the persistent socket so far
        self.fell_back = 0  # calls that took a per-call socket because it was not up

    def in_flight(self) -> int:
        return len(self._by_correlation)

    def dial(
        self,
        reactor: Any,
        relay_url: Any,
        credentials: Any,
        handle: str,
        request: fr.CallRequest,
        *,
        ca_file: str | None = None,
        on_status: StatusHandler,
        timeout_s: float,
    ) -> defer.Deferred[CallTerminal]:
        """Place ``request`` to ``handle``: on the persistent socket when it is up, else alone."""
        cid = request.correlation_id
        pending = _Pending(cid, defer.Deferred(self._cancelled), on_status)
        # A correlation id already in flight would be refused by the relay; place() mints a
        # fresh one per call, so that only happens to a caller that reuses its request.
        sent = cid not in self._by_correlation and self._link.carries_calls
        if sent:
            self._by_correlation[cid] = pending
            sent = self._link.send(attrs.evolve(request, to=handle))
            if not sent:
                del self._by_correlation[cid]
        if not sent:
            self.fell_back += 1
            _log.debug("outgoing_on_own_socket", to=handle)
            return self._fallback(
                reactor,
                relay_url,
                credentials,
                handle,
                request,
                ca_file=ca_file,
                on_status=on_status,
                timeout_s=timeout_s,
            )
        self.placed += 1
        pending.timer = self._clock.callLater(timeout_s, self._timed_out, pending, timeout_s)
        return pending.result

    # --- frames from the relay ----------------------------------------------------------------

    def on_frame(self, frame: fr.Frame) -> bool:
        """Take a frame about one of our outgoing calls; False when it is not one."""
        if not isinstance(frame, fr.OUTGOING_TO_LISTENER):
            return False
        pending = self._find(frame)
        if pending is None:
            # A late frame for a call that already ended here (timed out, socket replaced).
            _log.debug("outgoing_frame_unmatched", frame_type=frame.type)
            return True
        if isinstance(frame, fr.CallStatus):
            self._status(pending, frame)
        elif isinstance(frame, fr.CallOutcome | fr.CallError | fr.CallQueued):
            self._end(pending, frame)
        return True

    def socket_lost(self) -> None:
        """The socket closed: the relay hung up every call on it."""
        for pending in list(self._by_correlation.values()):
            self._end(pending, CallAborted("the connection to the relay was lost during the call"))

    # --- internals ----------------------------------------------------------------------------

    def _find(self, frame: fr.Frame) -> _Pending | None:
        cid = getattr(frame, "correlation_id", None)
        if cid is not None:
            return self._by_correlation.get(cid)
        call_id = getattr(frame, "call_id", None)
        return None if call_id is None else self._by_call_id.get(call_id)

    def _status(self, pending: _Pending, frame: fr.CallStatus) -> None:
        if pending.call_id is None:
            pending.call_id = frame.call_id
            self._by_call_id[frame.call_id] = pending
            if pending.abandoned:
                self._link.send(fr.CancelCall(call_id=frame.call_id))
                return
        elif frame.call_id != pending.call_id:
            _log.warn("outgoing_status_mismatch", frame_type=frame.type)
            return
        if pending.abandoned:
            return
        try:
            pending.on_status(attrs.evolve(frame, correlation_id=None))
        except Exception:
            _log.failure("outgoing_status_handler_failed")

    def _end(self, pending: _Pending, outcome: CallTerminal | Exception) -> None:
        self._forget(pending)
        if pending.result.called:
            return
        if isinstance(outcome, Exception):
            pending.result.errback(outcome)
        elif isinstance(outcome, fr.CallOutcome | fr.CallError | fr.CallQueued):
            # The tag was for routing here; the caller sees the frames a call socket gives.
            if isinstance(outcome, fr.CallError | fr.CallQueued):
                outcome = attrs.evolve(outcome, correlation_id=None)
            pending.result.callback(outcome)

    def _forget(self, pending: _Pending) -> None:
        if self._by_correlation.get(pending.correlation_id) is pending:
            del self._by_correlation[pending.correlation_id]
        if pending.call_id is not None and self._by_call_id.get(pending.call_id) is pending:
            del self._by_call_id[pending.call_id]
        if pending.timer is not None and pending.timer.active():
            pending.timer.cancel()

    def _timed_out(self, pending: _Pending, timeout_s: float) -> None:
        pending.timer = None
        self._hang_up(pending)
        self._end(pending, CallAborted(f"no answer within {timeout_s:g} s"))

    def _cancelled(self, result: defer.Deferred[CallTerminal]) -> None:
        """The caller stopped waiting (Ctrl-C, a thin client that hung up): hang up at the relay."""
        pending = next((p for p in self._by_correlation.values() if p.result is result), None)
        if pending is None:
            return
        self._hang_up(pending)
        if pending.call_id is None:
            # Keep listening for the ringing that names it, then cancel and forget it.
            pending.abandoned = True
            if pending.timer is not None and pending.timer.active():
                pending.timer.reset(60.0)
        else:
            self._forget(pending)

    def _hang_up(self, pending: _Pending) -> None:
        if pending.call_id is not None:
            self._link.send(fr.CancelCall(call_id=pending.call_id))
