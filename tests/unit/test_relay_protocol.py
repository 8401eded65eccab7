"""The relay's WebSocket adapter with real autobahn clients, connected in memory to a relay
composed as ``twistd agentcall-relay`` composes it.

``iosim`` pumps bytes both ways through the front door, the HTTP upgrade and autobahn; txaio's
timers run on the relay's memory clock, so nothing here waits on real time.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import attrs
import pytest
import txaio as _txaio
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import ILogObserver, globalLogPublisher
from twisted.test import iosim
from zope.interface import implementer

from agentcall import ids, limits
from agentcall.errors import CallErrorCode
from agentcall.relay import audit
from agentcall.relay.store_interface import RelayStore
from agentcall.wire import codec
from agentcall.wire.closecodes import (
    CLOSE_BAD_REQUEST,
    CLOSE_NORMAL,
    CLOSE_UNAUTHORIZED,
)
from agentcall.wire.frames import (
    CallAccepted,
    CallError,
    CallOutcome,
    CallRequest,
    CallStarted,
    CallState,
    CallStatus,
    CancelCall,
    Direction,
    Frame,
    IncomingCall,
    Ready,
    Role,
    Terminal,
)
from tests.unit.crypto_helpers import NOW
from tests.unit.relay_helpers import (
    ORIGIN,
    HeldStore,
    MemoryRelay,
    fired,
    memory_relay,
    sealed_looking,
)

txaio: Any = _txaio  # txaio's config is untyped
CORRELATION = "c0ffee" + "0" * 26
SOURCE = IPv4Address("TCP", "10.0.0.1", 40000)


REQUEST = CallRequest(
    envelope=sealed_looking(Direction.REQUEST, "@acme/ann", "@acme/ken"), correlation_id=CORRELATION
)


class PartySocket(WebSocketClientProtocol):
    factory: Party

    def onOpen(self) -> None:
        self.factory.socket = self

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.factory.raw.append(payload)
        self.factory.frames.append(codec.decode_frame(payload))

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.factory.close_code = code


class Party(WebSocketClientFactory):
    """One end at ``/v1/ws``: the frames it got, how it was closed, and a pump to the relay."""

    protocol = PartySocket  # type: ignore[assignment]

    def __init__(self, query: str, headers: dict[str, str], reactor: MemoryReactorClock) -> None:
        super().__init__(f"ws://{ORIGIN}/v1/ws?{query}", reactor=reactor, headers=headers)
        self.socket: PartySocket | None = None
        self.frames: list[Frame] = []
        self.raw: list[bytes] = []
        self.close_code: int | None = None
        self.pump: iosim.IOPump | None = None

    def send(self, frame: Frame) -> None:
        assert self.socket is not None
        self.socket.sendMessage(codec.encode(frame), isBinary=False)

    def send_raw(self, payload: bytes, *, binary: bool = False) -> None:
        assert self.socket is not None
        self.socket.sendMessage(payload, isBinary=binary)


class Switch:
    """The relay and every party connected to it; :meth:`flush` delivers all pending bytes."""

    def __init__(self, relay: MemoryRelay) -> None:
        self.relay = relay
        self.parties: list[Party] = []
        self.tokens = {handle: relay.enrol(handle) for handle in ("ann", "ken")}

    def connect(self, query: str, handle: str, token: str | None = None) -> Party:
        headers = {
            "Authorization": f"Bearer {token or self.tokens[handle]}",
            "X-AgentCall-Org": "acme",
            "X-AgentCall-Handle": handle,
        }
        party = Party(query, headers, self.relay.reactor)
        server = self.relay.relay.factory.buildProtocol(SOURCE)
        client = party.buildProtocol(SOURCE)
        party.pump = iosim.connect(
            server,
            iosim.FakeTransport(server, isServer=True, peerAddress=SOURCE),
            client,
            iosim.FakeTransport(client, isServer=False),
            greet=False,
        )
        self.parties.append(party)
        self.flush()
        return party

    def flush(self) -> None:
        # Delivering to one side can queue bytes for another; pump until all are quiet.
        while any(party.pump is not None and party.pump.pump() for party in self.parties):
            pass


@contextlib.contextmanager
def relay_switch(tmp_path: Path) -> Iterator[Switch]:
    """A memory relay and its parties; txaio's timers run on the relay's clock meanwhile."""
    relay = memory_relay(tmp_path, now=NOW)
    previous = txaio.config.loop
    txaio.config.loop = relay.reactor
    try:
        yield Switch(relay)
    finally:
        txaio.config.loop = previous


@pytest.fixture
def switch(tmp_path: Path) -> Iterator[Switch]:
    with relay_switch(tmp_path) as switched:
        yield switched


def ready(role: Role, address: str) -> Ready:
    # A listener socket is told it may carry the installation's own calls; a caller's is not.
    return Ready(role=role, address=address, relay_origin=ORIGIN, calls=role is Role.LISTEN)


def test_a_call_is_routed_from_caller_to_listener_and_back(switch: Switch) -> None:
    ken = switch.connect("role=listen", "ken")
    assert ken.frames == [ready(Role.LISTEN, "@acme/ken")]
    assert b'"calls":true' in ken.raw[0]
    assert switch.relay.relay.switchboard.is_online("acme", "ken")
    ann = switch.connect("role=call&to=ken", "ann")
    assert ann.frames == [ready(Role.CALL, "@acme/ann")]
    assert b"calls" not in ann.raw[0]

    ann.send(REQUEST)
    switch.flush()
    [ringing] = ann.frames[1:]
    assert isinstance(ringing, CallStatus) and ringing.state is CallState.RINGING
    call_id = ringing.call_id
    assert ken.frames[1:] == [
        IncomingCall(
            call_id=call_id, from_="ann", envelope=REQUEST.envelope, correlation_id=CORRELATION
        )
    ]

    outcome = CallOutcome(
        call_id=call_id,
        terminal=Terminal.COMPLETED,
        envelope=sealed_looking(Direction.RESPONSE, "@acme/ken", "@acme/ann"),
    )
    for frame in (CallAccepted(call_id=call_id), CallStarted(call_id=call_id), outcome):
        ken.send(frame)
        switch.flush()
    assert ann.frames[2:] == [
        CallStatus(call_id=call_id, state=CallState.ANSWERED),
        CallStatus(call_id=call_id, state=CallState.WORKING),
        outcome,
    ]
    assert ann.close_code == CLOSE_NORMAL
    assert ken.close_code is None  # the listener's session outlives its calls
    assert switch.relay.relay.calls.active_count() == 0
    assert switch.relay.relay.door.gate.callers_of("@acme/ann") == 0
    # The call's audit rows wait out their short window, then go in one batch.
    store, sink = switch.relay.store, switch.relay.relay.audit
    assert sink.pending > 0
    switch.relay.reactor.advance(limits.AUDIT_WINDOW_S)
    assert sink.pending == 0
    rows = [(r.event, r.call_id) for r in fired(store.audit_rows("acme"))]
    assert [r for r in rows if r[1] == call_id] == [
        (audit.CALL_SUBMIT, call_id),
        (audit.CALL_ACCEPT, call_id),
        (audit.CALL_COMPLETE, call_id),
    ]


def test_a_call_to_a_handle_that_is_not_listening_is_offline(switch: Switch) -> None:
    ann = switch.connect("role=call&to=ken", "ann")
    ann.send(REQUEST)
    switch.flush()
    [error] = ann.frames[1:]
    assert isinstance(error, CallError) and error.code is CallErrorCode.OFFLINE
    assert ann.close_code == CLOSE_NORMAL


def test_a_routing_bug_is_logged_and_ends_the_caller_socket(
    switch: Switch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not an unhandled error in a Deferred, and not a caller left waiting for its deadline."""
    switch.connect("role=listen", "ken")
    book = switch.relay.relay.calls

    def broken(*_args: object) -> None:
        raise RuntimeError("a bug in routing")

    monkeypatch.setattr(book, "_ring", broken)
    failures: list[str] = []

    @implementer(ILogObserver)
    def observe(event: dict[str, Any]) -> None:
        if "log_failure" in event:
            failures.append(f"{event.get('event')}: {event['log_failure'].value}")

    globalLogPublisher.addObserver(observe)
    try:
        ann = switch.connect("role=call&to=ken", "ann")
        ann.send(REQUEST)
        switch.flush()
        gc.collect()  # an unhandled failed Deferred would be logged now
    finally:
        globalLogPublisher.removeObserver(observe)
    assert ann.close_code == CLOSE_NORMAL
    assert failures == ["call_routing_failed: a bug in routing"]


