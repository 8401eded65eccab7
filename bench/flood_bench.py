"""Flood benchmark: issue 7 items 1 and 2 replayed against a real relay at 1,024 open files.

Run from the checkout: ``.venv/bin/python bench/flood_bench.py [--quick] [--checkout DIR]...``.
Each checkout given is measured in turn (default: this one), so the relay before and after a
change can be compared in one run. See bench/README.md for what is measured.

Only loopback addresses are used: the relay listens on 127.0.0.1 and every client binds a
127.0.0.0/8 source address, which Linux loopback accepts without configuration.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import secrets
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for _path in (str(REPO), str(BENCH)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from twisted.internet import epollreactor  # noqa: E402

epollreactor.install()

import attrs  # noqa: E402
import loadgen  # noqa: E402
import relayproc  # noqa: E402
from seeding import Identity, seed_identities  # noqa: E402
from twisted.internet import defer  # noqa: E402
from twisted.internet.protocol import ClientFactory, Protocol, connectionDone  # noqa: E402
from twisted.internet.task import LoopingCall  # noqa: E402
from twisted.python.failure import Failure  # noqa: E402
from twisted.web.client import Agent, FileBodyProducer, readBody  # noqa: E402
from twisted.web.http_headers import Headers  # noqa: E402
from zope.interface import directlyProvides, providedBy  # noqa: E402

from agentcall.client.api import RelayApi  # noqa: E402
from agentcall.relayurl import RelayUrl  # noqa: E402

ORG = "bench"
OPEN_FILES = 1024
RELAY_HOST = "127.0.0.1"
# Sources, all in 127.0.0.0/8: the spread flood, the trickle, the guesser, and the clients that
# stand for everyone else (each its own address, so no per-source cap of the flood hits them).
SPREAD_SOURCES = tuple(f"127.0.0.{i}" for i in range(2, 41))
TRICKLE_SOURCES = tuple(f"127.0.0.{i}" for i in range(41, 51))
GUESS_SOURCE = "127.0.0.60"
PROBE_SOURCE = "127.0.1.1"
CALLER_SOURCE = "127.0.1.2"
LISTENER_SOURCE = "127.0.1.3"

IDLE_HEAD = b"GET /v1/status HTTP/1.1\r\n"
FULL_STATUS = b"GET /v1/status HTTP/1.1\r\nHost: relay\r\n\r\n"
AT_ONCE_S = 1.0  # a connection closed this soon after it opened was refused at the door
RESET_ON_CONNECT = "An error occurred while connecting: 104"
CONNECT_TIMEOUT_S = 3.0
# Connections dialling at once: under the relay's accept backlog (50), so that SYNs dropped by
# a full backlog are not what the bench measures.
DIAL_WINDOW = 32
PROBE_TIMEOUT_S = 2.0
CALL_TIMEOUT_S = 8.0
SETTLED_FDS = 60  # the relay's descriptors with no flood (about 20) plus a margin

now = time.monotonic


class BenchError(Exception):
    """The run cannot go on."""


# --- raw connections -----------------------------------------------------------------------------


@attrs.define
class Conn:
    """One attacking connection, timestamps on the monotonic clock."""

    source: str
    made: float | None = None
    lost: float | None = None
    failed: str | None = None
    protocol: Protocol | None = None

    @property
    def is_open(self) -> bool:
        return self.made is not None and self.lost is None

    @property
    def at_once(self) -> bool:
        """Closed by the relay as soon as it was accepted (a reset can beat the connect)."""
        if self.failed is not None:
            return self.failed.startswith(RESET_ON_CONNECT)
        return self.made is not None and self.lost is not None and self.lost - self.made < AT_ONCE_S


class Crowd:
    """Many raw connections to the relay, dialled at most ``DIAL_WINDOW`` at a time."""

    def __init__(
        self, reactor: Any, port: int, make: Callable[[Crowd, Conn], Protocol], label: str
    ) -> None:
        self.reactor = reactor
        self.port = port
        self.make = make
        self.label = label
        self.conns: list[Conn] = []
        self._sources: Sequence[str] = ()
        self._todo = 0
        self._unsettled = 0
        self._launched: defer.Deferred[None] = defer.Deferred()
        self._all_closed: list[defer.Deferred[None]] = []
        self.aborted_at: float | None = None  # when the bench closed what was left

    def launch(self, sources: Sequence[str], count: int) -> defer.Deferred[None]:
        """Dial ``count`` connections, sources round-robin; fires once each is open or failed."""
        self._sources, self._todo, self._unsettled = sources, count, count
        for _ in range(min(DIAL_WINDOW, count)):
            self._dial()
        if count == 0:
            self._launched.callback(None)
        return self._launched

    def _dial(self) -> None:
        if self._todo == 0:
            return
        self._todo -= 1
        conn = Conn(self._sources[len(self.conns) % len(self._sources)])
        self.conns.append(conn)
        self.reactor.connectTCP(
            RELAY_HOST,
            self.port,
            _Dial(self, conn),
            timeout=CONNECT_TIMEOUT_S,
            bindAddress=(conn.source, 0),
        )

    def settled(self) -> None:
        self._unsettled -= 1
        if self._unsettled == 0:
            self._launched.callback(None)
        else:
            self._dial()

    def closed(self, conn: Conn) -> None:
        conn.lost = now()
        if self.open_count() == 0:
            waiters, self._all_closed = self._all_closed, []
            for d in waiters:
                d.callback(None)

    def open_count(self) -> int:
        return sum(1 for c in self.conns if c.is_open)

    async def wait_all_closed(self, until: float) -> bool:
        """True once every connection is closed; False at the monotonic deadline ``until``."""
        if self.open_count() == 0:
            return True
        d: defer.Deferred[None] = defer.Deferred()
        self._all_closed.append(d)
        d.addTimeout(max(0.0, until - now()), self.reactor)
        try:
            await d
        except defer.TimeoutError:
            return False
        return True

    def abort_all(self) -> None:
        self.aborted_at = now()
        for conn in self.conns:
            transport: Any = conn.protocol.transport if conn.protocol else None
            if conn.is_open and transport is not None:
                transport.abortConnection()

    def summary(self) -> dict[str, Any]:
        made = [c for c in self.conns if c.made is not None]
        held = [c for c in made if not c.at_once]
        end = self.aborted_at if self.aborted_at is not None else now()
        cuts = sorted(
            c.lost - c.made
            for c in held
            if c.lost is not None and c.made is not None and c.lost < end
        )
        return {
            "attempted": len(self.conns),
            "connect_failed": sum(1 for c in self.conns if c.failed and not c.at_once),
            "connect_errors": dict(Counter(c.failed for c in self.conns if c.failed is not None)),
            "refused_at_once": sum(1 for c in self.conns if c.at_once),
            "accepted": len(held),
            "sources": len({c.source for c in self.conns}),
            "cut_s": _spread(cuts),
            "cut_by_relay": len(cuts),
        }


class _Dial(ClientFactory):
    def __init__(self, crowd: Crowd, conn: Conn) -> None:
        self.crowd = crowd
        self.conn = conn

    def buildProtocol(self, addr: Any) -> Protocol:
        protocol = self.crowd.make(self.crowd, self.conn)
        self.conn.protocol = protocol
        return protocol

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        self.conn.failed = reason.getErrorMessage()[:80]
        self.crowd.settled()


class _Attacker(Protocol):
    def __init__(self, crowd: Crowd, conn: Conn) -> None:
        self.crowd = crowd
        self.conn = conn

    def connectionMade(self) -> None:
        self.conn.made = now()
        self.crowd.settled()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.crowd.closed(self.conn)


class IdleHead(_Attacker):
    """Sends the first line of a request head, then nothing."""

    def connectionMade(self) -> None:
        super().connectionMade()
        self.transport.write(IDLE_HEAD)  # type: ignore[union-attr]


class KeptAlive(_Attacker):
    """A whole request every ``interval_s`` on one kept-alive connection, which then idles.

    Its first head is done, so it no longer counts against the handshake cap, and each complete
    request re-arms the head deadline: it holds one slot of the total cap for as long as it
    keeps asking.
    """

    interval_s = 5.0

    def connectionMade(self) -> None:
        super().connectionMade()
        self.loop = LoopingCall(self._ask)
        self.loop.clock = self.crowd.reactor
        self.loop.start(self.interval_s, now=True)

    def _ask(self) -> None:
        if self.transport is not None:
            self.transport.write(FULL_STATUS)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.loop.running:
            self.loop.stop()
        super().connectionLost(reason)


class Trickle(_Attacker):
    """The request line, then one header line every ``interval_s``: bytes keep coming, the head
    never ends."""

    interval_s = 2.0
    max_lines = 20

    def connectionMade(self) -> None:
        super().connectionMade()
        self.transport.write(IDLE_HEAD)  # type: ignore[union-attr]
        self.lines = 0
        self.loop = LoopingCall(self._line)
        self.loop.clock = self.crowd.reactor
        self.loop.start(self.interval_s, now=False)

    def _line(self) -> None:
        self.lines += 1
        if self.lines > self.max_lines or self.transport is None:
            self.loop.stop()
            return
        self.transport.write(b"X-Trickle-%d: x\r\n" % self.lines)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if getattr(self, "loop", None) is not None and self.loop.running:
            self.loop.stop()
        super().connectionLost(reason)


# --- the clients that stand for everyone else ----------------------------------------------------


class SourceBoundReactor:
    """The reactor, except that every TCP connection it opens binds ``source``: how the
    product's own client library is made to dial from a chosen loopback address."""

    def __init__(self, reactor: Any, source: str) -> None:
        self._reactor = reactor
        self._source = source
        directlyProvides(self, providedBy(reactor))

    def connectTCP(
        self,
        host: str,
        port: int,
        factory: Any,
        timeout: float = 30.0,
        bindAddress: Any = None,
    ) -> Any:
        return self._reactor.connectTCP(host, port, factory, timeout, (self._source, 0))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reactor, name)


