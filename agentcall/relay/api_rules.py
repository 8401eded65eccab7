"""The relay HTTP API's decisions, apart from twisted.web.

Which route a method and path name, who may use each route, whether a key record a member
publishes may be stored, and what a member may see of a mailbox job. Pure: no sockets, no
store, no clock. The adapter (:mod:`agentcall.relay.web`) parses the request, fetches what a
rule needs (the authenticated member, the keys already published, ``now``) and renders the
answer; every refusal here is an :class:`~agentcall.errors.ApiError`.
"""

from __future__ import annotations

import enum
import re
import urllib.parse
from collections.abc import Mapping

import attrs

from agentcall import ids, limits
from agentcall.crypto import card, records, recovery
from agentcall.errors import ApiError, ApiErrorCode, CryptoError, MalformedFrame, StoreError
from agentcall.relay.mailbox import Job, JobState
from agentcall.relay.store_interface import AuditRow, Member, StoredJob
from agentcall.wire import codec, http
from agentcall.wire.frames import SealedEnvelope


class Route(enum.Enum):
    """One thing the API does."""

    STATUS = "status"
    REGISTER = "register"
    RECOVER = "recover"
    ME = "me"
    PRESENCE = "presence"
    CREATE_INVITE = "create_invite"
    LIST_INVITES = "list_invites"
    REVOKE_INVITE = "revoke_invite"
    PUBLISH_IDENTITY = "publish_identity"
    PUBLISH_ENCRYPTION = "publish_encryption"
    FETCH_KEYS = "fetch_keys"
    SET_OFFLINE_DELIVERY = "set_offline_delivery"
    LIST_JOBS = "list_jobs"
    GET_JOB = "get_job"
    CANCEL_JOB = "cancel_job"
    ROTATE_CREDENTIALS = "rotate_credentials"
    LIST_MEMBERS = "list_members"
    REMOVE_MEMBER = "remove_member"
    SET_MEMBER_ROLE = "set_member_role"
    PUBLISH_CARD = "publish_card"
    FETCH_CARD = "fetch_card"
    EXPORT_AUDIT = "export_audit"
    LIST_HOLDS = "list_holds"
    SET_HOLD = "set_hold"
    CLEAR_HOLD = "clear_hold"


class Access(enum.Enum):
    """Who may use a route."""

    ANYONE = "anyone"  # no credentials looked at
    MEMBER = "member"  # any enrolled member of an organisation
    ADMIN = "admin"  # an admin of the member's own organisation


ACCESS: Mapping[Route, Access] = {
    Route.STATUS: Access.ANYONE,
    # Credentials are what registration hands out; the door throttles it per source instead.
    Route.REGISTER: Access.ANYONE,
    # Proven by the recovery code's signature instead; throttled per source like register.
    Route.RECOVER: Access.ANYONE,
    Route.ME: Access.MEMBER,
    Route.PRESENCE: Access.MEMBER,
    Route.CREATE_INVITE: Access.ADMIN,
    Route.LIST_INVITES: Access.ADMIN,
    Route.REVOKE_INVITE: Access.ADMIN,
    Route.PUBLISH_IDENTITY: Access.MEMBER,
    Route.PUBLISH_ENCRYPTION: Access.MEMBER,
    Route.FETCH_KEYS: Access.MEMBER,
    # Each member's own setting and own jobs only; a job of someone else is not found.
    Route.SET_OFFLINE_DELIVERY: Access.MEMBER,
    Route.LIST_JOBS: Access.MEMBER,
    Route.GET_JOB: Access.MEMBER,
    Route.CANCEL_JOB: Access.MEMBER,
    Route.ROTATE_CREDENTIALS: Access.MEMBER,
    Route.LIST_MEMBERS: Access.ADMIN,
    Route.REMOVE_MEMBER: Access.ADMIN,
    Route.SET_MEMBER_ROLE: Access.ADMIN,
    # One's own card; anyone's card in one's own organisation (it holds only what its owner
    # offers every member).
    Route.PUBLISH_CARD: Access.MEMBER,
    Route.FETCH_CARD: Access.MEMBER,
    Route.EXPORT_AUDIT: Access.ADMIN,
    Route.LIST_HOLDS: Access.ADMIN,
    Route.SET_HOLD: Access.ADMIN,
    Route.CLEAR_HOLD: Access.ADMIN,
}

