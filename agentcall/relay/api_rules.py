"""The relay HTTP API's decisions, apart from twisted.web.

Which route a method and path name, who may use each route, and whether a key record a member
publishes may be stored. Pure: no sockets, no store, no clock. The adapter
(:mod:`agentcall.relay.web`) parses the request, fetches what a rule needs (the authenticated
member, the keys already published, ``now``) and renders the answer; every refusal here is an
:class:`~agentcall.errors.ApiError`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping

import attrs

from agentcall import ids
from agentcall.crypto import records
from agentcall.errors import ApiError, ApiErrorCode, CryptoError
from agentcall.relay.store_interface import Member
from agentcall.wire import http


class Route(enum.Enum):
    """One thing the API does."""

    STATUS = "status"
    REGISTER = "register"
    ME = "me"
    PRESENCE = "presence"
    CREATE_INVITE = "create_invite"
    LIST_INVITES = "list_invites"
    REVOKE_INVITE = "revoke_invite"
    PUBLISH_IDENTITY = "publish_identity"
    PUBLISH_ENCRYPTION = "publish_encryption"
    FETCH_KEYS = "fetch_keys"


class Access(enum.Enum):
    """Who may use a route."""

    ANYONE = "anyone"  # no credentials looked at
    MEMBER = "member"  # any enrolled member of an organisation
    ADMIN = "admin"  # an admin of the member's own organisation


ACCESS: Mapping[Route, Access] = {
    Route.STATUS: Access.ANYONE,
    # Credentials are what registration hands out; the door throttles it per source instead.
    Route.REGISTER: Access.ANYONE,
    Route.ME: Access.MEMBER,
    Route.PRESENCE: Access.MEMBER,
    Route.CREATE_INVITE: Access.ADMIN,
    Route.LIST_INVITES: Access.ADMIN,
    Route.REVOKE_INVITE: Access.ADMIN,
    Route.PUBLISH_IDENTITY: Access.MEMBER,
    Route.PUBLISH_ENCRYPTION: Access.MEMBER,
    Route.FETCH_KEYS: Access.MEMBER,
}

_FIXED: Mapping[tuple[str, str], Route] = {
    ("GET", "/v1/status"): Route.STATUS,
    ("POST", "/v1/register"): Route.REGISTER,
    ("GET", "/v1/me"): Route.ME,
    ("POST", "/v1/invites"): Route.CREATE_INVITE,
    ("GET", "/v1/invites"): Route.LIST_INVITES,
    ("PUT", "/v1/keys/identity"): Route.PUBLISH_IDENTITY,
    ("PUT", "/v1/keys/encryption"): Route.PUBLISH_ENCRYPTION,
    ("GET", "/v1/presence"): Route.PRESENCE,
}
_FIXED_PATHS = frozenset(path for (_method, path) in _FIXED)
_INVITE_REVOKE = re.compile(r"^/v1/invites/([0-9a-f]{64})/revoke$")
_KEYS_OF = re.compile(r"^/v1/keys/([a-z0-9][a-z0-9-]{1,30})$")


@attrs.frozen
class RouteMatch:
    route: Route
    # The invite id (REVOKE_INVITE) or handle (FETCH_KEYS) the path names; None for the rest.
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


def published(keys: http.KeysResponse | None) -> http.KeysResponse:
    """The keys a handle has published, or 404."""
    if keys is None:
        raise ApiError(404, ApiErrorCode.NOT_FOUND, "no published keys for that handle")
    return keys
