# zope interface methods are declarations: their bodies are only docstrings.
# mypy: disable-error-code="empty-body"
"""What the relay asks of its store, and the values the store hands back.

SQLite (:class:`agentcall.relay.store.SqliteRelayStore`) is the embedded default; a PostgreSQL
store for a fleet of relays would implement the same interface. Every method that depends on
time takes ``now`` (seconds since the epoch): a store never reads the clock.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from agentcall import ids
from agentcall.interfaces import IDirectory
from agentcall.relay.audit import AuditEntry, IAuditSink
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


class IRelayStore(IDirectory, IAuditSink):
    """The relay's registry: orgs, members, invites, published keys, audit rows.

    Refusals meant for API clients are ``ApiError(status, code, message)``; a failing database
    is ``StoreError``.
    """

    def ensure_org(org: str, now: float) -> bool:
        """Create the organisation unless it exists; True when it was created."""

    def org_exists(org: str) -> bool:
        """True when the organisation exists."""

    def get_member(org: str, handle: str) -> Member | None:
        """The member ``@org/handle``, or None."""

    def authenticate(org: str, handle: str, token: str) -> Member | None:
        """The member whose bearer token is ``token`` (compared in constant time), or None."""

    def create_invite(
        org: str,
        *,
        created_by: str | None,
        role: MemberRole,
        expires_in_days: int,
        description: str | None,
        now: float,
    ) -> tuple[str, InviteInfo]:
        """Mint a one-time invite; returns ``(secret, InviteInfo)``. The secret is shown once.

        409 ``too_many_invites`` past the active-invite cap of the organisation.
        """

    def list_invites(org: str, now: float) -> list[InviteInfo]:
        """The organisation's invites (a bounded list), active ones first."""

    def revoke_invite(org: str, invite_id: str, *, actor: str | None, now: float) -> InviteInfo:
        """Revoke an unused invite and return its ``InviteInfo``; revoking twice is harmless.

        404 ``not_found`` for an unknown id; 409 ``invite_used`` once it was redeemed.
        """

    def register(
        org: str, secret: str, handle: str, agent_kind: AgentKind | None, now: float
    ) -> tuple[Member, str]:
        """Redeem an invite for ``handle``; returns ``(Member, token)`` with a fresh token.

        Distinct refusals: ``handle_invalid`` 400, ``invite_unknown`` 404, ``invite_used``,
        ``invite_revoked``, ``invite_expired`` 410, ``handle_taken`` 409 (invite stays unused).
        """

    def publish_identity(org: str, handle: str, signed: SignedIdentityRecord, now: float) -> None:
        """Store a verified ``SignedIdentityRecord``; the same one again is a no-op.

        409 ``identity_key_exists`` for any other record: identities are never replaced.
        """

    def publish_encryption(
        org: str, handle: str, signed: SignedEncryptionKeyRecord, now: float
    ) -> None:
        """Store a verified ``SignedEncryptionKeyRecord`` whose epoch is above every stored one.

        409 ``identity_key_missing`` before an identity; 409 ``epoch_not_increasing``.
        """

    def fetch_keys(org: str, handle: str) -> KeysResponse | None:
        """``KeysResponse`` (identity and highest epoch), or None without an identity."""

    def audit_rows(org: str, *, limit: int = 100, after_id: int = 0) -> list[AuditRow]:
        """Audit rows of the organisation with ids above ``after_id``, oldest first."""

    def submissions_since(since: float) -> list[Submission]:
        """Every call submitted at or after ``since``, in every organisation, oldest first."""


class RelayStore(Protocol):
    """The structural twin of :class:`IRelayStore` for the type checker.

    zope declarations are invisible to mypy, so code that holds a store annotates with this
    protocol, while implementations declare ``IRelayStore`` and are checked with ``verifyObject``.
    """

    def handle_exists(self, org: str, handle: str) -> bool: ...

    def record(self, entry: AuditEntry) -> None: ...

    def ensure_org(self, org: str, now: float) -> bool: ...

    def org_exists(self, org: str) -> bool: ...

    def get_member(self, org: str, handle: str) -> Member | None: ...

    def authenticate(self, org: str, handle: str, token: str) -> Member | None: ...

    def create_invite(
        self,
        org: str,
        *,
        created_by: str | None,
        role: MemberRole,
        expires_in_days: int,
        description: str | None,
        now: float,
    ) -> tuple[str, InviteInfo]: ...

    def list_invites(self, org: str, now: float) -> list[InviteInfo]: ...

    def revoke_invite(
        self, org: str, invite_id: str, *, actor: str | None, now: float
    ) -> InviteInfo: ...

    def register(
        self, org: str, secret: str, handle: str, agent_kind: AgentKind | None, now: float
    ) -> tuple[Member, str]: ...

    def publish_identity(
        self, org: str, handle: str, signed: SignedIdentityRecord, now: float
    ) -> None: ...

    def publish_encryption(
        self, org: str, handle: str, signed: SignedEncryptionKeyRecord, now: float
    ) -> None: ...

    def fetch_keys(self, org: str, handle: str) -> KeysResponse | None: ...

    def audit_rows(self, org: str, *, limit: int = 100, after_id: int = 0) -> list[AuditRow]: ...

    def submissions_since(self, since: float) -> list[Submission]: ...
