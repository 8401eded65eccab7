"""Where the bridge places a call: the running service's socket, or directly."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
from twisted.internet import defer
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.a2a import placing
from agentcall.local import servicekey
from agentcall.local.home import Home
from agentcall.wire.local import (
    EndKind,
    LocalCall,
    LocalEnded,
    LocalNote,
    LocalStatus,
    decode_line,
    encode_key_line,
    encode_line,
)

CALL_ID = "5f0c3a5e-1b2c-4d3e-8f4a-0123456789ab"
REQUEST = LocalCall(target="@acme/ken", message="why?", queue=False)
KEY = "ab" * 32


def _home(tmp_path: Path, relay: str | None = None) -> Home:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    return Home(state_dir=state, user_home=tmp_path, relay_override=relay)


class Connected:
    """A ``_ServiceCall`` on a memory transport, with what it reported."""

    def __init__(self) -> None:
        self.states: list[str] = []
        self.done: defer.Deferred[LocalEnded] = defer.Deferred()
        self.ended: list[LocalEnded] = []
        self.done.addCallback(self.ended.append)
        self.protocol = placing._ServiceCall(REQUEST, self.states.append, self.done, KEY)
        self.transport = StringTransport()
        self.protocol.makeConnection(self.transport)

    def line(self, raw: bytes) -> None:
        self.protocol.dataReceived(raw + b"\n")


def test_the_key_then_the_request_go_out_as_two_lines() -> None:
    connected = Connected()
    sent = connected.transport.value()
    assert sent.startswith(encode_key_line(KEY))
    request = sent[len(encode_key_line(KEY)) :]
    assert request.endswith(b"\n") and request.count(b"\n") == 1
    assert decode_line(request[:-1], (LocalCall,), max_bytes=10**6) == REQUEST


def test_status_lines_then_the_end() -> None:
    connected = Connected()
    connected.line(encode_line(LocalStatus("ringing", CALL_ID)))
    connected.line(encode_line(LocalNote("a warning")))
    connected.line(encode_line(LocalStatus("working", CALL_ID)))
    ended = LocalEnded(EndKind.ANSWER, "@acme/ken", CALL_ID, text="hi")
    connected.line(encode_line(ended))
    assert connected.states == ["ringing", "working"]
    assert connected.ended == [ended]
    assert connected.transport.disconnecting
    # Whatever follows, or the close, changes nothing.
    connected.line(encode_line(LocalStatus("working", CALL_ID)))
    connected.protocol.connectionLost(Failure(ConnectionDone()))
    assert connected.ended == [ended] and connected.states == ["ringing", "working"]


def test_a_line_it_cannot_read_ends_the_call() -> None:
    connected = Connected()
    connected.line(b'{"type": "status", "state": "dancing"}')
    (ended,) = connected.ended
    assert ended.kind is EndKind.REFUSED and ended.code == "service_error"


def test_an_oversize_line_ends_the_call() -> None:
    connected = Connected()
    connected.protocol.dataReceived(b"x" * (limits.MAX_LOCAL_EVENT_BYTES + 10))
    (ended,) = connected.ended
    assert ended.code == "service_error"


def test_a_service_that_stops_mid_call_says_so() -> None:
    connected = Connected()
    connected.protocol.connectionLost(Failure(ConnectionDone()))
    (ended,) = connected.ended
    assert ended.code == "service_stopped"
    assert "stopped during the call" in str(ended.message)


def test_without_a_service_the_call_is_placed_directly(tmp_path: Path) -> None:
    """No socket: the direct path, which here finds no installation and says so."""
    placer = placing.CallPlacer(MemoryReactorClock(), _home(tmp_path))
    ended: list[LocalEnded] = []
    placer.place(REQUEST, lambda _s: None).addCallback(ended.append)
    (only,) = ended
    assert only.kind is EndKind.REFUSED and only.code == "not_set_up"


def _listening(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    return server


def test_a_running_service_is_handed_the_call(tmp_path: Path) -> None:
    home = _home(tmp_path)
    key = servicekey.make(home.service_key_path)
    reactor = MemoryReactorClock()
    with _listening(home.service_socket_path):
        states: list[str] = []
        done = placing.CallPlacer(reactor, home).place(REQUEST, states.append)
    ((_fd, family, factory),) = reactor.adoptedStreamConnections
    assert family == socket.AF_UNIX
    protocol: Any = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    assert transport.value().startswith(encode_key_line(key) + b'{"type":"call"')
    protocol.dataReceived(encode_line(LocalStatus("answered", CALL_ID)) + b"\n")
    assert states == ["answered"]
    # Cancelling hangs up: the connection is closed, which the service takes as a hang-up.
    done.addErrback(lambda f: f.trap(defer.CancelledError))
    done.cancel()
    assert transport.disconnecting


def test_without_a_readable_service_key_the_call_is_placed_directly(tmp_path: Path) -> None:
    """Like the CLI: a key this process cannot read (none, or not private) means the direct
    path, never a connection the service would refuse."""
    home = _home(tmp_path)
    reactor = MemoryReactorClock()
    with _listening(home.service_socket_path):
        placing.CallPlacer(reactor, home).place(REQUEST, lambda _s: None)
        servicekey.make(home.service_key_path)
        os.chmod(home.service_key_path, 0o644)
        placing.CallPlacer(reactor, home).place(REQUEST, lambda _s: None)
    assert reactor.adoptedStreamConnections == []


def test_a_relay_override_skips_the_service(tmp_path: Path) -> None:
    home = _home(tmp_path, relay="https://relay.example")
    reactor = MemoryReactorClock()
    with _listening(home.service_socket_path):
        ended: list[LocalEnded] = []
        placing.CallPlacer(reactor, home).place(REQUEST, lambda _s: None).addCallback(ended.append)
    assert reactor.adoptedStreamConnections == []
    assert ended[0].code == "not_set_up"


def test_a_stale_socket_file_means_no_service(tmp_path: Path) -> None:
    home = _home(tmp_path)
    reactor = MemoryReactorClock()
    server = _listening(home.service_socket_path)
    server.close()  # the file stays, nothing accepts
    ended: list[LocalEnded] = []
    placing.CallPlacer(reactor, home).place(REQUEST, lambda _s: None).addCallback(ended.append)
    assert reactor.adoptedStreamConnections == []
    assert ended[0].code == "not_set_up"


def test_a_socket_of_another_user_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peer must be this user: pretend to be someone else and the service is not used."""
    home = _home(tmp_path)
    reactor = MemoryReactorClock()
    # The key is readable (as it would be to that other user); the peer is what is wrong.
    monkeypatch.setattr(servicekey, "read", lambda _path: KEY)
    real_uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real_uid + 1)
    with _listening(home.service_socket_path):
        placing.CallPlacer(reactor, home).place(REQUEST, lambda _s: None)
    assert reactor.adoptedStreamConnections == []
