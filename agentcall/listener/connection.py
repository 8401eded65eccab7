"""The listener's one WebSocket to the relay, kept up by ``ClientService``.

- Reconnects with exponential backoff (x1.5) and full jitter, the first attempt included, and no
  sooner than a ``Retry-After`` the relay sent (:func:`reconnect_delay`). A dial turned away at
  once (nothing listens: the relay is restarting; or its front door is full and it closes the
  connection unanswered) does not widen the window, up to :data:`REFUSED_NOT_COUNTED` of them
  (:func:`counted_attempts`).
- Re-reads the relay URL, token and CA file (through ``load_settings``) on every attempt, so a
  rotated token or a moved relay is picked up without a restart.
- Verifies TLS exactly as the client library does (:func:`agentcall.client.ws.relay_endpoint`)
  and uses the same WebSocket options.
- Counts a connection only once the relay's ``ready`` frame for our own address arrived: that
  is ``prepareConnection``. Until then nothing is delivered and nothing is sent.
- Decodes every frame strictly for the listener role; a malformed one is logged and dropped.
- Dials with ``mailbox=1`` in the query: this listener takes offline-mailbox jobs
  (``job_delivery``), so the relay may hand it the owner's queued calls. A relay that asks
  for ``jobs_held`` in its ``ready`` (:attr:`RelayLink.takes_jobs_held`) is told first which
  jobs this listener holds.
- Stops for good when the relay closes its current socket with :data:`CLOSE_REPLACED`: another
  listener for the same identity connected, and redialling would only replace it in turn; and
  with :data:`CLOSE_REMOVED`: an admin removed the member, so its token will never work again.

:class:`RelayLink` is what the pipeline sends through: a frame goes to the current usable
socket, or :meth:`RelayLink.send` returns False and the pipeline keeps what matters.
"""

from __future__ import annotations

import errno
import random as _random
from collections.abc import Callable
from typing import Any

import attrs
import txaio
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.application import internet, service
from twisted.internet import defer, error
from twisted.internet.interfaces import IProtocol, IReactorTime, IStreamClientEndpoint
from twisted.internet.protocol import Factory, connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

from agentcall import limits
from agentcall.client.api import USER_AGENT, Credentials
from agentcall.client.common import parse_retry_after
from agentcall.client.ws import OPEN_TIMEOUT_S, relay_endpoint, set_relay_protocol_options
from agentcall.errors import AgentCallError, MalformedFrame
from agentcall.logevents import Logger, without_option_dump
from agentcall.relayurl import RelayUrl
from agentcall.wire import codec
from agentcall.wire.closecodes import (
    CLOSE_NORMAL,
    CLOSE_PROTOCOL_ERROR,
    CLOSE_RECOVERED,
    CLOSE_REMOVED,
    CLOSE_REPLACED,
)
from agentcall.wire.frames import TO_LISTENER, Frame, Ready, Role

txaio.use_twisted()

_log = Logger(namespace="agentcall.listener.connection")

RECONNECT_FACTOR = 1.5
# Dials turned away at once that do not widen the reconnect window: refused (ECONNREFUSED: no
# relay listens, it is restarting), reset while connecting, or closed by the relay before it
# answered the upgrade (its front door evicting an unfinished handshake for a newcomer). Each costs
# the relay nothing or next to nothing, and a relay back after a restart of a few seconds
# should not find the listeners it turned away spread over a window half as long again (in a
# 10,000-listener storm those were the last to return, bench/storm_bench.py). Four such dials
# are about 20 s of a relay down or full; after them the window grows as for any other failure,
# so a relay down for long is not dialled every few seconds.
REFUSED_NOT_COUNTED = 4
REPLACED_DETAIL = (
    "another listener for this identity connected to the relay and took over; this one stops "
    "and does not reconnect (restart it to answer calls here again)"
)
RECOVERED_DETAIL = (
    "this identity was recovered with its recovery code on another machine, which answers its "
    "calls now; this listener stops and does not reconnect (its token no longer works)"
)
REMOVED_DETAIL = (
    "an organisation admin removed this member; its token no longer works, so this listener "
    "stops and does not reconnect (an admin can invite you again)"
)


