"""WebSockets to the relay: a socket that counts once the relay says ``ready``, and one call.

:func:`open_socket` dials ``/v1/ws`` (TLS verified as for the HTTP API), sends the credentials
in the upgrade request, and fires only when the relay's :class:`~agentcall.wire.frames.Ready`
frame arrived: before that the connection is not usable, and any failure fails the Deferred
instead of reaching ``on_close``. Every incoming frame is decoded strictly for the receiving
role; anything malformed closes the socket with the protocol-error code.

:func:`place_call` is one call on its own socket: ``call_request`` out, ``call_status`` frames
to a callback, and the terminal ``call_outcome``, ``call_error`` or ``call_queued`` (the relay
kept the call as a mailbox job) as the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import txaio
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import defer, error
from twisted.internet.abstract import isIPAddress
from twisted.internet.interfaces import (
    IConnector,
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import ClientFactory, connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

from agentcall import ids, limits
from agentcall.client.common import (
    USER_AGENT,
    Credentials,
    RelayUnreachable,
    describe_failure,
    parse_retry_after,
)
from agentcall.errors import AgentCallError, MalformedFrame
from agentcall.logevents import Logger, without_option_dump
from agentcall.relayurl import RelayUrl
from agentcall.wire import codec
from agentcall.wire.closecodes import CLOSE_NORMAL, CLOSE_PROTOCOL_ERROR
from agentcall.wire.frames import (
    TO_CALLER,
    TO_LISTENER,
    CallError,
    CallOutcome,
    CallQueued,
    CallRequest,
    CallStatus,
    Frame,
    Ready,
    Role,
)

if TYPE_CHECKING:
    from agentcall.client.tls import RelayTlsPolicy

txaio.use_twisted()

_PLAIN_LOSS = (error.ConnectionDone, error.ConnectionLost, error.ConnectionAborted)
# From dialling until the relay's ready frame: TCP, TLS, the upgrade and the ready frame.
OPEN_TIMEOUT_S = limits.WS_OPENING_HANDSHAKE_TIMEOUT_S

_log = Logger(namespace="agentcall.client.ws")


class SocketRefused(AgentCallError):
    """The relay answered but closed, refused or broke the protocol before ``ready``."""

    def __init__(
        self, message: str, *, close_code: int | None = None, error: CallError | None = None
    ) -> None:
        super().__init__(message)
        self.close_code = close_code
        self.error = error


class RelayBusy(SocketRefused):
    """The relay turned the upgrade away (HTTP 503) and said when to come back: nothing was
    sent on this attempt, so dialling again after ``retry_after_s`` is safe."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CallAborted(AgentCallError):
    """A call's socket ended without a ``call_outcome`` or ``call_error``."""


@attrs.frozen
class SocketClosed:
    """How a usable socket ended. ``protocol_error`` is set when we closed it for one."""

    clean: bool
    code: int | None
    reason: str | None
    protocol_error: str | None = None


FrameHandler = Callable[[Frame], None]
# How a placed call ends: an answer, the relay's refusal, or kept as a mailbox job.
CallTerminal = CallOutcome | CallError | CallQueued
CloseHandler = Callable[[SocketClosed], None]


def set_relay_protocol_options(factory: WebSocketClientFactory) -> None:
    """The WebSocket options every socket to the relay uses (the listener's too)."""
    factory.setProtocolOptions(
        maxFramePayloadSize=limits.MAX_FRAME_BYTES,
        maxMessagePayloadSize=limits.MAX_FRAME_BYTES,
        autoPingInterval=limits.KEEPALIVE_INTERVAL_S,
        autoPingTimeout=limits.KEEPALIVE_TIMEOUT_S,
        openHandshakeTimeout=OPEN_TIMEOUT_S,
        # autobahn's 1 s default is too short for a loaded machine or a slow link; an unclean
        # close would be reported for a normal hang-up.
        closeHandshakeTimeout=5,
        perMessageCompressionOffers=[],
        perMessageCompressionAccept=lambda _response: None,
        # agentcall.wire.codec decodes every text frame as strict UTF-8 (in C); a second,
        # byte-by-byte validation here would only cost time.
        utf8validateIncoming=False,
    )


