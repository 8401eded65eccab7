"""Placing the bridge's calls: through the running local service, or dialled from here.

Like ``agentcall call``, the bridge hands a call to this installation's listener service when
one runs (its private UNIX socket, :mod:`agentcall.wire.local`'s lines opened by the service key
of :mod:`agentcall.local.servicekey`, the peer checked to be this user) and otherwise places
it itself with :func:`agentcall.caller.callflow.run_call`, the code both paths of the CLI run.
Either way the caller is the person running the bridge, the call is sealed end to end, and how
it ends is one :class:`~agentcall.wire.local.LocalEnded`.

Cancelling the Deferred :meth:`CallPlacer.place` returns hangs up: the service cancels a call
whose connection closes, and a direct call's socket is closed.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.protocol import Factory
from twisted.protocols.basic import LineOnlyReceiver
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.errors import AgentCallError, MalformedFrame
from agentcall.local import servicekey, unixsocket
from agentcall.local.home import Home, LocalStateError
from agentcall.logevents import Logger
from agentcall.wire.frames import CallStatus
from agentcall.wire.local import (
    FROM_SERVICE,
    LocalCall,
    LocalEnded,
    LocalNote,
    LocalStatus,
    decode_line,
    encode_key_line,
    encode_line,
)

log = Logger()

StateSink = Callable[[str], None]


class _ServiceCall(LineOnlyReceiver):
    """One call over the service's socket: the request line out, status lines in, one end."""

    delimiter = b"\n"
    MAX_LENGTH = limits.MAX_LOCAL_EVENT_BYTES

    def __init__(
        self, request: LocalCall, on_state: StateSink, done: defer.Deferred[Any], key: str
    ) -> None:
        self._request = request
        self._on_state = on_state
        self._done = done
        self._key = key

    def connectionMade(self) -> None:
        if self.transport is None:
            return
        # The service reads nothing of a connection that does not open with its key.
        key_line = encode_key_line(self._key)
        self.transport.write(key_line + encode_line(self._request) + self.delimiter)

    def lineReceived(self, line: bytes) -> None:
        if self._done.called:
            return
        try:
            event = decode_line(line, FROM_SERVICE, max_bytes=limits.MAX_LOCAL_EVENT_BYTES)
        except MalformedFrame:
            self._end(_trouble("the local AgentCall service sent a line this bridge cannot read"))
            return
        if isinstance(event, LocalStatus):
            self._on_state(event.state)
        elif isinstance(event, LocalNote):
            log.info("a2a_note", text=event.text[:200])
        elif isinstance(event, LocalEnded):
            self._end(event)

    def lineLengthExceeded(self, line: bytes) -> None:
        self._end(_trouble("the local AgentCall service sent more than a call can hold"))

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:  # noqa: B008
        self._end(
            _trouble(
                "the local AgentCall service stopped during the call (it may have reached the "
                "agent); check `agentcall doctor`, then send the message again",
                code="service_stopped",
            )
        )

    def _end(self, ended: LocalEnded) -> None:
        if not self._done.called:
            self._done.callback(ended)
        if self.transport is not None:
            self.transport.loseConnection()


def _trouble(message: str, code: str = "service_error") -> LocalEnded:
    return LocalEnded.refused(code, message)


class CallPlacer:
    """Places a call as this installation: through the service when it runs, else directly.

    ``home`` is read again for each call (``AGENTCALL_HOME`` as at start-up), so a service
    started or stopped while the bridge runs is noticed at the next call.
    """

    def __init__(self, reactor: Any, home: Home) -> None:
        self._reactor = reactor
        self._home = home

    def place(self, request: LocalCall, on_state: StateSink) -> defer.Deferred[LocalEnded]:
        """How ``request`` ended; cancelling the Deferred hangs up."""
        via_service = self._through_service(request, on_state)
        if via_service is not None:
            return via_service
        return self._directly(request, on_state)

    def _through_service(
        self, request: LocalCall, on_state: StateSink
    ) -> defer.Deferred[LocalEnded] | None:
        """The call handed to the running service; None when there is none to use."""
        if self._home.relay_override is not None:
            return None  # AGENTCALL_RELAY names a relay for this process; the service has its own
        try:
            key = servicekey.read(self._home)
        except OSError:
            return None  # no service, or a key this process may not read: as the CLI does
        try:
            sock = unixsocket.connect(
                self._home.service_socket_path, timeout_s=limits.LOCAL_CONNECT_TIMEOUT_S
            )
        except OSError:
            return None
        with contextlib.closing(sock):
            try:
                peer = unixsocket.peer_credentials(sock)
            except OSError:
                return None
            if peer.uid != os.getuid():
                return None
            protocols: list[_ServiceCall] = []

            def hang_up(_d: defer.Deferred[LocalEnded]) -> None:
                for protocol in protocols:
                    if protocol.transport is not None:
                        protocol.transport.loseConnection()

            done: defer.Deferred[LocalEnded] = defer.Deferred(hang_up)

            def build() -> _ServiceCall:
                protocol = _ServiceCall(request, on_state, done, key)
                protocols.append(protocol)
                return protocol

            factory = Factory.forProtocol(build)
            self._reactor.adoptStreamConnection(sock.fileno(), socket.AF_UNIX, factory)
        log.info("a2a_call_placed", target=request.target, path="service")
        return done

    def _directly(self, request: LocalCall, on_state: StateSink) -> defer.Deferred[LocalEnded]:
        from agentcall.caller import callflow
        from agentcall.local.config import load_config

        try:
            config = load_config(self._home)
        except LocalStateError as exc:
            return defer.succeed(LocalEnded.refused("not_set_up", str(exc)))

        def on_status(frame: CallStatus) -> None:
            on_state(str(frame.state))

        def on_note(text: str) -> None:
            log.info("a2a_note", text=text[:200])

        async def work() -> LocalEnded:
            try:
                return await callflow.run_request(
                    self._reactor, self._home, config, request, on_status, on_note
                )
            except AgentCallError as exc:
                return LocalEnded.refused("local_error", str(exc))

        log.info("a2a_call_placed", target=request.target, path="direct")
        return defer.ensureDeferred(work())
