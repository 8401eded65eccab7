"""Bodies of the relay's HTTP API (JSON in, JSON out).

Routes (all under the relay's public URL):

- ``GET  /v1/status``                      → :class:`StatusResponse` (no auth; health)
- ``GET  /healthz``, ``GET /readyz``       → :class:`HealthResponse` (no auth; alive, and the
                                           database answers: 200, else 503)
- ``POST /v1/register``                    :class:`RegisterRequest` → :class:`RegisterResponse`
- ``GET  /v1/me``                          → :class:`WhoAmIResponse`
- ``POST /v1/invites``                     :class:`InviteCreateRequest` → :class:`InviteCreated`
- ``GET  /v1/invites``                     → :class:`InviteList`
- ``POST /v1/invites/<id>/revoke``         → :class:`InviteInfo`
- ``PUT  /v1/keys/identity``               :class:`SignedIdentityRecord` → :class:`KeysResponse`
- ``PUT  /v1/keys/encryption``             :class:`SignedEncryptionKeyRecord`
                                           → :class:`KeysResponse`
- ``GET  /v1/keys/<handle>``               → :class:`KeysResponse`
- ``PUT  /v1/card``                        :class:`SignedCardRecord` → :class:`SignedCardRecord`
                                           (your own; the relay keeps only the newest)
- ``GET  /v1/cards/<handle>``              → :class:`SignedCardRecord` (your organisation)
- ``GET  /v1/members[?after=HANDLE]``       → :class:`MemberList` (admins; a page by handle)
- ``POST /v1/members/<handle>/remove``     :class:`MemberRemoveRequest` → :class:`MemberInfo`
                                           (admins; ``release`` frees the handle too)
- ``PUT  /v1/members/<handle>/role``       :class:`MemberRoleRequest` → :class:`MemberInfo`
                                           (admins; an organisation keeps one admin)
- ``POST /v1/recover``                     :class:`RecoverRequest` → :class:`RegisterResponse`
                                           (no credentials: the recovery code's signature)
- ``POST /v1/me/token``                    :class:`TokenRotateRequest` → :class:`TokenRotated`
                                           (the old token dies; the member's sockets close)
- ``GET  /v1/presence``                    → :class:`PresenceResponse` (self only; naming
                                           anyone else, ``?handle=`` or ``?address=``, is
                                           403 and an audit row)
- ``GET  /v1/audit/export[?since=S&until=S]`` → NDJSON, streamed: one :class:`AuditEvent` a
                                           line, then one :class:`AuditExportEnd` (admins)
- ``GET  /v1/audit/holds``                 → :class:`AuditHoldList` (admins)
- ``PUT  /v1/audit/holds``                 :class:`AuditHoldRequest` → :class:`AuditHold`
- ``POST /v1/audit/holds/clear``           :class:`AuditHoldRequest` → :class:`AuditHold`
- ``PUT  /v1/me/offline-delivery``         :class:`OfflineDelivery` → :class:`OfflineDelivery`
- ``GET  /v1/jobs``                        → :class:`JobList` (jobs the asker sent or receives)
- ``GET  /v1/jobs/<job_id>[?wait=S]``      → :class:`JobInfo`; with ``wait`` (seconds, at most
                                           ``MAILBOX_MAX_WAIT_S``) the relay answers once the
                                           job has ended or the time is up
- ``POST /v1/jobs/<job_id>/cancel``        → :class:`JobInfo` (the job's caller only)
- any error                                → :class:`ApiErrorBody`
"""

from __future__ import annotations

import enum
import re

import attrs

from agentcall import limits
from agentcall.errors import ApiErrorCode
from agentcall.safetext import safe_cell
from agentcall.wire import fields as f
from agentcall.wire.frames import SealedEnvelope, Terminal

# The key records live in their own module (the frames carry them too); named here as before.
from agentcall.wire.keyrecords import (
    SUITE_X25519,
    SUITES,
    EncryptionKeyRecord,
    IdentityRecord,
    KeysResponse,
    RecoveryLink,
    RecoveryStatement,
    SignedEncryptionKeyRecord,
    SignedIdentityRecord,
    SignedRecoveryStatement,
)

# Shared with the config (agentcall.local.config), which loads without this module.
from agentcall.wire.roles import AgentKind, MemberRole