_FIXED: Mapping[tuple[str, str], Route] = {
    ("GET", "/v1/status"): Route.STATUS,
    ("POST", "/v1/register"): Route.REGISTER,
    ("POST", "/v1/recover"): Route.RECOVER,
    ("GET", "/v1/me"): Route.ME,
    ("POST", "/v1/invites"): Route.CREATE_INVITE,
    ("GET", "/v1/invites"): Route.LIST_INVITES,
    ("PUT", "/v1/keys/identity"): Route.PUBLISH_IDENTITY,
    ("PUT", "/v1/keys/encryption"): Route.PUBLISH_ENCRYPTION,
    ("GET", "/v1/presence"): Route.PRESENCE,
    ("PUT", "/v1/me/offline-delivery"): Route.SET_OFFLINE_DELIVERY,
    ("GET", "/v1/jobs"): Route.LIST_JOBS,
    ("GET", "/v1/members"): Route.LIST_MEMBERS,
    ("PUT", "/v1/card"): Route.PUBLISH_CARD,
    ("POST", "/v1/me/token"): Route.ROTATE_CREDENTIALS,
    ("GET", "/v1/audit/export"): Route.EXPORT_AUDIT,
    ("GET", "/v1/audit/holds"): Route.LIST_HOLDS,
    ("PUT", "/v1/audit/holds"): Route.SET_HOLD,
    ("POST", "/v1/audit/holds/clear"): Route.CLEAR_HOLD,
}
_FIXED_PATHS = frozenset(path for (_method, path) in _FIXED)
_INVITE_REVOKE = re.compile(r"^/v1/invites/([0-9a-f]{64})/revoke$")
_KEYS_OF = re.compile(r"^/v1/keys/([a-z0-9][a-z0-9-]{1,30})$")
# The handle's own grammar (ids.is_handle) is checked once the path matched.
_CARD_OF = re.compile(r"^/v1/cards/([a-z0-9-]{2,31})\Z")
_MEMBER_REMOVE = re.compile(r"^/v1/members/([a-z0-9-]{2,31})/remove\Z")
_MEMBER_ROLE = re.compile(r"^/v1/members/([a-z0-9-]{2,31})/role\Z")
_JOB_ID = ids.JOB_ID_RE.pattern.removeprefix("^").removesuffix(r"\Z")
_JOB = re.compile(rf"^/v1/jobs/({_JOB_ID})\Z")
_JOB_CANCEL = re.compile(rf"^/v1/jobs/({_JOB_ID})/cancel\Z")
_WAIT = re.compile(r"^[0-9]{1,3}\Z")
# Someone asking the presence of another by path; what they name is judged by presence_subject.
_PRESENCE_OF = re.compile(r"^/v1/presence/((?:@[^/]{1,40}/)?[^/]{1,100})\Z")
_SECONDS = re.compile(r"^[0-9]{1,13}\Z")


@attrs.frozen
class RouteMatch:
    route: Route
    # The invite id (REVOKE_INVITE), handle (FETCH_KEYS, FETCH_CARD, REMOVE_MEMBER,
    # SET_MEMBER_ROLE), job id (GET_JOB, CANCEL_JOB) or whoever PRESENCE is asked about the
    # path names; None for the rest.
    argument: str | None = None

    @property
    def access(self) -> Access:
        return ACCESS[self.route]


