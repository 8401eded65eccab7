"""The relay's front door over memory transports: deadlines, caps, throttles, disclosure."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import attrs
import pytest
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import ILogObserver, LogLevel, globalLogPublisher
from twisted.python.failure import Failure
from zope.interface import implementer

from agentcall import limits
from agentcall.relay import audit
from agentcall.relay.door import Door, DoorConfig, source_of
from agentcall.relay.gate import GateLimits
from agentcall.relay.store import SqliteRelayStore
from agentcall.relay.store_interface import RelayStore
from tests.unit.relay_helpers import (
    ORIGIN,
    HeldStore,
    MemoryRelay,
    fired,
    holding,
    memory_relay,
    parse_answer,
)


@attrs.define
class Front:
    memory: MemoryRelay
    token: str

    @property
    def reactor(self) -> MemoryReactorClock:
        return self.memory.reactor

    @property
    def store(self) -> SqliteRelayStore:
        return self.memory.store

    @property
    def door(self) -> Door:
        return self.memory.relay.door

    def connect(self, host: str = "10.0.0.1") -> tuple[Any, StringTransport]:
        return self.memory.connect(host)

    def request(self, raw: bytes, host: str = "10.0.0.1") -> tuple[int, dict[str, str], bytes]:
        answer = self.memory.send(raw, host)
        return answer.status, answer.headers, answer.body


def parse(data: bytes) -> tuple[int, dict[str, str], bytes]:
    answer = parse_answer(data)
    return answer.status, answer.headers, answer.body


def config(**changes: Any) -> DoorConfig:
    values: dict[str, Any] = {
        "caps": GateLimits(per_source=3, total=10, handshakes=5, callers_per_identity=1),
        "head_timeout_s": 10.0,
        "call_request_timeout_s": 10.0,
        "register_per_minute": 2,
        "auth_failures_per_minute": 2,
    }
    values.update(changes)
    return DoorConfig(**values)


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Front]:
    yield make_front(tmp_path, config())


def make_front(tmp_path: Path, door_config: DoorConfig) -> Front:
    memory = memory_relay(tmp_path, now=1_000_000.0, door=door_config)
    return Front(memory, memory.enrol("ann"))


def get(path: str, *headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: relay.example", *headers, "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def upgrade(path: str, *headers: str) -> bytes:
    key = base64.b64encode(b"0123456789abcdef").decode()
    lines = [
        f"GET {path} HTTP/1.1",
        "Host: relay.example",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def auth(front: Front, token: str | None = None) -> tuple[str, str, str]:
    return (
        f"Authorization: Bearer {token or front.token}",
        "X-AgentCall-Org: acme",
        "X-AgentCall-Handle: ann",
    )


def ws_frames(data: bytes) -> list[tuple[int, bytes]]:
    """(opcode, payload) of the unmasked frames a server sent."""
    out = []
    while data:
        opcode, length = data[0] & 0x0F, data[1] & 0x7F
        offset = 2
        if length == 126:
            length, offset = int.from_bytes(data[2:4], "big"), 4
        out.append((opcode, data[offset : offset + length]))
        data = data[offset + length :]
    return out


# --- disclosure -------------------------------------------------------------------------------


def test_status_names_no_version_and_no_server(front: Front) -> None:
    status, headers, body = front.request(get("/v1/status"))
    assert status == 200
    assert json.loads(body) == {"ok": True, "relay_origin": ORIGIN, "version": None}
    assert "server" not in headers


def test_plain_get_of_the_socket_is_426_json(front: Front) -> None:
    status, headers, body = front.request(get("/v1/ws?role=listen"))
    assert status == 426
    assert json.loads(body)["error"] == "upgrade_required"
    assert headers["upgrade"] == "websocket"
    assert headers["content-type"] == "application/json"
    assert "server" not in headers


def test_upgrade_response_names_no_server(front: Front) -> None:
    protocol, transport = front.connect()
    protocol.dataReceived(upgrade("/v1/ws?role=listen", *auth(front)))
    status, headers, _ = parse(transport.value())
    assert status == 101
    assert "server" not in headers


# --- the head deadline ------------------------------------------------------------------------


def test_a_trickled_head_is_cut_at_its_deadline(front: Front) -> None:
    protocol, transport = front.connect()
    protocol.dataReceived(b"GET /v1/status HTTP/1.1\r\n")
    for n in range(4):
        front.reactor.advance(2.4)
        protocol.dataReceived(f"X-Trickle-{n}: y\r\n".encode())
    assert not transport.disconnecting
    front.reactor.advance(0.5)  # 10 s since the connection opened
    assert transport.disconnected
    assert front.door.turned_away.drain() == {"head_timeout": 1}


def test_a_complete_request_is_not_cut_and_an_idle_kept_alive_one_is(front: Front) -> None:
    protocol, transport = front.connect()
    protocol.dataReceived(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
    assert parse(transport.value())[0] == 200
    front.reactor.advance(9.9)
    assert not transport.disconnecting
    front.reactor.advance(0.2)
    assert transport.disconnected


def test_an_upgraded_socket_outlives_the_head_deadline(front: Front) -> None:
    protocol, transport = front.connect()
    protocol.dataReceived(upgrade("/v1/ws?role=listen", *auth(front)))
    front.reactor.advance(25.0)
    assert not transport.disconnecting


# --- caps -------------------------------------------------------------------------------------


def test_connections_over_the_per_source_cap_are_closed_at_once(front: Front) -> None:
    held = [front.connect("10.0.0.1") for _ in range(3)]
    assert not any(t.disconnecting for _, t in held)
    _, refused = front.connect("10.0.0.1")
    assert refused.disconnected
    _, other = front.connect("10.0.0.2")
    assert not other.disconnecting
    held[0][0].connectionLost(Failure(ConnectionDone()))
    _, again = front.connect("10.0.0.1")
    assert not again.disconnecting
    assert front.door.turned_away.drain() == {"per_source": 1}


def test_at_the_handshake_cap_a_newcomer_evicts_the_oldest_unfinished_head(
    tmp_path: Path,
) -> None:
    """Idle heads from many sources cannot keep the door shut; an open listener is never
    evicted for them."""
    caps = GateLimits(per_source=10, total=10, handshakes=2, callers_per_identity=1)
    front = make_front(tmp_path, config(caps=caps))
    listener, listener_socket = front.connect("10.0.0.1")
    listener.dataReceived(upgrade("/v1/ws?role=listen", *auth(front)))
    _, oldest = front.connect("10.0.0.2")
    _, older = front.connect("10.0.0.3")
    _, newcomer = front.connect("10.0.0.4")
    assert oldest.disconnected and not older.disconnecting and not newcomer.disconnecting
    assert not listener_socket.disconnecting
    assert front.door.gate.in_head == 2
    assert front.door.turned_away.drain() == {"evicted_in_head": 1}


def test_at_the_total_cap_a_newcomer_evicts_the_oldest_plain_http_connection(
    tmp_path: Path,
) -> None:
    """Kept-alive plain HTTP connections make room; authenticated sockets do not."""
    caps = GateLimits(per_source=10, total=3, handshakes=10, callers_per_identity=1)
    front = make_front(tmp_path, config(caps=caps))
    listener, listener_socket = front.connect("10.0.0.1")
    listener.dataReceived(upgrade("/v1/ws?role=listen", *auth(front)))
    kept: list[StringTransport] = []
    for host in ("10.0.0.2", "10.0.0.3"):
        protocol, transport = front.connect(host)
        kept_alive = b"GET /v1/status HTTP/1.1\r\nHost: relay.example\r\n\r\n"
        protocol.dataReceived(kept_alive)
        assert b" 200 " in transport.value()
        kept.append(transport)
    _, newcomer = front.connect("10.0.0.4")
    assert kept[0].disconnected and not kept[1].disconnecting
    assert not newcomer.disconnecting and not listener_socket.disconnecting
    assert front.door.turned_away.drain() == {"evicted_plain_http": 1}


def test_when_every_place_is_an_authenticated_socket_a_newcomer_is_turned_away(
    tmp_path: Path,
) -> None:
    caps = GateLimits(per_source=10, total=1, handshakes=10, callers_per_identity=1)
    front = make_front(tmp_path, config(caps=caps))
    listener, listener_socket = front.connect("10.0.0.1")
    listener.dataReceived(upgrade("/v1/ws?role=listen", *auth(front)))
    assert front.connect("10.0.0.2")[1].disconnected
    assert not listener_socket.disconnecting
    assert front.door.turned_away.drain() == {"total": 1}


# --- throttles and auth.failed ----------------------------------------------------------------


def register() -> bytes:
    body = b"{}"
    return (
        b"POST /v1/register HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\nConnection: close\r\n\r\n" + body
    )


def test_registration_is_throttled_per_source(front: Front) -> None:
    assert front.request(register())[0] == 400
    assert front.request(register())[0] == 400
    status, headers, body = front.request(register())
    assert status == 429 and headers["retry-after"] == "30"
    assert json.loads(body)["error"] == "rate_limited"
    assert front.request(register(), host="10.0.0.9")[0] == 400


def test_failed_authentication_is_throttled_and_audited_per_minute(front: Front) -> None:
    bad = auth(front, "guess-one-secret-token")
    assert front.request(get("/v1/me", *bad))[0] == 401
    assert front.request(get("/v1/me", *bad))[0] == 401
    status, headers, _ = front.request(get("/v1/me", *auth(front)))
    assert status == 429 and headers["retry-after"] == "30"
    # The socket is throttled too, before its credentials are looked at.
    status, headers, body = front.request(upgrade("/v1/ws?role=listen", *auth(front)))
    assert status == 429 and json.loads(body)["error"] == "rate_limited"
    assert front.request(get("/v1/me", *auth(front)), host="10.0.0.2")[0] == 200
    assert front.door.turned_away.drain() == {"api_refused": 2, "auth_throttled": 2}
    front.reactor.advance(60.0)
    front.door.flush()
    front.reactor.advance(limits.AUDIT_WINDOW_S)  # the audit rows of a window go in one batch
    rows = fired(front.store.audit_rows(audit.RELAY_WIDE))
    assert [(r.event, r.target, r.detail) for r in rows] == [
        (audit.AUTH_FAILED, "10.0.0.1", "2 failed authentications in this minute")
    ]
    assert "guess" not in repr(rows)


def test_a_failed_socket_login_counts_as_a_failure(front: Front) -> None:
    for _ in range(2):
        protocol, _ = front.connect()
        protocol.dataReceived(upgrade("/v1/ws?role=listen", *auth(front, "nope")))
    status, _, _ = front.request(get("/v1/me", *auth(front)))
    assert status == 429
    front.door.flush(final=True)
    front.reactor.advance(limits.AUDIT_WINDOW_S)
    assert fired(front.store.audit_rows(audit.RELAY_WIDE))[0].detail.startswith("2 ")  # type: ignore[union-attr]


def test_flush_never_raises() -> None:
    class Broken:
        def record(self, *args: object) -> None:
            raise RuntimeError("disk full")

    door = Door(config(), MemoryReactorClock(), Broken())  # type: ignore[arg-type]
    door.auth_failed("10.0.0.1")
    door.flush(final=True)


def test_an_auth_failed_row_that_could_not_be_written_is_written_next_time() -> None:
    """A busy database loses no minute's row: it is kept for the next flush."""

    class Flaky:
        def __init__(self) -> None:
            self.fail = True
            self.rows: list[audit.AuditEntry] = []

        def record(self, entry: audit.AuditEntry) -> Deferred[None]:
            if self.fail:
                return fail(RuntimeError("database is locked"))
            self.rows.append(entry)
            return succeed(None)

    clock = MemoryReactorClock()
    clock.advance(1_000_020.0)
    sink = Flaky()
    door = Door(config(), clock, sink)
    door.auth_failed("10.0.0.1")
    door.auth_failed("10.0.0.1")
    clock.advance(60.0)
    door.flush()
    assert sink.rows == []
    sink.fail = False
    clock.advance(60.0)
    door.flush()
    assert [(r.target, r.detail) for r in sink.rows] == [
        ("10.0.0.1", "2 failed authentications in this minute")
    ]