# Public names, the key records among them (defined in agentcall.wire.keyrecords).
__all__ = [
    "SUITES",
    "SUITE_X25519",
    "AgentKind",
    "ApiErrorBody",
    "AuditEvent",
    "AuditExportEnd",
    "AuditHold",
    "AuditHoldList",
    "AuditHoldRequest",
    "CardRecord",
    "CardTask",
    "EncryptionKeyRecord",
    "HealthResponse",
    "HoldScope",
    "IdentityRecord",
    "InviteCreateRequest",
    "InviteCreated",
    "InviteInfo",
    "InviteList",
    "InviteStatus",
    "JobFailureReason",
    "JobInfo",
    "JobList",
    "JobSide",
    "JobState",
    "KeysResponse",
    "MemberInfo",
    "MemberList",
    "MemberRemoveRequest",
    "MemberRole",
    "MemberRoleRequest",
    "MemberStatus",
    "OfflineDelivery",
    "PresenceResponse",
    "RecoverRequest",
    "RecoveryLink",
    "RecoveryStatement",
    "RegisterRequest",
    "RegisterResponse",
    "SignedCardRecord",
    "SignedEncryptionKeyRecord",
    "SignedIdentityRecord",
    "SignedRecoveryStatement",
    "StatusResponse",
    "TokenRotateRequest",
    "TokenRotated",
    "WhoAmIResponse",
]


class InviteStatus(enum.StrEnum):
    ACTIVE = "active"
    USED = "used"
    REVOKED = "revoked"
    EXPIRED = "expired"


@attrs.frozen
class ApiErrorBody:
    error: ApiErrorCode = attrs.field(converter=ApiErrorCode)
    message: str = attrs.field(validator=f.text(500))


@attrs.frozen
class StatusResponse:
    ok: bool
    relay_origin: str = attrs.field(validator=f.relay_origin)
    # Older relays sent their software version here; a relay now sends null, because an
    # unauthenticated health check should not tell a scanner what to attack. Clients accept both.
    version: str | None = attrs.field(default=None, validator=attrs.validators.optional(f.text(40)))


@attrs.frozen
class HealthResponse:
    """``/healthz`` (the process answers) and ``/readyz`` (and its database does)."""

    ok: bool = attrs.field(validator=f.boolean)
    problem: str | None = attrs.field(
        default=None,
        validator=f.optional(f.text(200)),
        metadata={"agentcall.omit_if_default": True},  # {"ok": true} when all is well
    )


@attrs.frozen
class RegisterRequest:
    org: str = attrs.field(validator=f.org)
    invite: str = attrs.field(validator=f.token)  # the secret after '#' in the invite URL
    handle: str = attrs.field(validator=f.text(64))  # checked against the grammar by the relay
    agent_kind: AgentKind | None = attrs.field(
        default=None, converter=attrs.converters.optional(AgentKind)
    )


@attrs.frozen
class RecoverRequest:
    """Reclaim ``@org/handle`` on a new machine: its new identity record, and the statement the
    recovery code's key signed moving the address to that identity key."""

    org: str = attrs.field(validator=f.org)
    handle: str = attrs.field(validator=f.handle)
    identity: SignedIdentityRecord
    statement: SignedRecoveryStatement
    agent_kind: AgentKind | None = attrs.field(
        default=None, converter=attrs.converters.optional(AgentKind)
    )


@attrs.frozen
class RegisterResponse:
    org: str = attrs.field(validator=f.org)
    handle: str = attrs.field(validator=f.handle)
    address: str = attrs.field(validator=f.address)
    role: MemberRole = attrs.field(converter=MemberRole)
    token: str = attrs.field(validator=f.token)
    relay_origin: str = attrs.field(validator=f.relay_origin)


@attrs.frozen
class WhoAmIResponse:
    org: str = attrs.field(validator=f.org)
    handle: str = attrs.field(validator=f.handle)
    address: str = attrs.field(validator=f.address)
    role: MemberRole = attrs.field(converter=MemberRole)
    relay_origin: str = attrs.field(validator=f.relay_origin)
    # Whether the relay keeps calls for this member while they are offline or busy.
    offline_delivery: bool = attrs.field(default=False, validator=f.boolean)