def listen_query(*, mailbox: bool) -> dict[str, str]:
    """The query of the listener's socket URL (``mailbox=1``: it can take queued jobs)."""
    query = {"role": str(Role.LISTEN)}
    if mailbox:
        query["mailbox"] = "1"
    return query


def reconnect_delay(
    attempt: int, random: Callable[[], float], retry_after: float | None = None
) -> float:
    """Seconds before retry number ``attempt`` (1, 2, …) of a connection to the relay.

    Full jitter: uniform between 0.25 s and a window of 10 s that grows 1.5 times with each
    attempt (15, 22.5, 33.75, … at most 60 s), so a crowd
    of listeners that lost the relay at the same instant comes back spread over seconds, not
    in one burst, and a single listener after a blip is back within 10 s. ``retry_after`` (the
    relay's ``Retry-After``, capped at 60 s) is a floor, plus up to 0.5 s so that those told
    the same number do not come back on the same tick. ``random()`` is in [0, 1).
    """
    exponent = min(max(attempt, 1) - 1, 32)  # 2**32 s is far past the cap; no overflow
    window = min(
        limits.RECONNECT_FIRST_WINDOW_S * RECONNECT_FACTOR**exponent, limits.RECONNECT_MAX_S
    )
    delay = limits.RECONNECT_MIN_S + random() * (window - limits.RECONNECT_MIN_S)
    if retry_after is not None:
        told = min(max(retry_after, 0.0), limits.RECONNECT_MAX_S)
        delay = max(delay, told + random() * limits.RECONNECT_JITTER_S)
    return delay


def counted_attempts(attempt: int, refused: int) -> int:
    """The attempt number the reconnect window is sized by: ClientService's ``attempt`` (failed
    dials since the last usable connection) less the ``refused`` ones among them (at most
    :data:`REFUSED_NOT_COUNTED`), at least 1."""
    return max(1, attempt - min(max(refused, 0), REFUSED_NOT_COUNTED))


@attrs.frozen
class RelaySettings:
    """Where to connect and as whom, as read from config.json for one attempt."""

    relay_url: RelayUrl
    credentials: Credentials  # its repr hides the token
    ca_file: str | None

    @property
    def address(self) -> str:
        return f"@{self.credentials.org}/{self.credentials.handle}"


class NotReady(AgentCallError):
    """The relay closed, timed out or broke the protocol before declaring the socket ready."""


class RelayLink:
    """The current usable socket, as the pipeline sees it."""

    def __init__(self) -> None:
        self._protocol: _ListenerProtocol | None = None

    @property
    def connected(self) -> bool:
        return self._protocol is not None and self._protocol.usable

    @property
    def carries_calls(self) -> bool:
        """The current socket is usable and its relay said it takes our own outgoing calls."""
        protocol = self._protocol
        return protocol is not None and protocol.usable and protocol.relay_takes_calls

    @property
    def takes_jobs_held(self) -> bool:
        """The current socket is usable and its relay asked for ``jobs_held``."""
        protocol = self._protocol
        return protocol is not None and protocol.usable and protocol.relay_takes_jobs_held

    def send(self, frame: Frame) -> bool:
        """Send one frame now; False (nothing sent) when no usable socket exists."""
        protocol = self._protocol
        if protocol is None or not protocol.usable:
            return False
        protocol.sendMessage(codec.encode(frame), isBinary=False)
        return True

    def attach(self, protocol: _ListenerProtocol) -> None:
        self._protocol = protocol

    def detach(self, protocol: _ListenerProtocol) -> None:
        if self._protocol is protocol:
            self._protocol = None

    def close(self) -> None:
        """Close the current socket normally (the listener is stopping)."""
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.close_normally()