def test_a_listener_that_goes_away_is_offline_again(switch: Switch) -> None:
    ken = switch.connect("role=listen", "ken")
    assert ken.socket is not None
    ken.socket.sendClose(CLOSE_NORMAL)
    switch.flush()
    assert not switch.relay.relay.switchboard.is_online("acme", "ken")


def test_a_bad_token_is_closed_unauthorized_and_counted(switch: Switch) -> None:
    ken = switch.connect("role=listen", "ken", token="x" * 43)
    assert ken.frames == []
    assert ken.close_code == CLOSE_UNAUTHORIZED
    assert not switch.relay.relay.switchboard.is_online("acme", "ken")
    caller = switch.connect("role=call&to=ken", "ann", token="y" * 43)
    assert caller.frames == [CallError(code=CallErrorCode.UNAUTHORIZED)]
    assert caller.close_code == CLOSE_UNAUTHORIZED
    switch.relay.reactor.advance(60.0)
    switch.relay.relay.door.flush()
    switch.relay.reactor.advance(limits.AUDIT_WINDOW_S)
    [row] = fired(switch.relay.store.audit_rows(audit.RELAY_WIDE))
    assert row.detail == "2 failed authentications in this minute"


@pytest.mark.parametrize("query", ["", "role=sing", "role=listen&role=call"])
def test_a_socket_without_one_known_role_is_a_bad_request(switch: Switch, query: str) -> None:
    party = switch.connect(query, "ken")
    assert party.frames == []
    assert party.close_code == CLOSE_BAD_REQUEST


