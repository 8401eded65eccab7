"""The listener's relay connection, against a scripted autobahn relay connected in memory.

``iosim`` pumps bytes between the real client and server protocols; txaio's timers and
ClientService's retries run on a Clock, so nothing here waits on real time.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import gc
import itertools
import random
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import pytest
import txaio as _txaio
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.types import ConnectionRequest
from twisted.internet import defer, error
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.task import Clock
from twisted.logger import LogEvent, capturedLogs
from twisted.python.failure import Failure
from twisted.test import iosim
from zope.interface import implementer

from agentcall import limits
from agentcall.client.api import Credentials
from agentcall.client.common import parse_retry_after
from agentcall.client.ws import CallAborted
from agentcall.listener.connection import (
    REFUSED_NOT_COUNTED,
    EndpointFor,
    RelayConnection,
    RelayLink,
    RelaySettings,
    counted_attempts,
    listen_query,
    reconnect_delay,
)
from agentcall.listener.outgoing import OutgoingCalls
from agentcall.relayurl import RelayUrl
from agentcall.wire import codec
from agentcall.wire.closecodes import CLOSE_REMOVED, CLOSE_REPLACED
from agentcall.wire.frames import (
    CallAccepted,
    CallOutcome,
    CallRequest,
    CallState,
    CallStatus,
    CancelCall,
    CancelJob,
    Direction,
    Frame,
    JobAck,
    Ready,
    Role,
    Terminal,
)
from tests.unit.relay_helpers import sealed_looking

txaio: Any = _txaio  # txaio's config is untyped
TOKEN_A = "AAAAaaaaAAAAaaaaAAAAaaaaAAAAaaaaAAAAaaaa123"
TOKEN_B = "BBBBbbbbBBBBbbbbBBBBbbbbBBBBbbbbBBBBbbbb456"
CALL_ID = "0b6e0c1e-7a51-4b51-9a3d-2f0d6f1c9e11"
ORIGIN = "relay.acme.test"
ADDR = IPv4Address("TCP", "127.0.0.1", 4433)


@pytest.mark.parametrize(
    ("attempt", "r", "expected"),
    [
        (1, 0.0, 0.25),
        (1, 0.5, 5.125),
        (1, 1.0, 10.0),
        (2, 1.0, 15.0),
        (3, 1.0, 22.5),
        (4, 1.0, 33.75),
        (5, 1.0, 50.625),
        (8, 1.0, 60.0),
        (50, 1.0, 60.0),
        (10_000, 1.0, 60.0),
        (10_000, 0.0, 0.25),
        (3, 0.5, 11.375),
    ],
)
def test_reconnect_delay_is_full_jitter_over_a_growing_window(
    attempt: int, r: float, expected: float
) -> None:
    """Uniform in [0.25 s, window) with a window of 10 s growing 1.5 times per attempt up to
    60 s: the first attempt included, so a crowd spreads out at once and one listener is back
    within 10 s."""
    assert reconnect_delay(attempt, lambda: r) == expected


def test_reconnect_delays_of_a_crowd_spread_over_the_first_window() -> None:
    """10,000 listeners that lost the relay at once, each with its own random draw: the first
    attempts land spread evenly over 10 s, about a thousand in any second (what one relay
    process can take on a 2-core machine; bench/storm_bench.py)."""
    rng = random.Random(7)
    delays = [reconnect_delay(1, rng.random) for _ in range(10_000)]
    assert min(delays) >= 0.25 and max(delays) < 10.0
    per_second = collections.Counter(int(d) for d in delays)
    assert sorted(per_second) == list(range(10))
    assert max(per_second.values()) < 1_200


@pytest.mark.parametrize(
    ("attempt", "r", "retry_after", "expected"),
    [
        (1, 0.0, 7.0, 7.0),  # the relay's number is a floor
        (1, 0.5, 7.0, 7.25),  # plus up to half a second, spread
        (8, 1.0, 7.0, 60.0),  # the own backoff is already longer
        (1, 0.0, 86_400.0, 60.0),  # never more than the longest backoff (plus jitter)
        (1, 0.0, -3.0, 0.25),
    ],
)
def test_reconnect_delay_honours_a_retry_after(
    attempt: int, r: float, retry_after: float, expected: float
) -> None:
    assert reconnect_delay(attempt, lambda: r, retry_after) == expected
    assert (
        reconnect_delay(attempt, lambda: r, retry_after)
        <= limits.RECONNECT_MAX_S + limits.RECONNECT_JITTER_S
    )


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("7", 7.0),
        (" 12 ", 12.0),
        ("0", 0.0),
        (None, None),
        ("", None),
        ("soon", None),
        ("Wed, 21 Oct 2026 07:28:00 GMT", None),
        ("-1", None),
        ("1.5", None),
        ("9999999", None),
    ],
)
def test_retry_after_is_read_in_whole_seconds_only(
    header: str | None, seconds: float | None
) -> None:
    assert parse_retry_after(header) == seconds


# --- an in-memory relay ------------------------------------------------------------------------


class RelaySide(WebSocketServerProtocol):
    factory: FakeRelay

    def processHandshake(self) -> None:
        busy = self.factory.busy_retry_after
        if busy is not None and b"\r\n\r\n" in self.data:
            # What the relay answers an upgrade past its cap: 503 and when to come back.
            self.sendHttpErrorResponse(503, "Service Unavailable", [("Retry-After", busy)])
            self.dropConnection(abort=False)
            return
        super().processHandshake()

    def onConnect(self, request: ConnectionRequest) -> None:
        headers: dict[str, str] = request.headers
        self.factory.upgrades.append(headers)
        self.factory.queries.append(request.params)

    def onOpen(self) -> None:
        self.factory.sockets.append(self)
        if self.factory.ready_address is not None:
            self.send(
                Ready(
                    role=Role.LISTEN,
                    address=self.factory.ready_address,
                    relay_origin=ORIGIN,
                    calls=self.factory.ready_calls,
                    jobs_held=self.factory.ready_jobs_held,
                )
            )

    def send(self, frame: Frame) -> None:
        self.sendMessage(codec.encode(frame), isBinary=False)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.factory.received.append(codec.decode_frame(payload))

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.factory.closes.append(code)


class FakeRelay(WebSocketServerFactory):
    protocol = RelaySide  # type: ignore[assignment]

    def __init__(self, clock: Clock) -> None:
        super().__init__("ws://relay.acme.test/v1/ws", reactor=clock)
        self.ready_address: str | None = "@acme/ken"
        # Whether ready says the socket takes the installation's own calls (a current relay).
        self.ready_calls = True
        # Whether ready asks for jobs_held (a relay that reconciles a listener's leases).
        self.ready_jobs_held = False
        self.busy_retry_after: str | None = None  # answer upgrades 503 with this Retry-After
        self.closing_at_door = False  # ClosingSide: close connections without an answer
        self.upgrades: list[dict[str, str]] = []
        self.queries: list[dict[str, list[str]]] = []
        self.sockets: list[RelaySide] = []
        self.received: list[Frame] = []
        self.closes: list[int | None] = []
        self.pumps: list[iosim.IOPump] = []
        self.dialled: list[tuple[str, str | None]] = []

    def endpoint_for(self, url: RelayUrl, ca_file: str | None) -> IStreamClientEndpoint:
        self.dialled.append((str(url), ca_file))
        return MemoryEndpoint(self)

    def flush(self) -> None:
        for pump in self.pumps:
            pump.flush()


@implementer(IStreamClientEndpoint)
class MemoryEndpoint:
    def __init__(self, relay: FakeRelay) -> None:
        self._relay = relay

    def connect(self, protocolFactory: Any) -> defer.Deferred[Any]:
        client = protocolFactory.buildProtocol(ADDR)
        server = self._relay.buildProtocol(ADDR)
        pump = iosim.connect(
            server,
            iosim.FakeTransport(server, isServer=True),
            client,
            iosim.FakeTransport(client, isServer=False),
            greet=False,
        )
        self._relay.pumps.append(pump)
        return defer.succeed(client)


def settings(token: str = TOKEN_A, url: str = "https://relay.acme.test") -> RelaySettings:
    return RelaySettings(
        relay_url=RelayUrl.parse(url),
        credentials=Credentials(org="acme", handle="ken", token=token),
        ca_file="/etc/agentcall/ca.pem",
    )


@attrs.define
class Listener:
    clock: Clock
    relay: FakeRelay
    loads: list[RelaySettings] = attrs.field(factory=list)
    next_settings: RelaySettings | Exception = attrs.field(factory=settings)
    frames: list[Frame] = attrs.field(factory=list)
    readies: int = 0
    replacements: int = 0
    draw: float = 0.0  # what the reconnect jitter's random() returns
    link: RelayLink = attrs.field(factory=RelayLink)
    # How each dial reaches the relay; the relay's own memory endpoint unless a test says.
    endpoint_for: EndpointFor | None = None
    connection: RelayConnection = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.connection = RelayConnection(
            self.clock,
            load_settings=self.load,
            link=self.link,
            on_frame=self.frames.append,
            on_ready=self.ready,
            on_replaced=self.replaced,
            clock=self.clock,
            endpoint_for=self.endpoint_for or self.relay.endpoint_for,
            random=lambda: self.draw,
        )

    def load(self) -> RelaySettings:
        if isinstance(self.next_settings, Exception):
            raise self.next_settings
        self.loads.append(self.next_settings)
        return self.next_settings

    def ready(self) -> None:
        self.readies += 1

    def replaced(self) -> None:
        self.replacements += 1


@pytest.fixture
def clock() -> Iterator[Clock]:
    """autobahn's timers go through txaio; point them at the test clock."""
    clock = Clock()
    previous = txaio.config.loop
    txaio.config.loop = clock
    try:
        yield clock
    finally:
        txaio.config.loop = previous