def relay_endpoint(
    reactor: Any, relay_url: RelayUrl, ca_file: str | None, tls: RelayTlsPolicy | None = None
) -> IStreamClientEndpoint:
    """TCP to the relay, inside verified TLS for an https relay: with ``tls``, the trust
    already read; else the CA file (or the platform's roots) is read now. A plain ``http``
    relay loads none of the TLS code.

    :raises CaFileError: the chosen CA file cannot be used.
    """
    # Imported here: twisted.internet.endpoints brings the TLS stack (pyOpenSSL, service-identity,
    # cryptography's x509) even for plain TCP, which a call to an address need not load.
    from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS

    endpoint: IStreamClientEndpoint = HostnameEndpoint(
        reactor, relay_url.host, relay_url.port, timeout=OPEN_TIMEOUT_S
    )
    if relay_url.secure:
        if tls is None:
            from agentcall.client.tls import RelayTlsPolicy

            tls = RelayTlsPolicy(ca_file)
        endpoint = wrapClientTLS(tls.for_host(relay_url.host), endpoint, clock=reactor)
    return endpoint


def call_endpoint(
    reactor: Any, relay_url: RelayUrl, ca_file: str | None, tls: RelayTlsPolicy | None = None
) -> IStreamClientEndpoint:
    """Where a call's own socket dials: :func:`relay_endpoint`, except that a plain ``http``
    relay named by an IPv4 address (a relay URL takes no IPv6 literal) is dialled straight
    (:class:`AddressEndpoint`)."""
    host = relay_url.host
    if not relay_url.secure and isIPAddress(host):
        return AddressEndpoint(reactor, host, relay_url.port, OPEN_TIMEOUT_S)
    return relay_endpoint(reactor, relay_url, ca_file, tls)


@implementer(IStreamClientEndpoint)
class AddressEndpoint:
    """TCP to one IP address: what ``HostnameEndpoint`` does for a name that is an address,
    without starting a resolver thread for it (nor importing ``twisted.internet.endpoints``).

    ``connect`` fires with the protocol once the connection is made, fails as the connection
    attempt failed (refused, timed out after ``timeout_s``), and cancelling it stops the attempt
    (the Deferred then fails with CancelledError).
    """

    def __init__(self, reactor: Any, host: str, port: int, timeout_s: float) -> None:
        self._reactor = reactor
        self._host = host
        self._port = port
        self._timeout_s = timeout_s

    def connect(self, protocolFactory: IProtocolFactory) -> defer.Deferred[IProtocol]:
        attempt = _Attempt(protocolFactory)
        connector = self._reactor.connectTCP(
            self._host, self._port, attempt, timeout=self._timeout_s
        )
        attempt.connector = connector
        return attempt.result


class _Attempt(ClientFactory):
    """One connection attempt of :class:`AddressEndpoint`, handing the connection to the
    caller's factory."""

    def __init__(self, wrapped: IProtocolFactory) -> None:
        self._wrapped = wrapped
        self.connector: IConnector | None = None
        self._cancelled = False
        self.result: defer.Deferred[IProtocol] = defer.Deferred(self._cancel)

    def doStart(self) -> None:
        self._wrapped.doStart()

    def doStop(self) -> None:
        self._wrapped.doStop()

    def buildProtocol(self, addr: Any) -> Any:
        protocol = self._wrapped.buildProtocol(addr)
        if protocol is None:
            self.result.errback(error.ConnectError("the factory built no protocol"))
        elif not self.result.called:
            # The transport connects it at once, in the same turn of the reactor.
            self.result.callback(protocol)
        return protocol

    def clientConnectionFailed(self, connector: IConnector, reason: Failure) -> None:
        if not self._cancelled and not self.result.called:
            self.result.errback(reason)

    def _cancel(self, _d: defer.Deferred[IProtocol]) -> None:
        self._cancelled = True
        if self.connector is not None:
            self.connector.stopConnecting()


class ClientSocket:
    """A socket the relay has declared ready. Frames out with :meth:`send`."""

    def __init__(self, protocol: _RelayClientProtocol, ready: Ready) -> None:
        self._protocol = protocol
        self.ready = ready

    @property
    def is_open(self) -> bool:
        return self._protocol.is_usable

    def send(self, frame: Frame) -> bool:
        """Send one frame; False (and nothing sent) if the socket is already closing."""
        if not self._protocol.is_usable:
            return False
        self._protocol.sendMessage(codec.encode(frame), isBinary=False)
        return True

    def close(self) -> None:
        self._protocol.close_normally()


