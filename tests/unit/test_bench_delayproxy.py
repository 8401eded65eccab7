"""bench/delayproxy.py: delays, order, the modelled TCP handshake, legs and round-trip counts.

Everything runs on a MemoryReactorClock with string transports: time is advanced by hand.
"""

from __future__ import annotations

import io
import json

from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport

from bench import delayproxy
from bench.delayproxy import DOWN, UP, DelayedPipe, EventLog, Flow, ProxyConfig, ProxyFactory

D = 0.025
HEAD_KEN = b"GET /v1/ws?role=listen HTTP/1.1\r\nHost: x\r\nX-AgentCall-Handle: ken\r\n\r\n"
HEAD_ANN = b"GET /v1/keys/ken HTTP/1.1\r\nx-agentcall-handle:ann\r\n\r\n"


def test_flow_counts_runs_of_one_direction() -> None:
    flow = Flow()
    starts = [flow.note(d, n) for d, n in [(UP, 5), (UP, 3), (DOWN, 9), (UP, 1), (DOWN, 2)]]
    assert starts == [True, False, True, True, True]
    assert (flow.bursts, flow.up_bytes, flow.down_bytes) == (4, 9, 11)


def test_pipe_delays_each_chunk_and_keeps_order() -> None:
    clock = MemoryReactorClock()
    out: list[bytes] = []
    drained: list[bool] = []
    pipe = DelayedPipe(clock, out.append, lambda: drained.append(True))
    pipe.push(b"a", D)
    clock.advance(0.010)
    pipe.push(b"b", D)
    pipe.push(b"c", 0.0)  # a shorter delay never overtakes what is queued
    clock.advance(D - 0.010 - 0.001)
    assert out == []
    clock.advance(0.001)
    assert out == [b"a"]
    clock.advance(0.010)
    assert out == [b"a", b"b", b"c"]
    pipe.close_after_queue()
    assert drained == [True]


def test_pipe_close_waits_for_the_queue() -> None:
    clock = MemoryReactorClock()
    out: list[bytes] = []
    drained: list[bool] = []
    pipe = DelayedPipe(clock, out.append, lambda: drained.append(True))
    pipe.push(b"x", D)
    pipe.close_after_queue()
    assert drained == []
    clock.advance(D)
    assert out == [b"x"] and drained == [True]


def test_leg_of_head_reads_the_handle_header() -> None:
    legs = {"ken": "listener"}
    assert delayproxy.leg_of_head(HEAD_KEN, legs, "caller") == "listener"
    assert delayproxy.leg_of_head(HEAD_ANN, legs, "caller") == "caller"
    assert delayproxy.leg_of_head(b"GET / HTTP/1.1\r\n\r\n", legs, "other") == "other"


def _proxy(
    handshake: bool = True,
) -> tuple[MemoryReactorClock, ProxyFactory, io.StringIO]:
    reactor = MemoryReactorClock()
    out = io.StringIO()
    config = ProxyConfig(
        target_host="127.0.0.1",
        target_port=9,
        delay_ms={"listener": D * 1000, "caller": 2 * D * 1000},
        legs={"ken": "listener"},
        tcp_handshake=handshake,
    )
    return reactor, ProxyFactory(reactor, config, EventLog(out), now=reactor.seconds), out


def _connect(
    reactor: MemoryReactorClock, factory: ProxyFactory
) -> tuple[delayproxy.ProxyConnection, StringTransport, StringTransport]:
    conn = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5000))
    client = StringTransport()
    conn.makeConnection(client)
    host, port, up_factory, _timeout, _bind = reactor.tcpClients[-1]
    assert (host, port) == ("127.0.0.1", 9)
    upstream = up_factory.buildProtocol(None)
    assert upstream is not None
    target = StringTransport()
    upstream.makeConnection(target)
    return conn, client, target


def test_a_request_and_its_answer_through_the_proxy() -> None:
    reactor, factory, out = _proxy()
    conn, client, target = _connect(reactor, factory)
    conn.dataReceived(HEAD_KEN[:10])  # the head in two chunks: one burst
    conn.dataReceived(HEAD_KEN[10:])
    # held for the modelled handshake (2 D), then delayed D
    reactor.advance(3 * D - 0.001)
    assert target.value() == b""
    reactor.advance(0.001)
    assert target.value() == HEAD_KEN
    conn._upstream.dataReceived(b"HTTP/1.1 101\r\n\r\n")  # type: ignore[union-attr]
    reactor.advance(D)
    assert client.value() == b"HTTP/1.1 101\r\n\r\n"
    conn.dataReceived(b"frame")
    reactor.advance(D)
    assert target.value() == HEAD_KEN + b"frame"
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    counts = delayproxy.summarize(events, 0.0, reactor.seconds())
    assert set(counts) == {"listener"}
    leg = counts["listener"]
    assert (leg.handshakes, leg.bursts, leg.round_trips) == (1, 3, 2.5)


def test_legs_have_their_own_delay_and_windows_select_events() -> None:
    reactor, factory, out = _proxy(handshake=False)
    ann, _ann_client, ann_target = _connect(reactor, factory)
    ann.dataReceived(HEAD_ANN)
    reactor.advance(D)
    assert ann_target.value() == b""  # the caller leg is 2 D here
    reactor.advance(D)
    assert ann_target.value() == HEAD_ANN
    middle = reactor.seconds()
    ken, ken_client, _ken_target = _connect(reactor, factory)
    ken.dataReceived(HEAD_KEN)
    ken._upstream.dataReceived(b"ok")  # type: ignore[union-attr]
    reactor.advance(D)
    assert ken_client.value() == b"ok"
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    late = delayproxy.summarize(events, middle, reactor.seconds())
    assert set(late) == {"listener"}
    assert (late["listener"].handshakes, late["listener"].bursts) == (0, 2)
    everything = delayproxy.summarize(events, 0.0, reactor.seconds())
    assert everything["caller"].bursts == 1


def test_the_far_side_is_closed_after_the_queued_bytes() -> None:
    reactor, factory, out = _proxy(handshake=False)
    conn, _client, target = _connect(reactor, factory)
    conn.dataReceived(HEAD_KEN)
    conn.connectionLost(None)
    assert not target.disconnecting
    reactor.advance(D)
    assert target.value() == HEAD_KEN and target.disconnecting
    assert conn._upstream is not None
    conn._upstream.connectionLost(None)
    closes = [e for e in map(json.loads, out.getvalue().splitlines()) if e["ev"] == "close"]
    assert len(closes) == 1 and closes[0]["up"] == len(HEAD_KEN)
    assert not factory.open_connections