@attrs.frozen
class Answer:
    status: int | None  # None: no HTTP answer (refused, reset, timed out)
    latency_s: float
    retry_after: str | None = None
    error: str | None = None


async def http_request(
    reactor: Any,
    url: str,
    source: str,
    *,
    method: bytes = b"GET",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> Answer:
    """One request on a fresh connection from ``source``; never raises."""
    agent = Agent(reactor, connectTimeout=timeout_s, bindAddress=(source, 0))
    raw = Headers({k.encode(): [v.encode()] for k, v in (headers or {}).items()})
    producer = FileBodyProducer(BytesIO(body)) if body else None
    started = now()
    try:
        d = agent.request(method, url.encode(), raw, producer)
        d.addTimeout(timeout_s, reactor)
        response = await d
        rest = readBody(response)
        rest.addTimeout(max(0.1, timeout_s - (now() - started)), reactor)
        await rest
    except Exception as exc:
        return Answer(None, now() - started, error=f"{type(exc).__name__}: {exc}"[:70])
    retry = response.headers.getRawHeaders(b"retry-after")
    return Answer(response.code, now() - started, retry[0].decode() if retry else None)


class Everyone:
    """A status prober and, through the client library, an echo listener and its caller."""

    def __init__(self, reactor: Any, url: RelayUrl, listener: Identity, caller: Identity) -> None:
        self.reactor = reactor
        self.url = url
        self.listener_id = listener
        self.caller_id = caller
        self.listen_env = loadgen.Env(SourceBoundReactor(reactor, LISTENER_SOURCE), url, None)
        self.call_env = loadgen.Env(SourceBoundReactor(reactor, CALLER_SOURCE), url, None)
        self.listener: loadgen.EchoListener | None = None
        self.target: loadgen.Target | None = None

    async def setup(self) -> None:
        api = RelayApi(self.reactor, self.url, self.caller_id.credentials)
        keys = await api.get_keys(self.listener_id.handle)
        self.target = loadgen.Target(self.listener_id, keys)

    async def ensure_listener(self) -> str | None:
        """(Re)connect the echo listener if it is not connected; an error text or None."""
        if self.listener is not None and self.listener.closed is None:
            return None
        listener = loadgen.EchoListener(
            self.listen_env, self.listener_id, {self.caller_id.handle: self.caller_id}
        )
        d = defer.ensureDeferred(listener.start())
        d.addTimeout(CALL_TIMEOUT_S, self.reactor)
        try:
            await d
        except Exception as exc:
            return f"listener: {type(exc).__name__}"
        self.listener = listener
        return None

    async def probe_status(self, count: int, budget_s: float) -> dict[str, Any]:
        """Up to ``count`` GET /v1/status one after another, within ``budget_s``."""
        answers: list[Answer] = []
        deadline = now() + budget_s
        while len(answers) < count and now() < deadline:
            timeout = min(PROBE_TIMEOUT_S, max(0.2, deadline - now()))
            answers.append(
                await http_request(
                    self.reactor, self.url.http("/v1/status"), PROBE_SOURCE, timeout_s=timeout
                )
            )
        ok = [a.latency_s for a in answers if a.status == 200]
        return {
            "probes": len(answers),
            "ok": len(ok),
            "failed": len(answers) - len(ok),
            "failures": dict(Counter(a.error or str(a.status) for a in answers if a.status != 200)),
            "ok_latency_ms": _spread(sorted(ok), scale=1000.0),
        }

    async def call(self) -> dict[str, Any]:
        """One real call, sealed and opened with the client library; bounded in time."""
        started = now()
        problem = await self.ensure_listener()
        if problem is not None:
            return {"ok": False, "error": problem, "s": round(now() - started, 3)}
        assert self.target is not None
        d = defer.ensureDeferred(
            loadgen.one_call(self.call_env, self.caller_id, self.target, "still there?")
        )
        d.addTimeout(max(0.5, CALL_TIMEOUT_S - (now() - started)), self.reactor)
        try:
            await d
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:100]}
        return {"ok": True, "s": round(now() - started, 3)}