def match(method: str, path: str) -> RouteMatch:
    """The route ``method`` and ``path`` (without a trailing slash) name.

    Raises 405 for a fixed path asked with another method and 404 for anything else. The fixed
    routes come first, so ``GET /v1/keys/identity`` fetches the keys of a handle ``identity``.
    """
    fixed = _FIXED.get((method, path))
    if fixed is not None:
        return RouteMatch(fixed)
    if method == "POST" and (found := _INVITE_REVOKE.match(path)):
        return RouteMatch(Route.REVOKE_INVITE, found.group(1))
    if method == "GET" and (found := _KEYS_OF.match(path)):
        return RouteMatch(Route.FETCH_KEYS, found.group(1))
    if method == "GET" and (found := _CARD_OF.match(path)) and ids.is_handle(found[1]):
        return RouteMatch(Route.FETCH_CARD, found.group(1))
    if method == "GET" and (found := _JOB.match(path)):
        return RouteMatch(Route.GET_JOB, found.group(1))
    if method == "POST" and (found := _JOB_CANCEL.match(path)):
        return RouteMatch(Route.CANCEL_JOB, found.group(1))
    if method == "POST" and (found := _MEMBER_REMOVE.match(path)) and ids.is_handle(found[1]):
        return RouteMatch(Route.REMOVE_MEMBER, found.group(1))
    if method == "PUT" and (found := _MEMBER_ROLE.match(path)) and ids.is_handle(found[1]):
        return RouteMatch(Route.SET_MEMBER_ROLE, found.group(1))
    if method == "GET" and (found := _PRESENCE_OF.match(path)):
        return RouteMatch(Route.PRESENCE, found.group(1))
    if path in _FIXED_PATHS:
        raise ApiError(405, ApiErrorCode.METHOD_NOT_ALLOWED, f"{method} not allowed here")
    raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such route")


def authorize(route: Route, member: Member) -> None:
    """Refuse (403) an authenticated member a route their role does not allow."""
    if ACCESS[route] is Access.ADMIN and member.role is not http.MemberRole.ADMIN:
        raise ApiError(403, ApiErrorCode.FORBIDDEN, "only an organisation admin may do this")


def check_record_names(member: Member, address: str, origin: str, relay_origin: str) -> None:
    """A member publishes records for themselves on this relay, never for anyone or anywhere
    else."""
    if address != ids.format_address(member.org, member.handle):
        raise ApiError(400, ApiErrorCode.RECORD_INVALID, "a record may only name yourself")
    if origin != relay_origin:
        raise ApiError(400, ApiErrorCode.RECORD_INVALID, "record names another relay")


def check_identity_record(
    member: Member, signed: http.SignedIdentityRecord, relay_origin: str
) -> None:
    """An identity record may be stored: it names the member on this relay and is self-signed."""
    check_record_names(member, signed.record.address, signed.record.relay_origin, relay_origin)
    try:
        records.verify_identity_record(signed)
    except CryptoError as exc:
        raise ApiError(400, ApiErrorCode.SIGNATURE_INVALID, str(exc)) from exc


def check_encryption_record(
    member: Member,
    signed: http.SignedEncryptionKeyRecord,
    current: http.KeysResponse | None,
    relay_origin: str,
    now: float,
) -> None:
    """An encryption record may be stored: it names the member on this relay, is signed by the
    identity key already published (409 without one), is valid at ``now``, and, when an
    encryption record is already published, is the next epoch chained to it."""
    check_record_names(member, signed.record.address, signed.record.relay_origin, relay_origin)
    if current is None:
        raise ApiError(409, ApiErrorCode.IDENTITY_KEY_MISSING, "publish the identity key first")
    try:
        records.verify_encryption_record(signed, current.identity.record.identity_pub, now=now)
        if current.encryption is not None:
            records.verify_chain(current.encryption, signed)
    except CryptoError as exc:
        raise ApiError(400, ApiErrorCode.SIGNATURE_INVALID, str(exc)) from exc


def check_recovery(
    request: http.RecoverRequest,
    current: http.KeysResponse | None,
    relay_origin: str,
    now: float,
) -> None:
    """A recovery may go ahead: the member's current identity record names a recovery key, that
    key signed a fresh statement moving this address on this relay to the identity key of the
    new record, and the new record is self-signed for the same address and relay. Every
    failure is the same 403, so the route reveals nothing to someone guessing."""
    refused = ApiError(403, ApiErrorCode.RECOVERY_REFUSED, "recovery refused")
    address = ids.format_address(request.org, request.handle)
    new = request.identity.record
    statement = request.statement.statement
    if current is None or current.identity.record.recovery_pub is None:
        raise refused
    if (new.address, new.relay_origin) != (address, relay_origin):
        raise refused
    if statement.new_identity_pub != new.identity_pub or new.recovery_pub is not None:
        raise refused
    if abs(statement.at - now) > limits.RECOVERY_STATEMENT_SKEW_S:
        raise refused
    try:
        records.verify_identity_record(request.identity)
        recovery.verify_statement(request.statement, current.identity)
    except CryptoError:
        raise refused from None


