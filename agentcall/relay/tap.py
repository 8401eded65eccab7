"""``twistd agentcall-relay``: parse options, compose the relay's services. Nothing else."""

from __future__ import annotations

import json
import os
import resource as rlimits
import sys
from typing import TYPE_CHECKING, Any

from twisted.application import internet, service
from twisted.internet import endpoints
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IListeningPort
from twisted.python import usage

from agentcall import limits
from agentcall.atomicfile import replace_file
from agentcall.logevents import Logger, configure_from_environ
from agentcall.sdnotify import notify

if TYPE_CHECKING:
    from agentcall.relay.composition import RelaySettings

_log = Logger(namespace="agentcall.relay")

# The largest per-callee mailbox caps an operator may set (a sanity bound, not a product number).
MAILBOX_MAX_QUEUED_OPTION = 100_000
MAILBOX_MAX_BYTES_OPTION = 64 * 1024**3
MAILBOX_MAX_TOTAL_BYTES_OPTION = 64 * 1024**4
# The accept queue asked of the kernel for tcp: and ssl: endpoints that name none (Twisted's own
# default is 50; the kernel caps it at net.core.somaxconn). While the front door holds accepting
# at its handshake cap, a reconnecting crowd waits there at no cost to the relay; with 50 places
# most of it would have its SYNs dropped and retried by TCP, and time out.
LISTEN_BACKLOG = 1024


