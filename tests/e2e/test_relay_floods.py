"""The relay's front door against a real `twistd agentcall-relay`: caps, deadlines, throttles."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import socket
import sqlite3
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcall.invites import parse_invite_url
from tests.e2e.processes import RelayProcess, start_relay

pytestmark = pytest.mark.e2e

PER_SOURCE = 5
AUTH_FAILURES = 3


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    """A relay with small caps; a long head deadline so held sockets stay while a test runs."""
    workdir: Path = tmp_path_factory.mktemp("floods")
    process, _ = start_relay(
        workdir,
        extra_args=(
            "--head-timeout=60",
            f"--max-per-source={PER_SOURCE}",
            f"--auth-failures-per-minute={AUTH_FAILURES}",
        ),
    )
    yield process
    process.stop()


def _tls(process: RelayProcess) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=process.ca_file)


def _get(
    process: RelayProcess, path: str, headers: dict[str, str] | None = None, source: str = ""
) -> http.client.HTTPResponse:
    conn = http.client.HTTPSConnection(
        "localhost",
        process.url.port,
        context=_tls(process),
        timeout=30,
        source_address=(source, 0) if source else None,
    )
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def _body(process: RelayProcess, path: str, headers: dict[str, str] | None = None) -> object:
    conn = http.client.HTTPSConnection("localhost", process.url.port, context=_tls(process))
    conn.request("GET", path, headers=headers or {})
    data = conn.getresponse().read()
    conn.close()
    return json.loads(data)


def _closed_by_peer(s: socket.socket) -> bool:
    """Block until the relay closes the socket (EOF or reset); False if it stays open."""
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def _refused_at_once(port: int) -> bool:
    """Connect and wait for the relay to close; True if it did.

    The relay aborts a refused connection (a reset). On a loaded machine that reset can land
    before ``connect`` returns to us, which is the same refusal seen earlier.
    """
    try:
        refused = socket.create_connection(("127.0.0.1", port), timeout=30)
    except ConnectionResetError:
        return True
    with refused:
        return _closed_by_peer(refused)


def test_status_and_plain_socket_get_disclose_nothing(relay: RelayProcess) -> None:
    status = _get(relay, "/v1/status")
    assert status.status == 200 and status.getheader("server") is None
    assert _body(relay, "/v1/status")["version"] is None  # type: ignore[index]
    ws = _get(relay, "/v1/ws?role=listen")
    assert ws.status == 426 and ws.getheader("server") is None
    assert ws.getheader("content-type") == "application/json"
    assert _body(relay, "/v1/ws")["error"] == "upgrade_required"  # type: ignore[index]


def test_idle_connections_over_the_per_source_cap_are_refused(relay: RelayProcess) -> None:
    port = relay.url.port
    held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(PER_SOURCE)]
    try:
        assert _refused_at_once(port)
        # Another source address is still served while 127.0.0.1 is at its cap.
        assert _get(relay, "/v1/status", source="127.0.0.2").status == 200
    finally:
        for s in held:
            s.close()


def test_bad_tokens_are_throttled_with_retry_after_and_audited(relay: RelayProcess) -> None:
    bad = {
        "Authorization": "Bearer not-a-real-token-at-all",
        "X-AgentCall-Org": "acme",
        "X-AgentCall-Handle": "nobody",
    }
    source = "127.0.0.3"
    codes = [_get(relay, "/v1/me", bad, source).status for _ in range(AUTH_FAILURES)]
    assert codes == [401] * AUTH_FAILURES
    throttled = _get(relay, "/v1/me", bad, source)
    assert throttled.status == 429 and int(throttled.getheader("retry-after") or "0") >= 1
    relay.stop()  # the final flush writes the row of the current minute
    with sqlite3.connect(relay.database) as db:
        rows = db.execute(
            "SELECT org, target, detail FROM audit WHERE event = 'auth.failed'"
        ).fetchall()
    assert ("", source, f"{AUTH_FAILURES} failed authentications in this minute") in rows
    assert not any("not-a-real-token" in str(row) for row in rows)
    relay.restart()


def test_a_trickled_head_is_cut_at_its_deadline(tmp_path: Path) -> None:
    process, _ = start_relay(tmp_path, extra_args=("--head-timeout=1",))
    try:
        raw = socket.create_connection(("127.0.0.1", process.url.port), timeout=30)
        with _tls(process).wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: localhost\r\n")
            started = time.monotonic()
            s.settimeout(0.2)  # the pace of the trickle, and how long each wait for EOF lasts
            lines = 0
            while not _closed_by_peer(s):
                s.sendall(f"X-Trickle-{lines}: y\r\n".encode())
                lines += 1
                assert time.monotonic() - started < 30, "the trickling head was never cut"
            assert lines >= 2  # it was trickling, and the trickle did not keep it open
    finally:
        process.stop()
    # Refusals are logged in aggregate (once a minute, and when the relay stops); the line may
    # still be on its way through the pipe when the process has exited.
    process.log.wait_for(r"front_door_refusals .*\bhead_timeout=1\b")


@contextlib.contextmanager
def _paused(process: RelayProcess) -> Iterator[None]:
    """The relay stopped (SIGSTOP) meanwhile: the kernel still completes connections to it and
    queues them, so that it then accepts them all in one go, in the order they were made."""
    process.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.process.send_signal(signal.SIGCONT)


def _exchange(raw: socket.socket, process: RelayProcess, request: bytes) -> tuple[int, bytes]:
    """TLS over ``raw``, one request, the whole answer: (status, body)."""
    with _tls(process).wrap_socket(raw, server_hostname="localhost") as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


HANDSHAKES = 4
FLOOD = 12  # three times the cap, from four addresses: every cap but the head cap is roomy


@pytest.mark.parametrize("hold", ["accept-hold", "no-accept-hold"])
def test_an_honest_newcomer_behind_a_flood_of_slow_connections_enrols(
    tmp_path: Path, hold: str
) -> None:
    """Connections that never send a byte, past the handshake cap, then one honest newcomer,
    all accepted in one go: it is neither reset nor evicted by the flood, and it enrols.

    The heads are young (a long grace), so the accept valve has stopped the port when the
    newcomer is taken: it comes in the same accept loop as the flood, where the relay once
    closed it (``handshakes_busy``). With --no-accept-hold every newcomer meets young heads."""
    extra = [
        f"--max-handshakes={HANDSHAKES}",
        "--handshake-grace=30",
        "--head-timeout=60",
    ]
    if hold == "no-accept-hold":
        extra.append("--no-accept-hold")
    process, invites = start_relay(tmp_path, extra_args=extra)
    link = parse_invite_url(invites["acme"])
    port = process.url.port
    flood: list[socket.socket] = []
    try:
        with _paused(process):
            for n in range(FLOOD):
                source = (f"127.0.0.{2 + n % 4}", 0)
                flood.append(socket.create_connection(("127.0.0.1", port), 30, source))
            newcomer = socket.create_connection(("127.0.0.1", port), 30, ("127.0.0.9", 0))
        body = json.dumps({"org": link.org, "invite": link.secret, "handle": "newcomer"})
        request = (
            "POST /v1/register HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
        ).encode()
        status, answer = _exchange(newcomer, process, request)
        assert status == 200, answer
        assert json.loads(answer)["address"] == "@acme/newcomer"
    finally:
        for s in flood:
            s.close()
        process.stop()
    # Every flood connection past the cap, and the newcomer, took the place of an older one
    # (the counts are logged when the relay stops; the line may still be on its way to us).
    refusals = process.log.wait_for(r"front_door_refusals .*").group(0)
    assert f" evicted_in_head={FLOOD + 1 - HANDSHAKES} " in refusals + " "
    assert "handshakes_busy" not in refusals
