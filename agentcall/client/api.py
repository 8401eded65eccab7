"""The relay's HTTP API from the client side: one method per route, typed bodies both ways.

Every method returns a Deferred that fires with the decoded wire object, or fails with

- :class:`~agentcall.errors.ApiError` when the relay answered with an error (its status, code
  and message; a body that is not an ``ApiErrorBody`` becomes code ``internal``), or answered
  2xx with a body that is not the promised shape;
- :class:`RelayUnreachable` when no answer came: refused, name not resolved, TLS verification
  failed, or nothing within ``limits.HTTP_TIMEOUT_S`` (plus the wait of a long poll).

The bearer token goes into the request headers and nowhere else: not into URLs, messages,
reprs or logs.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

from twisted.internet import defer
from twisted.internet.interfaces import IConsumer, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer, IPolicyForHTTPS, IResponse
from zope.interface import implementer

from agentcall import ids, limits
from agentcall.client.common import USER_AGENT, Credentials, RelayUnreachable, describe_failure
from agentcall.client.tls import RelayTlsPolicy
from agentcall.errors import AgentCallError, ApiError, ApiErrorCode, MalformedFrame
from agentcall.relayurl import RelayUrl
from agentcall.wire import codec
from agentcall.wire.http import (
    ApiErrorBody,
    AuditEvent,
    AuditExportEnd,
    AuditHold,
    AuditHoldList,
    AuditHoldRequest,
    InviteCreated,
    InviteCreateRequest,
    InviteInfo,
    InviteList,
    JobInfo,
    JobList,
    KeysResponse,
    MemberInfo,
    MemberList,
    MemberRemoveRequest,
    MemberRole,
    MemberRoleRequest,
    OfflineDelivery,
    PresenceResponse,
    RecoverRequest,
    RegisterRequest,
    RegisterResponse,
    SignedCardRecord,
    SignedEncryptionKeyRecord,
    SignedIdentityRecord,
    StatusResponse,
    TokenRotated,
    TokenRotateRequest,
    WhoAmIResponse,
)

T = TypeVar("T")

# The largest answer the relay has a reason to send is an invite list of MAX_INVITES_LISTED
# entries (well under 200 kB), or a job list; a megabyte leaves room and still bounds a broken
# relay.
MAX_RESPONSE_BODY_BYTES = 1_048_576
# One job may carry its sealed answer, as large as the largest call_outcome frame.
MAX_JOB_BODY_BYTES = limits.MAX_RESPONSE_FRAME_BYTES + 4_096


class MissingCredentials(AgentCallError):
    """An authenticated route was called on an API built without credentials."""


# Defined in agentcall.client.common (shared with the sockets); importable from here as before.
__all__ = [
    "MAX_JOB_BODY_BYTES",
    "MAX_RESPONSE_BODY_BYTES",
    "USER_AGENT",
    "Credentials",
    "MissingCredentials",
    "RelayApi",
    "RelayUnreachable",
    "describe_failure",
]


class ExportIncomplete(AgentCallError):
    """An audit export stopped before its end line: what arrived is not the whole export."""

    def __init__(self, message: str, events: int) -> None:
        super().__init__(message)
        self.events = events


# An export line is one AuditEvent: well under this. A relay sending more is broken.
MAX_EXPORT_LINE_BYTES = 16_384


# --- bodies --------------------------------------------------------------------------------------


@implementer(IBodyProducer)
class _BytesBody:
    """A request body that is already in memory (no cooperator, no global reactor)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> defer.Deferred[None]:
        consumer.write(self._data)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class _BodyTooLarge(Exception):
    pass


