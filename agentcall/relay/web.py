"""The relay's HTTP API in twisted.web: a thin adapter over :mod:`agentcall.relay.api_rules`.

Routes, who may use them and which key records may be stored are decided there; this module
parses requests, reads and writes the store, and renders JSON bodies from
:mod:`agentcall.wire.http`.

Every body is size-capped before it is stored in memory and decoded through the one wire
decoder; every refusal is an :class:`ApiError` rendered as ``{"error": code, "message": text}``.
Registration and failed authentication are throttled per source address by the relay's
:class:`~agentcall.relay.door.Door`; a throttled request gets 429 with ``Retry-After``.
"""

from __future__ import annotations

from typing import Any

import attrs
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from twisted.web import resource, server

from agentcall import limits
from agentcall.errors import ApiError, ApiErrorCode, MalformedFrame, StorageFault, StoreError
from agentcall.invites import make_invite_url
from agentcall.logevents import Logger
from agentcall.relay import api_rules as rules
from agentcall.relay import audit
from agentcall.relay.api_rules import Route, RouteMatch
from agentcall.relay.audit import AuditEntry, AuditSink
from agentcall.relay.audit_export import ExportStream
from agentcall.relay.auth import authenticate_headers
from agentcall.relay.calls import CallBook
from agentcall.relay.door import (
    Door,
    Throttled,
    is_upgrade,
    source_of,
    throttled_page,
    upgrade_required,
)
from agentcall.relay.gate import TurnedAway
from agentcall.relay.jobs import JobDesk
from agentcall.relay.lastseen import LastSeen
from agentcall.relay.metrics import NO_METRICS, RelayEvents
from agentcall.relay.store_interface import Member, RelayStore
from agentcall.relay.storewatch import RETRY_AFTER_S, StorageWatch, storage_detail
from agentcall.relay.switchboard import Switchboard
from agentcall.relay.throttle import retry_after_header
from agentcall.wire import codec, http
from agentcall.wire.closecodes import CLOSE_CREDENTIALS_CHANGED, CLOSE_RECOVERED, CLOSE_REMOVED

_log = Logger(namespace="agentcall.relay.web")


class CappedRequest(server.Request):
    """A request that stops buffering its body past the API's size cap, and whose answers
    carry no ``Server`` header (twisted.web would name itself and its version)."""

    too_large = False

    def setHeader(self, name: bytes | str, value: bytes | str) -> None:
        lowered = name.lower()
        if lowered in (b"server", "server"):
            return
        super().setHeader(name, value)

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > limits.MAX_HTTP_BODY_BYTES:
            self.too_large = True
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.too_large:
            return
        if self.content is not None and self.content.tell() + len(data) > (
            limits.MAX_HTTP_BODY_BYTES
        ):
            self.too_large = True
            return
        super().handleContentChunk(data)


