"""The service's private local socket: thin ``agentcall call`` processes hand their calls here,
and thin ``agentcall jobs`` processes their jobs commands.

A UNIX socket in the 0700 state directory, mode 0600
(:attr:`~agentcall.local.home.Home.service_socket_path`), bound when the service starts and
removed when it stops; a stale file left by a killed service is replaced at the next start
(:func:`agentcall.local.unixsocket.bind_listening`). Every connection's peer must be this user
(``SO_PEERCRED``): anyone else is dropped before a byte is read.

This user is not enough: the answering agent runs as this user too, and whoever gets through
here places calls and reads answers *as the owner*. So two more checks stand before a request
is read. The peer must not belong to an answering agent's run (:mod:`agentcall.local.runpeer`:
its marker, its session, its parent chain); and the connection must open with the service key
(:mod:`agentcall.local.servicekey`), a secret the service writes into the state directory at
each start, which no run may read. The key is compared in constant time; a wrong or missing
key ends the connection with an ``unauthorised`` refusal, and nothing the client wrote after
it is parsed.

One connection carries one request (:mod:`agentcall.wire.local`), dispatched by its type to
the call handler or the jobs handler (:class:`Handlers`). For a call: a request line within
:data:`~agentcall.limits.LOCAL_REQUEST_TIMEOUT_S` and
:data:`~agentcall.limits.MAX_LOCAL_REQUEST_BYTES`, strictly decoded; then status and note
lines as the call goes on and one ``ended`` line, and the service closes. A malformed request
gets an ``ended`` refusal (``bad_request``). The client closing early cancels the call (the
call's Deferred is cancelled, which hangs up at the relay). Stopping the service closes every
connection, so a waiting client learns it at once.

A jobs request goes the same way: progress lines, one ``jobs_ended`` line; the client closing
early cancels the work (a long poll at the relay is abandoned).

What placing a call and running a jobs command mean is passed in (:data:`CallHandler`,
:data:`JobsHandler`), so this module knows nothing of the caller's side;
:mod:`agentcall.compose.listen` supplies them.
"""

from __future__ import annotations

import hmac
import os
import socket
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import attrs
from twisted.application import service
from twisted.internet import defer, protocol, tcp, unix
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.errors import MalformedFrame
from agentcall.local import runpeer, servicekey, unixsocket
from agentcall.local.unixsocket import PeerCredentials
from agentcall.logevents import Logger
from agentcall.wire import codec, local
from agentcall.wire.local import (
    TO_SERVICE,
    EndKind,
    FromService,
    LocalCall,
    LocalEnded,
    LocalJobs,
    LocalJobsEnded,
)

_log = Logger(namespace="agentcall.listener.local")

EventSink = Callable[[FromService], None]
# Place one call for a thin client: events go to the sink as they happen; the Deferred fires
# with how the call ended. Cancelling it hangs the call up.
CallHandler = Callable[[LocalCall, EventSink], "defer.Deferred[LocalEnded]"]
# Run one ``agentcall jobs`` command: progress lines to the sink; the Deferred fires with what
# it prints. Cancelling it stops the work (a long poll at the relay is abandoned).
JobsHandler = Callable[[LocalJobs, EventSink], "defer.Deferred[LocalJobsEnded]"]
PeerReader = Callable[[socket.socket], PeerCredentials]
# Whether a peer's pid belongs to an answering agent's run, given the runs' leaders now.
RunPeerCheck = Callable[[int, Callable[[], Collection[int]]], bool]


RUN_PEER_REFUSAL = (
    "the local AgentCall service does not act for a process of an answering agent's run "
    "(one carrying its variables, in its session, or started by it)"
)


def _belongs_to_run(pid: int, run_leaders: Callable[[], Collection[int]]) -> bool:
    return runpeer.belongs_to_run(pid, run_leaders=run_leaders)


@attrs.frozen
class Handlers:
    """What the service does for each kind of request: a call, and (if given) a jobs command."""

    call: CallHandler
    jobs: JobsHandler | None = None


class _Port(unix.Port):
    """An adopted listening socket (bound and renamed into place by
    :func:`~agentcall.local.unixsocket.bind_listening`) whose file this module removes itself,
    only while it is still ours (a newer service may have replaced it); never Twisted on close.
    """

    @classmethod
    def adopt(cls, reactor: Any, sock: socket.socket, path: Path, factory: Any) -> _Port:
        port: _Port = cls._fromListeningDescriptor(reactor, sock.fileno(), factory)
        # startListening chmods the bound path to ``mode``: the file's real name (the adopted
        # socket was bound under a temporary one), and 0600 as it already is, never 0666.
        port._bindPath = os.fsencode(path)
        port.mode = 0o600
        return port

    def connectionLost(self, reason: Failure) -> None:
        tcp.Port.connectionLost(self, reason)


