"""The relay's front door in Twisted: caps at accept time, a deadline on every request head,
per-source throttles, and the periodic flush of refusal counts and ``auth.failed`` rows.

Decisions live in :mod:`agentcall.relay.gate` and :mod:`agentcall.relay.throttle`; this module
only wires them to sockets. The stack for one connection is (TLS) → :class:`GatedConnection`
(counts it, releases it when it is gone, whatever protocol holds it by then) →
:class:`GatedChannel` (HTTP with a head deadline) → autobahn after an upgrade.
"""

from __future__ import annotations

import ipaddress
import random as _random
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet import defer
from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime, ISSLTransport
from twisted.internet.protocol import Protocol, connectionDone
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.web import http, resource, server
from zope.interface import directlyProvides, providedBy

from agentcall.errors import ApiError, ApiErrorCode
from agentcall.logevents import Logger
from agentcall.relay import audit
from agentcall.relay.audit import AuditSink
from agentcall.relay.gate import (
    ConnectionGate,
    GateLimits,
    LetIn,
    Ticket,
    TurnedAway,
    TurnedAwayTally,
    busy_retry_after_s,
)
from agentcall.relay.throttle import FailureRow, FailureTally, TokenBuckets, retry_after_header
from agentcall.wire import codec
from agentcall.wire import http as wire_http

_log = Logger(namespace="agentcall.relay.door")


@attrs.frozen
class DoorConfig:
    """The front-door options of ``twistd agentcall-relay``."""

    caps: GateLimits
    head_timeout_s: float
    call_request_timeout_s: float
    register_per_minute: int
    auth_failures_per_minute: int
    # Stop accepting at the handshake cap rather than close newcomers (AcceptValve).
    hold_accept: bool = True


class Throttled(ApiError):
    """429 ``rate_limited`` (or ``status``); the API adds ``Retry-After`` from
    ``retry_after_s``."""

    def __init__(self, retry_after_s: float, message: str, status: int = 429) -> None:
        super().__init__(status, ApiErrorCode.RATE_LIMITED, message)
        self.retry_after_s = retry_after_s