@attrs.frozen
class OfflineDelivery:
    """The member's opt-in to the offline mailbox (off unless they turned it on)."""

    enabled: bool = attrs.field(validator=f.boolean)


class JobState(enum.StrEnum):
    """Where a mailbox job is (the one definition; agentcall.relay.mailbox decides the moves)."""

    QUEUED = "queued"
    DELIVERED = "delivered"
    RUNNING = "running"
    ANSWERED = "answered"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class JobFailureReason(enum.StrEnum):
    """Why a job ended ``failed`` (the one definition)."""

    DELIVERY_FAILED = "delivery_failed"  # no delivery was accepted within its lease, 3 times
    INDETERMINATE_EXECUTION = "indeterminate_execution"  # accepted, then lost: may have run
    REVOKED = "revoked"  # the caller or the callee left the organisation
    REJECTED = "rejected"  # the listener refused the sealed request before admission


class JobSide(enum.StrEnum):
    SENT = "sent"  # the asker is the job's caller
    RECEIVED = "received"  # the asker is the job's callee


# The states of a job that has not ended.
PENDING_JOB_STATES = frozenset({JobState.QUEUED, JobState.DELIVERED, JobState.RUNNING})


@attrs.frozen
class JobInfo:
    """A job as its caller or callee sees it: metadata, and the sealed answer for the caller.

    ``answer`` (with ``terminal``) is filled only for the caller, while the relay still holds
    it (until ``expires_at``); the callee and lists never get it.
    """

    job_id: str = attrs.field(validator=f.job_id)
    side: JobSide = attrs.field(converter=JobSide)
    caller: str = attrs.field(validator=f.address)
    callee: str = attrs.field(validator=f.address)
    state: JobState = attrs.field(converter=JobState)
    created_at: int = attrs.field(validator=f.timestamp)
    expires_at: int = attrs.field(validator=f.timestamp)
    attempts: int = attrs.field(validator=f.integer(0, 100))
    reason: JobFailureReason | None = attrs.field(
        default=None, converter=attrs.converters.optional(JobFailureReason)
    )
    cancel_requested: bool = attrs.field(default=False, validator=f.boolean)
    terminal: Terminal | None = attrs.field(
        default=None, converter=attrs.converters.optional(Terminal)
    )
    answer: SealedEnvelope | None = None

    @property
    def peer(self) -> str:
        """The other party, from the asker's side."""
        return self.callee if self.side is JobSide.SENT else self.caller

    @property
    def pending(self) -> bool:
        """Not ended yet: queued, delivered or running."""
        return self.state in PENDING_JOB_STATES

    def __attrs_post_init__(self) -> None:
        if (self.reason is not None) != (self.state is JobState.FAILED):
            raise ValueError("a failure reason goes with the failed state, and only with it")
        if (self.answer is None) != (self.terminal is None):
            raise ValueError("an answer comes with its terminal")
        if self.answer is not None and self.state is not JobState.ANSWERED:
            raise ValueError("only an answered job carries an answer")


@attrs.frozen
class JobList:
    jobs: tuple[JobInfo, ...] = attrs.field(
        validator=f.each(lambda *_: None, max_items=limits.MAX_JOBS_LISTED)
    )


@attrs.frozen
class InviteCreateRequest:
    role: MemberRole = attrs.field(default=MemberRole.MEMBER, converter=MemberRole)
    expires_in_days: int = attrs.field(
        default=limits.INVITE_DEFAULT_DAYS,
        validator=f.integer(limits.INVITE_MIN_DAYS, limits.INVITE_MAX_DAYS),
    )
    description: str | None = attrs.field(
        default=None, validator=f.optional(f.text(limits.MAX_INVITE_DESCRIPTION_CHARS))
    )


@attrs.frozen
class InviteInfo:
    id: str = attrs.field(validator=f.hex64)  # SHA-256 of the invite secret
    org: str = attrs.field(validator=f.org)
    role: MemberRole = attrs.field(converter=MemberRole)
    status: InviteStatus = attrs.field(converter=InviteStatus)
    created_by: str | None = attrs.field(validator=f.optional(f.handle))
    created_at: int = attrs.field(validator=f.timestamp)
    expires_at: int = attrs.field(validator=f.timestamp)
    description: str | None = attrs.field(
        default=None, validator=f.optional(f.text(limits.MAX_INVITE_DESCRIPTION_CHARS))
    )
    used_by: str | None = attrs.field(default=None, validator=f.optional(f.handle))