@without_option_dump
class _RelayClientProtocol(WebSocketClientProtocol):
    factory: _RelayClientFactory
    # autobahn logs the whole upgrade request, bearer token included, at debug level; this
    # logger stays at info whatever the global txaio level is.
    log = txaio.make_logger(level="info")  # type: ignore[attr-defined]

    def __init__(self) -> None:
        super().__init__()
        self.socket: ClientSocket | None = None
        self.is_usable = False
        self._lost: Failure | None = None
        self._protocol_error: str | None = None
        self._closed_reported = False

    # --- frames in -------------------------------------------------------------------------

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        # Once we are closing (protocol error, or our own close) nothing more is delivered.
        if self._protocol_error is not None or (self.socket is not None and not self.is_usable):
            return
        try:
            if isBinary:
                raise MalformedFrame("binary frames are not part of the protocol")
            frame = codec.decode_frame(
                payload, self.factory.accept, max_bytes=limits.MAX_FRAME_BYTES
            )
        except MalformedFrame as exc:
            self._violation(f"malformed frame ({exc})")
            return
        if self.socket is None:
            self._before_ready(frame)
        elif isinstance(frame, Ready):
            self._violation("a second ready frame")
        else:
            self.factory.deliver(frame)

    def _before_ready(self, frame: Frame) -> None:
        factory = self.factory
        if isinstance(frame, Ready):
            if frame.role != factory.role or frame.address != factory.address:
                self._violation(f"ready for {frame.role} {frame.address}, not for us")
                return
            self.is_usable = True
            self.socket = ClientSocket(self, frame)
            factory.opened(self.socket)
        elif isinstance(frame, CallError):
            # The relay turned the call away before the socket was usable (for example an
            # unknown token); that is its answer, not a broken connection.
            factory.fail(SocketRefused(f"the relay refused: {frame.code}", error=frame))
            self.close_normally()
        else:
            self._violation(f"{frame.type} before ready")

    def _violation(self, why: str) -> None:
        _log.warn("relay_protocol_error", reason=why, relay=self.factory.relay_url.netloc)
        self._protocol_error = why
        self.is_usable = False
        self.factory.fail(
            SocketRefused(f"the relay broke the protocol: {why}", close_code=CLOSE_PROTOCOL_ERROR)
        )
        if self.state == self.STATE_OPEN:
            # A close reason is at most 123 bytes of UTF-8.
            self.sendClose(CLOSE_PROTOCOL_ERROR, why.encode()[:100].decode(errors="ignore"))

    # --- closing ---------------------------------------------------------------------------

    def close_normally(self) -> None:
        self.is_usable = False
        if self.state == self.STATE_OPEN:
            self.sendClose(CLOSE_NORMAL)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        # autobahn reduces the reason to text; keep the failure to say what went wrong.
        self._lost = reason
        super().connectionLost(reason)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.is_usable = False
        if self._closed_reported:
            return
        self._closed_reported = True
        busy = None if self.socket is not None else self._busy_for()
        if self.socket is not None:
            self.factory.closed(SocketClosed(wasClean, code, reason, self._protocol_error))
        elif busy is not None:
            netloc = self.factory.relay_url.netloc
            self.factory.fail(
                RelayBusy(
                    f"{netloc} is busy accepting other connections (HTTP 503) and asked to be "
                    f"dialled again in {busy:g} s",
                    busy,
                )
            )
        elif wasClean:
            self.factory.fail(
                SocketRefused(
                    f"the relay closed the socket before it was ready (code {code}: {reason})",
                    close_code=code,
                )
            )
        else:
            self.factory.fail(RelayUnreachable(self._describe_loss(reason)))

    def _busy_for(self) -> float | None:
        """The relay's ``Retry-After`` if it answered the upgrade 503 with one, else None."""
        status = (getattr(self, "http_status_line", None) or "").split()
        if status[1:2] != ["503"]:
            return None
        headers = getattr(self, "http_headers", None) or {}
        return parse_retry_after(headers.get("retry-after"))

    def _describe_loss(self, reason: str | None) -> str:
        lost = self._lost.value if self._lost is not None else None
        if lost is None or isinstance(lost, _PLAIN_LOSS):
            # Nothing more specific than "closed": autobahn's words say why (upgrade refused).
            return f"{self.factory.relay_url.netloc}: {reason or 'connection closed'}"
        return describe_failure(lost, self.factory.relay_url)