@pytest.fixture
def listener(clock: Clock) -> Iterator[Listener]:
    relay = FakeRelay(clock)
    listener = Listener(clock, relay)
    yield listener
    if listener.connection.running:
        listener.connection.stopService()
        relay.flush()


def events_named(events: Sequence[LogEvent], name: str) -> list[LogEvent]:
    return [event for event in events if event.get("event") == name]


@contextlib.contextmanager
def no_unhandled_errors() -> Iterator[Sequence[LogEvent]]:
    """Fails when anything in the block logs a failure, including a Deferred that is
    garbage-collected with an unhandled error (collected before the block ends)."""
    with capturedLogs() as events:
        yield events
        gc.collect()
    failures = [event["log_failure"] for event in events if "log_failure" in event]
    assert failures == []


# --- counting a connection -------------------------------------------------------------------


def test_a_connection_counts_only_once_ready_arrives(listener: Listener) -> None:
    """Upgraded but not ready: nothing counted or sendable; ready: counted, once."""
    listener.relay.ready_address = None
    listener.connection.startService()
    listener.relay.flush()
    assert len(listener.relay.sockets) == 1  # the upgrade went through
    assert (listener.connection.connections, listener.readies) == (0, 0)
    assert not listener.link.connected
    assert listener.link.send(CallAccepted(call_id=CALL_ID)) is False
    connected = listener.connection.client.whenConnected()
    assert not connected.called
    listener.relay.sockets[0].send(
        Ready(role=Role.LISTEN, address="@acme/ken", relay_origin=ORIGIN, calls=True)
    )
    listener.relay.flush()
    assert (listener.connection.connections, listener.readies) == (1, 1)
    assert connected.called
    assert listener.link.send(CallAccepted(call_id=CALL_ID)) is True
    listener.relay.flush()
    assert listener.relay.received == [CallAccepted(call_id=CALL_ID)]