def published(keys: http.KeysResponse | None) -> http.KeysResponse:
    """The keys a handle has published, or 404."""
    if keys is None:
        raise ApiError(404, ApiErrorCode.NOT_FOUND, "no published keys for that handle")
    return keys


def check_card(
    member: Member,
    signed: http.SignedCardRecord,
    current: http.KeysResponse | None,
    relay_origin: str,
    now: float,
) -> None:
    """A card may be stored: it names the member on this relay, carries the identity key
    already published (409 without one) and is signed by it, and is not dated more than the
    clock skew into the future (such a card would shut out every honest one after it)."""
    check_record_names(member, signed.record.address, signed.record.relay_origin, relay_origin)
    if current is None:
        raise ApiError(409, ApiErrorCode.IDENTITY_KEY_MISSING, "publish the identity key first")
    if signed.record.issued_at > now + limits.CLOCK_SKEW_S:
        raise ApiError(400, ApiErrorCode.RECORD_INVALID, "the card is dated in the future")
    try:
        card.verify_card(
            signed,
            address=member.address,
            relay_origin=relay_origin,
            identity_pub=current.identity.record.identity_pub,
        )
    except CryptoError as exc:
        raise ApiError(400, ApiErrorCode.SIGNATURE_INVALID, str(exc)) from exc


def published_card(signed: http.SignedCardRecord | None) -> http.SignedCardRecord:
    """The card a handle has published, or 404."""
    if signed is None:
        raise ApiError(404, ApiErrorCode.NOT_FOUND, "no published card for that handle")
    return signed


# --- members ------------------------------------------------------------------------------------


def members_after(values: list[bytes] | None) -> str:
    """The ``after`` query parameter of ``GET /v1/members``: absent is the first page; otherwise
    exactly one handle (400 for anything else)."""
    if not values:
        return ""
    text = values[0].decode("ascii", "replace") if len(values) == 1 else ""
    if not ids.is_handle(text):
        raise ApiError(400, ApiErrorCode.BAD_REQUEST, "after must be one handle")
    return text


def member_page(found: list[http.MemberInfo], limit: int) -> http.MemberList:
    """A page of members as the store found them, asking for at most ``limit``: a full page
    names its last handle as where the next one starts (which may then be empty)."""
    page = tuple(found)
    full = len(page) >= limit and bool(page)
    return http.MemberList(members=page, next_after=page[-1].handle if full else None)


# --- the offline mailbox ----------------------------------------------------------------------


def wait_seconds(values: list[bytes] | None) -> int:
    """The ``wait`` query parameter of ``GET /v1/jobs/<id>``: absent is 0; otherwise exactly one
    whole number of seconds, 0..``MAILBOX_MAX_WAIT_S`` (400 for anything else)."""
    if not values:
        return 0
    text = values[0].decode("ascii", "replace") if len(values) == 1 else ""
    if _WAIT.match(text) is None or int(text) > limits.MAILBOX_MAX_WAIT_S:
        raise ApiError(
            400,
            ApiErrorCode.BAD_REQUEST,
            f"wait must be a whole number of seconds, 0..{int(limits.MAILBOX_MAX_WAIT_S)}",
        )
    return int(text)


def job_side(job: Job, member: Member) -> http.JobSide:
    """Whether ``member`` sent or receives ``job``; 404 when neither, exactly as for a job
    that does not exist (existence is never revealed)."""
    if job.org == member.org and job.caller == member.handle:
        return http.JobSide.SENT
    if job.org == member.org and job.callee == member.handle:
        return http.JobSide.RECEIVED
    raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such job")