class _CappedBodyReader(Protocol):
    """Collects a response body; stops the transfer once it passes ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self.finished: defer.Deferred[bytes] = defer.Deferred(self._cancel)

    def _cancel(self, _d: defer.Deferred[bytes]) -> None:
        # A response body's transport is a producer: stopping it drops the connection.
        if self.transport is not None:
            cast(IPushProducer, self.transport).stopProducing()

    def dataReceived(self, data: bytes) -> None:
        if self.finished.called:
            return
        self._size += len(data)
        if self._size > self._limit:
            self.finished.errback(_BodyTooLarge())
            self._cancel(self.finished)
            return
        self._chunks.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.finished.called:
            return
        # Without a length the end of the body is the end of the connection; the JSON
        # decoder catches a truncated body.
        if isinstance(reason.value, (ResponseDone, PotentialDataLoss)):
            self.finished.callback(b"".join(self._chunks))
        else:
            self.finished.errback(reason)


class _ExportReader(Protocol):
    """Reads an export's NDJSON as it arrives: each :class:`AuditEvent` line goes to
    ``on_event`` at once (nothing is collected), the :class:`AuditExportEnd` line must come
    last, and the answer fires with it once the body is whole. No data for ``idle_s`` fails
    it, however long the whole export takes."""

    def __init__(
        self,
        on_event: Callable[[AuditEvent], None],
        clock: IReactorTime,
        idle_s: float,
        where: str,
    ) -> None:
        self._on_event = on_event
        self._clock = clock
        self._idle_s = idle_s
        self._where = where
        self._buffer = bytearray()
        self._end: AuditExportEnd | None = None
        self.events = 0
        self.finished: defer.Deferred[AuditExportEnd] = defer.Deferred(self._cancel)
        self._idle: Any = clock.callLater(idle_s, self._went_quiet)

    def _cancel(self, _d: object) -> None:
        self._stop_idle()
        if self.transport is not None:
            cast(IPushProducer, self.transport).stopProducing()

    def _stop_idle(self) -> None:
        if self._idle is not None and self._idle.active():
            self._idle.cancel()
        self._idle = None

    def _went_quiet(self) -> None:
        self._idle = None
        self._fail(
            ExportIncomplete(
                f"no data from {self._where} for {self._idle_s:g} s after {self.events} events",
                self.events,
            )
        )

    def _fail(self, exc: BaseException) -> None:
        if self.finished.called:
            return
        self._stop_idle()
        self.finished.errback(Failure(exc))
        if self.transport is not None:
            cast(IPushProducer, self.transport).stopProducing()

    def dataReceived(self, data: bytes) -> None:
        if self.finished.called:
            return
        if self._idle is not None:
            self._idle.reset(self._idle_s)
        self._buffer += data
        start = 0
        try:
            while (newline := self._buffer.find(b"\n", start)) >= 0:
                self._line(bytes(self._buffer[start:newline]))
                start = newline + 1
                if self.finished.called:
                    return
        except Exception as exc:  # the sink failed (a full disk, a closed pipe): stop here
            self._fail(exc)
            return
        del self._buffer[:start]
        if len(self._buffer) > MAX_EXPORT_LINE_BYTES:
            self._fail(self._broken(f"a line longer than {MAX_EXPORT_LINE_BYTES} bytes"))

    def _broken(self, what: str) -> ExportIncomplete:
        return ExportIncomplete(
            f"the export from {self._where} is broken after {self.events} events: {what}",
            self.events,
        )

    def _line(self, line: bytes) -> None:
        if self._end is not None:
            self._fail(self._broken("data after its end line"))
            return
        try:
            event = codec.decode(line, AuditEvent, max_bytes=MAX_EXPORT_LINE_BYTES)
        except MalformedFrame:
            try:
                self._end = codec.decode(line, AuditExportEnd, max_bytes=MAX_EXPORT_LINE_BYTES)
            except MalformedFrame:
                self._fail(self._broken(f"line {self.events + 1} is not an audit event"))
            return
        self._on_event(event)
        self.events += 1

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._stop_idle()
        if self.finished.called:
            return
        whole = isinstance(reason.value, (ResponseDone, PotentialDataLoss))
        end = self._end
        if not whole or end is None:
            self._fail(
                ExportIncomplete(
                    f"the export from {self._where} stopped after {self.events} events "
                    "without its end line",
                    self.events,
                )
            )
        elif self._buffer:
            self._fail(self._broken("data after its end line"))
        elif end.events != self.events:
            self._fail(self._broken(f"its end line counts {end.events} events"))
        else:
            self.finished.callback(end)


def _read_body(response: IResponse, limit: int) -> defer.Deferred[bytes]:
    reader = _CappedBodyReader(limit)
    response.deliverBody(reader)
    return reader.finished


# --- the API -------------------------------------------------------------------------------------


class RelayApi:
    """The relay's HTTP routes as methods returning Deferreds of typed bodies."""

    def __init__(
        self,
        reactor: Any,
        relay_url: RelayUrl,
        credentials: Credentials | None,
        ca_file: str | None = None,
        *,
        clock: IReactorTime | None = None,
        timeout_s: float = limits.HTTP_TIMEOUT_S,
        tls_policy: RelayTlsPolicy | None = None,
    ) -> None:
        """``tls_policy``: the trust already read for this relay (by a caller that also dials
        its sockets); without it, ``ca_file`` (or the platform's roots) is read now, so a bad
        path is reported before anything is dialled."""
        self.relay_url = relay_url
        self.credentials = credentials
        self._clock: IReactorTime = reactor if clock is None else clock
        self._timeout_s = timeout_s
        policy: IPolicyForHTTPS
        if not relay_url.secure:
            policy = BrowserLikePolicyForHTTPS()
        elif tls_policy is not None:
            policy = tls_policy
        else:
            policy = RelayTlsPolicy(ca_file)
        self._agent = Agent(reactor, contextFactory=policy, connectTimeout=timeout_s)

    def __repr__(self) -> str:
        return f"<RelayApi {self.relay_url} as {self.credentials!r}>"

    # Routes, in the order of the wire module's list.

    def status(self) -> defer.Deferred[StatusResponse]:
        return self._call(b"GET", "/v1/status", None, StatusResponse, auth=False)

    def register(self, request: RegisterRequest) -> defer.Deferred[RegisterResponse]:
        return self._call(b"POST", "/v1/register", request, RegisterResponse, auth=False)

    def whoami(self) -> defer.Deferred[WhoAmIResponse]:
        return self._call(b"GET", "/v1/me", None, WhoAmIResponse)

    def create_invite(self, request: InviteCreateRequest) -> defer.Deferred[InviteCreated]:
        return self._call(b"POST", "/v1/invites", request, InviteCreated)

    def list_invites(self) -> defer.Deferred[InviteList]:
        return self._call(b"GET", "/v1/invites", None, InviteList)

    def revoke_invite(self, invite_id: str) -> defer.Deferred[InviteInfo]:
        if ids.HEX64_RE.match(invite_id) is None:
            return defer.fail(ValueError("an invite id is 64 lowercase hex characters"))
        return self._call(b"POST", f"/v1/invites/{invite_id}/revoke", None, InviteInfo)

    def recover(self, request: RecoverRequest) -> defer.Deferred[RegisterResponse]:
        """Reclaim an address with a recovery code's statement (no credentials needed)."""
        return self._call(b"POST", "/v1/recover", request, RegisterResponse, auth=False)

    def rotate_token(self, token: str) -> defer.Deferred[TokenRotated]:
        """Make ``token`` this member's bearer token; the one these credentials hold dies."""
        return self._call(b"POST", "/v1/me/token", TokenRotateRequest(token=token), TokenRotated)

    def list_members(self, after: str = "") -> defer.Deferred[MemberList]:
        """One page of the organisation's members (admins only), from the handle after
        ``after``; the page's ``next_after`` says where the next one starts."""
        if after and not ids.is_handle(after):
            return defer.fail(ValueError(f"not a valid handle: {after!r}"))
        path = "/v1/members" + (f"?after={after}" if after else "")
        return self._call(b"GET", path, None, MemberList)

    def remove_member(self, handle: str, *, release: bool = False) -> defer.Deferred[MemberInfo]:
        if not ids.is_handle(handle):
            return defer.fail(ValueError(f"not a valid handle: {handle!r}"))
        body = MemberRemoveRequest(release=release)
        return self._call(b"POST", f"/v1/members/{handle}/remove", body, MemberInfo)

    def set_member_role(self, handle: str, role: MemberRole) -> defer.Deferred[MemberInfo]:
        if not ids.is_handle(handle):
            return defer.fail(ValueError(f"not a valid handle: {handle!r}"))
        body = MemberRoleRequest(role=role)
        return self._call(b"PUT", f"/v1/members/{handle}/role", body, MemberInfo)

    def put_identity_key(self, record: SignedIdentityRecord) -> defer.Deferred[KeysResponse]:
        return self._call(b"PUT", "/v1/keys/identity", record, KeysResponse)

    def put_encryption_key(self, record: SignedEncryptionKeyRecord) -> defer.Deferred[KeysResponse]:
        return self._call(b"PUT", "/v1/keys/encryption", record, KeysResponse)

    def get_keys(self, handle: str) -> defer.Deferred[KeysResponse]:
        if not ids.is_handle(handle):
            return defer.fail(ValueError(f"not a valid handle: {handle!r}"))
        return self._call(b"GET", f"/v1/keys/{handle}", None, KeysResponse)

    def put_card(self, card: SignedCardRecord) -> defer.Deferred[SignedCardRecord]:
        return self._call(b"PUT", "/v1/card", card, SignedCardRecord)

    def get_card(self, handle: str) -> defer.Deferred[SignedCardRecord]:
        """The member's published card, as the relay serves it (verify it before showing it)."""
        if not ids.is_handle(handle):
            return defer.fail(ValueError(f"not a valid handle: {handle!r}"))
        return self._call(b"GET", f"/v1/cards/{handle}", None, SignedCardRecord)

    def presence(self) -> defer.Deferred[PresenceResponse]:
        return self._call(b"GET", "/v1/presence", None, PresenceResponse)

    def set_offline_delivery(self, enabled: bool) -> defer.Deferred[OfflineDelivery]:
        body = OfflineDelivery(enabled=enabled)
        return self._call(b"PUT", "/v1/me/offline-delivery", body, OfflineDelivery)

    def list_jobs(self) -> defer.Deferred[JobList]:
        return self._call(b"GET", "/v1/jobs", None, JobList)

    def get_job(self, job_id: str, wait_s: int = 0) -> defer.Deferred[JobInfo]:
        """The job; with ``wait_s`` the relay holds the answer until the job has ended or
        that many seconds (at most ``MAILBOX_MAX_WAIT_S``) have passed."""
        if not ids.is_job_id(job_id):
            return defer.fail(ValueError(f"not a valid job id: {job_id!r}"))
        if (
            isinstance(wait_s, bool)
            or not isinstance(wait_s, int)
            or not 0 <= wait_s <= limits.MAILBOX_MAX_WAIT_S
        ):
            return defer.fail(
                ValueError(f"wait must be 0..{limits.MAILBOX_MAX_WAIT_S:g} whole seconds")
            )
        path = f"/v1/jobs/{job_id}" + (f"?wait={wait_s}" if wait_s else "")
        # The relay may rightly stay silent for the whole wait: our timeout starts after it.
        return self._call(
            b"GET",
            path,
            None,
            JobInfo,
            timeout_s=self._timeout_s + wait_s,
            max_bytes=MAX_JOB_BODY_BYTES,
        )

    def cancel_job(self, job_id: str) -> defer.Deferred[JobInfo]:
        if not ids.is_job_id(job_id):
            return defer.fail(ValueError(f"not a valid job id: {job_id!r}"))
        return self._call(
            b"POST", f"/v1/jobs/{job_id}/cancel", None, JobInfo, max_bytes=MAX_JOB_BODY_BYTES
        )

    def export_audit(
        self,
        on_event: Callable[[AuditEvent], None],
        *,
        since: int | None = None,
        until: int | None = None,
    ) -> defer.Deferred[AuditExportEnd]:
        """Stream the organisation's audit rows (admins only), ``since <= at < until`` in
        whole seconds: ``on_event`` gets each as it arrives, in id order, and nothing is kept.
        Fires with the end line once the export is whole; :class:`ExportIncomplete` when it
        stopped short (then what ``on_event`` got is not the whole export)."""
        query = [
            f"{name}={value}"
            for name, value in (("since", since), ("until", until))
            if value is not None
        ]
        for value in (since, until):
            if value is not None and (isinstance(value, bool) or not 0 <= value <= 2**40):
                return defer.fail(ValueError("since and until are whole seconds since 1970"))
        path = "/v1/audit/export" + ("?" + "&".join(query) if query else "")
        return defer.Deferred.fromCoroutine(self._export(path, on_event))

    async def _export(self, path: str, on_event: Callable[[AuditEvent], None]) -> AuditExportEnd:
        headers = self._headers(auth=True, has_body=False)
        url = self.relay_url.http(path).encode("ascii")
        # The answer's head has the usual time to come; then the stream only must not go quiet.
        asked = self._agent.request(b"GET", url, headers, None)
        timer = self._clock.callLater(self._timeout_s, asked.cancel)
        try:
            response: IResponse = await asked
        except Exception as exc:
            if not timer.active():
                raise RelayUnreachable(
                    f"no answer from {self.relay_url.netloc} within {self._timeout_s:g} s"
                ) from None
            raise RelayUnreachable(describe_failure(Failure(exc), self.relay_url)) from None
        finally:
            if timer.active():
                timer.cancel()
        if not 200 <= response.code < 300:
            try:
                payload = await _read_body(response, MAX_RESPONSE_BODY_BYTES)
            except _BodyTooLarge:
                payload = b""
            raise _api_error(response.code, payload, b"GET", path)
        reader = _ExportReader(on_event, self._clock, self._timeout_s, self.relay_url.netloc)
        response.deliverBody(reader)
        return await reader.finished

    def list_holds(self) -> defer.Deferred[AuditHoldList]:
        return self._call(b"GET", "/v1/audit/holds", None, AuditHoldList)

    def set_hold(self, handle: str | None, note: str | None = None) -> defer.Deferred[AuditHold]:
        """Put the organisation (``handle`` None) or one handle under legal hold."""
        if handle is not None and not ids.is_handle(handle):
            return defer.fail(ValueError(f"not a valid handle: {handle!r}"))
        body = AuditHoldRequest(handle=handle, note=note)
        return self._call(b"PUT", "/v1/audit/holds", body, AuditHold)

    def clear_hold(self, handle: str | None) -> defer.Deferred[AuditHold]:
        if handle is not None and not ids.is_handle(handle):
            return defer.fail(ValueError(f"not a valid handle: {handle!r}"))
        body = AuditHoldRequest(handle=handle)
        return self._call(b"POST", "/v1/audit/holds/clear", body, AuditHold)

    # Plumbing.

    def _call(
        self,
        method: bytes,
        path: str,
        body: object,
        cls: type[T],
        *,
        auth: bool = True,
        timeout_s: float | None = None,
        max_bytes: int = MAX_RESPONSE_BODY_BYTES,
    ) -> defer.Deferred[T]:
        timeout = self._timeout_s if timeout_s is None else timeout_s
        exchange: Coroutine[Any, Any, T] = self._exchange(method, path, body, cls, auth, max_bytes)
        d = defer.Deferred.fromCoroutine(exchange)
        # Not addTimeout: cancelling the Agent's request surfaces as ResponseNeverReceived, not
        # CancelledError, so the timeout has to be remembered to be reported as one.
        timed_out: list[bool] = []

        def expire() -> None:
            timed_out.append(True)
            d.cancel()

        timer = self._clock.callLater(timeout, expire)

        def settle(result: object) -> object:
            if not timed_out:
                timer.cancel()
            return result

        d.addBoth(settle)
        d.addErrback(self._unreachable, timed_out, timeout)
        return d

    def _headers(self, *, auth: bool, has_body: bool) -> Headers:
        raw: dict[bytes, list[bytes]] = {
            b"User-Agent": [USER_AGENT.encode("ascii")],
            b"Accept": [b"application/json"],
        }
        if has_body:
            raw[b"Content-Type"] = [b"application/json"]
        if auth:
            if self.credentials is None:
                raise MissingCredentials("this request needs an enrolled identity")
            raw.update({name: [value] for name, value in self.credentials.headers().items()})
        return Headers(raw)

    async def _exchange(
        self, method: bytes, path: str, body: object, cls: type[T], auth: bool, max_bytes: int
    ) -> T:
        data = None if body is None else codec.encode(body)
        headers = self._headers(auth=auth, has_body=data is not None)
        url = self.relay_url.http(path).encode("ascii")
        producer: IBodyProducer | None = None if data is None else _BytesBody(data)
        response: IResponse = await self._agent.request(method, url, headers, producer)
        status = response.code
        try:
            payload = await _read_body(response, max_bytes)
        except _BodyTooLarge:
            raise ApiError(
                status,
                ApiErrorCode.INTERNAL,
                f"the relay's answer to {method.decode()} {path} is larger than {max_bytes} bytes",
            ) from None
        if not 200 <= status < 300:
            raise _api_error(status, payload, method, path)
        try:
            return codec.decode(payload, cls, max_bytes=max_bytes)
        except MalformedFrame:
            raise ApiError(
                status,
                ApiErrorCode.INTERNAL,
                f"the relay's answer to {method.decode()} {path} is not a valid {cls.__name__}",
            ) from None

    def _unreachable(self, failure: Failure, timed_out: list[bool], timeout_s: float) -> Failure:
        if timed_out:
            raise RelayUnreachable(f"no answer from {self.relay_url.netloc} within {timeout_s:g} s")
        # Our own errors (ApiError, MissingCredentials) already say what happened.
        if isinstance(failure.value, AgentCallError):
            return failure
        raise RelayUnreachable(describe_failure(failure, self.relay_url, timeout_s))


def _api_error(status: int, payload: bytes, method: bytes, path: str) -> ApiError:
    try:
        body = codec.decode(payload, ApiErrorBody, max_bytes=MAX_RESPONSE_BODY_BYTES)
    except MalformedFrame:
        return ApiError(
            status,
            ApiErrorCode.INTERNAL,
            f"the relay answered {method.decode()} {path} with HTTP {status}",
        )
    return ApiError(status, body.error, body.message)