class Door:
    """The front door's state for one relay: counters, throttles and what is due to be logged."""

    def __init__(
        self,
        config: DoorConfig,
        clock: IReactorTime,
        sink: AuditSink,
        random: Callable[[], float] = _random.random,
    ) -> None:
        self.config = config
        self.clock = clock
        self.random = random  # spreads the Retry-After of upgrades told to come back
        self.gate = ConnectionGate(config.caps)
        self.turned_away = TurnedAwayTally()
        self._register = TokenBuckets(config.register_per_minute)
        self._auth = TokenBuckets(config.auth_failures_per_minute)
        self._failures = FailureTally()
        self._sink = sink
        # The connection behind each ticket, so an evicted one can be closed.
        self.open_connections: dict[Ticket, GatedConnection] = {}
        self.valve = AcceptValve(self.gate, clock, self.turned_away, enabled=config.hold_accept)

    def head_done(self, ticket: Ticket) -> None:
        """The connection's first request head is complete: its place in head is free."""
        self.gate.head_done(ticket)
        self.valve.check()

    def released(self, ticket: Ticket) -> None:
        """The connection is gone."""
        self.gate.release(ticket)
        self.valve.check()

    def websocket_opened(self, transport: object) -> None:
        """An authenticated WebSocket is open on ``transport``: it is no longer evictable."""
        ticket = getattr(transport, "ticket", None)
        if isinstance(ticket, Ticket):
            self.gate.upgraded(ticket)
            self.valve.check()

    def begin_upgrade(self, transport: object) -> None:
        """A WebSocket upgrade arrived on ``transport``: count it until it is answered, or raise
        :class:`Throttled` (503, a jittered ``Retry-After``) when too many are being checked.

        Called before any credential is hashed or looked up, so turning a reconnecting crowd
        away costs only the request head already read.
        """
        ticket = getattr(transport, "ticket", None)
        if not isinstance(ticket, Ticket) or self.gate.begin_upgrade(ticket):
            return
        self.turned_away.note(TurnedAway.UPGRADES_BUSY)
        raise Throttled(
            busy_retry_after_s(self.random),
            "the relay is busy accepting other connections; try again after Retry-After",
            status=503,
        )

    def upgrade_answered(self, transport: object) -> None:
        """The upgrade on ``transport`` was answered (ready, or refused)."""
        ticket = getattr(transport, "ticket", None)
        if isinstance(ticket, Ticket):
            self.gate.end_upgrade(ticket)

    # --- throttles (called by the API and the WebSocket adapter) ------------------------------

    def check_register(self, source: str) -> None:
        """Every ``POST /v1/register`` takes a token; :class:`Throttled` when none is left."""
        wait = self._register.take(source, self.clock.seconds())
        if wait is not None:
            self.turned_away.note(TurnedAway.REGISTER_THROTTLED)
            raise Throttled(wait, "too many registration attempts from this address")

    def check_auth_allowed(self, source: str) -> None:
        """Raises :class:`Throttled` while ``source`` has used up its failed authentications."""
        wait = self._auth.retry_after(source, self.clock.seconds())
        if wait is not None:
            self.turned_away.note(TurnedAway.AUTH_THROTTLED)
            raise Throttled(wait, "too many failed authentications from this address")

    def auth_failed(self, source: str) -> None:
        now = self.clock.seconds()
        self._auth.take(source, now)
        self._failures.note(source, now)

    # --- periodic ---------------------------------------------------------------------------

    def _unwritten(self, failure: Failure, row: FailureRow) -> None:
        # Kept for the next flush rather than lost: a busy database is no reason to forget.
        _log.failure("front_door_flush_failed", failure=failure)
        self._failures.restore(row)

    def flush(self, *, final: bool = False) -> None:
        """Log the refusal counts and write the ``auth.failed`` rows of ended minutes.

        Runs on a timer, so it never raises: a failure is logged and the next run tries again.
        """
        try:
            now = self.clock.seconds()
            counts = self.turned_away.drain()
            if counts:
                _log.warn(
                    "front_door_refusals",
                    **counts,
                    open_connections=self.gate.open_total,
                    in_head=self.gate.in_head,
                    upgrades_in_flight=self.gate.upgrades_in_flight,
                )
            rows = self._failures.drain() if final else self._failures.due(now)
            for row in rows:
                # Relay-wide (no organisation was proven); the source and a count, nothing else.
                # Fire and forget, like every audit write: a failure is logged, never raised.
                entry = audit.AuditEntry(
                    audit.AUTH_FAILED,
                    audit.RELAY_WIDE,
                    actor=None,
                    target=row.source,
                    call_id=None,
                    at=row.minute,
                    detail=f"{row.count} failed authentications in this minute",
                )
                written = defer.maybeDeferred(self._sink.record, entry)
                written.addErrback(self._unwritten, row)
            self._register.prune(now)
            self._auth.prune(now)
        except Exception:
            _log.failure("front_door_flush_failed")


class AcceptValve:
    """Stops the listening port from accepting while the handshake cap is full of young heads.

    There a newcomer would evict the oldest head, most likely an honest client half way through
    its handshake in a reconnect storm, and send it back into its backoff. Instead the port
    stops accepting: newcomers wait in the kernel's accept queue (past its backlog the client's
    own TCP retries the SYN), which costs the relay nothing, and are taken in order as places
    free up, no more at a time than there are places (their heads are usually in the socket
    already, so they leave the head at once), or when the oldest head has had ``head_grace_s``
    (a newcomer then evicts it, so a flood of slow heads still cannot keep the door shut longer
    than the grace). Holding until half the places were free was tried: it left the relay idle
    while a slow crowd finished its heads.

    Until :meth:`attach` is given the port (and after :meth:`detach`) it does nothing, and every
    newcomer at the cap evicts the oldest head; so do the few connections one accept loop still
    takes after the port stopped (Twisted's loop runs to its end), rather than being closed.
    """

    def __init__(
        self,
        gate: ConnectionGate,
        clock: IReactorTime,
        tally: TurnedAwayTally,
        *,
        enabled: bool = True,
    ) -> None:
        self._enabled = enabled
        self._gate = gate
        self._clock = clock
        self._tally = tally
        self._port: Any = None
        self._reopen: IDelayedCall | None = None
        self.held = False

    def attach(self, port: Any) -> None:
        """The listening port (``stopReading``/``startReading``; Twisted's TCP and TLS ports).
        Ignored when the valve is disabled (``--no-accept-hold``)."""
        if not self._enabled:
            return
        self._port = port
        self.check()

    def detach(self) -> None:
        """The port is closing: never touch it again."""
        self._cancel_timer()
        self._port = None
        self.held = False

    def check(self) -> None:
        """Hold or release the port for the gate's current state; cheap, called often."""
        if self._port is None:
            return
        cap = self._gate.caps.handshakes
        in_head = self._gate.in_head
        if self.held:
            if in_head < cap:
                self._release()
            return
        oldest = self._gate.oldest_head_opened_at
        if in_head < cap or oldest is None:
            return
        left = oldest + self._gate.caps.head_grace_s - self._clock.seconds()
        if left <= 0:
            return  # a newcomer may evict the oldest: keep accepting
        self.held = True
        self._tally.note(TurnedAway.ACCEPT_HELD)
        self._port.stopReading()
        self._reopen = self._clock.callLater(left, self._grace_over)

    def _grace_over(self) -> None:
        self._reopen = None
        if self.held:
            self._release()

    def _release(self) -> None:
        self._cancel_timer()
        self.held = False
        port = self._port
        # Twisted's accept loop takes up to numberAccepts connections per turn; no more than
        # there are places, so that the first turn after the hold turns nobody away.
        if hasattr(port, "numberAccepts"):
            free = self._gate.caps.handshakes - self._gate.in_head
            port.numberAccepts = max(1, min(port.numberAccepts, free))
        port.startReading()

    def _cancel_timer(self) -> None:
        call, self._reopen = self._reopen, None
        if call is not None and call.active():
            call.cancel()