@without_option_dump
class _ListenerProtocol(WebSocketClientProtocol):
    factory: _ListenerFactory
    # autobahn logs the whole upgrade request, bearer token included, at debug level; this
    # logger stays at info whatever the global txaio level is.
    log = txaio.make_logger(level="info")  # type: ignore[attr-defined]

    def __init__(self) -> None:
        super().__init__()
        self.usable = False
        # Set once ClientService counts this connection; from then on its loss is reported to
        # ClientService (see _Gate).
        self.counted = False
        self._ready: Ready | Exception | None = None
        self._ready_waiters: list[defer.Deferred[_ListenerProtocol]] = []
        # The relay's Retry-After, when it turned this upgrade away.
        self.retry_after: float | None = None

    def connectionMade(self) -> None:
        self.factory.latest = self
        super().connectionMade()

    # --- ready ----------------------------------------------------------------------------

    def when_ready(self) -> defer.Deferred[_ListenerProtocol]:
        """Fires with this protocol once ``ready`` arrived, or fails with :class:`NotReady`."""
        if isinstance(self._ready, Ready):
            if self.usable:
                return defer.succeed(self)
            return defer.fail(NotReady("the socket closed right after ready"))
        if isinstance(self._ready, Exception):
            return defer.fail(self._ready)
        waiter: defer.Deferred[_ListenerProtocol] = defer.Deferred(self._stop_waiting)
        self._ready_waiters.append(waiter)
        return waiter

    def _stop_waiting(self, waiter: defer.Deferred[_ListenerProtocol]) -> None:
        """Canceller of a ``when_ready`` waiter (the open timeout, or ClientService stopping).

        The waiter leaves the list first: the close that dropping the socket causes would
        otherwise settle it a second time (an ``AlreadyCalledError`` per timed-out handshake).
        """
        if waiter in self._ready_waiters:
            self._ready_waiters.remove(waiter)
        self.drop()

    def _settle(self, outcome: Ready | Exception) -> None:
        if self._ready is not None:
            return
        self._ready = outcome
        self.usable = isinstance(outcome, Ready)
        waiters, self._ready_waiters = self._ready_waiters, []
        for waiter in waiters:
            if isinstance(outcome, Ready):
                waiter.callback(self)
            else:
                waiter.errback(outcome)

    def mark_counted(self) -> None:
        self.counted = True

    @property
    def relay_takes_calls(self) -> bool:
        """The relay's ready frame said this socket carries our own outgoing calls too."""
        return isinstance(self._ready, Ready) and self._ready.calls

    @property
    def relay_takes_jobs_held(self) -> bool:
        """The relay's ready frame asked this mailbox socket for ``jobs_held``."""
        return isinstance(self._ready, Ready) and self._ready.jobs_held

    @property
    def replaced(self) -> bool:
        """The relay's own close frame said a newer listener session took this one's place."""
        # remoteCloseCode, not onClose's code: an unclean ending reports 1006 even after the
        # relay's close frame arrived.
        return bool(self.remoteCloseCode == CLOSE_REPLACED)

    @property
    def removed(self) -> bool:
        """The relay's own close frame said an admin removed this member, or the identity was
        recovered on another machine: either way this installation's token is dead."""
        return self.remoteCloseCode in (CLOSE_REMOVED, CLOSE_RECOVERED)

    # --- frames in ------------------------------------------------------------------------

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        try:
            if isBinary:
                raise MalformedFrame("binary frames are not part of the protocol")
            # An incoming call with its caller's keys, or the answer to an outgoing call.
            frame = codec.decode_frame(
                payload, TO_LISTENER, max_bytes=limits.MAX_TO_LISTENER_FRAME_BYTES
            )
        except MalformedFrame as exc:
            if self._ready is None:
                self._violation(f"malformed frame before ready ({exc})")
            else:
                _log.warn("relay_frame_malformed", reason=str(exc), size=len(payload))
            return
        if self._ready is None:
            expected = self.factory.expected_address
            if isinstance(frame, Ready) and frame.role is Role.LISTEN and frame.address == expected:
                self._settle(frame)
            else:
                self._violation(f"{frame.type} for someone else or before ready")
        elif isinstance(frame, Ready):
            _log.warn("relay_frame_malformed", reason="a second ready frame", size=len(payload))
        elif self.usable:
            self.factory.deliver(frame)

    def _violation(self, why: str) -> None:
        _log.warn("relay_protocol_error", reason=why)
        if self.state == self.STATE_OPEN:
            # A close reason is at most 123 bytes of UTF-8.
            self.sendClose(CLOSE_PROTOCOL_ERROR, why.encode()[:100].decode(errors="ignore"))
        self._settle(NotReady(f"the relay broke the protocol: {why}"))

    # --- closing ----------------------------------------------------------------------------

    def close_normally(self) -> None:
        self.usable = False
        if self.state == self.STATE_OPEN:
            self.sendClose(CLOSE_NORMAL)

    def drop(self) -> None:
        self.usable = False
        # A socket already closing finishes its close handshake (autobahn bounds it).
        if self.state not in (self.STATE_CLOSING, self.STATE_CLOSED):
            self.dropConnection(abort=True)

    def lose_quietly(self, reason: Failure) -> None:
        """Connection lost before ClientService counted it: tell only this protocol."""
        self.connectionLost(reason)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.usable = False
        if self._ready is None:
            # An upgrade refused over HTTP (503 while the relay is busy) may say when to return.
            headers = getattr(self, "http_headers", None) or {}
            self.retry_after = parse_retry_after(headers.get("retry-after"))
            if self.retry_after is not None:
                # Before the waiter fails: that failure is what asks for the next delay.
                self.factory.told_retry_after(self.retry_after)
            if getattr(self, "http_status_line", None) is None:
                # Closed before any answer to the upgrade: turned away at the front door.
                self.factory.turned_away()
        self._settle(NotReady(f"the relay closed the socket before ready ({code}: {reason})"))
        self.factory.closed(self, code, reason)