class RelayApi(resource.Resource):
    """``/v1/*`` except the WebSocket: one leaf that parses, asks :mod:`agentcall.relay.api_rules`
    and the store, and renders."""

    isLeaf = True

    def __init__(
        self,
        *,
        store: RelayStore,
        jobs: JobDesk,
        calls: CallBook,
        switchboard: Switchboard,
        clock: IReactorTime,
        relay_origin: str,
        public_url: str,
        door: Door,
        seen: LastSeen,
        audit_sink: AuditSink | None = None,
        metrics: RelayEvents = NO_METRICS,
    ) -> None:
        super().__init__()
        self._metrics = metrics
        # Rows a member's requests can cause at request rate (presence refusals) go through the
        # relay's batching sink: one transaction a reactor turn, a bounded backlog.
        self._audit: AuditSink = store if audit_sink is None else audit_sink
        self._door = door
        self._seen = seen
        self._store = store
        self._jobs = jobs
        self._calls = calls
        self._switchboard = switchboard
        self._clock = clock
        self._origin = relay_origin
        self._public_url = public_url.rstrip("/")

    def render(self, request: server.Request) -> int:
        """Answer once the store has: the body, or the refusal as the same JSON error body."""
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        gone: list[Failure] = []
        # A client that went away before the store answered gets nothing written.
        request.notifyFinish().addErrback(gone.append)
        written = defer.ensureDeferred(self._respond(request, gone))
        written.addErrback(lambda f: _log.failure("api_write_failed", failure=f))
        return server.NOT_DONE_YET

    async def _respond(self, request: server.Request, gone: list[Failure]) -> None:
        try:
            status, body = 200, await self._answer(request, gone)
        except defer.CancelledError:
            if not gone:
                raise
            # A long-poll released because its client went away: nobody to answer.
            _log.info("api_client_gone", path=_path(request), status=None)
            return
        except Exception:
            failure = Failure()
            if isinstance(failure.value, StoreError):
                self._metrics.database_error()
            status, body = _refusal(request, failure, self._door)
        if isinstance(body, ExportStream):
            # Written page by page from here on; a client already gone gets nothing.
            if not gone:
                body.start()
            return
        _finish(request, gone, status, body)

    async def _answer(self, request: server.Request, gone: list[Failure]) -> object:
        if getattr(request, "too_large", False):
            raise ApiError(413, ApiErrorCode.BODY_TOO_LARGE, "request body too large")
        found = rules.match(request.method.decode("ascii", "replace"), _path(request))
        if found.route is Route.STATUS:
            # No version: an unauthenticated caller learns that the relay is up, nothing more.
            return http.StatusResponse(ok=True, relay_origin=self._origin)
        if found.route is Route.REGISTER:
            self._door.check_register(source_of(request.getClientAddress()))
            return await self._register(request)
        if found.route is Route.RECOVER:
            self._door.check_register(source_of(request.getClientAddress()))
            return await self._recover(request)
        member = await self._authenticated(request)
        rules.authorize(found.route, member)
        return await self._as_member(found, request, member, gone)

    async def _as_member(
        self, found: RouteMatch, request: server.Request, member: Member, gone: list[Failure]
    ) -> object:
        now = self._clock.seconds()
        match found.route:
            case Route.ME:
                status = await self._store.mailbox_status(member.org, member.handle)
                return http.WhoAmIResponse(
                    org=member.org,
                    handle=member.handle,
                    address=member.address,
                    role=member.role,
                    relay_origin=self._origin,
                    offline_delivery=status is not None and status.offline_delivery,
                )
            case Route.SET_OFFLINE_DELIVERY:
                wanted = _body(request, http.OfflineDelivery)
                await self._store.set_offline_delivery(
                    member.org, member.handle, wanted.enabled, now
                )
                _log.info(
                    "offline_delivery_set",
                    org=member.org,
                    handle=member.handle,
                    enabled=wanted.enabled,
                )
                return wanted
            case Route.LIST_JOBS:
                listed = await self._store.jobs_of(
                    member.org, member.handle, limits.MAX_JOBS_LISTED
                )
                return http.JobList(jobs=tuple(rules.job_info(job, member) for job in listed))
            case Route.GET_JOB:
                wait_s = rules.wait_seconds(request.args.get(b"wait"))
                waiting = self._jobs.job_for(member, _argument(found), wait_s)
                if wait_s > 0:
                    _release_when_gone(request, gone, waiting)
                return await waiting
            case Route.CANCEL_JOB:
                return await self._jobs.cancel(member, _argument(found))
            case Route.PRESENCE:
                # Self only: presence of others would be a free directory of who is at their
                # desk. Asking about someone else is refused alike whether they exist or not,
                # and the asking is recorded (who asked about whom).
                subject = rules.presence_subject(member, found.argument, request.args)
                if subject is not None:
                    # The audit row is the record (no log line per request); a failed write
                    # is logged by its errback and never changes the answer.
                    entry = AuditEntry(
                        event=audit.PRESENCE_REFUSED,
                        org=member.org,
                        actor=member.handle,
                        target=subject,
                        call_id=None,
                        at=now,
                    )
                    self._audit.record(entry).addErrback(
                        lambda f: _log.failure("presence_audit_failed", failure=f)
                    )
                    raise ApiError(403, ApiErrorCode.FORBIDDEN, rules.PRESENCE_PRIVATE)
                return http.PresenceResponse(
                    address=member.address,
                    online=self._switchboard.is_online(member.org, member.handle),
                )
            case Route.EXPORT_AUDIT:
                window = rules.export_window(request.args)
                # Recorded first, so the export carries the row of its own making.
                await self._store.record(
                    AuditEntry(
                        event=audit.AUDIT_EXPORT,
                        org=member.org,
                        actor=member.handle,
                        target=None,
                        call_id=None,
                        at=now,
                        detail=window.describe(),
                    )
                )
                newest = await self._store.last_audit_id(member.org)
                _log.info("audit_export_started", org=member.org, by=member.handle, up_to=newest)
                return ExportStream(request, self._store, self._clock, member.org, window, newest)
            case Route.LIST_HOLDS:
                holds = await self._store.list_holds(member.org)
                return http.AuditHoldList(holds=tuple(holds))
            case Route.SET_HOLD:
                wanted = _body(request, http.AuditHoldRequest)
                hold = await self._store.set_hold(
                    member.org, wanted.handle, note=wanted.note, actor=member.handle, now=now
                )
                _log.info("audit_hold_set", org=member.org, handle=wanted.handle, by=member.handle)
                return hold
            case Route.CLEAR_HOLD:
                wanted = _body(request, http.AuditHoldRequest)
                if wanted.note is not None:
                    raise ApiError(
                        400, ApiErrorCode.BAD_REQUEST, "a hold is cleared without a note"
                    )
                hold = await self._store.clear_hold(
                    member.org, wanted.handle, actor=member.handle, now=now
                )
                _log.info(
                    "audit_hold_cleared", org=member.org, handle=wanted.handle, by=member.handle
                )
                return hold
            case Route.CREATE_INVITE:
                wanted = _body(request, http.InviteCreateRequest)
                secret, info = await self._store.create_invite(
                    member.org,
                    created_by=member.handle,
                    role=wanted.role,
                    expires_in_days=wanted.expires_in_days,
                    description=wanted.description,
                    now=now,
                )
                url = make_invite_url(self._public_url, member.org, secret)
                return http.InviteCreated(invite=url, info=info)
            case Route.LIST_INVITES:
                invites = await self._store.list_invites(member.org, now)
                return http.InviteList(invites=tuple(invites))
            case Route.REVOKE_INVITE:
                return await self._store.revoke_invite(
                    member.org, _argument(found), actor=member.handle, now=now
                )
            case Route.PUBLISH_IDENTITY:
                identity = _body(request, http.SignedIdentityRecord)
                rules.check_identity_record(member, identity, self._origin)
                await self._store.publish_identity(member.org, member.handle, identity, now)
                return rules.published(await self._store.fetch_keys(member.org, member.handle))
            case Route.PUBLISH_ENCRYPTION:
                encryption = _body(request, http.SignedEncryptionKeyRecord)
                current = await self._store.fetch_keys(member.org, member.handle)
                rules.check_encryption_record(member, encryption, current, self._origin, now)
                await self._store.publish_encryption(member.org, member.handle, encryption, now)
                return rules.published(await self._store.fetch_keys(member.org, member.handle))
            case Route.ROTATE_CREDENTIALS:
                wanted = _body(request, http.TokenRotateRequest)
                await self._store.rotate_token(member.org, member.handle, wanted.token, now)
                # Sockets opened with the old token end too (it may have leaked); the
                # listener reconnects with the new one, which it reads from config.json.
                closed = self._switchboard.close_member(
                    member.org, member.handle, CLOSE_CREDENTIALS_CHANGED, "token rotated"
                )
                _log.info(
                    "token_rotated", org=member.org, handle=member.handle, sockets_closed=closed
                )
                return http.TokenRotated(rotated_at=int(now))
            case Route.LIST_MEMBERS:
                after = rules.members_after(request.args.get(b"after"))
                limit = limits.MAX_MEMBERS_LISTED
                members = await self._store.list_members(member.org, after=after, limit=limit)
                return rules.member_page(
                    [self._with_pending_seen(member.org, m) for m in members], limit
                )
            case Route.REMOVE_MEMBER:
                wanted = _body(request, http.MemberRemoveRequest)
                return await self._remove(member, _argument(found), wanted.release, now)
            case Route.SET_MEMBER_ROLE:
                wanted = _body(request, http.MemberRoleRequest)
                changed = await self._store.set_member_role(
                    member.org, _argument(found), wanted.role, actor=member.handle, now=now
                )
                _log.info(
                    "member_role_set",
                    org=member.org,
                    handle=changed.handle,
                    role=str(changed.role),
                    by=member.handle,
                )
                return changed
            case Route.PUBLISH_CARD:
                signed = _body(request, http.SignedCardRecord)
                current = await self._store.fetch_keys(member.org, member.handle)
                rules.check_card(member, signed, current, self._origin, now)
                await self._store.publish_card(member.org, member.handle, signed, now)
                return signed
            case Route.FETCH_CARD:
                # Within the member's own organisation only; a removed member has none.
                return rules.published_card(
                    await self._store.fetch_card(member.org, _argument(found))
                )
            case Route.FETCH_KEYS:
                # Within the member's own organisation only.
                handle = _argument(found)
                # Rare since callers keep records and the relay attaches a caller's to its
                # calls; the line shows who still fetches (and lets tests count fetches).
                _log.info("keys_fetched", org=member.org, asker=member.handle, handle=handle)
                return rules.published(await self._store.fetch_keys(member.org, handle))
        raise AssertionError(f"no handler for {found.route}")  # pragma: no cover

    async def _remove(
        self, admin: Member, handle: str, release: bool, now: float
    ) -> http.MemberInfo:
        """Remove a member, then cut off what they still hold: every socket (a call in
        progress ends with it) and every outstanding mailbox job. Asking again is harmless
        and finishes what a failure left undone."""
        removed = await self._store.remove_member(
            admin.org, handle, release=release, actor=admin.handle, now=now
        )
        # Calls first, so a removed caller's callee is still there to be told to stop.
        ended = self._calls.member_removed(admin.org, handle)
        closed = self._switchboard.close_member(
            admin.org, handle, CLOSE_REMOVED, "removed from the organisation"
        )
        revoked = await self._jobs.revoke(admin.org, handle, actor=admin.handle)
        _log.info(
            "member_removed",
            org=admin.org,
            handle=handle,
            by=admin.handle,
            released=removed.status is http.MemberStatus.RELEASED,
            calls_ended=ended,
            sockets_closed=closed,
            jobs_revoked=revoked,
        )
        return removed

    def _with_pending_seen(self, org: str, info: http.MemberInfo) -> http.MemberInfo:
        """``info`` with a last-seen time the relay knows but has not written yet."""
        pending = self._seen.pending(org, info.handle)
        if pending is None or info.status is not http.MemberStatus.ACTIVE:
            return info
        if info.last_seen is not None and info.last_seen >= int(pending):
            return info
        return attrs.evolve(info, last_seen=int(pending))

    async def _authenticated(self, request: server.Request) -> Member:
        source = source_of(request.getClientAddress())
        # Before the token is looked at: a throttled source learns nothing from a guess.
        self._door.check_auth_allowed(source)
        headers = {
            name: (request.getHeader(name) or "")
            for name in ("authorization", "x-agentcall-org", "x-agentcall-handle")
        }
        member = await authenticate_headers(self._store, headers)
        if member is None:
            self._door.auth_failed(source)
            raise ApiError(401, ApiErrorCode.UNAUTHORIZED, "missing or invalid credentials")
        return member

    async def _recover(self, request: server.Request) -> http.RegisterResponse:
        body = _body(request, http.RecoverRequest)
        now = self._clock.seconds()
        current = await self._store.fetch_keys(body.org, body.handle)
        rules.check_recovery(body, current, self._origin, now)
        assert current is not None  # check_recovery refuses without one
        token = await self._store.recover(
            body.org, body.handle, current.identity, body.statement, body.identity, now
        )
        member = await self._store.get_member(body.org, body.handle)
        if member is None:  # pragma: no cover - removed in the instant since
            raise ApiError(403, ApiErrorCode.RECOVERY_REFUSED, "recovery refused")
        # The old installation (a lost laptop, perhaps) is cut off, for good.
        closed = self._switchboard.close_member(
            body.org, body.handle, CLOSE_RECOVERED, "recovered on another machine"
        )
        _log.info("member_recovered", org=body.org, handle=body.handle, sockets_closed=closed)
        return self._enrolled(member, token)

    def _enrolled(self, member: Member, token: str) -> http.RegisterResponse:
        """What a registration or a recovery hands back: who, and the new token (shown once)."""
        return http.RegisterResponse(
            org=member.org,
            handle=member.handle,
            address=member.address,
            role=member.role,
            token=token,
            relay_origin=self._origin,
        )

    async def _register(self, request: server.Request) -> http.RegisterResponse:
        body = _body(request, http.RegisterRequest)
        member, token = await self._store.register(
            body.org, body.invite, body.handle, body.agent_kind, self._clock.seconds()
        )
        _log.info("member_registered", org=member.org, handle=member.handle, role=str(member.role))
        return self._enrolled(member, token)


