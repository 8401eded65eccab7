"""Relay WebSockets from the client side, against a scripted autobahn server on loopback.

The server sends whatever each test scripts (ready first, usually) and records what it gets;
TLS comes from the throwaway CA.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
import pytest_twisted  # type: ignore[import-untyped,unused-ignore]
import txaio as _txaio
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.types import ConnectionRequest
from twisted.internet import defer
from twisted.internet import protocol as twisted_protocol
from twisted.internet import reactor as _reactor
from twisted.internet.endpoints import serverFromString
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import ILogObserver, formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from zope.interface import implementer

from agentcall import limits
from agentcall.client.api import Credentials, RelayUnreachable
from agentcall.client.tls import RelayTlsPolicy
from agentcall.client.ws import (
    OPEN_TIMEOUT_S,
    AddressEndpoint,
    CallAborted,
    ClientSocket,
    RelayBusy,
    SocketClosed,
    SocketRefused,
    call_endpoint,
    open_socket,
    place_call,
)
from agentcall.errors import CallErrorCode
from agentcall.relayurl import RelayUrl
from agentcall.testing.tlsca import make_ca
from agentcall.wire import codec
from agentcall.wire.closecodes import CLOSE_PROTOCOL_ERROR
from agentcall.wire.frames import (
    CallAccepted,
    CallError,
    CallOutcome,
    CallQueued,
    CallRequest,
    CallState,
    CallStatus,
    Direction,
    Frame,
    IncomingCall,
    Ready,
    Role,
    SealedEnvelope,
    Terminal,
)

reactor: Any = _reactor
txaio: Any = _txaio  # txaio's logging helpers are untyped
F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, None]])
TOKEN = "SECRETsecretSECRETsecretSECRETsecretSECRET1"
CREDS = Credentials(org="acme", handle="ann", token=TOKEN)
CALL_ID = "0b6e0c1e-7a51-4b51-9a3d-2f0d6f1c9e11"
ORIGIN = "relay.acme.test"


def twisted_test(f: F) -> F:
    """Run an async test on the reactor (pytest-twisted is untyped)."""
    result: F = pytest_twisted.ensureDeferred(f)
    return result


def envelope(direction: Direction, sender: str, recipient: str) -> SealedEnvelope:
    return SealedEnvelope(
        v=1,
        direction=direction,
        relay_origin=ORIGIN,
        from_=sender,
        to=recipient,
        key_id="1" * 32,
        epoch=1,
        ct="A" * 64,
    )


REQUEST = CallRequest(
    envelope=envelope(Direction.REQUEST, "@acme/ann", "@acme/ken"), correlation_id="c" * 32
)
OUTCOME = CallOutcome(
    call_id=CALL_ID,
    terminal=Terminal.COMPLETED,
    envelope=envelope(Direction.RESPONSE, "@acme/ken", "@acme/ann"),
)
RINGING = CallStatus(call_id=CALL_ID, state=CallState.RINGING)
WORKING = CallStatus(call_id=CALL_ID, state=CallState.WORKING)


def ready(role: Role, address: str = "@acme/ann") -> bytes:
    return codec.encode(Ready(role=role, address=address, relay_origin=ORIGIN))


# --- a scripted relay ---------------------------------------------------------------------------


class Waiter:
    """Values in arrival order; next() is a Deferred for the next one."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._waiting: list[defer.Deferred[Any]] = []
        self._taken = 0

    def put(self, value: Any) -> None:
        self.values.append(value)
        if self._waiting:
            self._taken += 1
            self._waiting.pop(0).callback(value)

    def next(self) -> defer.Deferred[Any]:
        if self._taken < len(self.values):
            self._taken += 1
            return defer.succeed(self.values[self._taken - 1])
        waiting: defer.Deferred[Any] = defer.Deferred()
        self._waiting.append(waiting)
        return waiting


@attrs.define
class Script:
    """What the relay sends: on open, and after each message it receives."""

    on_open: list[bytes | tuple[bytes, bool]] = attrs.Factory(list)
    on_message: list[bytes] = attrs.Factory(list)
    close_after_open: int | None = None
    close_after_message: int | None = None
    # Answer the upgrade 503 with this Retry-After (or with none, for ""), as a busy relay does.
    busy_retry_after: str | None = None