def test_a_caller_without_a_target_is_told_unknown_handle(switch: Switch) -> None:
    ann = switch.connect("role=call", "ann")
    ann.send(REQUEST)
    switch.flush()
    assert ann.frames[1:] == [CallError(code=CallErrorCode.UNKNOWN_HANDLE)]
    assert ann.close_code == CLOSE_NORMAL


@pytest.mark.parametrize(
    ("payload", "binary", "code"),
    [
        (b"{", False, CallErrorCode.PROTOCOL_ERROR),
        (codec.encode(REQUEST), True, CallErrorCode.PROTOCOL_ERROR),
        (b" " * (limits.MAX_REQUEST_FRAME_BYTES + 1), False, CallErrorCode.MESSAGE_TOO_LARGE),
    ],
)
def test_a_bad_caller_frame_ends_the_call_socket(
    switch: Switch, payload: bytes, binary: bool, code: CallErrorCode
) -> None:
    switch.connect("role=listen", "ken")
    ann = switch.connect("role=call&to=ken", "ann")
    ann.send_raw(payload, binary=binary)
    switch.flush()
    assert ann.frames[1:] == [CallError(code=code)]
    assert ann.close_code == CLOSE_NORMAL


def test_a_bad_listener_frame_is_dropped_and_the_session_kept(switch: Switch) -> None:
    ken = switch.connect("role=listen", "ken")
    ken.send_raw(b"not json")
    ken.send_raw(b"{}", binary=True)
    switch.flush()
    assert ken.close_code is None
    assert switch.relay.relay.switchboard.is_online("acme", "ken")
    ann = switch.connect("role=call&to=ken", "ann")
    ann.send(REQUEST)
    switch.flush()
    assert isinstance(ken.frames[-1], IncomingCall)


# --- a store that answers later ------------------------------------------------------------