class _RelayClientFactory(WebSocketClientFactory):
    """One dial: owns the attempt, the deadline until ready, and the Deferred the caller gets."""

    protocol = _RelayClientProtocol  # type: ignore[assignment]

    def __init__(
        self,
        reactor: Any,
        relay_url: RelayUrl,
        credentials: Credentials,
        role: Role,
        query: dict[str, str],
        *,
        handlers: tuple[FrameHandler, CloseHandler],
    ) -> None:
        headers = {k.decode(): v.decode() for k, v in credentials.headers().items()}
        super().__init__(
            relay_url.ws(query), useragent=USER_AGENT, headers=headers, reactor=reactor
        )
        set_relay_protocol_options(self)
        self.relay_url = relay_url
        self.role = role
        self.address = ids.format_address(credentials.org, credentials.handle)
        self.accept = TO_CALLER if role is Role.CALL else TO_LISTENER
        self._on_frame, self._on_close = handlers
        self._attempt: defer.Deferred[Any] | None = None
        self._protocol: _RelayClientProtocol | None = None
        self._timer: IDelayedCall | None = None
        self.result: defer.Deferred[ClientSocket] = defer.Deferred(lambda _d: self._stop())

    def dial(
        self, endpoint: IStreamClientEndpoint, clock: IReactorTime
    ) -> defer.Deferred[ClientSocket]:
        self._timer = clock.callLater(OPEN_TIMEOUT_S, self._too_slow)
        self._attempt = endpoint.connect(self)
        self._attempt.addCallbacks(self._connected, self._not_connected)
        return self.result

    def _connected(self, protocol: _RelayClientProtocol) -> None:
        self._protocol = protocol

    def _not_connected(self, failure: Failure) -> None:
        self.fail(RelayUnreachable(describe_failure(failure, self.relay_url, OPEN_TIMEOUT_S)))

    def _too_slow(self) -> None:
        netloc = self.relay_url.netloc
        self.fail(RelayUnreachable(f"{netloc} was not ready within {OPEN_TIMEOUT_S:g} s"))
        self._stop()

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()

    def _stop(self) -> None:
        self._cancel_timer()
        if self._protocol is not None:
            self._protocol.dropConnection(abort=True)
        elif self._attempt is not None:
            self._attempt.cancel()

    def opened(self, socket: ClientSocket) -> None:
        if not self.result.called:
            self._cancel_timer()
            self.result.callback(socket)

    def fail(self, exc: Exception) -> None:
        if not self.result.called:
            self._cancel_timer()
            self.result.errback(exc)

    def deliver(self, frame: Frame) -> None:
        try:
            self._on_frame(frame)
        except Exception:
            # One bad handler run must not tear down the socket it was called from.
            _log.failure("ws_frame_handler_failed", frame_type=frame.type)

    def closed(self, info: SocketClosed) -> None:
        try:
            self._on_close(info)
        except Exception:
            _log.failure("ws_close_handler_failed")


def open_socket(
    reactor: Any,
    relay_url: RelayUrl,
    credentials: Credentials,
    role: Role,
    *,
    to: str | None = None,
    ca_file: str | None = None,
    tls: RelayTlsPolicy | None = None,
    on_frame: FrameHandler,
    on_close: CloseHandler,
    clock: IReactorTime | None = None,
) -> defer.Deferred[ClientSocket]:
    """Dial the relay; fire with a :class:`ClientSocket` once its ``ready`` frame arrived.

    Fails with :class:`RelayUnreachable` (no connection, TLS rejected, nothing usable within
    :data:`OPEN_TIMEOUT_S` on ``clock``, the reactor by default) or :class:`SocketRefused`.
    ``on_close`` is called only for a socket that became usable. Cancelling disconnects.
    ``tls``: the trust already read for this relay (else ``ca_file`` is read now).
    """
    if (role is Role.CALL) != (to is not None):
        return defer.fail(ValueError("a call socket needs `to`; a listen socket takes none"))
    if to is not None and not ids.is_handle(to):
        return defer.fail(ValueError(f"not a valid handle: {to!r}"))
    try:
        endpoint = call_endpoint(reactor, relay_url, ca_file, tls)
    except AgentCallError as exc:
        return defer.fail(exc)
    query = {"role": str(role)} if to is None else {"role": str(role), "to": to}
    factory = _RelayClientFactory(
        reactor, relay_url, credentials, role, query, handlers=(on_frame, on_close)
    )
    return factory.dial(endpoint, reactor if clock is None else clock)


