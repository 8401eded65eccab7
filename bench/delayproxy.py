"""A TCP proxy that delays every chunk by a fixed one-way delay, and counts round trips.

The kernel here has no netem, so a simulated network is this proxy on loopback: it accepts on
one port, connects each client to a target port, and forwards the bytes both ways, each chunk
``delay`` seconds after it arrived, in order. Each connection belongs to a **leg** (the
caller's or the listener's side of the relay), chosen from the ``X-AgentCall-Handle`` header of
its first HTTP request head (the bench enrols known handles): one public relay address, as the
product needs (every envelope names the relay's origin), and a delay and a count per leg.

What is counted, per connection (see :class:`Flow`):

- **handshake**: a new TCP connection. With ``tcp_handshake`` on (the default) the proxy models
  it: the client's first bytes are held until one round trip after the connection was
  accepted (SYN, SYN-ACK), then delayed like any other chunk.
- **bursts**: maximal runs of data in one direction. A burst ends when a byte flows the other
  way; each burst is one one-way trip on which the other side had to wait (a request → response
  turnaround is two bursts). Chunks that arrive back to back in one direction are one burst.

**Round trips** of a leg over a time window = handshakes opened in it + bursts in it / 2.
A call whose caller sends ``call_request`` on a socket it already holds and gets its answer back
is 2 bursts = 1 round trip on that leg; dialling a fresh WebSocket for it adds a handshake and
the upgrade's request and response (2 more round trips). Bursts that overlap with another
call's on the same connection (several calls on one socket) are not separated: measure one
call at a time.

The proxy appends one JSON line per event to ``--events`` (``open``, ``burst``, ``close``,
``config``), stamped with :func:`time.monotonic` (``CLOCK_MONOTONIC``, the same clock in every
process of the machine), so a bench counts the events inside a call's window with
:func:`summarize`. ``SIGHUP`` re-reads ``--control`` (``{"delay_ms": {"leg": ms}}``) for new
connections and chunks; bytes already queued keep their delivery time.

Run: ``python bench/delayproxy.py --listen 127.0.0.1:P --target 127.0.0.1:Q --delay-ms 25
--leg ken=listener --default-leg caller --events events.jsonl``. It stops on SIGTERM/SIGINT,
and by itself after ``--max-seconds`` (3600).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

import attrs
from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall, IReactorTime

UP = "up"  # client -> target
DOWN = "down"  # target -> client
HEAD_LIMIT = 16 * 1024  # classify after this many bytes even without a complete head
_HANDLE_RE = re.compile(rb"\r\nx-agentcall-handle:[ \t]*([A-Za-z0-9._-]+)", re.IGNORECASE)


def leg_of_head(head: bytes, legs: Mapping[str, str], default: str) -> str:
    """The leg of a connection from its first request head: by its handle header, else default."""
    match = _HANDLE_RE.search(head)
    if match is None:
        return default
    return legs.get(match.group(1).decode("ascii"), default)


@attrs.define
class Flow:
    """The direction bookkeeping of one connection (pure: no I/O, time passed in)."""

    last: str | None = None
    bursts: int = 0
    up_bytes: int = 0
    down_bytes: int = 0

    def note(self, direction: str, size: int) -> bool:
        """Count ``size`` bytes arriving in ``direction``; True when they start a new burst."""
        if direction == UP:
            self.up_bytes += size
        else:
            self.down_bytes += size
        if size <= 0 or direction == self.last:
            return False
        self.last = direction
        self.bursts += 1
        return True


class DelayedPipe:
    """One direction of one connection: chunks out ``delay`` after they came in, in order.

    A single timer serves the queue's head, so equal due times cannot be reordered.
    ``not_before`` holds everything until then (the modelled TCP handshake).
    """

    def __init__(
        self, clock: IReactorTime, write: Callable[[bytes], None], on_drained: Callable[[], None]
    ) -> None:
        self._clock = clock
        self._write = write
        self._on_drained = on_drained
        self._queue: deque[tuple[float, bytes]] = deque()
        self._timer: IDelayedCall | None = None
        self._last_due = 0.0
        self.not_before = 0.0
        self.closing = False

    def push(self, data: bytes, delay: float) -> None:
        now = self._clock.seconds()
        due = max(now, self.not_before) + delay
        due = max(due, self._last_due)  # a shorter delay set later never overtakes
        self._last_due = due
        self._queue.append((due, data))
        self._arm()

    def close_after_queue(self) -> None:
        """Tell the far side the stream ended once everything queued has been delivered."""
        self.closing = True
        if not self._queue:
            self._on_drained()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def _arm(self) -> None:
        if self._timer is not None or not self._queue:
            return
        wait = max(0.0, self._queue[0][0] - self._clock.seconds())
        self._timer = self._clock.callLater(wait, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self._clock.seconds()
        while self._queue and self._queue[0][0] <= now + 1e-9:
            self._write(self._queue.popleft()[1])
        if self._queue:
            self._arm()
        elif self.closing:
            self._on_drained()

    def cancel(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self._queue.clear()


@attrs.define
class ProxyConfig:
    target_host: str
    target_port: int
    delay_ms: dict[str, float]  # per leg
    legs: dict[str, str]  # handle -> leg
    default_leg: str = "caller"
    tcp_handshake: bool = True

    def delay_s(self, leg: str) -> float:
        return self.delay_ms.get(leg, self.delay_ms.get("*", 0.0)) / 1000.0


class EventLog:
    """JSON lines, one per event; ``write`` is given a monotonic timestamp by the caller."""

    def __init__(self, out: IO[str] | None) -> None:
        self._out = out
        self._next_id = 0

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def write(self, **event: Any) -> None:
        if self._out is not None:
            self._out.write(json.dumps(event, separators=(",", ":")) + "\n")
            self._out.flush()


class _Upstream(protocol.Protocol):
    """The proxy's connection to the target, owned by one :class:`ProxyConnection`."""

    def __init__(self, owner: ProxyConnection) -> None:
        self.owner = owner

    def connectionMade(self) -> None:
        self.owner.upstream_connected(self)

    def dataReceived(self, data: bytes) -> None:
        self.owner.from_target(data)

    def connectionLost(self, reason: Any = None) -> None:
        self.owner.target_lost()