def job_info(stored: StoredJob | Job | None, member: Member) -> http.JobInfo:
    """A job as ``member`` may see it: metadata for either party; the sealed answer (with its
    terminal) only for the caller of an answered job while the relay still holds it."""
    if stored is None:
        raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such job")
    if isinstance(stored, Job):
        stored = StoredJob(stored)
    job = stored.job
    side = job_side(job, member)
    answer: SealedEnvelope | None = None
    terminal = None
    if side is http.JobSide.SENT and job.state is JobState.ANSWERED and stored.answer is not None:
        try:
            answer = codec.decode(stored.answer, SealedEnvelope, max_bytes=len(stored.answer))
        except MalformedFrame as exc:
            raise StoreError(f"the stored answer of job {job.job_id} is unreadable") from exc
        terminal = stored.terminal
    return http.JobInfo(
        job_id=job.job_id,
        side=side,
        caller=ids.format_address(job.org, job.caller),
        callee=ids.format_address(job.org, job.callee),
        state=job.state,
        created_at=int(job.created_at),
        expires_at=int(job.expires_at),
        attempts=job.attempts,
        reason=job.reason,
        cancel_requested=job.cancel_requested,
        terminal=terminal if answer is not None else None,
        answer=answer,
    )


# --- presence -----------------------------------------------------------------------------------


def presence_subject(
    member: Member, path_argument: str | None, args: Mapping[bytes, list[bytes]]
) -> str | None:
    """Whom a presence request asks about: None for the asker themselves (the only answer the
    relay gives), otherwise what the audit row names as the target: a handle of the asker's
    organisation, or the address asked about in another.

    Presence is private: it would otherwise be a free directory of who is at their desk. So
    the caller refuses anyone else with the same 403 whether they exist or not. Someone can be
    named in the path (``/v1/presence/ken``), as ``?handle=`` or as ``?address=``; a name that
    is no handle or address, or more than one, is 400 and names nobody.
    """
    named: list[str] = [] if path_argument is None else [urllib.parse.unquote(path_argument)]
    for key in (b"handle", b"address"):
        named += [value.decode("utf-8", "replace") for value in args.get(key, [])]
    if not named:
        return None
    if len(named) > 1:
        raise ApiError(400, ApiErrorCode.BAD_REQUEST, "name at most one handle or address")
    text = named[0]
    if ids.is_handle(text):
        org, handle = member.org, text
    else:
        try:
            address = ids.parse_address(text)
        except ids.AddressError:
            raise ApiError(400, ApiErrorCode.BAD_REQUEST, "not a handle or address") from None
        org, handle = address.org, address.handle
    if (org, handle) == (member.org, member.handle):
        return None
    return handle if org == member.org else ids.format_address(org, handle)


PRESENCE_PRIVATE = "presence is private: the relay tells each member only their own"


# --- audit --------------------------------------------------------------------------------------


@attrs.frozen
class ExportWindow:
    """The rows an export covers: ``since <= at < until``, each bound absent for none."""

    since: int | None = None
    until: int | None = None

    def describe(self) -> str:
        """The window as the ``audit.export`` row's detail says it."""
        since = "start" if self.since is None else str(self.since)
        until = "now" if self.until is None else str(self.until)
        return f"since={since} until={until}"


def _seconds(values: list[bytes] | None, name: str) -> int | None:
    if not values:
        return None
    text = values[0].decode("ascii", "replace") if len(values) == 1 else ""
    if _SECONDS.match(text) is None or int(text) > 2**40:
        raise ApiError(
            400, ApiErrorCode.BAD_REQUEST, f"{name} must be whole seconds since the epoch (UTC)"
        )
    return int(text)


def export_window(args: Mapping[bytes, list[bytes]]) -> ExportWindow:
    """The ``since`` and ``until`` query parameters of ``GET /v1/audit/export``: whole seconds
    since the epoch, each optional; ``since`` before ``until`` (400 for anything else)."""
    window = ExportWindow(
        _seconds(args.get(b"since"), "since"), _seconds(args.get(b"until"), "until")
    )
    if window.since is not None and window.until is not None and window.since >= window.until:
        raise ApiError(400, ApiErrorCode.BAD_REQUEST, "since must be before until")
    return window


def export_event(row: AuditRow) -> http.AuditEvent:
    """One audit row as an export line: metadata, with the time in milliseconds."""
    return http.AuditEvent(
        id=row.id,
        at_ms=max(0, round(row.at * 1000)),
        event=row.event,
        actor=row.actor,
        target=row.target,
        call_id=row.call_id,
        detail=row.detail,
    )
