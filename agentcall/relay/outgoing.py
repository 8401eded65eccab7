"""An installation's outgoing calls on its persistent socket (``role=listen``).

A listener socket is the installation's one connection to the relay: besides the calls it
answers, it carries the calls its owner places, several at once. Each outgoing call gets a
:class:`CallPort`, which the :class:`~agentcall.relay.calls.CallBook` treats exactly like a
per-call caller socket: the same routing checks, rate window, mailbox and deadline, the same
frames. The differences live here:

- the frame names its target (``call_request.to``) instead of the socket URL;
- what the book sends about the call is tagged with the request's ``correlation_id`` (the
  ``call_status`` that says ringing tells the client the call id; ``call_outcome`` is keyed by
  call id alone and passes untouched, so the relay forwards the listener's bytes as they came);
- the book's "close" of a finished call ends only that call, never the socket;
- a cancel names the call by id, and only a call of this socket can be cancelled by it;
- when the socket closes, every call still on it is treated as a caller that went away.

No reactor and no I/O: the socket is a :class:`~agentcall.relay.switchboard.Channel`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs
from twisted.internet import defer
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.errors import CallErrorCode
from agentcall.logevents import Logger
from agentcall.relay.switchboard import Channel
from agentcall.wire import frames as fr
from agentcall.wire.closecodes import CLOSE_NORMAL

_log = Logger(namespace="agentcall.relay.outgoing")


class Book(Protocol):
    """What the ports need of :class:`~agentcall.relay.calls.CallBook`."""

    def submit(
        self,
        caller_org: str,
        caller_handle: str,
        target_handle: str,
        channel: Channel,
        request: fr.CallRequest,
    ) -> defer.Deferred[None]: ...

    def from_caller(self, channel: Channel, frame: fr.Frame) -> None: ...

    def caller_gone(self, channel: Channel) -> None: ...


_TAGGED = (fr.CallStatus, fr.CallError, fr.CallQueued)
_TERMINAL = (fr.CallError, fr.CallOutcome, fr.CallQueued)


class CallPort:
    """One outgoing call on a shared socket, seen by the book as a caller channel of its own."""

    def __init__(
        self, socket: Channel, correlation_id: str, on_done: Callable[[CallPort], None]
    ) -> None:
        self._socket = socket
        self.correlation_id = correlation_id
        self._on_done = on_done
        self.call_id: str | None = None
        self.done = False
        # A terminal frame went out: the client knows how the call ended.
        self._told_end = False

    @property
    def peer(self) -> str:
        return self._socket.peer

    def send(self, frame: object) -> None:
        if self.done:
            return
        if isinstance(frame, fr.CallStatus):
            # The most frequent frame, retagged without attrs.evolve's field walk.
            if self.call_id is None:
                self.call_id = frame.call_id
            frame = fr.CallStatus(
                call_id=frame.call_id, state=frame.state, correlation_id=self.correlation_id
            )
        else:
            if isinstance(frame, _TERMINAL):
                self._told_end = True
            if isinstance(frame, _TAGGED):
                frame = attrs.evolve(frame, correlation_id=self.correlation_id)
        self._socket.send(frame)

    def close(self, code: int, reason: str) -> None:
        """The book is done with the call: the call ends, the socket stays.

        On a per-call socket the close itself tells the client the call is over (an internal
        error closes with no frame); here the client must be told in a frame instead.
        """
        if self.done:
            return
        if not self._told_end:
            self.send(
                fr.CallError(
                    code=CallErrorCode.PROTOCOL_ERROR,
                    call_id=self.call_id,
                    detail=reason[: limits.MAX_DETAIL_CHARS] or "the relay ended the call",
                )
            )
        self.done = True
        self._on_done(self)

    def __repr__(self) -> str:
        return f"<CallPort {self.correlation_id} call={self.call_id} on {self._socket.peer}>"


class SocketCalls:
    """The outgoing calls in flight on one listener socket of ``@org/handle``."""

    def __init__(
        self,
        book: Book,
        socket: Channel,
        org: str,
        handle: str,
        *,
        max_calls: int = limits.MAX_OUTGOING_CALLS_PER_SOCKET,
    ) -> None:
        self._book = book
        self._socket = socket
        self._org = org
        self._handle = handle
        self._max_calls = max_calls
        self._ports: dict[str, CallPort] = {}
        self._closed = False

    def in_flight(self) -> int:
        return len(self._ports)

    def request(self, frame: fr.CallRequest) -> None:
        """Route one ``call_request`` that arrived on the socket, or refuse it on the socket."""
        cid = frame.correlation_id
        if self._closed:
            self.refuse(frame, CallErrorCode.PROTOCOL_ERROR, "the connection is closing")
        elif frame.to is None:
            self.refuse(frame, CallErrorCode.PROTOCOL_ERROR, "a call_request here must name `to`")
        elif cid in self._ports:
            self.refuse(frame, CallErrorCode.PROTOCOL_ERROR, "that correlation_id is in flight")
        elif len(self._ports) >= self._max_calls:
            detail = f"at most {self._max_calls} calls in flight on one connection"
            self.refuse(frame, CallErrorCode.RATE_LIMITED, detail)
        else:
            port = CallPort(self._socket, cid, self._port_done)
            self._ports[cid] = port
            routed = self._book.submit(self._org, self._handle, frame.to, port, frame)
            routed.addErrback(self._routing_failed, port)

    def refuse(self, frame: fr.CallRequest, code: CallErrorCode, detail: str) -> None:
        """Turn a request down on the socket before it reaches the book; the socket stays."""
        _log.info("outgoing_refused", org=self._org, caller=self._handle, code=str(code))
        self._socket.send(
            fr.CallError(code=code, detail=detail, correlation_id=frame.correlation_id)
        )

    def _routing_failed(self, failure: Failure, port: CallPort) -> None:
        # A bug in routing, not the caller's fault: logged with its traceback, and only this
        # call ends (told so), as a per-call socket would be closed.
        _log.failure("call_routing_failed", failure=failure, org=self._org, caller=self._handle)
        port.close(CLOSE_NORMAL, "internal error")

    def cancel(self, frame: fr.CancelCall) -> None:
        """A cancel of one of this socket's calls; any other call id is ignored."""
        port = next((p for p in self._ports.values() if p.call_id == frame.call_id), None)
        if port is None:
            _log.debug("outgoing_cancel_ignored", org=self._org, caller=self._handle)
            return
        self._book.from_caller(port, frame)

    def socket_gone(self) -> None:
        """The socket closed: each call still on it lost its caller."""
        self._closed = True
        for port in list(self._ports.values()):
            port.done = True
            self._ports.pop(port.correlation_id, None)
            self._book.caller_gone(port)

    def _port_done(self, port: CallPort) -> None:
        # The book forgets the port as it would forget a closed caller socket.
        if self._ports.get(port.correlation_id) is port:
            del self._ports[port.correlation_id]
        self._book.caller_gone(port)
