"""The thin path of ``agentcall call`` and ``agentcall jobs``: hand them to the running
listener service.

The service listens on a private UNIX socket in the state directory
(:attr:`agentcall.local.home.Home.service_socket_path`, served by
:mod:`agentcall.listener.localsocket`); the lines it speaks are :mod:`agentcall.wire.local`.
Nothing here imports Twisted, autobahn or any crypto, nor attrs, cattrs or the relay's frames
(tests/unit/test_cli_call_thin.py holds it to that): the service holds the keys, the relay
connection and the conversations, and this process only renders what comes back.

:func:`call` (and :func:`jobs`) return None when no service is there to take the call (no
socket file, a stale one left by a killed service, a socket that refuses, one owned by another
user), and when ``AGENTCALL_RELAY`` names a relay for this run: the CLI then dials the relay
itself. The same goes for a service key (:mod:`agentcall.local.servicekey`) this process
cannot read: only the owner's own processes may act as the owner through the service, and an
answering agent's run is denied the state directory. Once the request is handed over, the
service owns it: if it stops before saying how it ended, :class:`ServiceTrouble` says so in
one line (the call is not placed a second time).
Ctrl-C or SIGTERM here closes the connection, which hangs up: the service cancels the call.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from types import FrameType

from agentcall import limits
from agentcall.errors import MalformedFrame
from agentcall.local import servicekey, unixsocket
from agentcall.local.home import Home, LocalStateError
from agentcall.wire.local import (
    FROM_SERVICE,
    FROM_SERVICE_JOBS,
    LocalCall,
    LocalEnded,
    LocalJobs,
    LocalJobsEnded,
    LocalNote,
    LocalProgress,
    LocalStatus,
    ToService,
    decode_line,
    encode_key_line,
    encode_line,
)

# typing is imported for the type checker only: the thin `agentcall call` imports this module,
# and typing costs that process milliseconds (tests/unit/test_cli_call_thin.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

StateSink = Callable[[str, float], None]
NoteSink = Callable[[str], None]

STOPPED_MESSAGE = (
    "the local AgentCall service stopped during the call (it may have reached the agent); "
    "check `agentcall doctor`, then call again"
)
JOBS_STOPPED_MESSAGE = (
    "the local AgentCall service stopped before it said how the request ended; "
    "check `agentcall doctor`, then try again"
)


class ServiceTrouble(Exception):
    """The service took the call but did not say how it ended; one line for the person."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def connect(home: Home) -> socket.socket | None:
    """A connection to this user's running service, or None when there is none to use."""
    path = home.service_socket_path
    try:
        sock = unixsocket.connect(path, timeout_s=limits.LOCAL_CONNECT_TIMEOUT_S)
    except OSError:
        # No file, a stale file nothing listens on, a path this system cannot reach.
        return None
    try:
        peer = unixsocket.peer_credentials(sock)
    except OSError:
        sock.close()
        return None
    if peer.uid != os.getuid():
        sock.close()
        return None
    return sock


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends the wait like Ctrl-C (KeyboardInterrupt), so the connection is closed."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread (a test harness): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def call(request: LocalCall, on_state: StateSink, on_note: NoteSink) -> LocalEnded | None:
    """Place ``request`` through the running service; None when there is no service to use."""
    start = time.monotonic()

    def on_event(event: object) -> None:
        if isinstance(event, LocalStatus):
            on_state(str(event.state), time.monotonic() - start)
        elif isinstance(event, LocalNote):
            on_note(event.text)

    ended = _exchange(
        request, request.timeout_s + limits.LOCAL_RESULT_MARGIN_S, FROM_SERVICE, on_event, "call"
    )
    if ended is not None and not isinstance(ended, LocalEnded):
        raise ServiceTrouble("service_error", "the local AgentCall service answered out of turn")
    return ended


def jobs(request: LocalJobs, on_progress: NoteSink) -> LocalJobsEnded | LocalEnded | None:
    """Run ``agentcall jobs`` through the running service; None when there is none to use.

    The patience covers the job's own wait (``get --wait``, ``cancel --wait``) and the margin a
    call gets. A :class:`LocalEnded` back is the service refusing the request.
    """

    def on_event(event: object) -> None:
        if isinstance(event, LocalProgress):
            on_progress(event.text)

    ended: LocalJobsEnded | LocalEnded | None = _exchange(
        request,
        request.wait_s + limits.LOCAL_RESULT_MARGIN_S,
        FROM_SERVICE_JOBS,
        on_event,
        "request",
    )
    return ended


def _exchange(
    request: ToService,
    patience_s: float,
    accept: tuple[type[Any], ...],
    on_event: Callable[[object], None],
    what: str,
) -> Any:
    """Send ``request``, pass the lines that follow to ``on_event``, return the ending line
    (:class:`LocalEnded` or :class:`LocalJobsEnded`); None when there is no service to use."""
    try:
        home = Home.from_environ()
    except LocalStateError:
        return None
    if home.relay_override is not None:
        # AGENTCALL_RELAY names a relay for this run; the service keeps its own.
        return None
    try:
        # Only the owner's own processes can read it: an answering agent's run cannot.
        key = servicekey.read(home)
    except OSError:
        return None
    sock = connect(home)
    if sock is None:
        return None
    with contextlib.closing(sock), _sigterm_interrupts():
        start = time.monotonic()
        try:
            sock.sendall(encode_key_line(key) + encode_line(request) + b"\n")
        except OSError:
            # It accepted and went away before reading: it never saw the request.
            return None
        return _follow(sock, start + patience_s, accept, on_event, what)


def _follow(
    sock: socket.socket,
    deadline: float,
    accept: tuple[type[Any], ...],
    on_event: Callable[[object], None],
    what: str,
) -> LocalEnded | LocalJobsEnded:
    buffer = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ServiceTrouble(
                "service_timeout",
                f"the local AgentCall service did not say how the {what} ended in time",
            )
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            stopped = STOPPED_MESSAGE if what == "call" else JOBS_STOPPED_MESSAGE
            raise ServiceTrouble("service_stopped", stopped)
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            event = _decode(line, accept)
            if isinstance(event, LocalEnded | LocalJobsEnded):
                return event
            on_event(event)
        if len(buffer) > limits.MAX_LOCAL_EVENT_BYTES:
            raise ServiceTrouble(
                "service_error", f"the local AgentCall service sent more than a {what} can hold"
            )


def _decode(line: bytes, accept: tuple[type[Any], ...]) -> Any:
    try:
        event = decode_line(line, accept, max_bytes=limits.MAX_LOCAL_EVENT_BYTES)
    except MalformedFrame:
        raise ServiceTrouble(
            "service_error",
            "the local AgentCall service sent something this agentcall cannot read "
            "(a different version?); restart it",
        ) from None
    return event