class LocalSession(protocol.Protocol):
    """One client connection: its peer checked, one request read, one call followed."""

    def __init__(self, server: LocalSocketService) -> None:
        self._server = server
        self._buffer = b""
        self._key_seen = False
        self._request_seen = False
        self._call: defer.Deferred[Any] | None = None
        self._jobs = False  # the request is a jobs command, not a call
        self._command: str | None = None  # that command: list, get or cancel
        self._timer: Any = None
        self._open = False

    @property
    def _transport(self) -> Any:
        # A UNIX stream transport: ITCPTransport's abortConnection and getHandle.
        return self.transport

    def connectionMade(self) -> None:
        server = self._server
        try:
            peer = server.read_peer(self._transport.getHandle())
        except OSError:
            peer = None
        if peer is None or peer.uid != server.uid:
            _log.warn("local_client_refused", uid=None if peer is None else peer.uid)
            self._transport.abortConnection()
            return
        if server.is_run_peer(peer.pid, server.run_leaders):
            # The answering agent (or something it started) acting as the owner.
            _log.warn("local_client_refused", pid=peer.pid, reason="an answering agent's run")
            # Said, not just dropped: a person wrongly taken for a run learns why.
            refusal = LocalEnded.refused("unauthorised", RUN_PEER_REFUSAL)
            self._transport.write(codec.encode(refusal) + b"\n")
            self._transport.loseConnection()
            return
        if len(server.sessions) >= limits.LOCAL_MAX_CLIENTS:
            _log.warn("local_client_refused", reason="too many connections")
            self._transport.abortConnection()
            return
        self._open = True
        server.sessions.add(self)
        self._timer = server.clock.callLater(limits.LOCAL_REQUEST_TIMEOUT_S, self._too_slow)

    def _too_slow(self) -> None:
        self._timer = None
        _log.info("local_client_dropped", reason="no request in time")
        self._transport.abortConnection()

    def dataReceived(self, data: bytes) -> None:
        if not self._open or self._request_seen:
            return  # one request per connection; anything after it is ignored
        self._buffer += data
        if not self._key_seen:
            key_line, newline, rest = self._buffer.partition(b"\n")
            if not newline:
                if len(self._buffer) > local.KEY_LINE_BYTES:
                    self._unauthorised()
                return
            if not self._key_matches(key_line):
                self._unauthorised()
                return
            self._key_seen, self._buffer = True, rest
        line, newline, _rest = self._buffer.partition(b"\n")
        if not newline:
            if len(self._buffer) > limits.MAX_LOCAL_REQUEST_BYTES:
                self._refuse("the request is larger than a call can hold")
            return
        self._request_seen = True
        self._buffer = b""
        self._cancel_timer()
        try:
            request = local.decode_line(line, TO_SERVICE, max_bytes=limits.MAX_LOCAL_REQUEST_BYTES)
        except MalformedFrame as exc:
            self._refuse(f"the request is malformed: {exc}")
            return
        if not isinstance(request, LocalCall | LocalJobs):
            self._refuse("the request is not a call or a jobs command")
            return
        self._start(request)

    def _key_matches(self, line: bytes) -> bool:
        expected = self._server.key
        try:
            shown = local.key_from_line(line)
        except MalformedFrame:
            return False
        return expected is not None and hmac.compare_digest(shown, expected.encode("ascii"))

    def _unauthorised(self) -> None:
        self._request_seen = True
        self._buffer = b""
        self._cancel_timer()
        _log.warn("local_client_refused", reason="no service key")
        self._send(
            LocalEnded.refused(
                "unauthorised",
                "the local AgentCall service did not accept this client's key "
                "(only the owner's own agentcall may use it; if you are the owner, "
                "`agentcall doctor` checks the service)",
            )
        )
        self._transport.loseConnection()

    def _refuse(self, why: str) -> None:
        self._request_seen = True
        self._buffer = b""
        self._cancel_timer()
        _log.info("local_request_refused", reason=why)
        self._send(LocalEnded.refused("bad_request", why))
        self._transport.loseConnection()

    def _start(self, request: LocalCall | LocalJobs) -> None:
        handlers = self._server.handlers
        try:
            if isinstance(request, LocalJobs):
                self._jobs, self._command = True, request.command
                if handlers.jobs is None:
                    self._refuse("this service does not run jobs commands")
                    return
                work: defer.Deferred[Any] = handlers.jobs(request, self._send)
            else:
                work = handlers.call(request, self._send)
        except Exception:
            _log.failure(self._what("failed"))
            self._failed_locally()
            return
        self._call = work
        work.addCallbacks(self._ended, self._broke)

    def _what(self, outcome: str) -> str:
        """The log event for ``outcome`` of this session's request (one name per kind)."""
        names = {
            "failed": ("local_call_failed", "local_jobs_failed"),
            "hung_up": ("local_call_hung_up", "local_jobs_hung_up"),
        }
        return names[outcome][self._jobs]

    def _ended(self, ended: LocalEnded | LocalJobsEnded) -> None:
        self._call = None
        if not self._open:
            return  # hung up: logged as local_call_hung_up (or local_jobs_hung_up)
        if isinstance(ended, LocalJobsEnded):
            _log.info(
                "local_jobs_ended", command=self._command, code=ended.code, address=ended.address
            )
        else:
            _log.info(
                "local_call_ended",
                kind=str(ended.kind),
                call_id=ended.call_id,
                code=ended.code if ended.kind is not EndKind.ANSWER else None,
            )
        self._send(ended)
        self._transport.loseConnection()

    def _broke(self, failure: Failure) -> None:
        self._call = None
        if not self._open and failure.check(defer.CancelledError):
            return  # hung up: logged as local_call_hung_up (or local_jobs_hung_up)
        _log.failure(self._what("failed"), failure)
        self._failed_locally()

    def _failed_locally(self) -> None:
        doing = "running the jobs command" if self._jobs else "placing the call"
        self._send(
            LocalEnded.refused("local_error", f"the local AgentCall service failed while {doing}")
        )
        self._transport.loseConnection()

    def _send(self, event: FromService) -> None:
        if self._open:
            self._transport.write(codec.encode(event) + b"\n")

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        was_open, self._open = self._open, False
        self._cancel_timer()
        self._server.sessions.discard(self)
        call, self._call = self._call, None
        if was_open and call is not None:
            # The client hung up (Ctrl-C, SIGTERM, or it died), or the service is stopping:
            # the call hangs up too.
            _log.info(self._what("hung_up"))
            call.cancel()

    def close(self) -> None:
        """Stop serving this client (the service is stopping); its call is cancelled."""
        self._transport.loseConnection()


