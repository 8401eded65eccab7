"""The relay's HTTP API: JSON bodies from :mod:`agentcall.wire.http`, decisions in the store.

Every body is size-capped before it is stored in memory and decoded through the one wire
decoder; every refusal is an :class:`ApiError` rendered as ``{"error": code, "message": text}``.
Registration and failed authentication are throttled per source address by the relay's
:class:`~agentcall.relay.door.Door`; a throttled request gets 429 with ``Retry-After``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.web import resource, server

from agentcall import ids, limits
from agentcall.crypto import records
from agentcall.errors import ApiError, ApiErrorCode, CryptoError, MalformedFrame
from agentcall.invites import make_invite_url
from agentcall.logevents import Logger
from agentcall.relay.auth import authenticate_headers
from agentcall.relay.door import Door, Throttled, source_of
from agentcall.relay.store import IRelayStore, Member
from agentcall.relay.switchboard import Switchboard
from agentcall.relay.throttle import retry_after_header
from agentcall.wire import codec, http

_log = Logger(namespace="agentcall.relay.web")

_INVITE_REVOKE = re.compile(r"^/v1/invites/([0-9a-f]{64})/revoke$")
_KEYS_OF = re.compile(r"^/v1/keys/([a-z0-9][a-z0-9-]{1,30})$")


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
    """``/v1/*`` except the WebSocket: one leaf that routes by method and path."""

    isLeaf = True

    def __init__(
        self,
        *,
        store: IRelayStore,
        switchboard: Switchboard,
        clock: IReactorTime,
        relay_origin: str,
        public_url: str,
        door: Door,
    ) -> None:
        super().__init__()
        self._door = door
        self._store = store
        self._switchboard = switchboard
        self._clock = clock
        self._origin = relay_origin
        self._public_url = public_url.rstrip("/")

    def render(self, request: server.Request) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        try:
            status, body = self._route(request)
        except ApiError as exc:
            status, body = exc.status, http.ApiErrorBody(error=exc.code, message=exc.message)
            if isinstance(exc, Throttled):
                request.setHeader(b"retry-after", retry_after_header(exc.retry_after_s))
            else:
                # Throttled refusals are counted by the door and logged in aggregate instead.
                _log.info("api_refused", path=_path(request), status=status, code=str(exc.code))
        except Exception:
            _log.failure("api_internal_error", path=_path(request))
            status = 500
            body = http.ApiErrorBody(error=ApiErrorCode.INTERNAL, message="internal error")
        request.setResponseCode(status)
        return codec.encode(body)

    # --- routing -----------------------------------------------------------------------------

    def _route(self, request: server.Request) -> tuple[int, object]:
        method = request.method.decode("ascii", "replace")
        path = _path(request)
        if getattr(request, "too_large", False):
            raise ApiError(413, ApiErrorCode.BODY_TOO_LARGE, "request body too large")
        if path == "/v1/status" and method == "GET":
            # No version: an unauthenticated caller learns that the relay is up, nothing more.
            return 200, http.StatusResponse(ok=True, relay_origin=self._origin)
        if path == "/v1/register" and method == "POST":
            self._door.check_register(source_of(request.getClientAddress()))
            return 200, self._register(request)
        handlers: dict[tuple[str, str], Callable[[server.Request, Member], object]] = {
            ("GET", "/v1/me"): self._me,
            ("POST", "/v1/invites"): self._create_invite,
            ("GET", "/v1/invites"): self._list_invites,
            ("PUT", "/v1/keys/identity"): self._publish_identity,
            ("PUT", "/v1/keys/encryption"): self._publish_encryption,
            ("GET", "/v1/presence"): self._presence,
        }
        handler = handlers.get((method, path))
        if handler is not None:
            return 200, handler(request, self._authenticated(request))
        if method == "POST" and (match := _INVITE_REVOKE.match(path)):
            member = self._authenticated(request)
            return 200, self._revoke_invite(member, match.group(1))
        if method == "GET" and (match := _KEYS_OF.match(path)):
            member = self._authenticated(request)
            return 200, self._fetch_keys(member, match.group(1))
        known = {p for (_m, p) in handlers} | {"/v1/status", "/v1/register"}
        if path in known:
            raise ApiError(405, ApiErrorCode.METHOD_NOT_ALLOWED, f"{method} not allowed here")
        raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such route")

    def _now(self) -> float:
        return self._clock.seconds()

    def _authenticated(self, request: server.Request) -> Member:
        source = source_of(request.getClientAddress())
        # Before the token is looked at: a throttled source learns nothing from a guess.
        self._door.check_auth_allowed(source)
        headers = {
            name: (request.getHeader(name) or "")
            for name in ("authorization", "x-agentcall-org", "x-agentcall-handle")
        }
        member = authenticate_headers(self._store, headers)
        if member is None:
            self._door.auth_failed(source)
            raise ApiError(401, ApiErrorCode.UNAUTHORIZED, "missing or invalid credentials")
        return member

    # --- enrolment -----------------------------------------------------------------------

    def _register(self, request: server.Request) -> http.RegisterResponse:
        body = _body(request, http.RegisterRequest)
        member, token = self._store.register(
            body.org, body.invite, body.handle, body.agent_kind, self._now()
        )
        _log.info("member_registered", org=member.org, handle=member.handle, role=str(member.role))
        return http.RegisterResponse(
            org=member.org,
            handle=member.handle,
            address=ids.format_address(member.org, member.handle),
            role=member.role,
            token=token,
            relay_origin=self._origin,
        )

    def _me(self, _request: server.Request, member: Member) -> http.WhoAmIResponse:
        return http.WhoAmIResponse(
            org=member.org,
            handle=member.handle,
            address=ids.format_address(member.org, member.handle),
            role=member.role,
            relay_origin=self._origin,
        )

    def _presence(self, _request: server.Request, member: Member) -> http.PresenceResponse:
        # Self only: presence of others would be a free directory of who is at their desk.
        return http.PresenceResponse(
            address=ids.format_address(member.org, member.handle),
            online=self._switchboard.is_online(member.org, member.handle),
        )

    # --- invites ---------------------------------------------------------------------------

    def _require_admin(self, member: Member) -> None:
        if member.role is not http.MemberRole.ADMIN:
            raise ApiError(403, ApiErrorCode.FORBIDDEN, "only an organisation admin may do this")

    def _create_invite(self, request: server.Request, member: Member) -> http.InviteCreated:
        self._require_admin(member)
        body = _body(request, http.InviteCreateRequest)
        secret, info = self._store.create_invite(
            member.org,
            created_by=member.handle,
            role=body.role,
            expires_in_days=body.expires_in_days,
            description=body.description,
            now=self._now(),
        )
        url = make_invite_url(self._public_url, member.org, secret)
        return http.InviteCreated(invite=url, info=info)

    def _list_invites(self, _request: server.Request, member: Member) -> http.InviteList:
        self._require_admin(member)
        return http.InviteList(invites=tuple(self._store.list_invites(member.org, self._now())))

    def _revoke_invite(self, member: Member, invite_id: str) -> http.InviteInfo:
        self._require_admin(member)
        info: http.InviteInfo = self._store.revoke_invite(
            member.org, invite_id, actor=member.handle, now=self._now()
        )
        return info

    # --- keys --------------------------------------------------------------------------------

    def _publish_identity(self, request: server.Request, member: Member) -> http.KeysResponse:
        signed = _body(request, http.SignedIdentityRecord)
        self._check_record_route(member, signed.record.address, signed.record.relay_origin)
        try:
            records.verify_identity_record(signed)
        except CryptoError as exc:
            raise ApiError(400, ApiErrorCode.SIGNATURE_INVALID, str(exc)) from exc
        self._store.publish_identity(member.org, member.handle, signed, self._now())
        return self._keys_of(member.org, member.handle)

    def _publish_encryption(self, request: server.Request, member: Member) -> http.KeysResponse:
        signed = _body(request, http.SignedEncryptionKeyRecord)
        self._check_record_route(member, signed.record.address, signed.record.relay_origin)
        current = self._store.fetch_keys(member.org, member.handle)
        if current is None:
            raise ApiError(409, ApiErrorCode.IDENTITY_KEY_MISSING, "publish the identity key first")
        try:
            records.verify_encryption_record(
                signed, current.identity.record.identity_pub, now=self._now()
            )
            if current.encryption is not None:
                records.verify_chain(current.encryption, signed)
        except CryptoError as exc:
            raise ApiError(400, ApiErrorCode.SIGNATURE_INVALID, str(exc)) from exc
        self._store.publish_encryption(member.org, member.handle, signed, self._now())
        return self._keys_of(member.org, member.handle)

    def _fetch_keys(self, member: Member, handle: str) -> http.KeysResponse:
        return self._keys_of(member.org, handle)

    def _keys_of(self, org: str, handle: str) -> http.KeysResponse:
        keys: http.KeysResponse | None = self._store.fetch_keys(org, handle)
        if keys is None:
            raise ApiError(404, ApiErrorCode.NOT_FOUND, "no published keys for that handle")
        return keys

    def _check_record_route(self, member: Member, address: str, origin: str) -> None:
        if address != ids.format_address(member.org, member.handle):
            raise ApiError(400, ApiErrorCode.RECORD_INVALID, "a record may only name yourself")
        if origin != self._origin:
            raise ApiError(400, ApiErrorCode.RECORD_INVALID, "record names another relay")


def _path(request: server.Request) -> str:
    return request.path.decode("utf-8", "replace").rstrip("/") or "/"


def _body(request: server.Request, cls: type[Any]) -> Any:
    content = request.content
    data = content.read(limits.MAX_HTTP_BODY_BYTES + 1) if content is not None else b""
    try:
        return codec.decode(data, cls, max_bytes=limits.MAX_HTTP_BODY_BYTES)
    except MalformedFrame as exc:
        raise ApiError(400, ApiErrorCode.BAD_REQUEST, f"malformed body: {exc}") from exc