def test_ready_for_another_identity_is_refused_and_redialled(listener: Listener) -> None:
    listener.relay.ready_address = "@acme/someone-else"
    with capturedLogs() as events:
        listener.connection.startService()
        listener.relay.flush()
    assert (listener.connection.connections, listener.readies) == (0, 0)
    assert listener.relay.closes == [4002]
    [failed] = events_named(events, "relay_connect_failed")
    assert (failed["attempt"], failed["retry_in_s"]) == (1, 0.25)
    listener.relay.ready_address = "@acme/ken"
    listener.clock.advance(1.0)
    listener.relay.flush()
    assert listener.connection.connections == 1


def test_no_ready_within_the_open_timeout_drops_and_redials(listener: Listener) -> None:
    listener.relay.ready_address = None
    listener.connection.startService()
    listener.relay.flush()
    listener.clock.advance(limits.WS_OPENING_HANDSHAKE_TIMEOUT_S)
    listener.relay.flush()
    assert listener.connection.connections == 0
    assert len(listener.relay.dialled) == 1
    listener.relay.ready_address = "@acme/ken"
    listener.clock.advance(1.0)
    listener.relay.flush()
    assert len(listener.relay.dialled) == 2
    assert listener.connection.connections == 1


# --- settings ----------------------------------------------------------------------------------