class ScriptedRelay(WebSocketServerProtocol):
    factory: ScriptedRelayFactory
    # The server side would log the client's headers at debug level: keep it out of the way
    # of the client-side log check.
    log = txaio.make_logger(level="info")

    def processHandshake(self) -> None:
        busy = self.factory.script.busy_retry_after
        if busy is not None and b"\r\n\r\n" in self.data:
            extra = [("Retry-After", busy)] if busy else []
            self.sendHttpErrorResponse(503, "Service Unavailable", extra)
            self.dropConnection(abort=False)
            return
        super().processHandshake()

    def onConnect(self, request: ConnectionRequest) -> None:
        self.factory.requests.put(request)

    def onOpen(self) -> None:
        script = self.factory.script
        self.factory.protocols.append(self)
        for item in script.on_open:
            payload, binary = item if isinstance(item, tuple) else (item, False)
            self.sendMessage(payload, isBinary=binary)
        if script.close_after_open is not None:
            self.sendClose(script.close_after_open, "scripted")
        self.factory.opened.put(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        script = self.factory.script
        self.factory.messages.put(payload)
        for message in script.on_message:
            self.sendMessage(message)
        if script.close_after_message is not None:
            self.sendClose(script.close_after_message)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.factory.closes.put(code)


class ScriptedRelayFactory(WebSocketServerFactory):
    protocol = ScriptedRelay  # type: ignore[assignment]

    def __init__(self, script: Script) -> None:
        super().__init__(reactor=reactor)
        self.script = script
        self.requests = Waiter()
        self.opened = Waiter()
        self.messages = Waiter()
        self.closes = Waiter()
        self.protocols: list[ScriptedRelay] = []


class Relays:
    """Starts scripted relays; the fixture tears them down."""

    def __init__(self, tmp: Path) -> None:
        self.ports: list[Any] = []
        self.factories: list[ScriptedRelayFactory] = []
        self.tmp = tmp

    async def start(
        self, script: Script, description: str = "tcp:0:interface=127.0.0.1"
    ) -> tuple[ScriptedRelayFactory, RelayUrl]:
        factory = ScriptedRelayFactory(script)
        endpoint = serverFromString(reactor, description)
        port = await endpoint.listen(factory)
        self.ports.append(port)
        self.factories.append(factory)
        scheme = "https" if description.startswith("ssl:") else "http"
        return factory, RelayUrl.parse(f"{scheme}://127.0.0.1:{port.getHost().port}")


@pytest.fixture
def relays(tmp_path: Path) -> Iterator[Relays]:
    running = Relays(tmp_path)
    yield running
    for factory in running.factories:
        for protocol in factory.protocols:
            protocol.dropConnection(abort=True)
    for port in running.ports:
        pytest_twisted.blockon(defer.maybeDeferred(port.stopListening))


class Client:
    """The client callbacks, recorded."""

    def __init__(self) -> None:
        self.frames = Waiter()
        self.closes = Waiter()

    def on_frame(self, frame: Frame) -> None:
        self.frames.put(frame)

    def on_close(self, info: SocketClosed) -> None:
        self.closes.put(info)


def connect(
    url: RelayUrl, client: Client, role: Role = Role.LISTEN, **kw: Any
) -> defer.Deferred[ClientSocket]:
    return open_socket(
        reactor,
        url,
        CREDS,
        role,
        on_frame=client.on_frame,
        on_close=client.on_close,
        **kw,
    )


# --- opening ------------------------------------------------------------------------------------


@twisted_test
async def test_a_socket_is_usable_once_ready_arrives(relays: Relays) -> None:
    """open_socket fires with the Ready; frames flow both ways; close is clean."""
    incoming = IncomingCall(
        call_id=CALL_ID,
        from_="ken",
        envelope=envelope(Direction.REQUEST, "@acme/ken", "@acme/ann"),
        correlation_id="d" * 32,
    )
    relay, url = await relays.start(Script(on_open=[ready(Role.LISTEN), codec.encode(incoming)]))
    client = Client()
    socket = await connect(url, client)
    assert socket.ready.role is Role.LISTEN and socket.is_open
    assert await client.frames.next() == incoming
    assert socket.send(CallAccepted(call_id=CALL_ID))
    assert codec.decode_frame(await relay.messages.next()) == CallAccepted(call_id=CALL_ID)
    socket.close()
    info = await client.closes.next()
    assert info.clean and info.protocol_error is None
    assert await relay.closes.next() == 1000
    assert not socket.send(CallAccepted(call_id=CALL_ID))


@twisted_test
async def test_the_socket_to_the_relay_has_nagle_off(relays: Relays) -> None:
    """A frame written behind one the relay has not acknowledged yet (a listener's outcome
    after its call_started) goes at once, not after the relay's delayed ACK."""
    import socket as sockets

    ca = make_ca(relays.tmp / "ca")
    cert = ca.issue_server(relays.tmp / "srv", hostnames=[], ips=["127.0.0.1"])
    plain = await relays.start(Script(on_open=[ready(Role.LISTEN)]))
    tls = await relays.start(Script(on_open=[ready(Role.LISTEN)]), cert.endpoint_string(0))
    for (_relay, url), ca_file in ((plain, None), (tls, str(ca.cert_file))):
        socket = await connect(url, Client(), ca_file=ca_file)
        transport: Any = socket._protocol.transport
        if hasattr(transport, "wrappedProtocol"):  # TLS: the TCP connection under it
            transport = transport.transport
        tcp = transport.getHandle()
        assert tcp.getsockopt(sockets.IPPROTO_TCP, sockets.TCP_NODELAY) != 0, url
        socket.close()


@twisted_test
async def test_the_upgrade_request_carries_role_and_credentials(relays: Relays) -> None:
    """The relay sees /v1/ws?role=call&to=ken and the three auth headers."""
    relay, url = await relays.start(Script(on_open=[ready(Role.CALL)]))
    await connect(url, Client(), Role.CALL, to="ken")
    request: ConnectionRequest = await relay.requests.next()
    assert request.path == "/v1/ws"
    assert request.params == {"role": ["call"], "to": ["ken"]}
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert (request.headers["x-agentcall-org"], request.headers["x-agentcall-handle"]) == (
        "acme",
        "ann",
    )


@twisted_test
async def test_the_token_stays_out_of_debug_logs(relays: Relays) -> None:
    """Even at txaio debug level, no log event of an opening handshake holds the token."""
    _relay, url = await relays.start(Script(on_open=[ready(Role.LISTEN)]))
    events: list[str] = []

    @implementer(ILogObserver)
    def observe(event: dict[str, Any]) -> None:
        events.append(repr(event) + str(formatEvent(event)))

    before = txaio.get_global_log_level()
    noisy = twisted_protocol.Factory.noisy
    # A daemon's makeService (run in-process by other tests) turns these lines off.
    twisted_protocol.Factory.noisy = True
    globalLogPublisher.addObserver(observe)
    txaio.set_global_log_level("debug")
    try:
        socket = await connect(url, Client())
    finally:
        txaio.set_global_log_level(before)
        twisted_protocol.Factory.noisy = noisy
        globalLogPublisher.removeObserver(observe)
    socket.close()
    assert events, "autobahn logged nothing at debug level: the check would be empty"
    assert not [e for e in events if TOKEN in e]


@twisted_test
async def test_tls_with_the_right_ca_other_ca_and_wrong_name(relays: Relays) -> None:
    """wss verifies the chain and the name: the right CA works, the others fail early."""
    ca, other = make_ca(relays.tmp / "ca"), make_ca(relays.tmp / "other")
    good = ca.issue_server(relays.tmp / "srv", hostnames=[], ips=["127.0.0.1"])
    wrong = ca.issue_server(relays.tmp / "srv", hostnames=["elsewhere.test"], ips=[], name="w")
    script = Script(on_open=[ready(Role.LISTEN)])
    _relay, url = await relays.start(script, good.endpoint_string(0))
    socket = await connect(url, Client(), ca_file=str(ca.cert_file))
    assert socket.ready.address == "@acme/ann"
    with pytest.raises(RelayUnreachable, match="not trusted") as caught:
        await connect(url, Client(), ca_file=str(other.cert_file))
    assert TOKEN not in str(caught.value)
    wrong_relay, wrong_url = await relays.start(script, wrong.endpoint_string(0))
    with pytest.raises(RelayUnreachable, match="not valid for"):
        await connect(wrong_url, Client(), ca_file=str(ca.cert_file))
    assert wrong_relay.requests.values == []


@twisted_test
async def test_a_busy_relay_says_when_to_dial_again(relays: Relays) -> None:
    """An upgrade answered 503 with a Retry-After fails the open with RelayBusy and the wait;
    a 503 that names none is an ordinary failure to connect."""
    _relay, url = await relays.start(Script(busy_retry_after="7"))
    with pytest.raises(RelayBusy, match="busy") as caught:
        await connect(url, Client())
    assert caught.value.retry_after_s == 7.0
    _relay, url = await relays.start(Script(busy_retry_after=""))
    with pytest.raises(RelayUnreachable, match="503"):
        await connect(url, Client())


@twisted_test
async def test_nothing_listening_is_unreachable(relays: Relays) -> None:
    """A refused connection fails the open with RelayUnreachable."""
    _relay, url = await relays.start(Script())
    await relays.ports.pop().stopListening()
    with pytest.raises(RelayUnreachable, match="refused"):
        await connect(url, Client())


@twisted_test
async def test_no_ready_in_time_is_unreachable(relays: Relays) -> None:
    """A relay that upgrades but never says ready is given up on and disconnected."""
    relay, url = await relays.start(Script())
    clock = Clock()
    opening = connect(url, Client(), clock=clock)
    await relay.opened.next()
    clock.advance(limits.WS_OPENING_HANDSHAKE_TIMEOUT_S)
    with pytest.raises(RelayUnreachable, match="not ready within 10 s"):
        await opening
    await relay.closes.next()


@twisted_test
async def test_a_close_before_ready_is_a_refusal(relays: Relays) -> None:
    """The relay closing with a code before ready fails the open with that code."""
    _relay, url = await relays.start(Script(close_after_open=4001))
    with pytest.raises(SocketRefused) as caught:
        await connect(url, Client())
    assert caught.value.close_code == 4001


@pytest.mark.parametrize(
    ("first", "why"),
    [
        (b"{not json", "malformed"),
        ((b"\x00\x01", True), "binary"),
        (codec.encode(CallAccepted(call_id=CALL_ID)), "not expected here"),
        (ready(Role.CALL), "not for us"),
        (ready(Role.LISTEN, "@acme/ken"), "not for us"),
        (
            codec.encode(
                IncomingCall(
                    call_id=CALL_ID,
                    from_="ken",
                    correlation_id="d" * 32,
                    envelope=envelope(Direction.REQUEST, "@acme/ken", "@acme/ann"),
                )
            ),
            "before ready",
        ),
    ],
    ids=[
        "not-json",
        "binary",
        "not-for-listener",
        "ready-wrong-role",
        "ready-wrong-address",
        "incoming-before-ready",
    ],
)
@twisted_test
async def test_a_bad_first_frame_closes_with_a_protocol_error(
    relays: Relays, first: bytes | tuple[bytes, bool], why: str
) -> None:
    """Before ready, a malformed or unexpected frame fails the open and closes with 4002."""
    relay, url = await relays.start(Script(on_open=[first]))
    with pytest.raises(SocketRefused, match=why) as caught:
        await connect(url, Client())
    assert caught.value.close_code == CLOSE_PROTOCOL_ERROR
    assert await relay.closes.next() == CLOSE_PROTOCOL_ERROR


@pytest.mark.parametrize(
    ("later", "why"),
    [
        (b'{"type":"incoming_call"}', "malformed"),
        (b"[1, 2", "malformed"),
        (ready(Role.LISTEN), "second ready"),
        # A listener's own frame, never one the relay sends.
        (codec.encode(CallAccepted(call_id=CALL_ID)), "not expected here"),
    ],
    ids=["missing-fields", "truncated-json", "second-ready", "not-for-listener"],
)
@twisted_test
async def test_a_malformed_frame_on_a_usable_socket_closes_it(
    relays: Relays, later: bytes, why: str
) -> None:
    """After ready, a bad frame never reaches on_frame; the socket closes with 4002."""
    relay, url = await relays.start(Script(on_open=[ready(Role.LISTEN), later]))
    client = Client()
    await connect(url, client)
    info: SocketClosed = await client.closes.next()
    assert info.protocol_error is not None and why in info.protocol_error
    assert client.frames.values == []
    assert await relay.closes.next() == CLOSE_PROTOCOL_ERROR


def test_role_and_target_must_agree() -> None:
    """A call socket needs a valid target handle; a listen socket takes none."""
    url = RelayUrl.parse("http://127.0.0.1:9")
    for role, to in ((Role.CALL, None), (Role.LISTEN, "ken"), (Role.CALL, "Ken!")):
        failed = connect(url, Client(), role, to=to)
        failures: list[Any] = []
        failed.addErrback(failures.append)
        assert failures and failures[0].check(ValueError)


# --- dialling an address ------------------------------------------------------------------------


def test_only_a_plain_relay_named_by_its_address_is_dialled_straight() -> None:
    """(That it then starts no resolver thread is test_client_lean's real socket.)"""
    memory = MemoryReactorClock()
    for text, straight in (
        ("http://127.0.0.1:8443", True),
        ("http://localhost:8443", False),
        ("https://127.0.0.1:8443", False),
    ):
        endpoint = call_endpoint(memory, RelayUrl.parse(text), None, RelayTlsPolicy(None))
        assert isinstance(endpoint, AddressEndpoint) is straight, text
    address = RelayUrl.parse("http://127.0.0.1:8443")
    open_socket(memory, address, CREDS, Role.LISTEN, on_frame=lambda _f: None, on_close=print)
    assert [(h, p, t) for h, p, _f, t, _b in memory.tcpClients] == [
        ("127.0.0.1", 8443, OPEN_TIMEOUT_S)
    ]


def test_a_relay_named_by_a_name_is_resolved_first() -> None:
    memory = MemoryReactorClock()
    resolving: list[str] = []
    memory.nameResolver = type(
        "R", (), {"resolveHostName": lambda _s, _r, name, *a, **k: resolving.append(name)}
    )()
    url = RelayUrl.parse("http://localhost:8443")
    open_socket(memory, url, CREDS, Role.LISTEN, on_frame=lambda _f: None, on_close=print)
    assert (resolving, memory.tcpClients) == (["localhost"], [])


def test_the_address_endpoint_hands_over_the_protocol_or_the_failure() -> None:
    memory = MemoryReactorClock()
    endpoint = AddressEndpoint(memory, "127.0.0.1", 9, 5.0)
    factory = Factory.forProtocol(Protocol)
    connected = endpoint.connect(factory)
    got: list[Any] = []
    connected.addBoth(got.append)
    attempt = memory.tcpClients[0][2]
    protocol = attempt.buildProtocol(None)
    assert got == [protocol] and isinstance(protocol, Protocol)

    refused = endpoint.connect(factory)
    refused.addBoth(got.append)
    memory.tcpClients[1][2].clientConnectionFailed(
        memory.connectors[1], Failure(ConnectionRefusedError())
    )
    assert got[1].check(ConnectionRefusedError)


def test_cancelling_the_address_endpoint_stops_the_attempt() -> None:
    memory = MemoryReactorClock()
    connecting = AddressEndpoint(memory, "127.0.0.1", 9, 5.0).connect(Factory.forProtocol(Protocol))
    got: list[Any] = []
    connecting.addBoth(got.append)
    connecting.cancel()
    assert memory.connectors[0].stoppedConnecting
    # The reactor's report of the stopped attempt does not fail it a second time.
    memory.tcpClients[0][2].clientConnectionFailed(
        memory.connectors[0], Failure(ConnectionRefusedError())
    )
    assert len(got) == 1 and got[0].check(defer.CancelledError)


# --- place_call -----------------------------------------------------------------------------------


def call(url: RelayUrl, statuses: list[CallStatus], **kw: Any) -> defer.Deferred[Any]:
    return place_call(reactor, url, CREDS, "ken", REQUEST, on_status=statuses.append, **kw)


@twisted_test
async def test_place_call_returns_the_outcome(relays: Relays) -> None:
    """The request goes out; statuses reach on_status; the outcome is the result."""
    relay, url = await relays.start(
        Script(
            on_open=[ready(Role.CALL)],
            on_message=[codec.encode(RINGING), codec.encode(WORKING), codec.encode(OUTCOME)],
            close_after_message=1000,
        )
    )
    statuses: list[CallStatus] = []
    assert await call(url, statuses) == OUTCOME
    assert statuses == [RINGING, WORKING]
    assert codec.decode_frame(await relay.messages.next()) == REQUEST


@twisted_test
async def test_place_call_returns_a_relay_call_error(relays: Relays) -> None:
    """A call_error from the relay is a result, not an exception."""
    failure = CallError(code=CallErrorCode.OFFLINE, call_id=CALL_ID)
    _relay, url = await relays.start(
        Script(on_open=[ready(Role.CALL)], on_message=[codec.encode(failure)])
    )
    assert await call(url, []) == failure


@twisted_test
async def test_place_call_returns_call_queued_as_its_end(relays: Relays) -> None:
    """call_queued ends the call like an outcome: the relay kept it as a job."""
    queued = CallQueued(job_id=CALL_ID, expires_at=1_750_259_200)
    relay, url = await relays.start(
        Script(on_open=[ready(Role.CALL)], on_message=[codec.encode(queued)])
    )
    assert await call(url, []) == queued
    assert codec.decode_frame(await relay.messages.next()) == REQUEST


@twisted_test
async def test_place_call_returns_a_refusal_sent_instead_of_ready(relays: Relays) -> None:
    """The relay's unauthorized call_error before ready is the call's answer."""
    refusal = CallError(code=CallErrorCode.UNAUTHORIZED)
    _relay, url = await relays.start(Script(on_open=[codec.encode(refusal)], close_after_open=4001))
    assert await call(url, []) == refusal


@twisted_test
async def test_place_call_aborts_when_the_socket_ends_without_an_outcome(
    relays: Relays,
) -> None:
    """A close after statuses only is CallAborted, not a hang."""
    _relay, url = await relays.start(
        Script(
            on_open=[ready(Role.CALL)],
            on_message=[codec.encode(RINGING)],
            close_after_message=1000,
        )
    )
    statuses: list[CallStatus] = []
    with pytest.raises(CallAborted, match="without an outcome"):
        await call(url, statuses)
    assert statuses == [RINGING]


@twisted_test
async def test_place_call_aborts_on_a_malformed_frame(relays: Relays) -> None:
    """A malformed frame mid-call closes the socket and aborts with the reason."""
    relay, url = await relays.start(
        Script(on_open=[ready(Role.CALL)], on_message=[b'{"type":"call_outcome"}'])
    )
    with pytest.raises(CallAborted, match="broke the protocol"):
        await call(url, [])
    assert await relay.closes.next() == CLOSE_PROTOCOL_ERROR


@twisted_test
async def test_place_call_gives_up_after_its_timeout(relays: Relays) -> None:
    """No terminal frame within the call timeout: hang up and abort."""
    relay, url = await relays.start(
        Script(on_open=[ready(Role.CALL)], on_message=[codec.encode(RINGING)])
    )
    clock = Clock()
    pending = call(url, [], clock=clock)
    await relay.messages.next()
    clock.advance(limits.CLIENT_CALL_TIMEOUT_S)
    with pytest.raises(CallAborted, match="no outcome within 420 s"):
        await pending
    assert await relay.closes.next() == 1000


@twisted_test
async def test_cancelling_a_call_hangs_up(relays: Relays) -> None:
    """Cancelling place_call's Deferred closes the socket."""
    relay, url = await relays.start(Script(on_open=[ready(Role.CALL)]))
    pending = call(url, [])
    await relay.messages.next()
    pending.cancel()
    with pytest.raises(defer.CancelledError):
        await pending
    assert await relay.closes.next() == 1000


@twisted_test
async def test_place_call_to_nothing_is_unreachable(relays: Relays) -> None:
    """No relay at all: RelayUnreachable, without the token in the message."""
    _relay, url = await relays.start(Script())
    await relays.ports.pop().stopListening()
    with pytest.raises(RelayUnreachable) as caught:
        await call(url, [])
    assert TOKEN not in str(caught.value)
