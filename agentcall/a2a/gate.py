"""Who may reach the bridge: the resource in front of :class:`agentcall.a2a.web.BridgeResource`.

Whoever gets a request through places calls as the bridge's owner, and an answering agent runs
as that same user, on the same machine, and may connect to loopback ports. So each request
passes three checks, in this order, before the bridge reads it:

1. its ``Host`` names the bridge on loopback (else 403): a web page cannot rebind its way in;
2. it carries ``Authorization: Bearer TOKEN`` with the token of
   :mod:`agentcall.local.a2atoken` (else 401 with ``WWW-Authenticate: Bearer``;
   :mod:`agentcall.a2a.auth` decides), which no answering agent can read; an Agent Card is the
   one thing asked for without it (A2A clients read the card to learn that they need a token,
   and it holds nothing secret: :mod:`agentcall.a2a.cards`). A token file that cannot be
   trusted refuses everything but cards (503), and the log says why, once per change;
3. the client is not part of an answering agent's run (else 403), a second line behind the
   token: the pid holding the connection's client end comes from :mod:`agentcall.a2a.peerpid`
   and ``run_peer`` judges it. A client whose pid is not found is not refused for that alone.

The third check walks ``/proc``, so it runs only for requests that showed the token, and once
per connection: a connection's client does not change while it lives.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable
from typing import Any, Final, Protocol

from twisted.internet import address
from twisted.web import http, resource, server

from agentcall.a2a import auth, cards, peerpid
from agentcall.filetrust import LocalStateError
from agentcall.logevents import Logger

log = Logger()

ALLOWED_METHODS: Final = (b"GET", b"HEAD", b"POST")
LOCAL_ONLY: Final = "this bridge answers local clients only (Host must name it on loopback)"
FROM_A_RUN: Final = (
    "this bridge takes no requests from an agent that is answering a call: they would be "
    "placed as its owner"
)
CANNOT_CHECK: Final = (
    "the bridge cannot check tokens now: its token file cannot be used (its log says why); "
    "its owner can run `agentcall a2a token --rotate`"
)


class TokenSource(Protocol):
    """The bearer token as it stands now (:class:`agentcall.local.a2atoken.TokenFile`)."""

    def current(self) -> str:
        """The token; :class:`~agentcall.filetrust.LocalStateError` when none can be trusted."""
        ...


# The pid of an answering agent's run holding the client end of a connection, given the
# client's endpoint and the bridge's; None when there is none (or none is found).
RunPeer = Callable[[peerpid.Endpoint, peerpid.Endpoint], int | None]


def no_run_peer(_client: peerpid.Endpoint, _server: peerpid.Endpoint) -> int | None:
    """A :data:`RunPeer` that never finds one."""
    return None


def json_refusal(request: server.Request, code: int, text: str) -> bytes:
    """A refusal as the bridge shapes its non-JSON-RPC errors: ``{"error": TEXT}``."""
    request.setResponseCode(code)
    request.setHeader("content-type", "application/json")
    body = json.dumps({"error": text}, ensure_ascii=False, separators=(",", ":")).encode()
    request.setHeader("content-length", str(len(body)))
    return body


def _endpoint(where: object) -> peerpid.Endpoint | None:
    if not isinstance(where, address.IPv4Address | address.IPv6Address):
        return None  # a UNIX socket or a memory transport: no TCP peer to look up
    try:
        return peerpid.endpoint(where.host, where.port)
    except ValueError:
        return None


class Gate(resource.Resource):
    """Lets a request through to ``inner`` only when it passed the three checks."""

    isLeaf = True

    def __init__(
        self,
        inner: resource.Resource,
        local: Callable[[server.Request], bool],
        tokens: TokenSource,
        run_peer: RunPeer,
    ) -> None:
        super().__init__()
        self._inner = inner
        self._local = local
        self._tokens = tokens
        self._run_peer = run_peer
        self._peers: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()
        self._token_problem: str | None = None

    def render(self, request: server.Request) -> bytes | int:
        request.setHeader("x-content-type-options", "nosniff")
        if not self._local(request):
            return json_refusal(request, http.FORBIDDEN, LOCAL_ONLY)
        public = request.method in (b"GET", b"HEAD") and cards.is_card_path(request.postpath or [])
        if not public:
            refused = self._refusal(request)
            if refused is not None:
                return refused
        if request.method not in ALLOWED_METHODS:
            # Answered here in the bridge's JSON, rather than by Twisted's HTML pages.
            request.setHeader("allow", ", ".join(m.decode() for m in ALLOWED_METHODS))
            return json_refusal(request, http.NOT_ALLOWED, "the bridge answers GET and POST")
        answer: bytes | int = self._inner.render(request)
        return answer

    def _refusal(self, request: server.Request) -> bytes | None:
        """The answer to a request that may go no further; None when it may."""
        try:
            expected = self._tokens.current()
        except LocalStateError as exc:
            problem = str(exc)
            if problem != self._token_problem:
                self._token_problem = problem
                log.error("a2a_token_unusable", problem=problem)
            return json_refusal(request, http.SERVICE_UNAVAILABLE, CANNOT_CHECK)
        self._token_problem = None
        verdict = auth.judge(request.requestHeaders.getRawHeaders(b"authorization"), expected)
        if verdict is not auth.Verdict.ALLOWED:
            request.setHeader("www-authenticate", auth.challenge(verdict))
            return json_refusal(request, http.UNAUTHORIZED, auth.refusal(verdict))
        pid = self._peer_pid(request)
        if pid is not None:
            log.warn("a2a_refused_run_peer", pid=pid)
            return json_refusal(request, http.FORBIDDEN, FROM_A_RUN)
        return None

    def _peer_pid(self, request: server.Request) -> int | None:
        channel = request.channel
        if channel in self._peers:
            return self._peers[channel]
        client = _endpoint(request.getClientAddress())
        bridge = _endpoint(request.getHost())
        pid = None
        if client is not None and bridge is not None:
            pid = self._run_peer(client, bridge)
        self._peers[channel] = pid
        return pid