class _Factory(protocol.Factory):
    def __init__(self, server: LocalSocketService) -> None:
        self._server = server

    def buildProtocol(self, addr: Any) -> LocalSession:
        return LocalSession(self._server)


class LocalSocketService(service.Service):
    """Binds the local socket when started, removes it and closes every client when stopped.

    A socket that cannot be bound (an unusable directory, a path this system cannot reach) is
    logged and left out: the listener still answers calls, and thin clients dial directly.
    """

    def __init__(
        self,
        reactor: Any,
        path: Path,
        handler: CallHandler | Handlers,
        *,
        read_peer: PeerReader = unixsocket.peer_credentials,
        uid: int | None = None,
        clock: Any = None,
        key_path: Path | None = None,
        run_leaders: Callable[[], Collection[int]] = frozenset,
        is_run_peer: RunPeerCheck = _belongs_to_run,
    ) -> None:
        self.clock = reactor if clock is None else clock
        self._reactor = reactor
        self.path = path
        self.handlers = handler if isinstance(handler, Handlers) else Handlers(handler)
        self.read_peer = read_peer
        self.uid = os.getuid() if uid is None else uid
        self.key_path = path.with_name("service.key") if key_path is None else key_path
        self.key: str | None = None
        self.run_leaders = run_leaders
        self.is_run_peer = is_run_peer
        self.sessions: set[LocalSession] = set()
        self._port: _Port | None = None
        self._identity: tuple[int, int] | None = None

    @property
    def listening(self) -> bool:
        return self._port is not None

    def startService(self) -> None:
        super().startService()
        try:
            sock, identity = unixsocket.bind_listening(self.path)
        except OSError as exc:
            _log.warn("local_socket_unavailable", path=str(self.path), reason=str(exc))
            return
        try:
            # A fresh key at each start, written once the socket is ours: a start that fails
            # to bind leaves the running service's key alone. A client that read the old key
            # in the moment between is refused (`unauthorised`) and may simply call again.
            self.key = servicekey.make(self.key_path)
            sock.setblocking(False)
            port = _Port.adopt(self._reactor, sock, self.path, _Factory(self))
            port.startListening()
        except Exception as exc:
            unixsocket.remove_if_ours(self.path, identity)
            _log.warn("local_socket_unavailable", path=str(self.path), reason=str(exc))
            return
        finally:
            # The port holds its own duplicate of the descriptor.
            sock.close()
        self._port, self._identity = port, identity
        _log.info("local_socket_listening", path=str(self.path))

    def stopService(self) -> defer.Deferred[None]:
        super().stopService()
        port, self._port = self._port, None
        if self._identity is not None:
            unixsocket.remove_if_ours(self.path, self._identity)
            self._identity = None
        for session in list(self.sessions):
            session.close()
        if port is None:
            return defer.succeed(None)
        stopped: defer.Deferred[None] = defer.maybeDeferred(port.stopListening)
        return stopped