class Options(usage.Options):
    synopsis = "--database FILE --listen ENDPOINT --url PUBLIC_URL [options]"
    longdesc = (
        "Run an AgentCall relay: enrolment by one-time invite, published keys, presence, and "
        "routing of end-to-end encrypted calls between identities of one organisation. The "
        "relay sees routing metadata only, never a prompt or a reply. Create the database and "
        "the first admin invite with `agentcall relay bootstrap` first. Logs one info line per "
        "call; AGENTCALL_LOG_LEVEL=debug (or warn, error) changes that."
    )
    optFlags = [
        [
            "no-accept-hold",
            None,
            "At the --max-handshakes cap let every newcomer evict the oldest connection in "
            "head at once, instead of holding the port's accept until a place is free or the "
            "--handshake-grace has passed.",
        ],
    ]
    optParameters = [
        [
            "metrics",
            None,
            None,
            "Serve Prometheus metrics at /metrics on this Twisted endpoint, apart from the "
            "relay's own, e.g. tcp:9464:interface=127.0.0.1 (keep it on loopback or a "
            "private network: it needs no credentials). Off unless given.",
        ],
        [
            "log-format",
            None,
            "text",
            "text (the default, for a terminal) or json: one JSON object per line (ts, level, "
            "event, then its fields) on stdout, for the journal and log shippers.",
        ],
        [
            "database",
            "d",
            None,
            "SQLite file holding the relay's state (see `agentcall relay bootstrap`).",
        ],
        [
            "listen",
            "l",
            "tcp:8765:interface=127.0.0.1",
            "Twisted server endpoint string, e.g. tcp:8765:interface=127.0.0.1 or "
            "ssl:8443:privateKey=key.pem:certKey=cert.pem. A tcp: or ssl: endpoint without "
            f"backlog= gets backlog={LISTEN_BACKLOG} (the kernel caps it at somaxconn).",
        ],
        [
            "url",
            "u",
            None,
            "Public URL clients use to reach this relay (https://..., or http:// on loopback).",
        ],
        [
            "call-deadline",
            None,
            str(int(limits.CALL_DEADLINE_S)),
            "Seconds a call may take end to end before the caller gets `timeout` (1-360).",
        ],
        [
            "calls-per-hour",
            None,
            str(limits.CALLS_PER_HOUR_PER_PAIR),
            "Calls one identity may place to one other identity per sliding hour (1-1000).",
        ],
        ["ready-file", None, None, 'Write {"url", "port"} as JSON here once listening.'],
        [
            "head-timeout",
            None,
            f"{limits.HEAD_TIMEOUT_S:g}",
            "Seconds a client has to send a whole request head and body; bytes trickled in "
            "do not extend it (0.1-120).",
        ],
        [
            "call-request-timeout",
            None,
            f"{limits.CALL_REQUEST_TIMEOUT_S:g}",
            "Seconds a caller socket has, after `ready`, to send its call_request (0.1-120).",
        ],
        [
            "max-per-source",
            None,
            str(limits.MAX_CONNECTIONS_PER_SOURCE),
            "Open connections one source address may hold; more are closed at once (1-100000).",
        ],
        [
            "max-callers-per-identity",
            None,
            str(limits.MAX_CALLERS_PER_IDENTITY),
            "Caller sockets one identity may hold at once (1-10000).",
        ],
        [
            "max-handshakes",
            None,
            str(limits.MAX_CONNECTIONS_IN_HEAD),
            "Connections that may be sending their first request head or WebSocket upgrade "
            "at once; at the cap the relay stops accepting for up to --handshake-grace, then a "
            "newcomer evicts the oldest of them. A connection the relay accepted is never "
            "closed for this cap (1-100000).",
        ],
        [
            "handshake-grace",
            None,
            f"{limits.HEAD_EVICT_AFTER_S:g}",
            "Seconds a connection may spend on its first head before a newcomer at the "
            "--max-handshakes cap evicts it; until then the relay stops accepting (newcomers "
            "wait in the kernel's accept queue, at no cost to the relay) until a place is free "
            "or the grace has passed, so a reconnecting crowd is neither evicted half way "
            "through TLS nor turned away (0-60).",
        ],
        [
            "max-upgrades",
            None,
            str(limits.MAX_UPGRADES_IN_FLIGHT),
            "WebSocket upgrades whose credentials may be checked at once; more are answered 503 "
            f"with a Retry-After of {limits.UPGRADE_RETRY_MIN_S}-{limits.UPGRADE_RETRY_MAX_S} s, "
            "spread at random, before any lookup (1-100000).",
        ],
        [
            "max-connections",
            None,
            "auto",
            "Open connections in total; `auto` is the open-file limit minus --fd-reserve. At "
            "the cap a newcomer evicts the oldest plain HTTP connection.",
        ],
        [
            "fd-reserve",
            None,
            str(limits.FD_RESERVE),
            "File descriptors kept free under the open-file limit so the relay can always "
            "accept and refuse (16-10000).",
        ],
        [
            "register-per-minute",
            None,
            str(limits.REGISTER_PER_MINUTE),
            "Registration attempts per source address per minute before 429 (1-10000).",
        ],
        [
            "mailbox-max-queued",
            None,
            str(limits.MAILBOX_MAX_QUEUED_PER_CALLEE),
            "Calls the offline mailbox keeps waiting for one callee at most; more are refused "
            f"busy (1-{MAILBOX_MAX_QUEUED_OPTION}).",
        ],
        [
            "mailbox-max-bytes",
            None,
            str(limits.MAILBOX_MAX_QUEUED_BYTES_PER_CALLEE),
            "Bytes of sealed requests the offline mailbox keeps for one callee at most; at least "
            f"one largest request ({limits.MAX_REQUEST_FRAME_BYTES}) and at most "
            f"{MAILBOX_MAX_BYTES_OPTION}.",
        ],
        [
            "mailbox-max-total-bytes",
            None,
            None,  # the default is the mailbox's own (MAX_HELD_BYTES_TOTAL, 1 GiB)
            "Bytes of sealed requests and answers the offline mailbox keeps for every callee "
            "together, so that many full mailboxes cannot fill the disk (default 1 GiB; at "
            f"least one largest request ({limits.MAX_REQUEST_FRAME_BYTES}) and at most "
            f"{MAILBOX_MAX_TOTAL_BYTES_OPTION}). Past it a call that would be queued (its callee "
            "offline or busy) is refused `busy`, saying the relay's mailbox storage is full, "
            "and nothing already kept is dropped.",
        ],
        [
            "audit-retention-days",
            None,
            str(limits.AUDIT_RETENTION_DAYS),
            "Days the relay keeps audit rows and ended (used, revoked, expired) invites; older "
            "ones are pruned at start and then daily, except what a legal hold covers "
            f"(`agentcall audit hold`) (1-{limits.AUDIT_RETENTION_MAX_DAYS}).",
        ],
        [
            "auth-failures-per-minute",
            None,
            str(limits.AUTH_FAILURES_PER_MINUTE),
            "Failed authentications per source address per minute before 429 (1-10000).",
        ],
    ]

    def postOptions(self) -> None:
        from agentcall.logevents import use_log_format
        from agentcall.relayurl import RelayUrl

        use_log_format(self, self["log-format"])
        if not self["database"]:
            raise usage.UsageError("--database FILE is required")
        if not self["url"]:
            raise usage.UsageError("--url PUBLIC_URL is required")
        try:
            self["relay_url"] = RelayUrl.parse(self["url"])
        except ValueError as exc:
            raise usage.UsageError(f"--url: {exc}") from exc
        self["call-deadline"] = _bounded(self["call-deadline"], "--call-deadline", 1, 360, float)
        self["calls-per-hour"] = _bounded(self["calls-per-hour"], "--calls-per-hour", 1, 1000, int)
        self["door"] = _door_config(self, _open_file_limit())
        self["mailbox-max-queued"] = _bounded(
            self["mailbox-max-queued"], "--mailbox-max-queued", 1, MAILBOX_MAX_QUEUED_OPTION, int
        )
        # A cap below one largest request would refuse every big call as too large, forever.
        self["mailbox-max-bytes"] = _bounded(
            self["mailbox-max-bytes"],
            "--mailbox-max-bytes",
            limits.MAX_REQUEST_FRAME_BYTES,
            MAILBOX_MAX_BYTES_OPTION,
            int,
        )
        total_bytes = self["mailbox-max-total-bytes"]
        self["mailbox-max-total-bytes"] = _bounded(
            str(_default_total_bytes()) if total_bytes is None else total_bytes,
            "--mailbox-max-total-bytes",
            limits.MAX_REQUEST_FRAME_BYTES,
            MAILBOX_MAX_TOTAL_BYTES_OPTION,
            int,
        )
        self["audit-retention-days"] = _bounded(
            self["audit-retention-days"],
            "--audit-retention-days",
            1,
            limits.AUDIT_RETENTION_MAX_DAYS,
            int,
        )