def test_the_listener_says_it_takes_mailbox_jobs(listener: Listener) -> None:
    """role=listen&mailbox=1: the relay may hand this listener the owner's queued jobs."""
    listener.connection.startService()
    listener.relay.flush()
    assert listener.relay.queries == [{"role": ["listen"], "mailbox": ["1"]}]
    assert listen_query(mailbox=False) == {"role": "listen"}


def test_settings_are_read_again_for_every_attempt(listener: Listener) -> None:
    """A new token and relay URL from config.json take effect on the next connection."""
    listener.connection.startService()
    listener.relay.flush()
    assert listener.relay.upgrades[0]["authorization"] == f"Bearer {TOKEN_A}"
    listener.next_settings = settings(TOKEN_B, "https://relay2.acme.test:8443")
    with capturedLogs() as events:
        listener.relay.sockets[0].transport.abortConnection()  # type: ignore[union-attr]
        listener.relay.flush()
    [gone] = events_named(events, "relay_disconnected")
    assert gone["retry_in_s"] == 0.25
    assert not listener.link.connected
    listener.clock.advance(1.0)
    listener.relay.flush()
    assert len(listener.loads) == 2
    assert listener.relay.upgrades[1]["authorization"] == f"Bearer {TOKEN_B}"
    assert listener.relay.upgrades[1]["x-agentcall-handle"] == "ken"
    assert listener.relay.dialled[1] == ("https://relay2.acme.test:8443", "/etc/agentcall/ca.pem")
    assert (listener.connection.connections, listener.readies) == (2, 2)


def test_a_relay_that_says_retry_after_is_not_dialled_again_sooner(listener: Listener) -> None:
    """A 503 with Retry-After: 7 holds the next attempt back 7 s (plus the jitter's share)."""
    listener.relay.busy_retry_after = "7"
    with capturedLogs() as events:
        listener.connection.startService()
        listener.relay.flush()
    [failed] = events_named(events, "relay_connect_failed")
    assert (failed["retry_in_s"], failed["retry_after"]) == (7.0, 7.0)
    assert len(listener.relay.dialled) == 1
    listener.relay.busy_retry_after = None
    listener.clock.advance(6.9)
    assert len(listener.relay.dialled) == 1
    listener.clock.advance(0.1)
    listener.relay.flush()
    assert len(listener.relay.dialled) == 2
    assert listener.connection.connections == 1
    # Used once: the next loss backs off on its own again.
    with capturedLogs() as events:
        listener.relay.sockets[0].transport.abortConnection()  # type: ignore[union-attr]
        listener.relay.flush()
    [gone] = events_named(events, "relay_disconnected")
    assert gone["retry_in_s"] == 0.25