@pytest.fixture
def slow_auth(tmp_path: Path) -> Iterator[tuple[Switch, HeldStore]]:
    """A relay whose store checks tokens only when the test releases it."""
    made: list[HeldStore] = []

    def wrap(store: RelayStore) -> RelayStore:
        made.append(HeldStore(store, "authenticate"))
        return cast(RelayStore, made[0])

    relay = memory_relay(tmp_path, now=NOW, wrap=wrap)
    previous = txaio.config.loop
    txaio.config.loop = relay.reactor
    try:
        yield Switch(relay), made[0]
    finally:
        txaio.config.loop = previous


def test_the_upgrade_waits_for_the_store(slow_auth: tuple[Switch, HeldStore]) -> None:
    """No Ready and no listener session until the store has checked the token."""
    switch, held = slow_auth
    ken = switch.connect("role=listen", "ken")
    assert ken.frames == [] and len(held.pending) == 1
    assert not switch.relay.relay.switchboard.is_online("acme", "ken")
    held.release()
    switch.flush()
    assert ken.frames == [ready(Role.LISTEN, "@acme/ken")]
    assert switch.relay.relay.switchboard.is_online("acme", "ken")


def test_a_client_gone_during_the_token_check_is_never_attached(
    slow_auth: tuple[Switch, HeldStore],
) -> None:
    """A socket closed while its token was checked opens no session and holds no count."""
    switch, held = slow_auth
    ken = switch.connect("role=listen", "ken")
    ann = switch.connect("role=call&to=ken", "ann")
    for party in (ken, ann):
        assert party.pump is not None
        party.pump.client.transport.loseConnection()
    switch.flush()
    held.release()
    switch.flush()
    assert ken.frames == [] and ann.frames == []
    assert not switch.relay.relay.switchboard.is_online("acme", "ken")
    assert switch.relay.relay.door.gate.callers_of("@acme/ann") == 0


# --- an installation's persistent socket carries its outgoing calls -----------------------------

OUTGOING = attrs.evolve(REQUEST, to="ken")


def test_a_listener_socket_places_a_call_and_gets_the_answer_as_sent(switch: Switch) -> None:
    ken = switch.connect("role=listen", "ken")
    ann = switch.connect("role=listen&mailbox=1", "ann")
    ann.send(OUTGOING)
    switch.flush()
    [ringing] = ann.frames[1:]
    assert isinstance(ringing, CallStatus) and ringing.correlation_id == CORRELATION
    call_id = ringing.call_id
    [incoming] = ken.frames[1:]
    assert isinstance(incoming, IncomingCall) and incoming.call_id == call_id

    outcome = CallOutcome(
        call_id=call_id,
        terminal=Terminal.COMPLETED,
        envelope=sealed_looking(Direction.RESPONSE, "@acme/ken", "@acme/ann"),
    )
    # Valid JSON in an order and spacing of the listener's own: the caller gets these bytes.
    fields = list(json.loads(codec.encode(outcome)).items())
    as_sent = json.dumps(dict(reversed(fields)), indent=1).encode()
    ken.send_raw(as_sent)
    switch.flush()
    assert ann.raw[-1] == as_sent and ann.frames[-1] == outcome
    assert ann.close_code is None and ken.close_code is None
    assert switch.relay.relay.calls.active_count() == 0


def test_an_oversize_request_on_a_listener_socket_is_refused_and_the_socket_kept(
    switch: Switch,
) -> None:
    switch.connect("role=listen", "ken")
    ann = switch.connect("role=listen", "ann")
    body = json.loads(codec.encode(OUTGOING))
    body["envelope"]["ct"] = "A" * (limits.MAX_REQUEST_FRAME_BYTES + 10)
    ann.send_raw(json.dumps(body).encode())
    switch.flush()
    [error] = ann.frames[1:]
    assert isinstance(error, CallError) and error.code is CallErrorCode.MESSAGE_TOO_LARGE
    assert error.correlation_id == CORRELATION and ann.close_code is None


