"""The service's local socket: a real UNIX socket in a temporary state directory, and sessions
on memory transports with a Clock for what depends on time. Tests wait on events (a handler
called, a connection closed), never on sleeps."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet import defer, protocol, threads
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.cli import viaservice
from agentcall.listener.localsocket import EventSink, LocalSession, LocalSocketService
from agentcall.local import runpeer, servicekey, unixsocket
from agentcall.local.unixsocket import PeerCredentials
from agentcall.wire import codec, local
from agentcall.wire.local import (
    FROM_SERVICE,
    EndKind,
    LocalCall,
    LocalEnded,
    LocalNote,
    LocalStatus,
)
from tests.unit.agent_helpers import reactor, twisted_test

CALL_ID = "1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b"
REQUEST = LocalCall(target="ken", message="why is CI red?")
ANSWER = LocalEnded(EndKind.ANSWER, "@acme/ken", CALL_ID, text="because", task="ask")


class Handler:
    """Records each call it is handed; the test decides when and how each one ends."""

    def __init__(self) -> None:
        self.calls: list[tuple[LocalCall, EventSink, defer.Deferred[LocalEnded]]] = []
        self.started: defer.Deferred[None] = defer.Deferred()
        self.cancelled: defer.Deferred[None] = defer.Deferred()

    def __call__(self, request: LocalCall, send: EventSink) -> defer.Deferred[LocalEnded]:
        def cancel(_d: defer.Deferred[LocalEnded]) -> None:
            if not self.cancelled.called:
                self.cancelled.callback(None)

        call: defer.Deferred[LocalEnded] = defer.Deferred(cancel)
        self.calls.append((request, send, call))
        if not self.started.called:
            self.started.callback(None)
        return call


class Client(protocol.Protocol):
    """The CLI's side as a Twisted protocol: collects lines, fires ``closed`` at the end."""

    def __init__(self) -> None:
        self.data = b""
        self.closed: defer.Deferred[None] = defer.Deferred()
        self.lines: defer.Deferred[None] = defer.Deferred()  # fires at the first line

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        if b"\n" in self.data and not self.lines.called:
            self.lines.callback(None)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.closed.callback(None)

    def events(self) -> list[object]:
        return [
            local.decode_line(line, FROM_SERVICE, max_bytes=limits.MAX_LOCAL_EVENT_BYTES)
            for line in self.data.splitlines()
        ]


def connect(path: Path, *, key: str | None = None) -> Client:
    """Connect with the standard library (a long path needs the /proc alias at connect time),
    then hand the descriptor to the reactor; the first line is the service key (the one the
    service wrote beside its socket, unless ``key`` is given)."""
    if key is None:
        key = path.with_name("service.key").read_text().strip()
    sock = unixsocket.connect(path, timeout_s=5)
    sock.sendall(local.encode_key_line(key))
    sock.setblocking(False)
    client = Client()
    factory = protocol.Factory.forProtocol(lambda: client)
    try:
        reactor.adoptStreamConnection(sock.fileno(), socket.AF_UNIX, factory)
    finally:
        sock.close()
    return client


def long_state_dir(base: Path) -> Path:
    """A 0700 state directory whose socket path is longer than sun_path allows."""
    state = base
    while len(os.fsencode(state / "service.sock")) <= unixsocket.MAX_SOCKET_PATH_BYTES + 20:
        state = state / ("d" * 40)
    state.mkdir(parents=True, mode=0o700)
    return state


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return long_state_dir(tmp_path)


@pytest.fixture
def served(state_dir: Path) -> Iterator[tuple[LocalSocketService, Handler]]:
    handler = Handler()
    server = LocalSocketService(reactor, state_dir / "service.sock", handler)
    server.startService()
    assert server.listening
    yield server, handler
    server.stopService()


def send_line(client: Client, value: object) -> None:
    assert client.transport is not None
    client.transport.write(codec.encode(value) + b"\n")


# --- over a real socket -------------------------------------------------------------------------