# --- phases --------------------------------------------------------------------------------------


async def flood_phase(
    reactor: Any,
    relay: relayproc.Relay,
    port: int,
    everyone: Everyone,
    args: argparse.Namespace,
    kind: type[_Attacker],
    sources: Sequence[str],
) -> dict[str, Any]:
    """Open the flood, measure everyone else during it, wait (bounded) for the relay to cut it."""
    crowd = Crowd(reactor, port, kind, kind.__name__)
    started = now()
    await crowd.launch(sources, args.flood)
    launched = now()
    relay_fds = relayproc.proc_fd_count(relay.pid)
    probes_d = defer.ensureDeferred(everyone.probe_status(args.probes, args.probe_budget))
    call_d = defer.ensureDeferred(everyone.call())
    during = await probes_d
    during["call"] = await call_d
    # A kept-alive flood is never cut (it keeps asking); it is held only while measured.
    hold = 0.0 if kind is KeptAlive else args.cut_budget
    all_cut = await crowd.wait_all_closed(launched + hold)
    left = crowd.open_count()
    crowd.abort_all()
    await crowd.wait_all_closed(now() + 5.0)
    result = crowd.summary()
    result.update(
        {
            "launch_s": round(launched - started, 2),
            "relay_fds_during": relay_fds,
            "during": during,
            "all_cut_within_budget": all_cut,
            "still_open_at_budget": left,
            "cut_budget_s": hold,
        }
    )
    await settle(reactor, relay)
    result["after"] = await everyone.probe_status(3, 6.0)
    return result