@attrs.frozen
class InviteCreated:
    invite: str = attrs.field(validator=f.text(600))  # the URL to hand over; shown once
    info: InviteInfo


@attrs.frozen
class InviteList:
    invites: tuple[InviteInfo, ...] = attrs.field(
        validator=f.each(lambda *_: None, max_items=limits.MAX_INVITES_LISTED)
    )


class MemberStatus(enum.StrEnum):
    ACTIVE = "active"
    # Removed by an admin: the token is dead, the keys withdrawn, the handle still reserved.
    REMOVED = "removed"
    # Only in the answer to a remove with release: the handle is free again.
    RELEASED = "released"


@attrs.frozen
class MemberInfo:
    """One member as an admin sees it. ``last_seen``: when a socket of theirs last opened or
    closed (None before the first); never whether they are online now."""

    handle: str = attrs.field(validator=f.handle)
    role: MemberRole = attrs.field(converter=MemberRole)
    status: MemberStatus = attrs.field(converter=MemberStatus)
    enrolled_at: int = attrs.field(validator=f.timestamp)
    last_seen: int | None = attrs.field(default=None, validator=f.optional(f.timestamp))
    agent_kind: AgentKind | None = attrs.field(
        default=None, converter=attrs.converters.optional(AgentKind)
    )
    removed_at: int | None = attrs.field(default=None, validator=f.optional(f.timestamp))
    removed_by: str | None = attrs.field(default=None, validator=f.optional(f.handle))


@attrs.frozen
class MemberList:
    members: tuple[MemberInfo, ...] = attrs.field(
        validator=f.each(lambda *_: None, max_items=limits.MAX_MEMBERS_LISTED)
    )
    # The handle to ask ``?after=`` for the next page; None on the last page.
    next_after: str | None = attrs.field(default=None, validator=f.optional(f.handle))


@attrs.frozen
class MemberRemoveRequest:
    # Also free the handle for someone new (who will have new keys: callers see a changed
    # identity). Without it the handle stays reserved.
    release: bool = attrs.field(default=False, validator=f.boolean)


@attrs.frozen
class MemberRoleRequest:
    role: MemberRole = attrs.field(converter=MemberRole)


@attrs.frozen
class TokenRotateRequest:
    """The installation's next bearer token, minted by the client: it is written down locally
    before the relay is asked, so a crash in between loses nothing (the caller then finishes the
    rotation with whichever token the relay accepts)."""

    token: str = attrs.field(repr=False, validator=f.token)


@attrs.frozen
class TokenRotated:
    rotated_at: int = attrs.field(validator=f.timestamp)


@attrs.frozen
class PresenceResponse:
    address: str = attrs.field(validator=f.address)
    online: bool


# --- the card -----------------------------------------------------------------------------


def _card_text(max_bytes: int) -> f.Validator:
    """One line of text that needs no cleaning to be shown, at most ``max_bytes`` of UTF-8."""
    size = f.utf8_bytes(max_bytes, min_bytes=1)

    def check(inst: object, attribute: attrs.Attribute[object], value: object) -> None:
        size(inst, attribute, value)
        if safe_cell(str(value)) != value:
            raise ValueError(f"{attribute.name}: holds control or invisible characters")

    return check


@attrs.frozen
class CardTask:
    """One task of a card: what every member of the organisation may ask for by default."""

    id: str = attrs.field(validator=f.task_id)
    name: str = attrs.field(validator=_card_text(limits.MAX_CARD_NAME_BYTES))
    # The first line of the task's description (agentcall.listener.card.summary_of).
    summary: str = attrs.field(validator=_card_text(limits.MAX_CARD_SUMMARY_BYTES))