class _UpstreamFactory(protocol.ClientFactory):
    noisy = False

    def __init__(self, owner: ProxyConnection) -> None:
        self.owner = owner

    def buildProtocol(self, addr: Any) -> _Upstream:
        return _Upstream(self.owner)

    def clientConnectionFailed(self, connector: Any, reason: Any) -> None:
        self.owner.target_lost()


class ProxyConnection(protocol.Protocol):
    """A client's connection to the proxy, its twin to the target, and their two pipes.

    The connection's leg is known once its first request head arrived; until then its bytes
    wait (they are still counted, and stamped, as they arrive).
    """

    factory: ProxyFactory

    def __init__(self) -> None:
        self.flow = Flow()
        self.leg: str | None = None
        self.cid = 0
        self.opened_at = 0.0  # the event clock (monotonic)
        self._accepted_clock = 0.0  # the reactor clock, for the modelled handshake
        self._head = b""
        self._upstream: _Upstream | None = None
        self._early: list[bytes] = []  # delivered by the up pipe before the target answered
        self._up: DelayedPipe | None = None
        self._down: DelayedPipe | None = None
        self._client_gone = False
        self._target_gone = False
        self._closed_logged = False

    # --- set-up ---------------------------------------------------------------------------

    def connectionMade(self) -> None:
        factory = self.factory
        self.cid = factory.events.new_id()
        self.opened_at = factory.now()
        self._accepted_clock = factory.clock.seconds()
        self._up = DelayedPipe(factory.clock, self._to_target, self._end_target)
        self._down = DelayedPipe(factory.clock, self._to_client, self._end_client)
        factory.open_connections.add(self)
        config = factory.config
        factory.reactor.connectTCP(
            config.target_host, config.target_port, _UpstreamFactory(self), timeout=10
        )

    def upstream_connected(self, upstream: _Upstream) -> None:
        self._upstream = upstream
        early, self._early = self._early, []
        for data in early:
            self._to_target(data)
        if self._up is not None and self._up.closing and not self._up.pending:
            self._end_target()

    def _classify(self) -> str:
        config = self.factory.config
        leg = self.leg = leg_of_head(self._head, config.legs, config.default_leg)
        assert self._up is not None
        if config.tcp_handshake:
            # The client may send only once SYN and SYN-ACK went both ways: one round trip.
            self._up.not_before = self._accepted_clock + 2 * config.delay_s(leg)
        self.factory.events.write(
            t=round(self.opened_at, 6),
            c=self.cid,
            ev="open",
            leg=leg,
            handshake=config.tcp_handshake,
        )
        return leg

    # --- data in ----------------------------------------------------------------------------

    def _note(self, direction: str, size: int) -> None:
        if self.flow.note(direction, size):
            self.factory.events.write(
                t=round(self.factory.now(), 6), c=self.cid, ev="burst", d=direction
            )

    def dataReceived(self, data: bytes) -> None:
        self._note(UP, len(data))
        leg = self.leg
        if leg is None:
            self._head += data
            if b"\r\n\r\n" not in self._head and len(self._head) < HEAD_LIMIT:
                return
            leg = self._classify()
            data, self._head = self._head, b""
        assert self._up is not None
        self._up.push(data, self.factory.config.delay_s(leg))

    def from_target(self, data: bytes) -> None:
        self._note(DOWN, len(data))
        assert self._down is not None
        leg = self.leg or self.factory.config.default_leg
        self._down.push(data, self.factory.config.delay_s(leg))

    # --- data out ---------------------------------------------------------------------------

    def _to_target(self, data: bytes) -> None:
        if self._upstream is None:
            self._early.append(data)
        elif self._upstream.transport is not None:
            self._upstream.transport.write(data)

    def _to_client(self, data: bytes) -> None:
        if self.transport is not None and not self._client_gone:
            self.transport.write(data)

    def _end_target(self) -> None:
        if self._upstream is not None and self._upstream.transport is not None:
            self._upstream.transport.loseConnection()

    def _end_client(self) -> None:
        if self.transport is not None:
            self.transport.loseConnection()

    # --- endings ----------------------------------------------------------------------------

    def connectionLost(self, reason: Any = None) -> None:
        self._client_gone = True
        assert self._up is not None
        if self.leg is None:
            leg = self._classify()
            if self._head:
                data, self._head = self._head, b""
                self._up.push(data, self.factory.config.delay_s(leg))
        self._up.close_after_queue()
        self._finished()

    def target_lost(self) -> None:
        self._target_gone = True
        assert self._down is not None
        self._down.close_after_queue()
        self._finished()

    def _finished(self) -> None:
        if self._client_gone and self._target_gone and not self._closed_logged:
            self._closed_logged = True
            self.factory.open_connections.discard(self)
            self.factory.events.write(
                t=round(self.factory.now(), 6),
                c=self.cid,
                ev="close",
                bursts=self.flow.bursts,
                up=self.flow.up_bytes,
                down=self.flow.down_bytes,
            )