def test_unusable_settings_are_retried_with_backoff(listener: Listener) -> None:
    """A config being edited does not stop the listener; the attempts back off."""
    listener.next_settings = ValueError("config.json: token: not a valid token")
    listener.draw = 0.5
    with capturedLogs() as events:
        listener.connection.startService()
        listener.clock.advance(5.125)
    delays = [event["retry_in_s"] for event in events_named(events, "relay_connect_failed")]
    assert delays == [5.125, 7.625]
    assert "not a valid token" in events_named(events, "relay_connect_failed")[0]["reason"]
    listener.next_settings = settings()
    listener.clock.advance(7.5)
    listener.relay.flush()
    assert listener.connection.connections == 0
    listener.clock.advance(0.125)
    listener.relay.flush()
    assert listener.connection.connections == 1


@pytest.mark.parametrize(
    ("attempt", "refused", "counted"),
    [(1, 0, 1), (2, 1, 1), (5, 4, 1), (6, 5, 2), (9, 9, 5), (3, 1, 2), (1, 3, 1), (4, -1, 4)],
)
def test_refused_dials_are_not_counted_up_to_a_limit(
    attempt: int, refused: int, counted: int
) -> None:
    assert REFUSED_NOT_COUNTED == 4
    assert counted_attempts(attempt, refused) == counted


@implementer(IStreamClientEndpoint)
class FailingEndpoint:
    def __init__(self, failure: Exception) -> None:
        self._failure = failure

    def connect(self, protocolFactory: Any) -> defer.Deferred[Any]:
        return defer.fail(self._failure)


def test_a_restarting_relay_that_refuses_dials_does_not_widen_the_window(clock: Clock) -> None:
    """A closed port (ECONNREFUSED) or a reset while connecting is retried within the first
    window, four times; then, and after any other kind of failure, the window grows as before."""
    reset = error.getConnectError((errno.ECONNRESET, "Connection reset by peer"))
    assert type(reset) is error.ConnectError
    failures: list[Exception] = [error.ConnectionRefusedError(), reset] * 2
    failures += [
        error.ConnectionRefusedError(),
        error.TimeoutError(),
        error.ConnectionRefusedError(),
    ]
    relay = FakeRelay(clock)
    dials: list[float] = []

    def endpoint_for(url: RelayUrl, ca_file: str | None) -> IStreamClientEndpoint:
        dials.append(clock.seconds())
        if failures:
            return FailingEndpoint(failures.pop(0))
        return relay.endpoint_for(url, ca_file)

    # Every delay at the top of its window.
    listener = Listener(clock, relay, draw=1.0, endpoint_for=endpoint_for)
    with no_unhandled_errors():
        listener.connection.startService()
        for _ in range(480):  # 120 s, in steps that every delay here is a multiple of
            clock.advance(0.25)
            relay.flush()
    gaps = [later - earlier for earlier, later in itertools.pairwise(dials)]
    # Five turned away (refused, reset, refused, reset, refused), four of them not counted: each
    # retried within the first window (10 s); a timeout counts (attempt 2: 15 s); a refusal
    # beyond the four counts too (attempt 3: 22.5 s); then the relay answers. Without the rule:
    # 10, 15, 22.5, 33.75, 50.6, 60, 60.
    assert gaps == [10.0, 10.0, 10.0, 10.0, 10.0, 15.0, 22.5]
    assert listener.connection.connections == 1
    listener.connection.stopService()
    relay.flush()


class ClosingSide(RelaySide):
    """A relay whose front door is full: it closes a connection without answering its upgrade."""

    def processHandshake(self) -> None:
        if self.factory.closing_at_door:
            assert self.transport is not None
            self.transport.loseConnection()
            return
        super().processHandshake()


def test_a_connection_closed_before_the_upgrade_is_answered_does_not_widen_the_window(
    clock: Clock,
) -> None:
    """The relay at its handshake cap closes newcomers unanswered (handshakes_busy): retried
    within the first window like a refused dial."""
    relay = FakeRelay(clock)
    relay.protocol = ClosingSide
    relay.closing_at_door = True
    dials: list[float] = []

    def dialling(url: RelayUrl, ca_file: str | None) -> IStreamClientEndpoint:
        dials.append(clock.seconds())
        if len(dials) == 3:
            relay.closing_at_door = False
        return relay.endpoint_for(url, ca_file)

    listener = Listener(clock, relay, draw=1.0, endpoint_for=dialling)
    with no_unhandled_errors():
        listener.connection.startService()
        relay.flush()
        for _ in range(200):
            clock.advance(0.25)
            relay.flush()
    gaps = [later - earlier for earlier, later in itertools.pairwise(dials)]
    # Two closed at the door, not counted: 10 s each; the third dial is answered and ready.
    assert gaps[:2] == [10.0, 10.0]
    assert listener.connection.connections == 1
    listener.connection.stopService()
    relay.flush()