def test_a_listener_socket_closing_mid_call_cancels_it_at_the_callee(switch: Switch) -> None:
    ken = switch.connect("role=listen", "ken")
    ann = switch.connect("role=listen", "ann")
    ann.send(OUTGOING)
    switch.flush()
    [ringing] = ann.frames[1:]
    assert isinstance(ringing, CallStatus)
    assert ann.socket is not None
    ann.socket.sendClose(CLOSE_NORMAL)
    switch.flush()
    assert ken.frames[-1] == CancelCall(call_id=ringing.call_id)


def test_a_listener_session_logs_one_info_line_each_way(switch: Switch) -> None:
    """Attached and detached; the switchboard's and the call book's own lines are debug."""
    from twisted.logger import LogLevel, capturedLogs

    with capturedLogs() as events:
        ken = switch.connect("role=listen", "ken")
        assert ken.socket is not None
        ken.socket.sendClose(CLOSE_NORMAL)
        switch.flush()
    ours = [e for e in events if str(e.get("log_namespace", "")).startswith("agentcall")]
    assert [e["event"] for e in ours if e["log_level"] is LogLevel.info] == [
        "listener_attached",
        "listener_detached",
    ]
    assert {"listener_online", "listener_offline", "listener_gone"} <= {
        e["event"] for e in ours if e["log_level"] is LogLevel.debug
    }


def _server_socket(switch: Switch, handle: str) -> Any:
    """The relay's own protocol of ``@acme/handle``'s listener socket."""
    channel = switch.relay.relay.switchboard.listener_for("acme", handle)
    assert channel is not None
    return cast(Any, channel)._protocol


@pytest.mark.parametrize("size", [0, 1, 125, 126, 4000, 65535, 65536, 70000])
def test_a_text_frame_is_written_as_autobahn_writes_it(switch: Switch, size: int) -> None:
    ken = switch.connect("role=listen", "ken")
    relay_side = _server_socket(switch, "ken")
    written: list[bytes] = []
    relay_side.transport.write = written.append
    payload = json.dumps({"pad": "x" * max(0, size - 10)})[:size].encode()
    relay_side.send_text(payload)
    relay_side.sendMessage(payload, isBinary=False)
    assert len(written) == 2 and written[0] == written[1]
    del relay_side.transport.write
    status = codec.encode(CallStatus(call_id=ids.mint_call_id(), state=CallState.WORKING))
    relay_side.send_text(status)
    switch.flush()
    assert ken.raw[-1] == status