@attrs.frozen
class CardRecord:
    """What callers see of an installation, signed by its identity key
    (:mod:`agentcall.crypto.card`): bound to the address, the relay and the identity key, and
    dated, so the relay can keep only the newest and a caller can refuse an older one.

    ``agent_kind`` None and no tasks: the installation answers no calls. ``omitted``: tasks on
    the default menu left off because the card was full.
    """

    v: int = attrs.field(validator=f.exactly(1))
    relay_origin: str = attrs.field(validator=f.relay_origin)
    address: str = attrs.field(validator=f.address)
    identity_pub: str = attrs.field(validator=f.b64url(43, min_chars=43))
    issued_at: int = attrs.field(validator=f.timestamp)
    agent_kind: AgentKind | None = attrs.field(converter=attrs.converters.optional(AgentKind))
    tasks: tuple[CardTask, ...] = attrs.field(
        validator=f.each(lambda *_: None, max_items=limits.MAX_CARD_TASKS)
    )
    omitted: int = attrs.field(default=0, validator=f.integer(0, 10_000))

    def __attrs_post_init__(self) -> None:
        ids = [task.id for task in self.tasks]
        if ids != sorted(set(ids)):
            raise ValueError("tasks: ids must be unique and in order")
        text = sum(len(f"{t.id}{t.name}{t.summary}".encode()) for t in self.tasks)
        if text > limits.MAX_CARD_TEXT_BYTES:
            raise ValueError(f"tasks: more than {limits.MAX_CARD_TEXT_BYTES} bytes of text")
        if self.agent_kind is None and self.tasks:
            raise ValueError("tasks: an installation that answers no calls offers none")


@attrs.frozen
class SignedCardRecord:
    record: CardRecord
    signature: str = attrs.field(validator=f.b64url(86, min_chars=86))


# --- audit --------------------------------------------------------------------------------------

_AUDIT_EVENT_RE = re.compile(r"^[a-z][a-z_]*(?:\.[a-z][a-z_]*){1,3}\Z")


@attrs.frozen
class AuditEvent:
    """One audit row as an export carries it (one NDJSON line): metadata about an action,
    never message content, tokens or invite secrets. ``at_ms``: when, in milliseconds since
    the epoch (UTC); ``id`` orders the rows of an organisation."""

    id: int = attrs.field(validator=f.integer(1, 2**63 - 1))
    at_ms: int = attrs.field(validator=f.integer(0, 2**50))
    event: str = attrs.field(validator=f.matches(_AUDIT_EVENT_RE))
    actor: str | None = attrs.field(default=None, validator=f.optional(f.text(200)))
    target: str | None = attrs.field(default=None, validator=f.optional(f.text(200)))
    call_id: str | None = attrs.field(default=None, validator=f.optional(f.text(64)))
    detail: str | None = attrs.field(
        default=None, validator=f.optional(f.text(limits.MAX_DETAIL_CHARS))
    )


@attrs.frozen
class AuditExportEnd:
    """The last line of a whole export: how many events came before it. A stream that ends
    without it was cut short."""

    complete: bool = attrs.field(validator=f.exactly(True))
    events: int = attrs.field(validator=f.integer(0, 2**63 - 1))


class HoldScope(enum.StrEnum):
    ORGANISATION = "organisation"  # every audit row and invite of the organisation
    HANDLE = "handle"  # the rows naming one handle as actor or target, and its invites


@attrs.frozen
class AuditHoldRequest:
    """Set or clear a legal hold: on one handle, or (``handle`` None) the whole organisation.
    ``note`` (a case reference, say) is kept with a hold being set."""

    handle: str | None = attrs.field(default=None, validator=f.optional(f.handle))
    note: str | None = attrs.field(
        default=None, validator=f.optional(f.text(limits.MAX_HOLD_NOTE_CHARS))
    )


@attrs.frozen
class AuditHold:
    scope: HoldScope = attrs.field(converter=HoldScope)
    handle: str | None = attrs.field(validator=f.optional(f.handle))
    set_at: int = attrs.field(validator=f.timestamp)
    set_by: str = attrs.field(validator=f.handle)
    note: str | None = attrs.field(
        default=None, validator=f.optional(f.text(limits.MAX_HOLD_NOTE_CHARS))
    )

    def __attrs_post_init__(self) -> None:
        if (self.scope is HoldScope.HANDLE) != (self.handle is not None):
            raise ValueError("a handle hold names its handle; an organisation hold none")


@attrs.frozen
class AuditHoldList:
    holds: tuple[AuditHold, ...] = attrs.field(
        validator=f.each(lambda *_: None, max_items=limits.MAX_AUDIT_HOLDS)
    )