def _default_total_bytes() -> int:
    # Imported late, as the rest of the relay is, so that --help does not load the mailbox.
    from agentcall.relay.mailbox import MAX_HELD_BYTES_TOTAL

    return MAX_HELD_BYTES_TOTAL


def _open_file_limit() -> int:
    soft, _hard = rlimits.getrlimit(rlimits.RLIMIT_NOFILE)
    # RLIM_INFINITY: fall back to a number the kernel could really hand out.
    return soft if soft != rlimits.RLIM_INFINITY else 1_048_576


def _door_config(options: usage.Options, open_file_limit: int) -> Any:
    from agentcall.relay.door import DoorConfig
    from agentcall.relay.gate import GateLimits, total_cap

    reserve = _bounded(options["fd-reserve"], "--fd-reserve", 16, 10_000, int)
    if options["max-connections"] == "auto":
        try:
            total = total_cap(open_file_limit, reserve)
        except ValueError as exc:
            raise usage.UsageError(str(exc)) from exc
    else:
        total = _bounded(options["max-connections"], "--max-connections", 1, 10_000_000, int)
        if total > open_file_limit - reserve:
            raise usage.UsageError(
                f"--max-connections {total} does not fit under the open-file limit "
                f"{open_file_limit} minus --fd-reserve {reserve}; raise LimitNOFILE (ulimit -n)"
            )
    caps = GateLimits(
        per_source=_bounded(options["max-per-source"], "--max-per-source", 1, 100_000, int),
        total=total,
        handshakes=_bounded(options["max-handshakes"], "--max-handshakes", 1, 100_000, int),
        upgrades=_bounded(options["max-upgrades"], "--max-upgrades", 1, 100_000, int),
        head_grace_s=_bounded(options["handshake-grace"], "--handshake-grace", 0, 60, float),
        callers_per_identity=_bounded(
            options["max-callers-per-identity"], "--max-callers-per-identity", 1, 10_000, int
        ),
    )
    return DoorConfig(
        caps=caps,
        head_timeout_s=_bounded(options["head-timeout"], "--head-timeout", 0.1, 120, float),
        call_request_timeout_s=_bounded(
            options["call-request-timeout"], "--call-request-timeout", 0.1, 120, float
        ),
        register_per_minute=_bounded(
            options["register-per-minute"], "--register-per-minute", 1, 10_000, int
        ),
        auth_failures_per_minute=_bounded(
            options["auth-failures-per-minute"], "--auth-failures-per-minute", 1, 10_000, int
        ),
        hold_accept=not options["no-accept-hold"],
    )