def test_a_frame_either_way_builds_no_debug_text(
    switch: Switch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """autobahn's per-read and per-write debug lines name functions with hltype even when
    debug is off; the relay's frame path must not call it."""
    import autobahn.twisted.websocket
    import autobahn.websocket.protocol

    ken = switch.connect("role=listen", "ken")
    ann = switch.connect("role=listen", "ann")
    calls: list[object] = []
    for module in (autobahn.websocket.protocol, autobahn.twisted.websocket):
        monkeypatch.setattr(module, "hltype", calls.append)
    ann.send(OUTGOING)
    switch.flush()
    [ringing] = ann.frames[1:]
    assert isinstance(ringing, CallStatus)
    assert isinstance(ken.frames[-1], IncomingCall)
    # The clients are autobahn too: only the relay's side must stay clear of it.
    from agentcall.relay.protocol import RelayWebSocket

    relay_calls = [c for c in calls if isinstance(getattr(c, "__self__", None), RelayWebSocket)]
    assert relay_calls == []


class _Tcp:
    """Stands in for twisted.internet.tcp.Connection: what Unsent looks at, and doWrite."""

    def __init__(self, *, tls: bool = False) -> None:
        self.TLS = tls
        self.connected = 1
        self.disconnecting = False
        self._writeDisconnecting = False
        self._writeDisconnected = False
        self.producer: object | None = None
        self._tempDataBuffer: list[bytes] = []
        self.dataBuffer = b""
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self._tempDataBuffer.append(data)

    def doWrite(self) -> None:
        self.written.append(b"".join(self._tempDataBuffer))
        self._tempDataBuffer = []


class _Wrapper:
    """A ProtocolWrapper (the front door's GatedConnection) over a connection."""

    def __init__(self, transport: _Tcp) -> None:
        self.wrappedProtocol = object()
        self.transport = transport


def test_what_one_read_wrote_is_written_out_at_its_end_once_per_connection() -> None:
    from agentcall.relay.protocol import Unsent

    unsent = Unsent()
    caller, listener = _Tcp(), _Tcp()
    unsent.note(_Wrapper(caller))  # outside a read: the reactor's to write
    unsent.reading = True
    for tcp, data in ((listener, b"incoming"), (caller, b"ringing"), (caller, b"status")):
        tcp.write(data)
        unsent.note(_Wrapper(tcp) if tcp is caller else tcp)
    assert caller.written == [] and listener.written == []
    unsent.reading = False
    unsent.flush()
    assert listener.written == [b"incoming"] and caller.written == [b"ringingstatus"]
    unsent.flush()
    assert len(caller.written) == 1 and unsent.flushed == 2


@pytest.mark.parametrize(
    "state",
    ["tls", "disconnecting", "half_closing", "producer", "empty", "not_connected"],
)
def test_a_connection_in_any_other_state_is_left_to_the_reactor(state: str) -> None:
    from agentcall.relay.protocol import Unsent

    tcp = _Tcp(tls=state == "tls")
    tcp.write(b"frame")
    if state == "disconnecting":
        tcp.disconnecting = True
    elif state == "half_closing":
        tcp._writeDisconnecting = True
    elif state == "producer":
        tcp.producer = object()
    elif state == "empty":
        tcp._tempDataBuffer = []
    elif state == "not_connected":
        tcp.connected = 0
    unsent = Unsent()
    unsent.reading = True
    unsent.note(tcp)
    unsent.reading = False
    unsent.flush()
    assert tcp.written == [] and unsent.flushed == 0


def test_each_read_ends_by_writing_out_what_it_wrote(switch: Switch) -> None:
    """ann's call_request is read; ken's incoming_call and ann's ringing are noted during
    that read and handed to the flush at its end (memory transports are never written out
    early: they are not plain TCP)."""
    ken = switch.connect("role=listen", "ken")
    ann = switch.connect("role=listen", "ann")
    ken_side, ann_side = _server_socket(switch, "ken"), _server_socket(switch, "ann")
    unsent = ann_side.factory.unsent
    seen: list[tuple[str, object]] = []
    note, flush = unsent.note, unsent.flush

    def noting(transport: object) -> None:
        seen.append(("note" if unsent.reading else "note outside a read", transport))
        note(transport)

    def flushing() -> None:
        seen.append(("flush", None))
        flush()

    unsent.note, unsent.flush = noting, flushing
    ann.send(OUTGOING)
    switch.flush()
    assert isinstance(ken.frames[-1], IncomingCall)
    assert seen[-3:] == [
        ("note", ken_side.transport),
        ("note", ann_side.transport),
        ("flush", None),
    ]


def test_a_connection_reads_its_options_from_its_class_not_copies_of_its_own(
    switch: Switch,
) -> None:
    """autobahn copies only the options a protocol class lacks: kept on the factory's class,
    none lands in a connection's attributes (the copies doubled an idle listener's table)."""
    from autobahn.websocket.protocol import WebSocketProtocol

    from agentcall.relay.protocol import RelayWebSocket

    switch.connect("role=listen", "ken")
    side: Any = _server_socket(switch, "ken")
    factory = side.factory
    names = [*WebSocketProtocol.CONFIG_ATTRS_COMMON, *WebSocketProtocol.CONFIG_ATTRS_SERVER]
    assert isinstance(side, RelayWebSocket) and type(side) is not RelayWebSocket
    assert not set(names) & set(vars(side))
    options: Any = side  # autobahn's options are untyped
    for name in names:
        if name != "perMessageCompressionAccept":
            assert getattr(options, name) == getattr(factory, name), name
    assert options.maxFramePayloadSize == limits.MAX_FRAME_BYTES
    # The callable option is called unbound, as autobahn calls its own copy.
    assert options.perMessageCompressionAccept(["permessage-deflate"]) is None