# --- frames ------------------------------------------------------------------------------------


def test_frames_after_ready_reach_the_handler_and_malformed_ones_are_dropped(
    listener: Listener,
) -> None:
    listener.connection.startService()
    listener.relay.flush()
    relay_side = listener.relay.sockets[0]
    with capturedLogs() as events:
        relay_side.sendMessage(b'{"type":"incoming_call","call_id":"nope"}', isBinary=False)
        relay_side.sendMessage(b"not json", isBinary=False)
        relay_side.send(CancelCall(call_id=CALL_ID))
        listener.relay.flush()
    assert listener.frames == [CancelCall(call_id=CALL_ID)]
    assert len(events_named(events, "relay_frame_malformed")) == 2
    assert listener.link.connected  # still the same socket
    assert listener.relay.closes == []


def test_job_frames_reach_the_handler_and_a_malformed_delivery_is_dropped(
    listener: Listener,
) -> None:
    """A delivery that does not decode never reaches the mailbox desk: nothing is run."""
    job_id = "5e3f8a1b-2c4d-4e6f-8a0b-1c2d3e4f5a6b"
    listener.connection.startService()
    listener.relay.flush()
    relay_side = listener.relay.sockets[0]
    with capturedLogs() as events:
        relay_side.sendMessage(
            b'{"type":"job_delivery","job_id":"job_1","from":"ann","envelope":{},'
            b'"expires_at":1,"attempt":1}',
            isBinary=False,
        )
        relay_side.send(CancelJob(job_id=job_id))
        relay_side.send(JobAck(job_id=job_id))
        listener.relay.flush()
    assert listener.frames == [CancelJob(job_id=job_id), JobAck(job_id=job_id)]
    assert len(events_named(events, "relay_frame_malformed")) == 1
    assert listener.link.connected


def test_a_failing_frame_handler_does_not_take_the_socket_down(listener: Listener) -> None:
    def broken(_frame: Frame) -> None:
        raise RuntimeError("handler bug")

    listener.connection._on_frame = broken
    listener.connection.startService()
    listener.relay.flush()
    with capturedLogs() as events:
        listener.relay.sockets[0].send(CancelCall(call_id=CALL_ID))
        listener.relay.flush()
    assert events_named(events, "relay_frame_handler_failed")
    assert listener.link.connected


# --- stopping ----------------------------------------------------------------------------------


def test_stopping_closes_the_socket_normally_and_stops_redialling(listener: Listener) -> None:
    listener.connection.startService()
    listener.relay.flush()
    stopped = listener.connection.stopService()
    listener.relay.flush()
    assert listener.relay.closes == [1000]
    assert stopped.called
    listener.clock.advance(limits.RECONNECT_MAX_S * 2)
    assert len(listener.relay.dialled) == 1


# --- a handshake that never completes --------------------------------------------------------


def test_a_timed_out_handshake_whose_socket_then_closes_logs_no_error(listener: Listener) -> None:
    """The open timeout drops the socket; the close that follows must not settle it again."""
    listener.relay.ready_address = None
    with no_unhandled_errors() as events:
        listener.connection.startService()
        listener.relay.flush()
        listener.clock.advance(limits.WS_OPENING_HANDSHAKE_TIMEOUT_S)
        listener.relay.flush()
        listener.clock.advance(limits.RECONNECT_MAX_S)
        listener.relay.flush()
    [failed, *_] = events_named(events, "relay_connect_failed")
    assert failed["reason"] == "no ready frame within 10 s"