def test_junk_requests_are_counted_not_logged_one_line_each(front: Front) -> None:
    """200 pipelined 404s with 8 KB paths: no line per request (no access log either), one
    count in the door's tally."""
    events: list[dict[str, Any]] = []

    @implementer(ILogObserver)
    def observe(event: dict[str, Any]) -> None:
        events.append(event)

    globalLogPublisher.addObserver(observe)
    try:
        protocol, transport = front.connect()
        junk = b"GET /v1/" + b"x" * 8000 + b" HTTP/1.1\r\nHost: relay.example\r\n\r\n"
        protocol.dataReceived(junk * 200)
    finally:
        globalLogPublisher.removeObserver(observe)
    assert transport.value().count(b" 404 ") == 200
    loud = [e for e in events if e.get("log_level", LogLevel.info) >= LogLevel.info]
    assert len(loud) < 5, loud[:3]
    assert front.door.turned_away.drain() == {"api_refused": 200}


@pytest.mark.parametrize(
    ("host", "source"),
    [
        ("203.0.113.9", "203.0.113.9"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::9", "2001:db8:1:2::/64"),
        ("::ffff:198.51.100.7", "198.51.100.7"),
        ("fe80::1%eth0", "fe80::/64"),
    ],
)
def test_an_ipv6_source_is_its_64(host: str, source: str) -> None:
    """One subscriber holds a whole /64: counting its addresses one by one would give an
    attacker endless fresh sources."""
    address = IPv6Address("TCP", host, 1) if ":" in host else IPv4Address("TCP", host, 1)
    assert source_of(address) == source


# --- caller sockets ---------------------------------------------------------------------------


def open_caller(front: Front) -> StringTransport:
    protocol, transport = front.connect()
    protocol.dataReceived(upgrade("/v1/ws?role=call&to=ken", *auth(front)))
    return transport


def server_frames(transport: StringTransport) -> list[tuple[int, bytes]]:
    _, _, rest = transport.value().partition(b"\r\n\r\n")
    return ws_frames(rest)


def test_a_caller_that_never_sends_its_request_is_closed(front: Front) -> None:
    transport = open_caller(front)
    ready = server_frames(transport)
    assert json.loads(ready[0][1])["type"] == "ready"
    front.reactor.advance(9.9)
    assert len(server_frames(transport)) == 1
    front.reactor.advance(0.2)
    sent = server_frames(transport)
    assert json.loads(sent[1][1])["code"] == "protocol_error"
    assert sent[2][0] == 0x8  # close
    assert front.door.turned_away.drain() == {"call_request_timeout": 1}


def test_caller_sockets_per_identity_are_capped(front: Front) -> None:
    open_caller(front)
    second = open_caller(front)
    sent = server_frames(second)
    assert json.loads(sent[0][1])["code"] == "rate_limited"
    assert sent[1][0] == 0x8 and int.from_bytes(sent[1][1][:2], "big") == 4029
    assert front.door.gate.callers_of("@acme/ann") == 1


# --- upgrades in flight -------------------------------------------------------------------------


def test_upgrades_past_the_cap_are_told_to_come_back_before_any_lookup(tmp_path: Path) -> None:
    """Two upgrades whose credentials are still being checked fill a cap of two; the third is
    answered 503 with a jittered Retry-After without a store lookup, and counted."""
    caps = GateLimits(per_source=10, total=10, handshakes=10, callers_per_identity=1, upgrades=2)
    stores: list[HeldStore] = []

    def hold(store: SqliteRelayStore) -> RelayStore:
        stores.append(HeldStore(store, "authenticate"))
        return cast(RelayStore, stores[-1])

    memory = memory_relay(tmp_path, now=1_000_000.0, door=config(caps=caps), wrap=hold)
    token = memory.enrol("ann")
    [held] = stores
    memory.relay.door.random = lambda: 0.5
    headers = (
        f"Authorization: Bearer {token}",
        "X-AgentCall-Org: acme",
        "X-AgentCall-Handle: ann",
    )
    waiting = []
    for _ in range(2):
        protocol, transport = memory.connect()
        protocol.dataReceived(upgrade("/v1/ws?role=listen", *headers))
        waiting.append((protocol, transport))
    assert len(held.pending) == 2 and memory.relay.door.gate.upgrades_in_flight == 2
    protocol, transport = memory.connect()
    protocol.dataReceived(upgrade("/v1/ws?role=listen", *headers))
    status, answer_headers, body = parse(transport.value())
    assert status == 503 and answer_headers["retry-after"] == "6"
    assert json.loads(body)["error"] == "rate_limited"
    assert len(held.pending) == 2  # no lookup for the one turned away
    assert memory.relay.door.turned_away.drain() == {"upgrades_busy": 1}
    # Once the first two are answered (ready), the next upgrade is checked again.
    held.release()
    assert [parse(t.value())[0] for _p, t in waiting] == [101, 101]
    assert memory.relay.door.gate.upgrades_in_flight == 0
    protocol, transport = memory.connect()
    protocol.dataReceived(upgrade("/v1/ws?role=listen", *headers))
    assert len(held.pending) == 1


def test_an_upgrade_that_leaves_while_checked_frees_its_place(tmp_path: Path) -> None:
    caps = GateLimits(per_source=10, total=10, handshakes=10, callers_per_identity=1, upgrades=1)
    memory = memory_relay(
        tmp_path, now=1_000_000.0, door=config(caps=caps), wrap=holding("authenticate")
    )
    token = memory.enrol("ann")
    headers = (f"Authorization: Bearer {token}", "X-AgentCall-Org: acme", "X-AgentCall-Handle: ann")
    protocol, _transport = memory.connect()
    protocol.dataReceived(upgrade("/v1/ws?role=listen", *headers))
    assert memory.relay.door.gate.upgrades_in_flight == 1
    protocol.connectionLost(Failure(ConnectionDone()))
    assert memory.relay.door.gate.upgrades_in_flight == 0


def test_a_refused_upgrade_is_answered_and_frees_its_place(front: Front) -> None:
    """Bad credentials: the socket opens only to be closed; it no longer counts as in flight."""
    protocol, _transport = front.connect()
    protocol.dataReceived(upgrade("/v1/ws?role=listen", *auth(front, "nope")))
    assert front.door.gate.upgrades_in_flight == 0


def test_the_connection_wrapper_claims_the_transport_s_interfaces_but_not_tls(
    front: Front,
) -> None:
    """autobahn must not take the wrapper for the TLS layer; everything else is passed on."""
    from twisted.internet.interfaces import IPushProducer, ISSLTransport, ITransport
    from zope.interface import directlyProvides

    class TlsTransport(StringTransport):
        pass

    for _ in range(2):  # the second one through the cached interfaces
        transport = TlsTransport(peerAddress=IPv4Address("TCP", "10.0.0.1", 40000))
        directlyProvides(transport, ISSLTransport)
        protocol = front.memory.relay.factory.buildProtocol(transport.getPeer())
        protocol.makeConnection(transport)
        assert ITransport.providedBy(protocol) and IPushProducer.providedBy(protocol)
        assert not ISSLTransport.providedBy(protocol)
    plain, _ = front.connect()
    assert ITransport.providedBy(plain) and not ISSLTransport.providedBy(plain)


def test_without_the_valve_a_newcomer_at_the_head_cap_evicts_the_oldest_head_however_young(
    tmp_path: Path,
) -> None:
    """With --no-accept-hold the port never stops accepting, and a newcomer at the head cap is
    never closed: the oldest connection in head makes room, young or not."""
    caps = GateLimits(
        per_source=10, total=10, handshakes=2, callers_per_identity=1, head_grace_s=2.0
    )
    front = make_front(tmp_path, config(caps=caps, hold_accept=False))
    port = FakePort()
    front.door.valve.attach(port)
    _, first = front.connect("10.0.0.2")
    front.reactor.advance(0.5)
    _, second = front.connect("10.0.0.3")
    _, newcomer = front.connect("10.0.0.4")
    assert first.disconnected and not second.disconnecting and not newcomer.disconnecting
    assert port.reading and port.stops == 0
    assert front.door.gate.open_total == 2
    assert front.door.turned_away.drain() == {"evicted_in_head": 1}


@attrs.define
class FakePort:
    """What the valve asks of a listening port."""

    reading: bool = True
    numberAccepts: int = 100
    stops: int = 0

    def stopReading(self) -> None:
        self.reading = False
        self.stops += 1

    def startReading(self) -> None:
        self.reading = True


def test_at_the_head_cap_the_port_stops_accepting_instead_of_closing_newcomers(
    tmp_path: Path,
) -> None:
    """A reconnecting crowd fills the places in head: the port stops accepting (newcomers wait
    in the kernel's queue), nobody is closed; it accepts again as places free up, at most as
    many at once as there are places."""
    caps = GateLimits(
        per_source=10, total=20, handshakes=4, callers_per_identity=1, head_grace_s=2.0
    )
    front = make_front(tmp_path, config(caps=caps))
    port = FakePort()
    front.door.valve.attach(port)
    heads = [front.connect(f"10.0.0.{i}") for i in range(2, 6)]
    assert not port.reading and front.door.valve.held
    assert all(not t.disconnecting for _p, t in heads)
    assert front.door.turned_away.drain() == {"accept_held": 1}
    # One head done: one place free, one accept at a time.
    heads[0][0].dataReceived(get("/v1/status"))
    assert port.reading and port.numberAccepts == 1
    front.connect("10.0.0.6")
    assert not port.reading and port.stops == 2
    heads[1][0].dataReceived(get("/v1/status"))
    heads[2][0].dataReceived(get("/v1/status"))
    assert port.reading and port.numberAccepts == 1  # clamped when the first place freed
    assert front.door.turned_away.drain() == {"accept_held": 1}


def test_newcomers_the_accept_loop_takes_after_the_port_stopped_evict_and_are_not_closed(
    tmp_path: Path,
) -> None:
    """Twisted's accept loop runs to its end after the valve stopped the port: the newcomers it
    still takes get places (the oldest heads make room, young as they are) instead of being
    reset; and one of them finishing its head frees a place, so the port accepts again well
    before the grace."""
    caps = GateLimits(
        per_source=10, total=20, handshakes=2, callers_per_identity=1, head_grace_s=30.0
    )
    front = make_front(tmp_path, config(caps=caps))
    port = FakePort()
    front.door.valve.attach(port)
    _, first = front.connect("10.0.0.2")
    _, second = front.connect("10.0.0.3")
    assert not port.reading
    # The same accept loop goes on: two more connections from other sources.
    _, third = front.connect("10.0.0.4")
    newcomer, newcomer_socket = front.connect("10.0.0.5")
    assert first.disconnected and second.disconnected
    assert not third.disconnecting and not newcomer_socket.disconnecting
    assert not port.reading and front.door.gate.in_head == 2
    front.reactor.advance(1.0)
    newcomer.dataReceived(get("/v1/status"))
    assert b" 200 " in newcomer_socket.value()
    assert port.reading
    assert front.door.turned_away.drain() == {"accept_held": 1, "evicted_in_head": 2}


def test_a_held_port_accepts_again_once_the_oldest_head_had_its_grace(tmp_path: Path) -> None:
    """Slow heads cannot keep the door shut: after the grace the port accepts, and a newcomer
    evicts the oldest, as without the valve."""
    caps = GateLimits(
        per_source=10, total=20, handshakes=2, callers_per_identity=1, head_grace_s=2.0
    )
    front = make_front(tmp_path, config(caps=caps))
    port = FakePort()
    front.door.valve.attach(port)
    _, first = front.connect("10.0.0.2")
    front.reactor.advance(0.5)
    front.connect("10.0.0.3")
    assert not port.reading
    front.reactor.advance(1.4)
    assert not port.reading
    front.reactor.advance(0.1)
    assert port.reading and port.numberAccepts == 1
    _, newcomer = front.connect("10.0.0.4")
    assert first.disconnected and not newcomer.disconnecting
    # The next oldest is 1.5 s old: held again, for the 0.5 s it has left.
    assert not port.reading and port.stops == 2
    front.reactor.advance(0.5)
    assert port.reading
    assert front.door.turned_away.drain() == {"accept_held": 2, "evicted_in_head": 1}


def test_a_detached_valve_leaves_the_port_alone(tmp_path: Path) -> None:
    caps = GateLimits(
        per_source=10, total=20, handshakes=1, callers_per_identity=1, head_grace_s=2.0
    )
    front = make_front(tmp_path, config(caps=caps))
    port = FakePort()
    front.door.valve.attach(port)
    front.door.valve.detach()
    front.connect("10.0.0.2")
    assert port.reading and port.stops == 0
