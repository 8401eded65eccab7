"""What the relay asks of its store, and the values the store hands back.

SQLite (:class:`agentcall.relay.store.SqliteRelayStore`) is the embedded default; a PostgreSQL
store for a fleet of relays (``twisted.enterprise.adbapi``) implements the same interface. Every
method returns a Deferred, so a store may answer later without blocking the reactor, and nothing
above the store may assume that it has already answered. Refusals meant for API clients arrive
as a failed Deferred carrying ``ApiError(status, code, message)``; a failing database as
``StoreError``. Every method that depends on time takes ``now`` (seconds since the epoch): a
store never reads the clock.

Each method is declared once, here, as a typing :class:`~typing.Protocol`; narrow views
(:class:`Directory`, :class:`KeySource`, :class:`~agentcall.relay.audit.AuditSink` and
:class:`~agentcall.relay.audit.AuditLog`, :class:`SubmissionLog`) are the protocols
:class:`RelayStore` is built from, so a core asks for only what it uses. Not a zope interface:
what matters for an asynchronous store is the return type (a Deferred of the right value, never a
bare value), which zope cannot express and mypy checks on every caller, implementation and fake
alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs
from twisted.internet.defer import Deferred

from agentcall import ids
from agentcall.errors import StorageFault
from agentcall.relay.audit import AuditLog, AuditSink
from agentcall.relay.mailbox import Decision, Job, Refused
from agentcall.wire.frames import Terminal
from agentcall.wire.http import (
    AgentKind,
    AuditHold,
    InviteInfo,
    KeysResponse,
    MemberInfo,
    MemberRole,
    SignedCardRecord,
    SignedEncryptionKeyRecord,
    SignedIdentityRecord,
)
from agentcall.wire.keyrecords import SignedRecoveryStatement


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
    """One call the relay let ring or queued: who called whom, and when (from its
    ``call.submit`` or ``job.queue`` row)."""

    org: str
    caller: str
    callee: str
    at: float


@attrs.frozen
class OneJob:
    """The scope of one job, by id."""

    job_id: str


@attrs.frozen
class JobsOf:
    """The scope of every job (any state) that some members of one organisation sent or
    receive: a caller and a callee for an enqueue, a callee for a delivery."""

    org: str
    handles: tuple[str, ...]


@attrs.frozen
class JobsDue:
    """The scope of the jobs about which time decides something at ``now``: a lease lapsed,
    expiry (of an outstanding job or of held ciphertext), or the end of the metadata grace."""

    now: float
    metadata_grace_s: float


@attrs.frozen
class JobsHeld:
    """The scope of every job holding a lease (delivered or running), in every organisation:
    the relay's start-up grace. Few rows: at most one per callee."""


JobScope = OneJob | JobsOf | JobsDue | JobsHeld

Decide = Callable[[Mapping[str, Job]], Sequence[Decision] | Refused]
"""A pure decision over the rows of a scope (:mod:`agentcall.relay.mailbox`). It may run in a
database thread, inside the transaction: it reads only its argument and what it closes over."""


@attrs.frozen
class SealedBytes:
    """Sealed bytes to keep with a decision about ``job_id``: the encoded request envelope of a
    job being queued, or the encoded answer envelope (with its terminal) of a job answered."""

    job_id: str
    request: bytes | None = None
    answer: bytes | None = None
    terminal: Terminal | None = None

    def __attrs_post_init__(self) -> None:
        if (self.request is None) == (self.answer is None):
            raise ValueError("sealed bytes are a request or an answer")
        if (self.answer is None) != (self.terminal is None):
            raise ValueError("an answer comes with its terminal")


@attrs.frozen
class StoredJob:
    """A job's row with the sealed bytes still kept for it (ciphertext; never opened)."""

    job: Job
    request: bytes | None = None
    answer: bytes | None = None
    terminal: Terminal | None = None


@attrs.frozen
class MailboxStatus:
    """What routing needs to know of a callee: opted in, and a job of theirs out to them."""

    offline_delivery: bool
    job_out: bool