async def trickle_phase(
    reactor: Any, relay: relayproc.Relay, port: int, args: argparse.Namespace
) -> dict[str, Any]:
    checkpoints = args.trickle_checkpoints
    Trickle.max_lines = int(checkpoints[-1] / Trickle.interval_s) + 2
    crowd = Crowd(reactor, port, Trickle, "trickle")
    started = now()
    await crowd.launch(TRICKLE_SOURCES, args.trickle)
    launched = now() - started
    open_at: dict[str, int] = {}
    for at in checkpoints:
        await loadgen.sleep(reactor, max(0.0, started + at - now()))
        open_at[f"{at:g}s"] = crowd.open_count()
    crowd.abort_all()
    await crowd.wait_all_closed(now() + 5.0)
    result = crowd.summary()
    result.update(
        {"line_every_s": Trickle.interval_s, "open_at": open_at, "launch_s": round(launched, 2)}
    )
    await settle(reactor, relay)
    return result


async def guessing_phase(reactor: Any, url: RelayUrl, args: argparse.Namespace) -> dict[str, Any]:
    """Bad bearer tokens, then bad invites, one request at a time from one source."""
    result: dict[str, Any] = {"source": GUESS_SOURCE}
    deadline = now() + args.guess_budget
    kinds: list[tuple[str, Callable[[int], tuple[bytes, str, dict[str, str], bytes | None]]]] = [
        (
            "bad_token",
            lambda _n: (
                b"GET",
                "/v1/me",
                {
                    "Authorization": f"Bearer {secrets.token_urlsafe(32)}",
                    "X-AgentCall-Org": ORG,
                    "X-AgentCall-Handle": "lis-0000",
                },
                None,
            ),
        ),
        (
            "bad_invite",
            lambda n: (
                b"POST",
                "/v1/register",
                {"Content-Type": "application/json"},
                json.dumps(
                    {"org": ORG, "invite": secrets.token_urlsafe(32), "handle": f"guess{n:04d}"}
                ).encode(),
            ),
        ),
    ]
    for name, build in kinds:
        statuses: Counter[str] = Counter()
        retry_after: Counter[str] = Counter()
        first_429: int | None = None
        started = now()
        for n in range(args.guesses):
            if now() > deadline:
                break
            method, path, headers, body = build(n)
            answer = await http_request(
                reactor, url.http(path), GUESS_SOURCE, method=method, headers=headers, body=body
            )
            statuses[str(answer.status or answer.error)] += 1
            if answer.status == 429 and first_429 is None:
                first_429 = n + 1
            if answer.retry_after is not None:
                retry_after[answer.retry_after] += 1
        result[name] = {
            "requests": sum(statuses.values()),
            "statuses": dict(statuses),
            "first_429_at": first_429,
            "retry_after_s": dict(retry_after),
            "elapsed_s": round(now() - started, 2),
        }
    return result