def test_a_close_before_the_open_timeout_logs_no_error(listener: Listener) -> None:
    """The relay closes first; the timeout that would have fired later does nothing."""
    listener.relay.ready_address = None
    with no_unhandled_errors():
        listener.connection.startService()
        listener.relay.flush()
        listener.relay.sockets[0].sendClose(4001, "unauthorized")
        listener.relay.flush()
        listener.clock.advance(limits.WS_OPENING_HANDSHAKE_TIMEOUT_S)
        listener.relay.flush()
    assert listener.connection.connections == 0
    assert len(listener.relay.dialled) == 2  # redialled once, after one second


def test_stopping_during_the_handshake_then_the_close_logs_no_error(listener: Listener) -> None:
    """ClientService cancels the wait for ready on stop; the socket's close comes after."""
    listener.relay.ready_address = None
    with no_unhandled_errors():
        listener.connection.startService()
        listener.relay.flush()
        stopped = listener.connection.stopService()
        listener.relay.flush()
        listener.clock.advance(limits.WS_OPENING_HANDSHAKE_TIMEOUT_S * 2)
        listener.relay.flush()
    assert stopped.called
    assert len(listener.relay.dialled) == 1


# --- replaced by another listener for the same identity ---------------------------------------


def test_replaced_by_another_listener_logs_one_line_and_stops_redialling(
    listener: Listener,
) -> None:
    """Close code 4000 on the current socket: one clear error line, no more attempts."""
    listener.connection.startService()
    listener.relay.flush()
    with capturedLogs() as events:
        listener.relay.sockets[0].sendClose(CLOSE_REPLACED, "replaced by a newer connection")
        listener.relay.flush()
        listener.clock.advance(limits.RECONNECT_MAX_S * 3)
        listener.relay.flush()
    assert len(listener.relay.dialled) == 1
    assert listener.replacements == 1
    assert listener.connection.replaced
    assert not listener.connection.client.running
    assert not listener.link.connected
    [line] = events_named(events, "listener_replaced")
    assert (line["address"], line["relay"]) == ("@acme/ken", "relay.acme.test")
    assert "another listener for this identity" in line["detail"]
    assert "restart it" in line["detail"]
    assert events_named(events, "relay_disconnected") == []
    assert events_named(events, "relay_connect_failed") == []


def test_removed_from_the_organisation_logs_one_line_and_stops_redialling(
    listener: Listener,
) -> None:
    """Close code 4004: the token will never work again, so no attempt is made with it."""
    listener.connection.startService()
    listener.relay.flush()
    with capturedLogs() as events:
        listener.relay.sockets[0].sendClose(CLOSE_REMOVED, "removed from the organisation")
        listener.relay.flush()
        listener.clock.advance(limits.RECONNECT_MAX_S * 3)
        listener.relay.flush()
    assert len(listener.relay.dialled) == 1
    assert listener.replacements == 1  # the service ends the process, as when replaced
    assert not listener.connection.client.running
    [line] = events_named(events, "listener_removed")
    assert line["address"] == "@acme/ken"
    assert "admin removed this member" in line["detail"]
    assert events_named(events, "listener_replaced") == []


@pytest.mark.parametrize("code", [1000, 3000, 4001, 4002, 4999])
def test_any_other_close_code_is_redialled(listener: Listener, code: int) -> None:
    listener.connection.startService()
    listener.relay.flush()
    listener.relay.sockets[0].sendClose(code, "bye")
    listener.relay.flush()
    listener.clock.advance(1.0)
    listener.relay.flush()
    assert listener.replacements == 0
    assert listener.connection.connections == 2