def source_of(address: IAddress | None) -> str:
    """The source a connection is counted under: its IPv4 address, or its IPv6 /64.

    One IPv6 subscriber holds a whole /64, so counting single IPv6 addresses would hand an
    attacker endless fresh sources for every cap and throttle.
    """
    host = getattr(address, "host", None)
    if not isinstance(host, str):
        return "unknown"
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


# --- connections ------------------------------------------------------------------------------


class GatedChannel(http.HTTPChannel):
    """HTTP/1.1 whose request head (and body) must arrive within a deadline.

    twisted.web's own ``timeOut`` is an idle timer that every byte resets, so a client that
    trickles one header line at a time could hold the socket for ever. This deadline is armed
    when the connection opens and again after each response on a kept-alive connection, and it
    is only cancelled once the whole request has arrived.
    """

    site: RelaySite
    # Set by GatedFactory: tells the gate the first head is complete.
    on_head_done: Callable[[], None] | None = None
    _head_deadline: IDelayedCall | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        self._arm_head_deadline()

    def allHeadersReceived(self) -> None:
        hook, self.on_head_done = self.on_head_done, None
        if hook is not None:
            hook()
        super().allHeadersReceived()

    def allContentReceived(self) -> None:
        self._disarm_head_deadline()
        super().allContentReceived()

    def requestDone(self, request: Any) -> None:
        # Armed before the parent feeds a pipelined request, whose arrival disarms it again.
        if self.persistent:
            self._arm_head_deadline()
        super().requestDone(request)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm_head_deadline()
        super().connectionLost(reason)

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_deadline = self.callLater(self.site.door.config.head_timeout_s, self._overdue)

    def _disarm_head_deadline(self) -> None:
        call, self._head_deadline = self._head_deadline, None
        if call is not None and call.active():
            call.cancel()

    def _overdue(self) -> None:
        self._head_deadline = None
        self.site.door.turned_away.note(TurnedAway.HEAD_TIMEOUT)
        # Abort, not a polite close: a client that is not reading must not keep the socket.
        transport: Any = self.transport
        if transport is not None:
            transport.abortConnection()


class RelaySite(server.Site):
    """A Site whose channels carry the head deadline and answer without a Server header."""

    protocol = GatedChannel  # type: ignore[assignment]

    def __init__(self, root: resource.IResource, door: Door, reactor: Any) -> None:
        super().__init__(root, reactor=reactor)
        self.door = door
        self.displayTracebacks = False

    def log(self, request: Any) -> None:
        """No access log: it would write a line per request, with text the client chose, into
        the relay's log. What the relay refuses is counted by the door instead."""