class _PlacedCall:
    """One call on its own socket: request out, statuses to a callback, a terminal back."""

    def __init__(
        self,
        clock: IReactorTime,
        request: CallRequest,
        on_status: Callable[[CallStatus], None],
        timeout_s: float,
    ) -> None:
        self._clock = clock
        self._request = request
        self._on_status = on_status
        self._timeout_s = timeout_s
        self._opening: defer.Deferred[ClientSocket] | None = None
        self._socket: ClientSocket | None = None
        self._terminal: CallTerminal | None = None
        self._timer: IDelayedCall | None = None
        self._gave_up: str | None = None
        self.result: defer.Deferred[CallTerminal] = defer.Deferred(self._cancel)

    def start(self, opening: defer.Deferred[ClientSocket]) -> None:
        self._opening = opening
        opening.addCallbacks(self._opened, self._not_opened)

    def _opened(self, socket: ClientSocket) -> None:
        self._opening = None
        self._socket = socket
        socket.send(self._request)
        self._timer = self._clock.callLater(self._timeout_s, self._too_slow)

    def _not_opened(self, failure: Failure) -> None:
        self._opening = None
        if self.result.called:
            return
        refused = failure.value
        if isinstance(refused, SocketRefused) and refused.error is not None:
            self.result.callback(refused.error)
        else:
            self.result.errback(failure)

    def on_frame(self, frame: Frame) -> None:
        if self._terminal is not None:
            return
        if isinstance(frame, CallStatus):
            self._on_status(frame)
        elif isinstance(frame, (CallOutcome, CallError, CallQueued)):
            # The relay closes after a terminal frame; closing too keeps a stuck relay from
            # holding the result back.
            self._terminal = frame
            self._stop_timer()
            if self._socket is not None:
                self._socket.close()

    def on_close(self, info: SocketClosed) -> None:
        self._stop_timer()
        if self.result.called:
            return
        if self._terminal is not None:
            self.result.callback(self._terminal)
            return
        why = self._gave_up or (
            f"the relay broke the protocol: {info.protocol_error}"
            if info.protocol_error
            else f"the relay closed the call without an outcome (code {info.code})"
        )
        self.result.errback(CallAborted(why))

    def _too_slow(self) -> None:
        self._timer = None
        self._gave_up = f"no outcome within {self._timeout_s:g} s"
        if self._socket is not None:
            self._socket.close()

    def _stop_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _cancel(self, _d: defer.Deferred[CallTerminal]) -> None:
        # Closing the socket is how a caller hangs up: the relay cancels the call.
        self._stop_timer()
        if self._opening is not None:
            self._opening.cancel()
        elif self._socket is not None:
            self._socket.close()


def place_call(
    reactor: Any,
    relay_url: RelayUrl,
    credentials: Credentials,
    target_handle: str,
    request: CallRequest,
    *,
    ca_file: str | None = None,
    tls: RelayTlsPolicy | None = None,
    on_status: Callable[[CallStatus], None],
    clock: IReactorTime | None = None,
    timeout_s: float = limits.CLIENT_CALL_TIMEOUT_S,
) -> defer.Deferred[CallTerminal]:
    """Place one call; fire with the terminal ``call_outcome``, ``call_error`` or
    ``call_queued``.

    Fails with :class:`CallAborted` when the socket ends without one (or nothing came within
    ``timeout_s``), and with :class:`RelayUnreachable` / :class:`SocketRefused` when no usable
    socket was opened. Cancelling the Deferred hangs up.
    """
    call = _PlacedCall(reactor if clock is None else clock, request, on_status, timeout_s)
    opening = open_socket(
        reactor,
        relay_url,
        credentials,
        Role.CALL,
        to=target_handle,
        ca_file=ca_file,
        tls=tls,
        on_frame=call.on_frame,
        on_close=call.on_close,
        clock=clock,
    )
    call.start(opening)
    return call.result