def _release_when_gone(
    request: server.Request, gone: list[Failure], waiting: defer.Deferred[Any]
) -> None:
    """Cancel a long-poll once its HTTP client has gone, so nothing is held for nobody."""
    if gone:
        waiting.cancel()
        return
    request.notifyFinish().addErrback(lambda _failure: waiting.cancel())


def _refusal(request: server.Request, failure: Failure, door: Door) -> tuple[int, object]:
    """The status and JSON error body of a refusal; anything but an ApiError is a 500."""
    exc = failure.value
    if isinstance(exc, StorageFault):
        # Logged once per episode by the storage watch; the client is told to come back.
        request.setHeader(b"retry-after", b"%d" % RETRY_AFTER_S)
        code = ApiErrorCode(str(exc.code))
        return 503, http.ApiErrorBody(error=code, message=storage_detail(exc))
    if isinstance(exc, ApiError):
        if isinstance(exc, Throttled):
            request.setHeader(b"retry-after", retry_after_header(exc.retry_after_s))
        else:
            # Anyone can send junk requests at request rate: they are counted and logged once a
            # minute with the door's tally, never one line each.
            door.turned_away.note(TurnedAway.API_REFUSED)
        return exc.status, http.ApiErrorBody(error=exc.code, message=exc.message)
    _log.failure("api_internal_error", failure=failure, path=_path(request))
    return 500, http.ApiErrorBody(error=ApiErrorCode.INTERNAL, message="internal error")