class ProxyFactory(protocol.Factory):
    protocol = ProxyConnection
    noisy = False

    def __init__(
        self,
        reactor: Any,
        config: ProxyConfig,
        events: EventLog,
        *,
        clock: IReactorTime | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reactor = reactor
        self.clock: IReactorTime = reactor if clock is None else clock
        self.config = config
        self.events = events
        self.now = now
        self.open_connections: set[ProxyConnection] = set()

    def buildProtocol(self, addr: Any) -> ProxyConnection:
        conn = ProxyConnection()
        conn.factory = self
        return conn


# --- reading the events -------------------------------------------------------------------------


@attrs.define
class LegCount:
    handshakes: int = 0
    bursts: int = 0
    connections: set[int] = attrs.field(factory=set)

    @property
    def round_trips(self) -> float:
        return self.handshakes + self.bursts / 2

    def as_dict(self) -> dict[str, Any]:
        return {
            "round_trips": self.round_trips,
            "handshakes": self.handshakes,
            "bursts": self.bursts,
            "connections_used": len(self.connections),
        }


def read_events(path: Any) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def summarize(events: Iterable[Mapping[str, Any]], start: float, end: float) -> dict[str, LegCount]:
    """Per leg: handshakes (connections opened) and bursts whose time falls in [start, end]."""
    leg_of: dict[int, str] = {}
    events = list(events)
    for event in events:
        if event.get("ev") == "open":
            leg_of[int(event["c"])] = str(event["leg"])
    counts: dict[str, LegCount] = {}
    for event in events:
        kind = event.get("ev")
        if kind not in ("open", "burst") or not start <= float(event["t"]) <= end:
            continue
        cid = int(event["c"])
        leg = leg_of.get(cid, "?")
        count = counts.setdefault(leg, LegCount())
        count.connections.add(cid)
        if kind == "open":
            if event.get("handshake", True):
                count.handshakes += 1
        else:
            count.bursts += 1
    return counts


# --- the process --------------------------------------------------------------------------------


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if host not in ("127.0.0.1", "::1", "[::1]", "localhost"):
        raise argparse.ArgumentTypeError("the proxy works on loopback only")
    return host.strip("[]"), int(port)


def _leg(text: str) -> tuple[str, str]:
    handle, sep, leg = text.partition("=")
    if not sep or not handle or not leg:
        raise argparse.ArgumentTypeError("use HANDLE=LEG")
    return handle, leg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--listen", type=_hostport, required=True, help="127.0.0.1:PORT to accept on")
    p.add_argument("--target", type=_hostport, required=True, help="127.0.0.1:PORT to forward to")
    p.add_argument("--delay-ms", type=float, default=25.0, help="one-way delay, every leg (25)")
    p.add_argument("--leg", type=_leg, action="append", default=[], help="HANDLE=LEG")
    p.add_argument("--default-leg", default="caller")
    p.add_argument("--no-tcp-handshake", dest="tcp_handshake", action="store_false")
    p.add_argument("--events", help="append JSON-line events here")
    p.add_argument("--control", help='JSON {"delay_ms": {"leg": ms}} re-read on SIGHUP')
    p.add_argument("--max-seconds", type=float, default=3600.0, help="stop by itself after this")
    args = p.parse_args(argv)
    from twisted.internet import reactor

    config = ProxyConfig(
        target_host=args.target[0],
        target_port=args.target[1],
        delay_ms={"*": args.delay_ms},
        legs=dict(args.leg),
        default_leg=args.default_leg,
        tcp_handshake=args.tcp_handshake,
    )
    out = open(args.events, "a", encoding="utf-8") if args.events else None  # noqa: SIM115
    events = EventLog(out)
    factory = ProxyFactory(reactor, config, events)

    def reload(_signum: int = 0, _frame: object = None) -> None:
        if args.control:
            try:
                with open(args.control, encoding="utf-8") as fh:
                    wanted = json.load(fh)
                config.delay_ms = {"*": args.delay_ms, **wanted.get("delay_ms", {})}
            except (OSError, ValueError) as exc:
                print(f"delayproxy: control file unusable: {exc}", file=sys.stderr, flush=True)
        events.write(t=round(time.monotonic(), 6), ev="config", delay_ms=config.delay_ms)

    reactor.listenTCP(args.listen[1], factory, interface=args.listen[0])  # type: ignore[attr-defined]
    reload()
    signal.signal(signal.SIGHUP, lambda s, f: reactor.callFromThread(reload))  # type: ignore[attr-defined]
    reactor.callLater(args.max_seconds, reactor.stop)  # type: ignore[attr-defined]
    reactor.callWhenRunning(  # type: ignore[attr-defined]
        lambda: print(f"delayproxy_listening port={args.listen[1]}", flush=True)
    )
    reactor.run()  # type: ignore[attr-defined]  # SIGTERM and SIGINT stop it
    if out is not None:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