@twisted_test
async def test_a_call_streams_its_events_then_ends(
    served: tuple[LocalSocketService, Handler],
) -> None:
    """Status and note lines as they come, then the ended line, then the service closes; the
    socket's path is longer than a socket address allows, and the file is 0600."""
    server, handler = served
    assert len(os.fsencode(server.path)) > unixsocket.MAX_SOCKET_PATH_BYTES
    assert stat.S_IMODE(os.lstat(server.path).st_mode) == 0o600
    assert stat.S_ISSOCK(os.lstat(server.path).st_mode)
    client = connect(server.path)
    send_line(client, REQUEST)
    await handler.started
    request, send, call = handler.calls[0]
    assert request == REQUEST
    send(LocalStatus("ringing", CALL_ID))
    send(LocalNote("careful"))
    call.callback(ANSWER)
    await client.closed
    assert client.events() == [LocalStatus("ringing", CALL_ID), LocalNote("careful"), ANSWER]


@twisted_test
async def test_the_thin_client_follows_a_call_to_its_end(
    served: tuple[LocalSocketService, Handler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """agentcall.cli.viaservice against the real server: callbacks, then the outcome."""
    server, handler = served
    monkeypatch.setenv("AGENTCALL_HOME", str(server.path.parent))
    seen: list[object] = []
    done = threads.deferToThread(
        viaservice.call,
        REQUEST,
        lambda state, _elapsed: seen.append(state),
        seen.append,
    )
    await handler.started
    _request, send, call = handler.calls[0]
    send(LocalStatus("answered", CALL_ID))
    send(LocalNote("careful"))
    call.callback(ANSWER)
    assert await done == ANSWER
    assert seen == ["answered", "careful"]


@twisted_test
async def test_a_service_stopping_mid_call_is_a_clear_error_for_the_client(
    served: tuple[LocalSocketService, Handler], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, handler = served
    monkeypatch.setenv("AGENTCALL_HOME", str(server.path.parent))
    done = threads.deferToThread(viaservice.call, REQUEST, lambda *_: None, lambda _: None)
    await handler.started
    await server.stopService()
    with pytest.raises(viaservice.ServiceTrouble) as caught:
        await done
    assert caught.value.code == "service_stopped"
    assert "the local AgentCall service stopped during the call" in str(caught.value)
    await handler.cancelled  # its call was hung up too
    assert not server.path.exists()


def test_no_socket_or_a_stale_one_means_no_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No file, then a socket file nothing listens on: the CLI dials directly (None)."""
    state = long_state_dir(tmp_path)
    monkeypatch.setenv("AGENTCALL_HOME", str(state))
    assert viaservice.call(REQUEST, lambda *_: None, lambda _: None) is None
    sock, _identity = unixsocket.bind_listening(state / "service.sock")
    sock.close()  # as a killed service leaves it
    assert (state / "service.sock").exists()
    assert viaservice.call(REQUEST, lambda *_: None, lambda _: None) is None


@twisted_test
async def test_a_client_that_hangs_up_cancels_its_call(
    served: tuple[LocalSocketService, Handler],
) -> None:
    server, handler = served
    client = connect(server.path)
    send_line(client, REQUEST)
    await handler.started
    assert client.transport is not None
    client.transport.loseConnection()
    await handler.cancelled
    await client.closed
    assert server.sessions == set()


@twisted_test
async def test_a_malformed_request_is_refused_in_one_line(
    served: tuple[LocalSocketService, Handler],
) -> None:
    server, handler = served
    client = connect(server.path)
    assert client.transport is not None
    client.transport.write(b'{"type": "call", "target": 5}\n')
    await client.closed
    [refusal] = client.events()
    assert isinstance(refusal, LocalEnded)
    assert (refusal.kind, refusal.code) == (EndKind.REFUSED, "bad_request")
    assert handler.calls == []


@twisted_test
async def test_one_request_per_connection(served: tuple[LocalSocketService, Handler]) -> None:
    """Lines after the request are ignored: they never start a second call."""
    server, handler = served
    client = connect(server.path)
    assert client.transport is not None
    client.transport.write((codec.encode(REQUEST) + b"\n") * 3)
    await handler.started
    handler.calls[0][2].callback(ANSWER)
    await client.closed
    assert len(handler.calls) == 1
    assert client.events() == [ANSWER]


@twisted_test
async def test_another_user_is_dropped_before_a_byte_is_read(state_dir: Path) -> None:
    """With the credential reader saying the peer is someone else, nothing is served."""
    handler = Handler()
    other = PeerCredentials(pid=1, uid=os.getuid() + 1, gid=0)
    server = LocalSocketService(
        reactor, state_dir / "service.sock", handler, read_peer=lambda _sock: other
    )
    server.startService()
    try:
        client = connect(server.path)
        send_line(client, REQUEST)
        await client.closed
        assert client.data == b""
        assert handler.calls == []
    finally:
        await server.stopService()


@twisted_test
async def test_a_stale_file_does_not_stop_a_start(state_dir: Path) -> None:
    """A socket file left by a killed service (nothing listening) is replaced."""
    path = state_dir / "service.sock"
    stale, _identity = unixsocket.bind_listening(path)
    stale.close()
    handler = Handler()
    server = LocalSocketService(reactor, path, handler)
    server.startService()
    try:
        assert server.listening
        client = connect(path)
        send_line(client, REQUEST)
        await handler.started
        handler.calls[0][2].callback(ANSWER)
        await client.closed
        assert client.events() == [ANSWER]
    finally:
        await server.stopService()
    assert not path.exists()


@twisted_test
async def test_stopping_an_older_service_leaves_the_newer_ones_socket(state_dir: Path) -> None:
    path = state_dir / "service.sock"
    older = LocalSocketService(reactor, path, Handler())
    older.startService()
    newer_handler = Handler()
    newer = LocalSocketService(reactor, path, newer_handler)
    newer.startService()
    await older.stopService()
    try:
        assert path.exists()
        client = connect(path)
        send_line(client, REQUEST)
        await newer_handler.started
        newer_handler.calls[0][2].callback(ANSWER)
        await client.closed
    finally:
        await newer.stopService()
    assert not path.exists()


def test_an_unusable_directory_leaves_the_socket_out(tmp_path: Path) -> None:
    """The listener still starts; thin clients then dial directly."""
    server = LocalSocketService(reactor, tmp_path / "missing" / "service.sock", Handler())
    server.startService()
    assert not server.listening
    server.stopService()


# --- sessions on a memory transport ------------------------------------------------------------


class MemoryTransport(StringTransport):
    aborted = False

    def getHandle(self) -> None:
        return None

    def abortConnection(self) -> None:
        self.aborted = True
        self.loseConnection()


KEY = "ab" * 32
RUN_PID = 4242


def session(
    uid: int | None = None, peer_error: bool = False, *, pid: int = 42, with_key: bool = True
) -> tuple[LocalSession, MemoryTransport, Handler, Clock, LocalSocketService]:
    handler = Handler()
    clock = Clock()

    def read_peer(_sock: Any) -> PeerCredentials:
        if peer_error:
            raise OSError("no SO_PEERCRED here")
        return PeerCredentials(pid=pid, uid=os.getuid() if uid is None else uid, gid=0)

    server = LocalSocketService(
        reactor,
        Path("/unused"),
        handler,
        read_peer=read_peer,
        clock=clock,
        is_run_peer=lambda pid, _leaders: pid == RUN_PID,
    )
    server.key = KEY
    proto = LocalSession(server)
    transport = MemoryTransport()
    proto.makeConnection(transport)
    if with_key:
        proto.dataReceived(local.encode_key_line(KEY))
    return proto, transport, handler, clock, server


@pytest.mark.parametrize(
    ("uid", "peer_error"),
    [(os.getuid() + 1, False), (0 if os.getuid() else 1, False), (None, True)],
)
def test_the_peer_must_be_this_user(uid: int | None, peer_error: bool) -> None:
    proto, transport, handler, _clock, server = session(uid, peer_error)
    assert transport.aborted
    proto.dataReceived(codec.encode(REQUEST) + b"\n")
    assert handler.calls == [] and server.sessions == set()
    assert transport.value() == b""


def test_a_client_that_never_sends_is_dropped() -> None:
    proto, transport, handler, clock, _server = session()
    proto.dataReceived(b'{"type": "call"')  # half a request, then nothing
    clock.advance(limits.LOCAL_REQUEST_TIMEOUT_S - 0.1)
    assert not transport.aborted
    clock.advance(0.2)
    assert transport.aborted and handler.calls == []


def test_a_request_in_time_stops_the_timer() -> None:
    proto, transport, handler, clock, _server = session()
    proto.dataReceived(codec.encode(REQUEST) + b"\n")
    clock.advance(limits.LOCAL_REQUEST_TIMEOUT_S * 2)
    assert not transport.aborted and len(handler.calls) == 1


def test_an_oversize_request_is_refused_without_reading_on() -> None:
    proto, transport, handler, _clock, _server = session()
    chunk = b"x" * 65536
    sent = 0
    while sent <= limits.MAX_LOCAL_REQUEST_BYTES:
        proto.dataReceived(chunk)
        sent += len(chunk)
    [line] = transport.value().splitlines()
    refusal = local.decode_line(line, FROM_SERVICE, max_bytes=limits.MAX_LOCAL_EVENT_BYTES)
    assert isinstance(refusal, LocalEnded) and refusal.code == "bad_request"
    assert transport.disconnecting and handler.calls == []


def test_a_handler_that_breaks_is_a_local_error_not_a_hang() -> None:
    proto, transport, handler, _clock, _server = session()
    proto.dataReceived(codec.encode(REQUEST) + b"\n")
    handler.calls[0][2].errback(RuntimeError("boom"))
    [line] = transport.value().splitlines()
    refusal = local.decode_line(line, FROM_SERVICE, max_bytes=limits.MAX_LOCAL_EVENT_BYTES)
    assert isinstance(refusal, LocalEnded) and refusal.code == "local_error"
    assert "boom" not in line.decode()
    assert transport.disconnecting


def test_too_many_clients_are_turned_away() -> None:
    _proto, _transport, _handler, _clock, server = session()
    for _ in range(limits.LOCAL_MAX_CLIENTS - 1):
        LocalSession(server).makeConnection(MemoryTransport())
    extra = MemoryTransport()
    LocalSession(server).makeConnection(extra)
    assert extra.aborted and len(server.sessions) == limits.LOCAL_MAX_CLIENTS


# --- who may act as the owner: the service key and the run check ----------------------------


def _refusal(transport: MemoryTransport) -> LocalEnded:
    [line] = transport.value().splitlines()
    refusal = local.decode_line(line, FROM_SERVICE, max_bytes=limits.MAX_LOCAL_EVENT_BYTES)
    assert isinstance(refusal, LocalEnded)
    return refusal


@pytest.mark.parametrize(
    "first",
    [
        local.encode_key_line("ef" * 32),  # another key
        local.encode_key_line(KEY[:-2] + "AB"),  # upper-case digits are not the key's form
        b"key " + KEY.encode()[:-1] + b"\n",  # one digit short
        b"key  " + KEY.encode() + b"\n",  # two spaces
        b"KEY " + KEY.encode() + b"\n",
        codec.encode(REQUEST) + b"\n",  # no key line at all: the request comes first
        b"\n",
    ],
)
def test_a_client_without_the_key_is_refused_before_its_request_is_read(first: bytes) -> None:
    proto, transport, handler, _clock, server = session(with_key=False)
    proto.dataReceived(first + codec.encode(REQUEST) + b"\n")
    refusal = _refusal(transport)
    assert refusal.code == "unauthorised"
    assert KEY not in transport.value().decode()
    assert transport.disconnecting and handler.calls == []
    # Whatever follows on the same connection is not read either.
    proto.dataReceived(local.encode_key_line(KEY) + codec.encode(REQUEST) + b"\n")
    assert handler.calls == [] and len(transport.value().splitlines()) == 1
    assert server.key == KEY


def test_a_service_with_no_key_yet_admits_nobody() -> None:
    proto, transport, handler, _clock, server = session(with_key=False)
    server.key = None
    proto.dataReceived(local.encode_key_line(KEY) + codec.encode(REQUEST) + b"\n")
    assert _refusal(transport).code == "unauthorised" and handler.calls == []


def test_the_key_and_the_request_may_arrive_in_any_pieces() -> None:
    proto, transport, handler, _clock, _server = session(with_key=False)
    data = local.encode_key_line(KEY) + codec.encode(REQUEST) + b"\n"
    for index in range(len(data)):
        proto.dataReceived(data[index : index + 1])
    assert [request for request, _send, _d in handler.calls] == [REQUEST]
    assert not transport.disconnecting


def test_an_endless_key_line_is_refused_without_waiting_for_its_end() -> None:
    proto, transport, handler, _clock, _server = session(with_key=False)
    proto.dataReceived(b"key " + b"a" * (local.KEY_LINE_BYTES + 1))
    assert _refusal(transport).code == "unauthorised" and handler.calls == []


def test_a_client_from_an_answering_agents_run_is_refused_even_with_the_key() -> None:
    proto, transport, handler, _clock, server = session(pid=RUN_PID, with_key=False)
    assert transport.disconnecting and server.sessions == set()
    refusal = _refusal(transport)
    assert refusal.code == "unauthorised" and "answering agent's run" in (refusal.message or "")
    proto.dataReceived(local.encode_key_line(KEY) + codec.encode(REQUEST) + b"\n")
    assert handler.calls == [] and len(transport.value().splitlines()) == 1


def test_the_run_check_is_given_the_runs_going_now() -> None:
    seen: list[tuple[int, frozenset[int]]] = []

    def check(pid: int, leaders: Callable[[], Collection[int]]) -> bool:
        seen.append((pid, frozenset(leaders())))
        return False

    server = LocalSocketService(
        reactor,
        Path("/unused"),
        Handler(),
        read_peer=lambda _sock: PeerCredentials(pid=7, uid=os.getuid(), gid=0),
        clock=Clock(),
        run_leaders=lambda: frozenset({11, 12}),
        is_run_peer=check,
    )
    LocalSession(server).makeConnection(MemoryTransport())
    assert seen == [(7, frozenset({11, 12}))]


def test_each_start_writes_a_new_private_key(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    keys = []
    for _ in range(2):
        server = LocalSocketService(reactor, state / "service.sock", Handler())
        server.startService()
        try:
            key_file = state / "service.key"
            assert stat.S_IMODE(os.lstat(key_file).st_mode) == 0o600
            assert key_file.read_text() == f"{server.key}\n"
            assert servicekey.is_key(server.key or "")
            keys.append(server.key)
        finally:
            server.stopService()
    assert keys[0] != keys[1]


@pytest.fixture
def short_served() -> Iterator[tuple[LocalSocketService, Handler]]:
    """A service whose socket path a child process can dial as it is. Its run check is the
    real one, but for "a descendant of the service": here the service is this test's own
    process, which starts the clients."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ac-") as base:
        state = Path(base) / "s"
        state.mkdir(mode=0o700)
        handler = Handler()
        server = LocalSocketService(
            reactor,
            state / "service.sock",
            handler,
            is_run_peer=lambda pid, leaders: runpeer.belongs_to_run(
                pid, run_leaders=leaders, service_pid=0
            ),
        )
        server.startService()
        try:
            yield server, handler
        finally:
            server.stopService()


@twisted_test
async def test_a_process_carrying_a_run_marker_is_refused_over_the_real_socket(
    short_served: tuple[LocalSocketService, Handler],
) -> None:
    """The service's own check (no stand-in): a child process with a run's marker in its
    environment and the right key gets nothing; the same child without the marker is served."""
    server, handler = short_served
    script = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        "try:\n"
        "    s.sendall(sys.argv[2].encode() + b'\\n' + sys.argv[3].encode() + b'\\n')\n"
        "    sys.stdout.write(s.recv(65536).decode() or 'CLOSED')\n"
        "except OSError:\n"  # aborted before or while it wrote: reset, broken pipe
        "    sys.stdout.write('CLOSED')\n"
    )
    request = codec.encode(REQUEST).decode()
    key_line = local.encode_key_line(server.key or "").decode().strip()

    def attempt(marked: bool) -> str:
        import subprocess
        import sys

        env = {"PATH": os.environ.get("PATH", "")}
        if marked:
            env["AGENTCALL_RUN_ID"] = "0" * 32
        done = subprocess.run(
            [sys.executable, "-I", "-c", script, str(server.path), key_line, request],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.stdout + done.stderr

    refused = await threads.deferToThread(attempt, True)
    assert handler.calls == []
    # Told why (or, if it was still writing when the service closed, cut off).
    assert refused == "CLOSED" or ('"unauthorised"' in refused and "agent's run" in refused)
    served_client = threads.deferToThread(attempt, False)
    await handler.started
    handler.calls[0][2].callback(ANSWER)
    assert "because" in await served_client