class _ListenerFactory(WebSocketClientFactory):
    protocol = _ListenerProtocol  # type: ignore[assignment]

    def __init__(self, reactor: Any, connection: RelayConnection, *, mailbox: bool) -> None:
        super().__init__(useragent=USER_AGENT, reactor=reactor)
        set_relay_protocol_options(self)
        self._connection = connection
        self._mailbox = mailbox
        self.expected_address = ""
        # The protocol of the newest attempt; ClientService dials only once the previous
        # socket is gone, so any other one is a leftover.
        self.latest: _ListenerProtocol | None = None

    def configure(self, settings: RelaySettings) -> None:
        """Point the next connection at ``settings`` (URL and credentials as just re-read)."""
        headers = {k.decode(): v.decode() for k, v in settings.credentials.headers().items()}
        self.setSessionParameters(
            url=settings.relay_url.ws(listen_query(mailbox=self._mailbox)),
            useragent=USER_AGENT,
            headers=headers,
        )
        self.expected_address = settings.address

    def deliver(self, frame: Frame) -> None:
        self._connection.frame_received(frame)

    def closed(self, protocol: _ListenerProtocol, code: int | None, reason: str | None) -> None:
        self._connection.socket_closed(protocol, code, reason)

    def told_retry_after(self, seconds: float) -> None:
        self._connection.retry_after = seconds

    def turned_away(self) -> None:
        self._connection.turned_away()