def _finish(request: server.Request, gone: list[Failure], status: int, body: object) -> None:
    if gone:
        _log.info("api_client_gone", path=_path(request), status=status)
        return
    data = codec.encode(body)
    request.setResponseCode(status)
    # As twisted.web sets it for a body returned from render (rather than chunked encoding).
    request.setHeader(b"content-length", b"%d" % len(data))
    request.write(data)
    request.finish()


def _argument(found: RouteMatch) -> str:
    if found.argument is None:  # pragma: no cover - api_rules sets it on these routes
        raise AssertionError(f"{found.route} carries no path argument")
    return found.argument


def _path(request: server.Request) -> str:
    return request.path.decode("utf-8", "replace").rstrip("/") or "/"


def _body(request: server.Request, cls: type[Any]) -> Any:
    content = request.content
    data = content.read(limits.MAX_HTTP_BODY_BYTES + 1) if content is not None else b""
    try:
        return codec.decode(data, cls, max_bytes=limits.MAX_HTTP_BODY_BYTES)
    except MalformedFrame as exc:
        raise ApiError(400, ApiErrorCode.BAD_REQUEST, f"malformed body: {exc}") from exc


class ApiWithSocket(resource.Resource):
    """``/v1/ws`` is the WebSocket; every other ``/v1/...`` path goes to the JSON API."""

    def __init__(self, api: resource.Resource, socket: resource.IResource, door: Door) -> None:
        super().__init__()
        self._api = api
        self._socket = socket
        self._door = door

    def getChild(self, path: bytes, request: server.Request) -> resource.IResource:
        if path == b"ws" and not request.postpath:
            # Answered here, in the API's JSON, rather than by autobahn's HTML pages.
            if not is_upgrade(request):
                return upgrade_required()
            try:
                self._door.check_auth_allowed(source_of(request.getClientAddress()))
                # Counted until ready; past the cap told to come back (503), unauthenticated.
                self._door.begin_upgrade(request.channel.transport)
            except Throttled as exc:
                return throttled_page(exc)
            return self._socket
        return self._api  # a leaf that routes on the full request path itself

    def render(self, request: server.Request) -> bytes | int:
        body: bytes | int = self._api.render(request)
        return body