def _bounded(value: str, name: str, lo: float, hi: float, kind: type[Any]) -> Any:
    try:
        number = kind(value)
    except ValueError as exc:
        raise usage.UsageError(f"{name} must be a number") from exc
    if not lo <= number <= hi:
        # Whole numbers in full: "68719476736", not "6.87195e+10".
        low, high = (int(lo), int(hi)) if kind is int else (f"{lo:g}", f"{hi:g}")
        raise usage.UsageError(f"{name} must be between {low} and {high}")
    return number


def with_backlog(description: str, backlog: int = LISTEN_BACKLOG) -> str:
    """``description`` with ``:backlog=N`` added when it is a tcp: or ssl: endpoint naming none."""
    kind, _, rest = description.partition(":")
    if kind not in ("tcp", "ssl") or not rest:
        return description
    if any(part.startswith("backlog=") for part in rest.split(":")):
        return description
    return f"{description}:backlog={backlog}"


class ListeningService(service.Service):
    """Listen on an endpoint; once bound, log it and optionally write a ready file."""

    def __init__(
        self,
        reactor: Any,
        description: str,
        site: Any,
        ready_file: str | None,
        after: Deferred[None] | None = None,
        valve: Any = None,
    ) -> None:
        self._reactor = reactor
        # Told the port once bound, so it can stop accepting at the handshake cap
        # (agentcall.relay.door.AcceptValve), and to let go of it before it closes.
        self._valve = valve
        # Listening waits for this (the relay's rate windows, read from the store).
        self._after = after if after is not None else succeed(None)
        self._description = description
        self._site = site
        self._ready_file = ready_file
        self._port: IListeningPort | None = None

    def startService(self) -> None:
        super().startService()
        endpoint = endpoints.serverFromString(self._reactor, with_backlog(self._description))
        d = self._after.addCallback(lambda _: endpoint.listen(self._site))
        d.addCallback(self._bound)
        d.addErrback(self._failed)

    def _bound(self, port: IListeningPort) -> None:
        self._port = port
        if self._valve is not None:
            self._valve.attach(port)
        number = port.getHost().port  # type: ignore[attr-defined]
        _log.info("relay_listening", port=number)
        # Listening, with the database open and the rate windows read from it: ready.
        problem = notify({"READY": "1", "STATUS": f"listening on port {number}"})
        if problem is not None:
            _log.warn("service_manager_not_told", reason=problem)
        if self._ready_file:
            ready = json.dumps({"port": number, "pid": os.getpid()}).encode("utf-8")
            # Readers poll for this file, so they must never see it half written.
            replace_file(self._ready_file, ready, mode=0o644, durable=False)

    def _failed(self, failure: Any) -> None:
        _log.failure("relay_listen_failed", failure=failure)
        # A relay that cannot listen must not linger: the bind usually fails before the
        # reactor runs, where stop() would do nothing. Exit 1 once it is down, so a supervisor
        # sees a failure and may retry (twistd itself would exit 0).
        self._reactor.addSystemEventTrigger("after", "shutdown", _exit_failed)
        self._reactor.callWhenRunning(self._reactor.stop)

    def stopService(self) -> Any:
        super().stopService()
        notify({"STOPPING": "1"})
        if self._valve is not None:
            self._valve.detach()
        if self._port is not None:
            return self._port.stopListening()
        return None


def settings_from(config: Options) -> RelaySettings:
    """The checked options as the one frozen value a relay is composed from."""
    from agentcall.relay.composition import RelaySettings
    from agentcall.relay.mailbox import MailboxLimits

    relay_url = config["relay_url"]
    return RelaySettings(
        relay_origin=relay_url.origin,
        ws_url=relay_url.ws(""),
        public_url=config["url"],
        call_deadline_s=config["call-deadline"],
        calls_per_hour=config["calls-per-hour"],
        door=config["door"],
        mailbox=MailboxLimits(
            max_queued_per_callee=config["mailbox-max-queued"],
            max_queued_bytes_per_callee=config["mailbox-max-bytes"],
            max_held_bytes_total=config["mailbox-max-total-bytes"],
        ),
        audit_retention_days=config["audit-retention-days"],
    )


def _exit_failed() -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(1)