class GatedConnection(ProtocolWrapper):
    """Holds the connection's ticket and returns it when the socket closes.

    It stays between the transport and whatever protocol speaks (autobahn replaces the HTTP
    channel here after an upgrade), so the count is right for every kind of connection.
    """

    factory: GatedFactory

    def __init__(self, factory: GatedFactory, wrapped: Any, ticket: Ticket) -> None:
        super().__init__(factory, wrapped)
        self.ticket = ticket

    def makeConnection(self, transport: Any) -> None:
        self.factory.door.open_connections[self.ticket] = self
        # ProtocolWrapper.makeConnection, except for the interfaces this wrapper claims: the
        # transport's, without TLS (autobahn would take this wrapper for the TLS layer itself
        # and fail to read a channel id from it; the relay asks nothing of TLS at this level).
        # They are worked out once per kind of transport: building zope declarations for each
        # connection cost about a tenth of the relay's busy CPU.
        directlyProvides(self, *_interfaces_without_tls(providedBy(transport)))
        Protocol.makeConnection(self, transport)
        self.factory.registerProtocol(self)
        wrapped: Any = self.wrappedProtocol
        wrapped.makeConnection(self)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        door = self.factory.door
        door.open_connections.pop(self.ticket, None)
        door.released(self.ticket)
        super().connectionLost(reason)

    def evict(self) -> None:
        """Close at once to make room for a newcomer (the gate already let go of it)."""
        self.factory.door.open_connections.pop(self.ticket, None)
        transport: Any = self.transport
        if transport is not None:
            transport.abortConnection()


_WITHOUT_TLS: dict[object, tuple[Any, ...]] = {}
_WITHOUT_TLS_MAX = 32  # kinds of transport; a spec made per connection is not kept


def _interfaces_without_tls(spec: Any) -> tuple[Any, ...]:
    """The interfaces ``spec`` declares, except ISSLTransport and what extends it."""
    found = _WITHOUT_TLS.get(spec)
    if found is None:
        found = tuple(i for i in spec.interfaces() if not i.isOrExtends(ISSLTransport))
        if len(_WITHOUT_TLS) < _WITHOUT_TLS_MAX:
            _WITHOUT_TLS[spec] = found
    return found


class _Refused(Protocol):
    """Closes a connection over a cap at once, before reading a byte (TLS included)."""

    def connectionMade(self) -> None:
        transport: Any = self.transport
        transport.abortConnection()


class GatedFactory(WrappingFactory[GatedConnection]):
    """Admits a connection through the gate, or closes it at once and counts why."""

    protocol = GatedConnection

    def __init__(self, site: RelaySite) -> None:
        super().__init__(site)
        self.door = site.door

    def buildProtocol(self, addr: IAddress) -> Any:  # type: ignore[override]
        door = self.door
        decision = door.gate.admit(source_of(addr), door.clock.seconds())
        door.valve.check()
        if isinstance(decision, TurnedAway):
            door.turned_away.note(decision)
            return _Refused()
        self._evict(decision)
        ticket = decision.ticket
        channel = self.wrappedFactory.buildProtocol(addr)
        if isinstance(channel, GatedChannel):
            channel.on_head_done = lambda: door.head_done(ticket)
        return GatedConnection(self, channel, ticket)

    def _evict(self, decision: LetIn) -> None:
        for victim, why in decision.evicted:
            self.door.turned_away.note(why)
            connection = self.door.open_connections.get(victim)
            if connection is not None:
                connection.evict()


# --- JSON error pages ---------------------------------------------------------------------------


class ErrorPage(resource.Resource):
    """An API error as a resource: the status and ``{"error", "message"}`` for any method."""

    isLeaf = True

    def __init__(
        self, status: int, code: ApiErrorCode, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__()
        self._status = status
        self._body = codec.encode(wire_http.ApiErrorBody(error=code, message=message))
        self._headers = headers or {}

    def render(self, request: server.Request) -> bytes:
        request.setResponseCode(self._status)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        for name, value in self._headers.items():
            request.setHeader(name.encode("ascii"), value.encode("ascii"))
        return self._body


def upgrade_required() -> ErrorPage:
    return ErrorPage(
        426,
        ApiErrorCode.UPGRADE_REQUIRED,
        "this path is a WebSocket; send an upgrade request",
        {"upgrade": "websocket", "connection": "Upgrade"},
    )


def throttled_page(exc: Throttled) -> ErrorPage:
    return ErrorPage(
        exc.status, exc.code, exc.message, {"retry-after": retry_after_header(exc.retry_after_s)}
    )


def is_upgrade(request: server.Request) -> bool:
    """A WebSocket upgrade request, as far as the headers go (autobahn checks the rest)."""
    upgrade = (request.getHeader("upgrade") or "").lower()
    return request.method == b"GET" and "websocket" in upgrade