class HealthPage(resource.Resource):
    """``GET /healthz``: the relay process answers (for a liveness probe). ``GET /readyz`` (with
    ``store``): and its database answers a query, else 503 (for a readiness probe or a load
    balancer). Neither needs credentials nor says anything about members or calls."""

    isLeaf = True

    def __init__(
        self, store: RelayStore | None = None, storage: StorageWatch | None = None
    ) -> None:
        super().__init__()
        self._store = store
        self._storage = storage

    def render(self, request: server.Request) -> bytes | int:
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        if request.method not in (b"GET", b"HEAD") or request.postpath not in ([], [b""]):
            request.setResponseCode(404 if request.postpath not in ([], [b""]) else 405)
            return codec.encode(http.HealthResponse(ok=False, problem="no such route"))
        if self._store is None:
            return codec.encode(http.HealthResponse(ok=True))
        failing = None if self._storage is None else self._storage.failing
        if failing is not None:
            # Reads may still answer, but nothing can be queued, stored or enrolled: a load
            # balancer should send people elsewhere until a probe write succeeds.
            request.setResponseCode(503)
            return codec.encode(http.HealthResponse(ok=False, problem=str(failing.code)))
        gone: list[Failure] = []
        request.notifyFinish().addErrback(gone.append)
        checked = defer.maybeDeferred(self._store.ping)

        def ready(_: object) -> tuple[int, http.HealthResponse]:
            return 200, http.HealthResponse(ok=True)

        def not_ready(failure: Failure) -> tuple[int, http.HealthResponse]:
            _log.warn("readiness_failed", reason=str(failure.value)[:200])
            return 503, http.HealthResponse(ok=False, problem="database_unavailable")

        def answer(result: tuple[int, http.HealthResponse]) -> None:
            if gone:
                return
            status, body = result
            data = codec.encode(body)
            request.setResponseCode(status)
            request.setHeader(b"content-length", str(len(data)).encode())
            request.write(data)
            request.finish()

        checked.addCallbacks(ready, not_ready).addCallback(answer)
        return server.NOT_DONE_YET
