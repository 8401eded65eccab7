"""A bare autobahn relay: the floor the real relay is measured against, in its own process.

No authentication, no store, no checks, no frame decoding: it pairs sockets and forwards text
frames. Three kinds of socket, chosen by the request path:

- ``/listen?id=NAME`` — a listener. It receives ``ROUTE BODY`` and answers ``ROUTE BODY``.
- ``/call?to=NAME`` — a **per-call** caller (like the product's ``role=call``): one socket per
  call. Each text frame it sends goes to listener NAME as ``KEY BODY`` (KEY names this socket);
  the listener's ``KEY BODY`` comes back to it as ``BODY``.
- ``/mux`` — a **persistent** caller: calls multiplexed on one long-lived socket. It sends
  ``NAME CORR BODY``; listener NAME gets ``SID.CORR BODY`` (SID names the socket); the answer
  comes back as ``CORR BODY``.

The only parsing is splitting at the first space or two; a frame for an unknown route is
dropped (counted). It uses the same WebSocket options as the relay (no compression, no UTF-8
pass, same frame caps). Run: ``python bench/bare_relay.py --port 0`` prints
``bare_relay_listening port=N`` and serves until SIGTERM/SIGINT or ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

Sink = Callable[[bytes], None]
MAX_FRAME_BYTES = 256 * 1024  # agentcall.limits.MAX_FRAME_BYTES is read at start when present


class Switch:
    """The pairing table (pure: sockets are just send functions here)."""

    def __init__(self) -> None:
        self.listeners: dict[bytes, Sink] = {}
        self.calls: dict[int, Sink] = {}
        self.mux: dict[int, Sink] = {}
        self._next = 0
        self.forwarded = 0
        self.dropped = 0

    def _key(self) -> int:
        self._next += 1
        return self._next

    # --- sockets ------------------------------------------------------------------------------

    def add_listener(self, name: bytes, sink: Sink) -> None:
        self.listeners[name] = sink  # a newer listener for a name replaces the older one

    def remove_listener(self, name: bytes, sink: Sink) -> None:
        if self.listeners.get(name) == sink:  # bound methods: equal, not identical
            del self.listeners[name]

    def open_call(self, sink: Sink) -> int:
        key = self._key()
        self.calls[key] = sink
        return key

    def close_call(self, key: int) -> None:
        self.calls.pop(key, None)

    def open_mux(self, sink: Sink) -> int:
        sid = self._key()
        self.mux[sid] = sink
        return sid

    def close_mux(self, sid: int) -> None:
        self.mux.pop(sid, None)

    # --- frames -------------------------------------------------------------------------------

    def from_call(self, key: int, to: bytes, payload: bytes) -> bool:
        listener = self.listeners.get(to)
        if listener is None:
            self.dropped += 1
            return False
        listener(b"%d %s" % (key, payload))
        self.forwarded += 1
        return True

    def from_mux(self, sid: int, payload: bytes) -> bool:
        to, _, rest = payload.partition(b" ")
        listener = self.listeners.get(to)
        if listener is None or not rest:
            self.dropped += 1
            return False
        listener(b"%d.%s" % (sid, rest))  # rest = CORR BODY
        self.forwarded += 1
        return True

    def from_listener(self, payload: bytes) -> bool:
        route, sep, body = payload.partition(b" ")
        sid, dot, corr = route.partition(b".")
        try:
            key = int(sid)
        except ValueError:
            key = -1
        sink = (self.mux if dot else self.calls).get(key)
        if sink is None or not sep:
            self.dropped += 1
            return False
        sink(corr + b" " + body if dot else body)
        self.forwarded += 1
        return True


def make_factory(reactor: Any, switch: Switch) -> Any:
    """An autobahn server factory whose sockets are wired to ``switch``."""
    from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol

    try:
        from agentcall import limits

        frame_cap = limits.MAX_FRAME_BYTES
        ping, ping_timeout = limits.KEEPALIVE_INTERVAL_S, limits.KEEPALIVE_TIMEOUT_S
    except ImportError:  # pragma: no cover - the bench always has the checkout on sys.path
        frame_cap, ping, ping_timeout = MAX_FRAME_BYTES, 30, 30

    class BareProtocol(WebSocketServerProtocol):  # type: ignore[misc]
        kind = ""
        name = b""
        key = 0

        def onConnect(self, request: Any) -> None:
            # autobahn splits the query off into request.params (name -> list of values)
            parts = urlsplit(request.path)
            query = dict(parse_qs(parts.query), **request.params)
            self.kind = parts.path.strip("/")
            if self.kind == "listen":
                self.name = query.get("id", [""])[0].encode()
            elif self.kind == "call":
                self.name = query.get("to", [""])[0].encode()
            elif self.kind != "mux":
                from autobahn.websocket.types import ConnectionDeny

                raise ConnectionDeny(404)

        def _send(self, payload: bytes) -> None:
            self.sendMessage(payload, isBinary=False)

        def onOpen(self) -> None:
            if self.kind == "listen":
                switch.add_listener(self.name, self._send)
            elif self.kind == "call":
                self.key = switch.open_call(self._send)
            else:
                self.key = switch.open_mux(self._send)

        def onMessage(self, payload: bytes, isBinary: bool) -> None:
            if self.kind == "listen":
                switch.from_listener(payload)
            elif self.kind == "call":
                switch.from_call(self.key, self.name, payload)
            else:
                switch.from_mux(self.key, payload)

        def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
            if self.kind == "listen":
                switch.remove_listener(self.name, self._send)
            elif self.kind == "call":
                switch.close_call(self.key)
            elif self.kind == "mux":
                switch.close_mux(self.key)

    factory = WebSocketServerFactory(reactor=reactor)
    factory.protocol = BareProtocol
    factory.setProtocolOptions(
        maxFramePayloadSize=frame_cap,
        maxMessagePayloadSize=frame_cap,
        autoPingInterval=ping,
        autoPingTimeout=ping_timeout,
        closeHandshakeTimeout=5,
        webStatus=False,
        perMessageCompressionAccept=lambda _offers: None,
        utf8validateIncoming=False,
    )
    return factory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A bare autobahn relay (the benchmark's floor).")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--interface", default="127.0.0.1", choices=("127.0.0.1", "::1"))
    p.add_argument("--max-seconds", type=float, default=3600.0, help="stop by itself after this")
    args = p.parse_args(argv)
    from twisted.internet import epollreactor

    epollreactor.install()
    import txaio
    from twisted.internet import reactor

    txaio.use_twisted()
    switch = Switch()
    port = reactor.listenTCP(  # type: ignore[attr-defined]
        args.port, make_factory(reactor, switch), interface=args.interface
    )
    reactor.callLater(args.max_seconds, reactor.stop)  # type: ignore[attr-defined]
    reactor.callWhenRunning(  # type: ignore[attr-defined]
        lambda: print(f"bare_relay_listening port={port.getHost().port}", flush=True)
    )
    reactor.run()  # type: ignore[attr-defined]  # SIGTERM and SIGINT stop it
    print(f"bare_relay_stopped forwarded={switch.forwarded} dropped={switch.dropped}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