class JobStore(Protocol):
    """The offline mailbox's rows. The store is the truth: several relays may share it, so
    nothing above it keeps jobs in memory as anything more than a hint.

    Isolation: the decisions over one scope must be serialisable. While ``decide`` runs on the
    rows of a scope, no other transaction may change those rows or add one that belongs to the
    scope, or two relays could each deliver a job to the same callee, or both let a caller past
    their cap. SQLite gives this with ``BEGIN IMMEDIATE`` (one writer at a time). PostgreSQL
    needs either SERIALIZABLE transactions, retried on a serialisation failure (``decide`` is
    pure, so it may simply run again on the rows read afresh), or, at READ COMMITTED, locks
    taken before the rows are read: an advisory (or row) lock per member in scope (the caller
    and the callee of an enqueue, the callee of a delivery, the callee of a job decided by id),
    taken in a fixed order, with the sweep and the start-up grace locking the members of the
    rows they change. Reads outside ``decide_jobs`` (``get_job``, ``jobs_of``, the deadline,
    ``mailbox_status``) may see any committed state.
    """

    def decide_jobs(
        self,
        scope: JobScope,
        decide: Decide,
        *,
        actor: str | None,
        at: float,
        sealed: SealedBytes | None = None,
    ) -> Deferred[list[Decision] | Refused]:
        """In one transaction: load the rows of ``scope``, run ``decide`` on them, and persist
        what it decided (rows inserted, updated or deleted; sealed bytes dropped; ``sealed``
        kept when its job is queued or answered; one audit row per event, ``actor`` causing it
        at ``at``). The decisions, or the refusal (then nothing is written).

        Serialisable over ``scope`` (see the class): the rows ``decide`` sees stay the rows it
        decides over until the transaction commits."""
        ...

    def get_job(self, job_id: str) -> Deferred[StoredJob | None]:
        """The job with the sealed bytes kept for it, or None."""
        ...

    def mailbox_bytes_held(self) -> Deferred[int]:
        """The sealed bytes held for every job together
        (:func:`agentcall.relay.mailbox.held_bytes`), for the relay-wide cap and its metric.

        Cheap enough to ask before every enqueue: keep a running total, or sum over an index;
        right after a restart as much as at any other time. Read outside ``decide_jobs``, so
        enqueues that race one another through a store that answers later may each pass the
        cap by one request: it bounds the disk, it is not a promise to the byte."""
        ...

    def jobs_of(self, org: str, handle: str, limit: int) -> Deferred[list[Job]]:
        """The jobs ``@org/handle`` sent or receives, newest first, at most ``limit``."""
        ...

    def next_job_deadline(self, metadata_grace_s: float) -> Deferred[float | None]:
        """The earliest time :func:`agentcall.relay.mailbox.sweep` would decide something
        (``mailbox.next_deadline`` over every row), or None."""
        ...

    def mailbox_status(self, org: str, handle: str) -> Deferred[MailboxStatus | None]:
        """The member's opt-in and whether a job is out to them; None for no such member."""
        ...

    def set_offline_delivery(
        self, org: str, handle: str, enabled: bool, now: float
    ) -> Deferred[None]:
        """Store the member's opt-in (audited ``member.offline_delivery`` when it changes).

        404 ``not_found`` for no such member."""
        ...


class Directory(Protocol):
    """Who exists in an organisation (the relay's registry, read-only view)."""

    def handle_exists(self, org: str, handle: str) -> Deferred[bool]:
        """True when ``@org/handle`` is an enrolled identity."""
        ...


class KeySource(Protocol):
    """Published key records (read-only): what ``GET /v1/keys`` serves, and what the relay
    attaches to ``incoming_call`` and ``job_delivery`` as the caller's."""

    def fetch_keys(self, org: str, handle: str) -> Deferred[KeysResponse | None]:
        """``KeysResponse`` (identity and highest epoch), or None without an identity."""
        ...


class SubmissionLog(Protocol):
    """The calls that rang, as their ``call.submit`` audit rows remember them."""

    def submissions_since(self, since: float) -> Deferred[list[Submission]]:
        """Every call submitted (rung or queued) at or after ``since``, in every organisation,
        oldest first."""
        ...


