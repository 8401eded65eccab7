"""``twistd agentcall-relay``: parse options, compose the relay's services. Nothing else."""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.application import internet, service
from twisted.internet import endpoints
from twisted.internet.interfaces import IListeningPort
from twisted.python import usage
from twisted.web import resource, server

from agentcall import limits
from agentcall.logevents import Logger

_log = Logger(namespace="agentcall.relay")


class Options(usage.Options):
    synopsis = "--database FILE --listen ENDPOINT --url PUBLIC_URL [options]"
    longdesc = (
        "Run an AgentCall relay: enrolment by one-time invite, published keys, presence, and "
        "routing of end-to-end encrypted calls between identities of one organisation. The "
        "relay sees routing metadata only, never a prompt or a reply. Create the database and "
        "the first admin invite with `agentcall relay bootstrap` first."
    )
    optParameters = [
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
            "ssl:8443:privateKey=key.pem:certKey=cert.pem.",
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
    ]

    def postOptions(self) -> None:
        from agentcall.client.endpoint import RelayUrl

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


def _bounded(value: str, name: str, lo: float, hi: float, kind: type[Any]) -> Any:
    try:
        number = kind(value)
    except ValueError as exc:
        raise usage.UsageError(f"{name} must be a number") from exc
    if not lo <= number <= hi:
        raise usage.UsageError(f"{name} must be between {lo:g} and {hi:g}")
    return number


class ListeningService(service.Service):
    """Listen on an endpoint; once bound, log it and optionally write a ready file."""

    def __init__(self, reactor: Any, description: str, site: server.Site, ready_file: str | None):
        self._reactor = reactor
        self._description = description
        self._site = site
        self._ready_file = ready_file
        self._port: IListeningPort | None = None

    def startService(self) -> None:
        super().startService()
        endpoint = endpoints.serverFromString(self._reactor, self._description)
        d = endpoint.listen(self._site)
        d.addCallback(self._bound)
        d.addErrback(self._failed)

    def _bound(self, port: IListeningPort) -> None:
        self._port = port
        number = port.getHost().port  # type: ignore[attr-defined]
        _log.info("relay_listening", port=number)
        if self._ready_file:
            tmp = self._ready_file + ".tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"port": number, "pid": os.getpid()}, fh)
            os.replace(tmp, self._ready_file)

    def _failed(self, failure: Any) -> None:
        _log.failure("relay_listen_failed", failure=failure)
        self._reactor.stop()

    def stopService(self) -> Any:
        super().stopService()
        if self._port is not None:
            return self._port.stopListening()
        return None


def makeService(config: Options, reactor: Any = None) -> service.IService:
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = global_reactor
    from autobahn.twisted.resource import WebSocketResource

    from agentcall.relay.calls import CallBook, restored_limiter
    from agentcall.relay.protocol import RelayWebSocketFactory
    from agentcall.relay.store import open_relay_store
    from agentcall.relay.switchboard import Switchboard
    from agentcall.relay.web import CappedRequest, RelayApi

    relay_url = config["relay_url"]
    origin: str = relay_url.origin
    store = open_relay_store(config["database"])
    switchboard = Switchboard()
    # The windows start from the calls of the last hour, so a restart grants no fresh hour.
    limiter = restored_limiter(
        store, config["calls-per-hour"], limits.RATE_WINDOW_S, reactor.seconds()
    )
    calls = CallBook(
        reactor,
        switchboard,
        store,
        store,
        limiter,
        origin,
        deadline_s=config["call-deadline"],
    )
    ws_factory = RelayWebSocketFactory(
        relay_url.ws(""),
        store=store,
        switchboard=switchboard,
        calls=calls,
        relay_origin=origin,
        reactor=reactor,
    )
    api = RelayApi(
        store=store,
        switchboard=switchboard,
        clock=reactor,
        relay_origin=origin,
        public_url=config["url"],
    )
    v1 = _ApiWithSocket(api, WebSocketResource(ws_factory))
    root = resource.Resource()
    root.putChild(b"v1", v1)
    site = server.Site(root)
    site.requestFactory = CappedRequest
    site.displayTracebacks = False

    top = service.MultiService()
    ListeningService(reactor, config["listen"], site, config["ready-file"]).setServiceParent(top)
    internet.TimerService(600, lambda: _prune(limiter, reactor)).setServiceParent(top)
    _log.info("relay_configured", relay_origin=origin, deadline_s=config["call-deadline"])
    return top


class _ApiWithSocket(resource.Resource):
    """``/v1/ws`` is the WebSocket; every other ``/v1/...`` path goes to the JSON API."""

    def __init__(self, api: resource.Resource, socket: resource.IResource) -> None:
        super().__init__()
        self._api = api
        self._socket = socket

    def getChild(self, path: bytes, request: server.Request) -> resource.IResource:
        if path == b"ws" and not request.postpath:
            return self._socket
        return self._api  # a leaf that routes on the full request path itself

    def render(self, request: server.Request) -> bytes:
        body: bytes = self._api.render(request)
        return body


def _prune(limiter: Any, clock: Any) -> None:
    # A periodic job never raises: TimerService stops looping after a failure.
    try:
        limiter.prune(clock.seconds())
    except Exception:
        _log.failure("rate_prune_failed")