async def settle(reactor: Any, relay: relayproc.Relay, budget_s: float = 5.0) -> None:
    """Wait (bounded) until the relay has closed what the last phase left it holding."""
    deadline = now() + budget_s
    while now() < deadline and relayproc.proc_fd_count(relay.pid) > SETTLED_FDS:
        await loadgen.sleep(reactor, 0.1)


# --- one relay -----------------------------------------------------------------------------------


RELAYS: list[relayproc.Relay] = []


async def measure(reactor: Any, checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="agentcall-flood-"))
    port = relayproc.free_port()
    url = RelayUrl.parse(f"http://{RELAY_HOST}:{port}")
    database = workdir / "relay.sqlite"
    listener, caller = seed_identities(database, ORG, url.origin, ["lis-0000", "cal-0000"])
    twistd = [str(relayproc.BIN / "twistd"), "-n", "--pidfile=", "--logfile=-", "agentcall-relay"]
    relay_args = ["--database", str(database), "--listen", f"tcp:{port}:interface={RELAY_HOST}"]
    relay_args += ["--url", str(url), "--calls-per-hour", "1000"]
    limit = f"ulimit -n {OPEN_FILES} && exec " + '"$@"'
    relay = relayproc.Relay(
        ["sh", "-c", limit, "sh", *twistd, *relay_args], workdir, checkout=checkout
    )
    RELAYS.append(relay)
    result: dict[str, Any] = {"checkout": relayproc.checkout_facts(checkout)}
    label = (result["checkout"]["commit"] or str(checkout))[:12]
    try:
        if relay.wait_ready(30.0) != port:
            raise BenchError("the relay listens on another port")
        result["relay_open_files"] = _open_file_limit(relay.pid)
        result["relay_fds_idle"] = relayproc.proc_fd_count(relay.pid)
        everyone = Everyone(reactor, url, listener, caller)
        await everyone.setup()
        problem = await everyone.ensure_listener()
        if problem is not None:
            raise BenchError(problem)
        result["before"] = await everyone.probe_status(3, 6.0)
        result["before"]["call"] = await everyone.call()
        floods: list[tuple[str, type[_Attacker], Sequence[str]]] = [
            ("idle_one_source", IdleHead, ("127.0.0.1",)),
            ("idle_spread", IdleHead, SPREAD_SOURCES),
            ("kept_alive_spread", KeptAlive, SPREAD_SOURCES),
        ]
        for name, kind, sources in floods:
            say(f"[{label}] flood {name}: {args.flood} connections")
            result[name] = await flood_phase(reactor, relay, port, everyone, args, kind, sources)
            if not relay.alive():
                raise BenchError(f"the relay exited during {name}")
        say(f"[{label}] trickle: {args.trickle} connections")
        result["trickle"] = await trickle_phase(reactor, relay, port, args)
        say(f"[{label}] guessing: {args.guesses} bad tokens, {args.guesses} bad invites")
        result["guessing"] = await guessing_phase(reactor, url, args)
        if everyone.listener is not None and everyone.listener.socket is not None:
            everyone.listener.socket.close()
    finally:
        result["relay_exit_code"] = relay.stop()
        result["relay_log"] = _log_facts(relay)
        result["audit"] = _audit(database)
        if args.keep_workdir:
            say(f"[{label}] work dir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def _open_file_limit(pid: int) -> int | None:
    with open(f"/proc/{pid}/limits", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    return None


_REFUSALS = re.compile(r"front_door_refusals ([^\n]*)")
_FIELD = re.compile(r"(\w+)=(\d+)")


def _log_facts(relay: relayproc.Relay) -> dict[str, Any]:
    text = relay._read_log()
    refusals: Counter[str] = Counter()
    for match in _REFUSALS.finditer(text):
        for key, value in _FIELD.findall(match.group(1)):
            if key not in ("open_connections", "in_head"):
                refusals[key] += int(value)
    return {
        "front_door_refusals": dict(refusals),
        "emfile_lines": len(re.findall(r"EMFILE|Too many open files", text)),
        "lines": text.count("\n"),
    }


def _audit(database: Path) -> dict[str, Any]:
    try:
        db = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return {"error": str(exc)}
    try:
        events = dict(db.execute("SELECT event, count(*) FROM audit GROUP BY event").fetchall())
        rows = db.execute(
            "SELECT at, org, actor, target, call_id, detail FROM audit"
            " WHERE event = 'auth.failed' ORDER BY id"
        ).fetchall()
    except sqlite3.Error as exc:
        return {"error": str(exc)}
    finally:
        db.close()
    keys = ("at", "org", "actor", "target", "call_id", "detail")
    return {"events": events, "auth_failed": [dict(zip(keys, r, strict=True)) for r in rows]}


# --- options, main, report -----------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="flood_bench.py",
        description="Replay the issue 7 floods and guessing against a real relay on loopback.",
    )
    p.add_argument(
        "--checkout",
        type=Path,
        action="append",
        metavar="DIR",
        help="a checkout whose relay is measured; repeat to compare (default: this one)",
    )
    p.add_argument("--quick", action="store_true", help="smaller numbers: about 1 min a relay")
    p.add_argument("--flood", type=int, default=1100, help="connections per flood (1100)")
    p.add_argument("--probes", type=int, help="status probes during a flood (20; quick 8)")
    p.add_argument("--trickle", type=int, help="trickling connections (300; quick 120)")
    p.add_argument("--guesses", type=int, help="bad tokens, and bad invites (300 each; quick 100)")
    p.add_argument(
        "--cut-budget", type=float, default=14.0, help="seconds a flood may stay once open (14)"
    )
    p.add_argument("--results-dir", type=Path, default=BENCH / "results")
    p.add_argument("--keep-workdir", action="store_true", help="keep the temp dirs (db, log)")
    args = p.parse_args(argv)
    quick = {"probes": 8, "trickle": 120, "guesses": 100}
    full = {"probes": 20, "trickle": 300, "guesses": 300}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.trickle_checkpoints = (5.0, 12.0) if args.quick else (5.0, 12.0, 20.0)
    args.probe_budget = 8.0
    args.guess_budget = 60.0
    args.checkout = [c.resolve() for c in (args.checkout or [REPO])]
    if not 1 <= args.flood <= 5000 or not 1 <= args.trickle <= 5 * 64 * len(TRICKLE_SOURCES):
        p.error("--flood must be 1..5000 and --trickle 1..3200")
    if not 1 <= args.probes <= 200 or not 1 <= args.guesses <= 2000:
        p.error("--probes must be 1..200 and --guesses 1..2000")
    if not 1.0 <= args.cut_budget <= 60.0:
        p.error("--cut-budget must be 1..60")
    for checkout in args.checkout:
        if not (checkout / "twisted" / "plugins" / "agentcall_plugins.py").is_file():
            p.error(f"{checkout} is not an AgentCall checkout")
    return args


def say(text: str) -> None:
    print(f"  · {text}", flush=True)


def run_reactor(reactor: Any, work: Callable[[], Any]) -> Any:
    """Run ``work()`` on the reactor; its result, or re-raise its failure; Ctrl-C stops."""
    box: dict[str, Any] = {}

    def finished(result: object) -> None:
        box["result"] = result
        reactor.stop()

    reactor.callWhenRunning(lambda: defer.ensureDeferred(work()).addBoth(finished))
    reactor.run()
    if "result" not in box:
        raise KeyboardInterrupt
    outcome = box["result"]
    if isinstance(outcome, Failure):
        outcome.raiseException()
    return outcome


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm)
    # twisted.web warns about its own response transport when a body read is given a timeout.
    warnings.filterwarnings("ignore", "Using readBody with a transport", DeprecationWarning)
    from twisted.internet import reactor

    soft, _hard = relayproc.raise_nofile_limit()
    if soft < args.flood + args.trickle + 200:
        print(f"the bench needs {args.flood + args.trickle + 200} file descriptors; it has {soft}")
        return 2
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    machine = relayproc.machine_facts()
    print(f"AgentCall relay flood benchmark ({'quick' if args.quick else 'full'}) {stamp}")
    print(f"  {machine['cpu_model']} · {machine['cores']} cores · Python {machine['python']}")
    result: dict[str, Any] = {
        "timestamp": stamp,
        "quick": args.quick,
        "machine": machine,
        "bench_checkout": relayproc.checkout_facts(),
        "options": {
            "open_files": OPEN_FILES,
            "flood": args.flood,
            "probes": args.probes,
            "trickle": args.trickle,
            "trickle_checkpoints_s": list(args.trickle_checkpoints),
            "guesses": args.guesses,
            "cut_budget_s": args.cut_budget,
        },
        "runs": [],
    }

    async def work() -> None:
        for checkout in args.checkout:
            result["runs"].append(await measure(reactor, checkout, args))

    status = 1
    try:
        run_reactor(reactor, work)
        status = 0
    except KeyboardInterrupt:
        print("\ninterrupted")
        status = 130
    except BenchError as exc:
        print(f"bench failed: {exc}")
    finally:
        for relay in RELAYS:
            relay.stop()
    if status == 0:
        print(report(result))
        args.results_dir.mkdir(parents=True, exist_ok=True)
        out = args.results_dir / f"flood-{stamp}.json"
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"results: {out}")
    return status