class AuditArchive(AuditSink, Protocol):
    """The audit rows kept, as an export reads them and retention prunes them, and the legal
    holds that stop retention (:mod:`agentcall.relay.retention`)."""

    def audit_rows(
        self,
        org: str,
        *,
        limit: int = 100,
        after_id: int = 0,
        up_to_id: int | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> Deferred[list[AuditRow]]:
        """Up to ``limit`` audit rows of the organisation with ``after_id < id <= up_to_id``
        and ``since <= at < until`` (each bound absent: none), by id."""
        ...

    def last_audit_id(self, org: str) -> Deferred[int]:
        """The id of the organisation's newest audit row; 0 without one."""
        ...

    def list_holds(self, org: str) -> Deferred[list[AuditHold]]:
        """The legal holds standing in the organisation (the organisation's own first)."""
        ...

    def set_hold(
        self, org: str, handle: str | None, *, note: str | None, actor: str, now: float
    ) -> Deferred[AuditHold]:
        """Hold the organisation (``handle`` None) or one handle; audited ``audit.hold.set``.
        A hold that stands already is answered as it is. 409 ``too_many_holds`` past the cap."""
        ...

    def clear_hold(
        self, org: str, handle: str | None, *, actor: str, now: float
    ) -> Deferred[AuditHold]:
        """Take a hold off (the hold it was); audited ``audit.hold.clear``. 404 ``not_found``."""
        ...

    def retention_orgs(self) -> Deferred[list[str]]:
        """The orgs whose rows retention looks at: ``audit.RELAY_WIDE`` and every organisation."""
        ...

    def prune_audit(self, org: str, before: float, limit: int) -> Deferred[int]:
        """Delete up to ``limit`` rows older than ``before`` that no hold covers, oldest first,
        in one transaction, reading the holds in it; how many were deleted."""
        ...

    def purge_invites(self, org: str, before: float) -> Deferred[int]:
        """Delete invites that ended before ``before`` and no hold covers; how many."""
        ...


class RelayStore(Directory, KeySource, AuditArchive, AuditLog, SubmissionLog, JobStore, Protocol):
    """The relay's registry: orgs, members, invites, published keys, audit rows, jobs."""

    def ping(self) -> Deferred[None]:
        """Fires once the database answered a query; fails (StoreError) when it cannot."""
        ...

    def probe(self, now: float) -> Deferred[None]:
        """Fires once a small write reached the storage; fails (StorageFault) while writes
        fail. The storage watch asks it to learn when a failing storage recovers."""
        ...

    def watch_faults(self, report: Callable[[StorageFault, str], object]) -> None:
        """Call ``report(fault, operation)`` for every operation that fails because the storage
        does (each also fails its Deferred with that :class:`StorageFault`)."""
        ...

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

    def list_members(self, org: str, *, after: str = "", limit: int) -> Deferred[list[MemberInfo]]:
        """Up to ``limit`` members of ``org`` whose handles sort after ``after``, removed ones
        (still reserving their handles) included, by handle."""
        ...

    def remove_member(
        self, org: str, handle: str, *, release: bool, actor: str, now: float
    ) -> Deferred[MemberInfo]:
        """Remove a member (token dead, keys withdrawn, handle reserved) and, with ``release``,
        free the handle; audited. The relay then closes their sockets and ends their jobs.

        404 ``not_found``; 409 ``last_admin`` (the only admin); 409 ``handle_busy`` (a release
        while mailbox jobs of the handle are still kept).
        """
        ...

    def set_member_role(
        self, org: str, handle: str, role: MemberRole, *, actor: str, now: float
    ) -> Deferred[MemberInfo]:
        """Change an active member's role; audited. 404 ``not_found``; 409 ``last_admin``."""
        ...

    def recover(
        self,
        org: str,
        handle: str,
        previous: SignedIdentityRecord,
        statement: SignedRecoveryStatement,
        new_identity: SignedIdentityRecord,
        now: float,
    ) -> Deferred[str]:
        """Move a member to a new identity key, keeping the link; a fresh token. The statement
        was verified against ``previous``, which must still be the stored record (409)."""
        ...

    def rotate_token(self, org: str, handle: str, token: str, now: float) -> Deferred[None]:
        """Make ``token`` the member's only valid bearer token (its hash kept); audited."""
        ...

    def record_seen(self, seen: Sequence[tuple[str, str, float]]) -> Deferred[None]:
        """Raise the last-seen times of ``(org, handle, at)`` rows, in one transaction."""
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

    def publish_card(
        self, org: str, handle: str, signed: SignedCardRecord, now: float
    ) -> Deferred[None]:
        """Keep a verified ``SignedCardRecord`` as the member's only card; the same one again
        is a no-op.

        409 ``identity_key_missing`` before an identity; 409 ``card_not_newer`` for a card
        dated no later than the kept one.
        """
        ...

    def fetch_card(self, org: str, handle: str) -> Deferred[SignedCardRecord | None]:
        """The member's card, or None (none published, or the member was removed)."""
        ...