def makeService(config: Options, reactor: Any = None) -> service.IService:
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = global_reactor
    from agentcall.errors import StoreError
    from agentcall.logevents import quiet_factories
    from agentcall.relay.composition import compose

    quiet_factories()
    from agentcall.relay.store import open_relay_store

    try:
        configure_from_environ()
    except ValueError as exc:
        raise SystemExit(f"agentcall-relay: {exc}") from None
    settings = settings_from(config)
    try:
        store = open_relay_store(config["database"])
    except StoreError as exc:
        # twistd prints this and exits non-zero before anything is started.
        raise SystemExit(f"agentcall-relay: {exc}") from None
    kept: list[Any] = []

    def prometheus(switchboard: Any) -> Any:
        from agentcall.relay.metrics import PrometheusMetrics

        kept.append(PrometheusMetrics(switchboard.count))
        return kept[-1]

    relay = compose(settings, store, reactor, metrics=prometheus if config["metrics"] else None)

    top = service.MultiService()
    # First in, so last to stop: it writes what the services stopped after it still recorded.
    _AuditFlush(relay.audit).setServiceParent(top)
    _SeenFlush(relay.seen).setServiceParent(top)
    ListeningService(
        reactor,
        config["listen"],
        relay.factory,
        config["ready-file"],
        relay.windows_restored,
        valve=relay.door.valve,
    ).setServiceParent(top)
    internet.TimerService(600, lambda: _prune(relay.limiter, reactor)).setServiceParent(top)
    _DoorFlush(relay.door).setServiceParent(top)
    # A pass at start, then daily; the next waits for the last (run_logged never fails).
    internet.TimerService(limits.RETENTION_EVERY_S, relay.retention.run_logged).setServiceParent(
        top
    )
    _MailboxTimers(relay.jobs, relay.storage).setServiceParent(top)
    if kept:
        from twisted.application import strports

        from agentcall.relay.metrics import metrics_site

        # Apart from the relay's own endpoint: scraped by the operator's monitoring only.
        strports.service(config["metrics"], metrics_site(kept[0])).setServiceParent(top)
    caps = settings.door.caps
    _log.info(
        "relay_configured",
        relay_origin=settings.relay_origin,
        deadline_s=settings.call_deadline_s,
        max_connections=caps.total,
        max_per_source=caps.per_source,
        max_handshakes=caps.handshakes,
        max_upgrades=caps.upgrades,
        handshake_grace_s=caps.head_grace_s,
        accept_hold=settings.door.hold_accept,
        max_callers_per_identity=caps.callers_per_identity,
        mailbox_max_queued=settings.mailbox.max_queued_per_callee,
        mailbox_max_bytes=settings.mailbox.max_queued_bytes_per_callee,
        mailbox_max_total_bytes=settings.mailbox.max_held_bytes_total,
        audit_retention_days=settings.audit_retention_days,
    )
    return top


class _DoorFlush(internet.TimerService):
    """Logs the front door's refusal counts and writes ``auth.failed`` rows once a minute,
    and everything still pending when the relay stops."""

    def __init__(self, door: Any) -> None:
        super().__init__(60, door.flush)
        self._door = door

    def stopService(self) -> Any:
        result = super().stopService()
        self._door.flush(final=True)
        return result


class _SeenFlush(internet.TimerService):
    """Writes members' last-seen times once a minute, and what is waiting when the relay stops
    (the batch's own errback logs a failure, so the timer keeps running)."""

    def __init__(self, seen: Any) -> None:
        super().__init__(limits.LAST_SEEN_FLUSH_S, seen.flush)
        self._seen = seen

    def stopService(self) -> Any:
        result = super().stopService()
        self._seen.flush()
        return result


class _AuditFlush(service.Service):
    """Writes the audit rows still waiting for their reactor turn when the relay stops."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink

    def stopService(self) -> Any:
        result = super().stopService()
        self._sink.flush()
        return result


class _MailboxTimers(service.Service):
    """Stops the mailbox's sweep and rest timers and the storage probe with the relay (the
    desk and the watch arm them themselves)."""

    def __init__(self, jobs: Any, storage: Any) -> None:
        self._jobs = jobs
        self._storage = storage

    def stopService(self) -> Any:
        result = super().stopService()
        self._jobs.stop()
        self._storage.stop()
        return result


def _prune(limiter: Any, clock: Any) -> None:
    # A periodic job never raises: TimerService stops looping after a failure.
    try:
        limiter.prune(clock.seconds())
    except Exception:
        _log.failure("rate_prune_failed")
