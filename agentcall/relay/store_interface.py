"""What the relay asks of its store, and the values the store hands back.

SQLite (:class:`agentcall.relay.store.SqliteRelayStore`) is the embedded default; a PostgreSQL
store for a fleet of relays (``twisted.enterprise.adbapi``) implements the same interface. Every
method returns a Deferred, so a store may answer later without blocking the reactor, and nothing
above the store may assume that it has already answered. Refusals meant for API clients arrive
as a failed Deferred carrying ``ApiError(status, code, message)``; a failing database as
``StoreError``. Every method that depends on time takes ``now`` (seconds since the epoch): a
store never reads the clock.

Each method is declared once, here, as a typing :class:`~typing.Protocol`; narrow views
(:class:`Directory`, :class:`~agentcall.relay.audit.AuditSink`, :class:`SubmissionLog`) are
the protocols :class:`RelayStore` is built from, so a core asks for only what it uses. Not a
zope interface: what matters for an asynchronous store is the return type (a Deferred of the
right value, never a bare value), which zope cannot express and mypy checks on every caller,
implementation and fake alike.
"""

from __future__ import annotations

from typing import Protocol

import attrs
from twisted.internet.defer import Deferred

from agentcall import ids
from agentcall.relay.audit import AuditSink
from agentcall.wire.http import (
    AgentKind,
    InviteInfo,
    KeysResponse,
    MemberRole,
    SignedEncryptionKeyRecord,
    SignedIdentityRecord,
)


@attrs.frozen
class Member:
    """An enrolled installation. Its token hash never leaves the store."""

    org: str
    handle: str
    role: MemberRole
    agent_kind: AgentKind | None
    created_at: float

    @property
    def address(self) -> str:
        return ids.format_address(self.org, self.handle)


@attrs.frozen
class AuditRow:
    """One audit row: metadata about an action, never content, tokens or secrets."""

    id: int
    at: float
    org: str
    event: str
    actor: str | None
    target: str | None
    call_id: str | None
    detail: str | None


@attrs.frozen
class Submission:
    """One call the relay let ring: who called whom, and when (from its ``call.submit`` row)."""

    org: str
    caller: str
    callee: str
    at: float


class Directory(Protocol):
    """Who exists in an organisation (the relay's registry, read-only view)."""

    def handle_exists(self, org: str, handle: str) -> Deferred[bool]:
        """True when ``@org/handle`` is an enrolled identity."""
        ...


class SubmissionLog(Protocol):
    """The calls that rang, as their ``call.submit`` audit rows remember them."""

    def submissions_since(self, since: float) -> Deferred[list[Submission]]:
        """Every call submitted at or after ``since``, in every organisation, oldest first."""
        ...


class RelayStore(Directory, AuditSink, SubmissionLog, Protocol):
    """The relay's registry: orgs, members, invites, published keys, audit rows."""

    def ensure_org(self, org: str, now: float) -> Deferred[bool]:
        """Create the organisation unless it exists; True when it was created."""
        ...

    def org_exists(self, org: str) -> Deferred[bool]:
        """True when the organisation exists."""
        ...

    def get_member(self, org: str, handle: str) -> Deferred[Member | None]:
        """The member ``@org/handle``, or None."""
        ...

    def authenticate(self, org: str, handle: str, token: str) -> Deferred[Member | None]:
        """The member whose bearer token is ``token`` (compared in constant time), or None."""
        ...

    def create_invite(
        self,
        org: str,
        *,
        created_by: str | None,
        role: MemberRole,
        expires_in_days: int,
        description: str | None,
        now: float,
    ) -> Deferred[tuple[str, InviteInfo]]:
        """Mint a one-time invite; ``(secret, InviteInfo)``. The secret is shown once.

        409 ``too_many_invites`` past the active-invite cap of the organisation.
        """
        ...

    def list_invites(self, org: str, now: float) -> Deferred[list[InviteInfo]]:
        """The organisation's invites (a bounded list), active ones first."""
        ...

    def revoke_invite(
        self, org: str, invite_id: str, *, actor: str | None, now: float
    ) -> Deferred[InviteInfo]:
        """Revoke an unused invite; its ``InviteInfo``. Revoking twice is harmless.

        404 ``not_found`` for an unknown id; 409 ``invite_used`` once it was redeemed.
        """
        ...

    def register(
        self, org: str, secret: str, handle: str, agent_kind: AgentKind | None, now: float
    ) -> Deferred[tuple[Member, str]]:
        """Redeem an invite for ``handle``; ``(Member, token)`` with a fresh token.

        Distinct refusals: ``handle_invalid`` 400, ``invite_unknown`` 404, ``invite_used``,
        ``invite_revoked``, ``invite_expired`` 410, ``handle_taken`` 409 (invite stays unused).
        """
        ...

    def publish_identity(
        self, org: str, handle: str, signed: SignedIdentityRecord, now: float
    ) -> Deferred[None]:
        """Store a verified ``SignedIdentityRecord``; the same one again is a no-op.

        409 ``identity_key_exists`` for any other record: identities are never replaced.
        """
        ...

    def publish_encryption(
        self, org: str, handle: str, signed: SignedEncryptionKeyRecord, now: float
    ) -> Deferred[None]:
        """Store a verified ``SignedEncryptionKeyRecord`` whose epoch is above every stored one.

        409 ``identity_key_missing`` before an identity; 409 ``epoch_not_increasing``.
        """
        ...

    def fetch_keys(self, org: str, handle: str) -> Deferred[KeysResponse | None]:
        """``KeysResponse`` (identity and highest epoch), or None without an identity."""
        ...

    def audit_rows(
        self, org: str, *, limit: int = 100, after_id: int = 0
    ) -> Deferred[list[AuditRow]]:
        """Audit rows of the organisation with ids above ``after_id``, oldest first."""
        ...