def _spread(values: Sequence[float], scale: float = 1.0) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "min": round(values[0] * scale, 2),
        "median": round(statistics.median(values) * scale, 2),
        "max": round(values[-1] * scale, 2),
    }


def report(result: dict[str, Any]) -> str:
    lines = []
    for run in result["runs"]:
        commit = (run["checkout"]["commit"] or "?")[:12]
        dirty = " (modified)" if run["checkout"]["modified_files"] else ""
        lines.append(
            f"relay {commit}{dirty}: open files {run['relay_open_files']},"
            f" {run['relay_fds_idle']} in use idle"
        )
        lines.append(f"  before   : {_probe_line(run['before'])}")
        for name in ("idle_one_source", "idle_spread", "kept_alive_spread"):
            f = run[name]
            cut = f["cut_s"]
            cut_text = "none cut" if cut is None else f"cut after {cut['min']}-{cut['max']} s"
            lines.append(
                f"  {name}: {f['attempted']} from {f['sources']} source(s): accepted"
                f" {f['accepted']}, refused at once {f['refused_at_once']}, connect failed"
                f" {f['connect_failed']}; relay fds {f['relay_fds_during']}; {cut_text}"
                f" ({f['cut_by_relay']} by the relay, {f['still_open_at_budget']} left at"
                f" {f['cut_budget_s']:g} s)"
            )
            lines.append(f"    during: {_probe_line(f['during'])}")
            lines.append(f"    after : {_probe_line(f['after'])}")
        t = run["trickle"]
        opened = ", ".join(f"{k} {v}" for k, v in t["open_at"].items())
        lines.append(
            f"  trickle: {t['attempted']} from {t['sources']} sources, accepted {t['accepted']},"
            f" refused at once {t['refused_at_once']}; open at {opened} after the first dial"
            f" (dialling took {t['launch_s']} s); cut {t['cut_s'] or '-'} s after opening"
        )
        g = run["guessing"]
        for name in ("bad_token", "bad_invite"):
            k = g[name]
            lines.append(
                f"  {name}: {k['requests']} in {k['elapsed_s']} s: {k['statuses']};"
                f" first 429 at #{k['first_429_at']}; Retry-After {k['retry_after_s']}"
            )
        audit = run["audit"]
        rows = audit.get("auth_failed", [])
        lines.append(
            f"  audit: {len(rows)} auth.failed row(s)"
            + "".join(f"; {r['target']}: {r['detail']}" for r in rows[:3])
        )
        logs = run["relay_log"]
        lines.append(
            f"  relay log: refusals {logs['front_door_refusals'] or '-'},"
            f" EMFILE lines {logs['emfile_lines']}"
        )
    return "\n".join(lines)


def _probe_line(p: dict[str, Any]) -> str:
    lat = p["ok_latency_ms"]
    text = f"status {p['ok']}/{p['probes']} ok"
    if lat:
        text += f" ({lat['median']} ms median, {lat['max']} max)"
    if p["failures"]:
        text += f", failures {p['failures']}"
    call = p.get("call")
    if call is not None:
        text += f"; call {'ok in ' + str(call['s']) + ' s' if call['ok'] else call['error']}"
    return text


if __name__ == "__main__":
    sys.exit(main())