def test_a_stale_socket_replaced_after_a_blip_does_not_stop_the_listener(
    listener: Listener,
) -> None:
    """The listener lost its socket without a close handshake and dialled again; the relay
    then replaces the old, stale session with 4000. The newer socket is this listener's own."""
    listener.connection.startService()
    listener.relay.flush()
    old_pump = listener.relay.pumps[0]
    # The client notices the loss first; the relay still holds the old session.
    old_pump.clientIO.reportDisconnect()
    listener.clock.advance(1.0)
    listener.relay.flush()
    assert listener.connection.connections == 2
    stale_relay_side = listener.relay.sockets[0]
    stale_relay_side.sendClose(CLOSE_REPLACED, "replaced by a newer connection")
    listener.relay.flush()
    assert listener.replacements == 0
    assert listener.connection.client.running
    assert listener.link.send(CallAccepted(call_id=CALL_ID)) is True


# --- the owner's own calls on the same socket ----------------------------------------------------


def test_an_outgoing_call_rides_the_socket_and_a_large_answer_reaches_it(clock: Clock) -> None:
    """The answer to an outgoing call may be far larger than any incoming call; losing the
    socket ends the calls still on it."""
    relay = FakeRelay(clock)
    link = RelayLink()
    outgoing = OutgoingCalls(link, clock)
    lost: list[bool] = []

    def on_lost() -> None:
        lost.append(True)
        outgoing.socket_lost()

    def on_frame(frame: Frame) -> None:
        assert outgoing.on_frame(frame)

    connection = RelayConnection(
        clock,
        load_settings=settings,
        link=link,
        on_frame=on_frame,
        on_ready=lambda: None,
        on_lost=on_lost,
        clock=clock,
        endpoint_for=relay.endpoint_for,
        random=lambda: 0.0,
    )
    connection.startService()
    relay.flush()
    request = CallRequest(
        envelope=sealed_looking(Direction.REQUEST, "@acme/ken", "@acme/ann"),
        correlation_id="a1" * 16,
    )
    got: list[object] = []
    outgoing.dial(
        clock, None, None, "ann", request, on_status=lambda _s: None, timeout_s=60
    ).addBoth(got.append)
    relay.flush()
    assert relay.received == [attrs.evolve(request, to="ann")]

    relay_side = relay.sockets[0]
    relay_side.send(CallStatus(call_id=CALL_ID, state=CallState.RINGING, correlation_id="a1" * 16))
    ct = "A" * (limits.MAX_REQUEST_FRAME_BYTES + 1000)  # larger than any request frame
    answer = CallOutcome(
        call_id=CALL_ID,
        terminal=Terminal.COMPLETED,
        envelope=attrs.evolve(sealed_looking(Direction.RESPONSE, "@acme/ann", "@acme/ken"), ct=ct),
    )
    relay_side.send(answer)
    relay.flush()
    assert got == [answer]

    second: list[object] = []
    outgoing.dial(
        clock,
        None,
        None,
        "ann",
        attrs.evolve(request, correlation_id="b2" * 16),
        on_status=lambda _s: None,
        timeout_s=60,
    ).addBoth(second.append)
    relay.flush()
    relay_side.sendClose(1000)
    relay.flush()
    assert lost == [True]
    [failure] = second
    assert isinstance(failure, Failure) and failure.check(CallAborted)
    connection.stopService()
    relay.flush()


def test_a_relay_that_does_not_offer_to_take_calls_gets_none(listener: Listener) -> None:
    """A relay from before the persistent socket says nothing about calls in its ready: the
    socket serves the listener, and the owner's calls take sockets of their own."""
    listener.relay.ready_calls = False
    listener.connection.startService()
    listener.relay.flush()
    assert listener.link.connected and not listener.link.carries_calls
    listener.relay.sockets[0].sendClose(1000)
    listener.relay.flush()
    assert not listener.link.carries_calls


@pytest.mark.parametrize("asks", [False, True])
def test_the_link_says_whether_the_relay_asked_for_jobs_held(
    listener: Listener, asks: bool
) -> None:
    """A relay that predates jobs_held does not ask, and is told nothing it cannot read."""
    listener.relay.ready_jobs_held = asks
    assert not listener.link.takes_jobs_held
    listener.connection.startService()
    listener.relay.flush()
    assert listener.link.connected and listener.link.takes_jobs_held is asks
    listener.relay.sockets[0].sendClose(1000)
    listener.relay.flush()
    assert not listener.link.takes_jobs_held
