"""The loopback HTTP server both model mocks are built on: a thread, a request record, a limit.

A mock listens on ``127.0.0.1`` on an ephemeral port, answers on a background thread and
writes every request it receives into :attr:`ScriptedServer.requests` before answering. It
shuts itself down after ``lifetime_s`` even if a test forgets to, so a stuck run cannot keep
a port and a thread alive for the rest of the session.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs

DEFAULT_LIFETIME_S = 600.0
# Headers worth keeping in the record; nothing else the CLIs send matters to the tests.
_KEPT_HEADERS = frozenset(
    {
        "anthropic-beta",
        "anthropic-version",
        "user-agent",
        "x-app",
        "x-api-key",
        "authorization",
        "content-type",
        "accept",
        "originator",
        "session_id",
        "upgrade",
    }
)


@attrs.frozen
class RecordedRequest:
    """One request as the mock saw it. ``body`` is the raw bytes, ``json`` the parsed body."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    json: Any

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0]


@attrs.frozen
class Reply:
    """What to send back: a status, a content type and the body bytes."""

    status: int
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def of_json(cls, status: int, value: object) -> Reply:
        return cls(status, json.dumps(value).encode())


def sse(events: list[tuple[str, Mapping[str, Any]]]) -> bytes:
    """Server-sent events: one ``event:``/``data:`` pair per event, blank-line separated."""
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
    )


Handler = Callable[[RecordedRequest], Reply]


class _ThreadingServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False


class ScriptedServer:
    """A loopback HTTP server that records each request and answers it with ``handle``."""

    def __init__(self, handle: Handler, lifetime_s: float = DEFAULT_LIFETIME_S) -> None:
        self._handle = handle
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._errors: list[str] = []
        server = self

        class _RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length > 0 else b""
                try:
                    parsed: Any = json.loads(raw) if raw else None
                except ValueError:
                    parsed = None
                headers = {
                    key.lower(): value
                    for key, value in self.headers.items()
                    if key.lower() in _KEPT_HEADERS
                }
                request = RecordedRequest(self.command, self.path, headers, raw, parsed)
                server._record(request)
                try:
                    reply = server._handle(request)
                except Exception as exc:  # a broken script must show up, not hang the CLI
                    server._note_error(f"{self.command} {self.path}: {exc!r}")
                    reply = Reply.of_json(
                        500, {"error": {"type": "api_error", "message": f"mock broke: {exc}"}}
                    )
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(reply.body)

            do_GET = _serve
            do_POST = _serve
            do_HEAD = _serve
            do_PUT = _serve
            do_DELETE = _serve
            do_PATCH = _serve

        self._httpd = _ThreadingServer(("127.0.0.1", 0), _RequestHandler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="mock-model-server",
            daemon=True,
        )
        self._watchdog = threading.Timer(lifetime_s, self.stop)
        self._watchdog.daemon = True
        self._stopped = False

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _note_error(self, text: str) -> None:
        with self._lock:
            self._errors.append(text)

    @property
    def port(self) -> int:
        port: int = self._httpd.server_address[1]
        return port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def errors(self) -> list[str]:
        """Exceptions raised by the script while answering (a test should assert none)."""
        with self._lock:
            return list(self._errors)

    def saw_bytes(self, needle: bytes) -> bool:
        """Whether ``needle`` occurs in any request path or body received so far."""
        return any(needle in r.body or needle in r.path.encode() for r in self.requests)

    def start(self) -> ScriptedServer:
        self._thread.start()
        self._watchdog.start()
        return self

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._watchdog.cancel()
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