@implementer(IProtocol)
class _Gate:
    """Sits between the transport and ClientService's protocol proxy.

    ClientService learns of a lost connection from its proxy's ``connectionLost``. Before
    ``prepareConnection`` has succeeded that notification has no transition in its state
    machine and raises; the failed ``prepareConnection`` already reports such a loss. So a
    loss is passed on to ClientService only for a counted connection.
    """

    def __init__(self, proxy: Any) -> None:
        # The proxy forwards unknown attributes to our protocol (ClientService documents it).
        self.proxy = proxy

    def makeConnection(self, transport: Any) -> None:
        self.proxy.makeConnection(transport)

    def connectionMade(self) -> None:
        """Never called: makeConnection hands the transport on, and the proxy calls its own."""

    def dataReceived(self, data: bytes) -> None:
        self.proxy.dataReceived(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.proxy.counted:
            self.proxy.connectionLost(reason)
        else:
            self.proxy.lose_quietly(reason)


class _GateFactory(Factory):
    noisy = False  # one per attempt; relay_connected and relay_connect_failed say enough

    def __init__(self, proxy_factory: Any) -> None:
        self._proxy_factory = proxy_factory

    def buildProtocol(self, addr: Any) -> _Gate | None:  # type: ignore[override]
        proxy = self._proxy_factory.buildProtocol(addr)
        return None if proxy is None else _Gate(proxy)


def _reset(failure: BaseException | None) -> bool:
    """A dial the other end reset while it connected (how a relay closing at once looks)."""
    return isinstance(failure, error.ConnectError) and failure.osError == errno.ECONNRESET


EndpointFor = Callable[[RelayUrl, str | None], IStreamClientEndpoint]


@implementer(IStreamClientEndpoint)
class _ReloadingEndpoint:
    """Each ``connect`` re-reads the settings, then dials the relay they name."""

    def __init__(self, connection: RelayConnection) -> None:
        self._connection = connection

    def connect(self, protocolFactory: Any) -> defer.Deferred[Any]:
        return self._connection.dial(protocolFactory)

    def __repr__(self) -> str:
        # ClientService logs this on every retry; it names no credential.
        return f"<relay {self._connection.netloc}>"


class RelayConnection(service.MultiService):
    """One listener socket to the relay, kept up by a ``ClientService`` child."""

    def __init__(
        self,
        reactor: Any,
        *,
        load_settings: Callable[[], RelaySettings],
        link: RelayLink,
        on_frame: Callable[[Frame], None],
        on_ready: Callable[[], None],
        on_replaced: Callable[[], None] = lambda: None,
        on_lost: Callable[[], None] = lambda: None,
        mailbox: bool = True,
        clock: IReactorTime | None = None,
        endpoint_for: EndpointFor | None = None,
        random: Callable[[], float] = _random.random,
    ) -> None:
        super().__init__()
        self._reactor = reactor
        self._clock: IReactorTime = reactor if clock is None else clock
        self._load_settings = load_settings
        self._endpoint_for: EndpointFor = endpoint_for or (
            lambda url, ca_file: relay_endpoint(reactor, url, ca_file)
        )
        self.link = link
        self._on_frame = on_frame
        self._on_ready = on_ready
        self._on_replaced = on_replaced
        self._on_lost = on_lost
        self._random = random
        self._factory = _ListenerFactory(reactor, self, mailbox=mailbox)
        self.netloc = "?"
        self.connections = 0  # usable connections so far
        self._last_failure = "not connected yet"
        self._lost: tuple[int | None, str | None] | None = None
        self.retry_after: float | None = None  # the relay's Retry-After, for the next retry only
        self._refused = 0  # dials turned away at once since the last usable connection
        self.replaced = False  # set once the relay said another listener took over
        self.client = internet.ClientService(
            _ReloadingEndpoint(self),
            self._factory,
            retryPolicy=self._retry_delay,
            clock=self._clock,
            prepareConnection=self._prepare,
        )
        self.client.setServiceParent(self)

    # --- dialling ---------------------------------------------------------------------------

    def dial(self, protocol_factory: Any) -> defer.Deferred[Any]:
        try:
            settings = self._load_settings()
            self.netloc = settings.relay_url.netloc
            endpoint = self._endpoint_for(settings.relay_url, settings.ca_file)
        except Exception as exc:
            # A config being edited, a missing CA file: retried with the usual backoff.
            self._last_failure = f"settings unusable: {exc}"
            return defer.fail(exc)
        self._factory.configure(settings)
        connecting: defer.Deferred[Any] = endpoint.connect(_GateFactory(protocol_factory))
        connecting.addCallback(lambda gate: gate.proxy)
        connecting.addErrback(self._dial_failed)
        return connecting

    def _dial_failed(self, failure: Failure) -> Failure:
        self._last_failure = f"cannot connect: {type(failure.value).__name__}"
        if failure.check(error.ConnectionRefusedError) or _reset(failure.value):
            self._refused += 1
        return failure

    def turned_away(self) -> None:
        """The relay closed a connection before answering its upgrade (its front door was
        full): retried like a refused dial."""
        self._refused += 1

    def _prepare(self, proxy: Any) -> defer.Deferred[None]:
        """ClientService's prepareConnection: a connection counts once the relay is ready."""
        # ClientService cancels this on stop; a cancel or the timeout drops the socket (the
        # waiter's own canceller, so nothing can fire it afterwards).
        result: defer.Deferred[_ListenerProtocol] = proxy.when_ready()
        result.addTimeout(OPEN_TIMEOUT_S, self._clock)

        def ready(protocol: _ListenerProtocol) -> None:
            protocol.mark_counted()
            self.connections += 1
            self._refused = 0
            self.link.attach(protocol)
            _log.info("relay_connected", relay=self.netloc, connections=self.connections)
            try:
                self._on_ready()
            except Exception:
                _log.failure("relay_ready_handler_failed")

        def not_ready(failure: Failure) -> Failure:
            if failure.check(defer.TimeoutError):
                self._last_failure = f"no ready frame within {OPEN_TIMEOUT_S:g} s"
            else:
                self._last_failure = str(failure.value)
            proxy.drop()
            return failure

        return result.addCallbacks(ready, not_ready)

    def _retry_delay(self, attempt: int) -> float:
        retry_after, self.retry_after = self.retry_after, None
        delay = reconnect_delay(counted_attempts(attempt, self._refused), self._random, retry_after)
        if self._lost is not None:
            code, reason = self._lost
            self._lost = None
            _log.info("relay_disconnected", code=code, reason=reason, retry_in_s=round(delay, 3))
        else:
            _log.info(
                "relay_connect_failed",
                attempt=attempt,
                reason=self._last_failure,
                retry_in_s=round(delay, 3),
                retry_after=retry_after,
            )
        return delay

    # --- frames and closes ------------------------------------------------------------------

    def frame_received(self, frame: Frame) -> None:
        try:
            self._on_frame(frame)
        except Exception:
            # One bad frame handler run must not take the socket down.
            _log.failure("relay_frame_handler_failed", frame_type=frame.type)

    def socket_closed(
        self, protocol: _ListenerProtocol, code: int | None, reason: str | None
    ) -> None:
        self.link.detach(protocol)
        if protocol.counted:
            # Whatever rode this socket (the installation's own outgoing calls) is gone with it.
            try:
                self._on_lost()
            except Exception:
                _log.failure("relay_lost_handler_failed")
        stopped_by_relay = protocol.replaced or protocol.removed
        if stopped_by_relay and protocol is self._factory.latest and self.running:
            self._replaced_elsewhere(
                removed=protocol.removed, recovered=protocol.remoteCloseCode == CLOSE_RECOVERED
            )
            return
        if protocol.counted:
            self._lost = (code, reason)
            if not self.running:
                _log.info("relay_disconnected", code=code, reason=reason, retry_in_s=None)

    def _replaced_elsewhere(self, *, removed: bool = False, recovered: bool = False) -> None:
        """Another listener for this identity holds the relay session now (or the member was
        removed): stop redialling.

        Redialling would replace that listener, which would redial and replace this one, every
        few seconds for as long as both run; a removed member's token never works again. Only
        the socket the newest attempt opened counts, so a leftover socket of this very listener
        (a network blip) cannot stop it.
        """
        if self.replaced:
            return
        self.replaced = True
        event, detail = "listener_replaced", REPLACED_DETAIL
        if recovered:
            event, detail = "listener_recovered_elsewhere", RECOVERED_DETAIL
        elif removed:
            event, detail = "listener_removed", REMOVED_DETAIL
        _log.error(event, address=self._factory.expected_address, relay=self.netloc, detail=detail)
        self.client.stopService()
        try:
            self._on_replaced()
        except Exception:
            _log.failure("listener_replaced_handler_failed")

    def stopService(self) -> defer.Deferred[None]:
        # A normal WebSocket close first; ClientService then drops whatever is left.
        self.link.close()
        result: defer.Deferred[None] = defer.maybeDeferred(super().stopService)
        return result
