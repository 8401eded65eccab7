"""The relay's registry: orgs, members, invites, published keys and audit rows.

This module (with :mod:`agentcall.relay.store_keys` and :mod:`agentcall.relay.store_jobs`) holds
every SQL statement of the relay.
:class:`SqliteRegistry` is synchronous ``sqlite3``; :class:`SqliteRelayStore` is the relay's
asynchronous :class:`~agentcall.relay.store_interface.RelayStore` over it. The queries run on
the reactor thread and their Deferreds have fired when they are returned (``defer.succeed``):
every query is small, indexed and local, and the connection belongs to one thread, so a thread
pool would add a thread hop and a shutdown order to get right, for no gain. Callers never rely
on that: a PostgreSQL store answers later, and the tests drive the relay's cores with a store
whose Deferreds fire later. One-shot tools (``agentcall relay bootstrap``, the bench's seeding)
use :class:`SqliteRegistry` directly. Neither reads the clock; callers pass ``now`` in seconds.

Refusals that the API shows to people are :class:`~agentcall.errors.ApiError` with their own
codes, so a wrong, used, revoked or expired invite can each be told apart. The store writes the
audit rows of its own changes in the same transaction as the change.
"""

from __future__ import annotations

import collections
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
from twisted.internet import defer
from twisted.internet.defer import Deferred

from agentcall import ids, limits
from agentcall.db import durable_transaction, open_database, packaged_schema, transaction
from agentcall.db.faults import storage_fault
from agentcall.errors import ApiError, ApiErrorCode, StorageFault, StoreError
from agentcall.relay import audit, store_jobs, store_keys
from agentcall.relay.audit import AuditEntry
from agentcall.relay.auth import hash_secret, secret_matches
from agentcall.relay.mailbox import Decision, Job, Refused
from agentcall.relay.store_interface import (
    AuditRow,
    Decide,
    JobScope,
    MailboxStatus,
    Member,
    RelayStore,
    SealedBytes,
    StoredJob,
    Submission,
)
from agentcall.wire.http import (
    AgentKind,
    AuditHold,
    HoldScope,
    InviteInfo,
    InviteStatus,
    KeysResponse,
    MemberInfo,
    MemberRole,
    MemberStatus,
    SignedCardRecord,
    SignedEncryptionKeyRecord,
    SignedIdentityRecord,
)
from agentcall.wire.keyrecords import SignedRecoveryStatement

__all__ = [
    "RELAY_SCHEMA",
    "AuditRow",
    "Member",
    "RelayStore",
    "SqliteRegistry",
    "SqliteRelayStore",
    "Submission",
    "open_relay_store",
]

RELAY_SCHEMA = packaged_schema("relay")
T = TypeVar("T")

# Names people would mistake for the service itself or its staff.
RESERVED_HANDLES = frozenset(
    {
        "admin",
        "www",
        "relay",
        "api",
        "install",
        "help",
        "support",
        "root",
        "agentcall",
        "system",
        "status",
        "info",
    }
)
MAX_AUDIT_PAGE = 500
_INSERT_AUDIT = (
    "INSERT INTO audit (at, org, event, actor, target, call_id, detail)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)

_DAY_S = 86_400
# What an unknown member's token is compared with, so a miss costs the same work as a hit.
_NO_MEMBER_HASH = "0" * 64
# Statements spelled out in full (no string building), so each one can be read as it runs.
# A removed member's row keeps the handle reserved; nothing else of the relay sees it.
_SELECT_MEMBER = (
    "SELECT org, handle, role, agent_kind, created_at FROM members"
    " WHERE org = ? AND handle = ? AND removed_at IS NULL"
)
_SELECT_MEMBER_AND_HASH = (
    "SELECT org, handle, role, agent_kind, created_at, token_hash FROM members"
    " WHERE org = ? AND handle = ? AND removed_at IS NULL"
)
_SELECT_MEMBER_INFO = (
    "SELECT handle, role, agent_kind, created_at, last_seen, removed_at, removed_by"
    " FROM members WHERE org = ? AND handle = ?"
)
_LIST_MEMBERS = (
    "SELECT handle, role, agent_kind, created_at, last_seen, removed_at, removed_by"
    " FROM members WHERE org = ? AND handle > ? ORDER BY handle LIMIT ?"
)
_COUNT_ADMINS = (
    "SELECT COUNT(*) FROM members WHERE org = ? AND role = 'admin' AND removed_at IS NULL"
)
# What a removed member's token hash becomes: no SHA-256 hex digest equals it.
_REMOVED_HASH_MARK = "removed"
# The latest time at which the mailbox still keeps metadata of a job the handle is part of.
_JOBS_KEPT_UNTIL = "SELECT MAX(expires_at) FROM jobs WHERE org = ? AND (caller = ? OR callee = ?)"
_SELECT_INVITE = (
    "SELECT id, org, role, created_by, created_at, expires_at, description, used_at, used_by,"
    " revoked_at FROM invites WHERE id = ? AND org = ?"
)
# An invite is active while unused, unrevoked and now < expires_at.
_LIST_INVITES = (
    "SELECT id, org, role, created_by, created_at, expires_at, description, used_at, used_by,"
    " revoked_at FROM invites WHERE org = ?"
    " ORDER BY (used_at IS NULL AND revoked_at IS NULL AND expires_at > ?) DESC,"
    # Newest first; rowid breaks ties within a second, so the order is the order of creation.
    " created_at DESC, rowid DESC LIMIT ?"
)
# The cap is part of the insert, so it holds however requests interleave.
_INSERT_INVITE_UNDER_CAP = (
    "INSERT INTO invites (id, org, role, created_by, created_at, expires_at, description)"
    " SELECT ?, ?, ?, ?, ?, ?, ?"
    " WHERE (SELECT COUNT(*) FROM invites WHERE org = ? AND used_at IS NULL"
    "        AND revoked_at IS NULL AND expires_at > ?) < ?"
)


# No bound on that side of an audit query (ids are positive; times are seconds since 1970).
_NO_ID_LIMIT = 2**63 - 1
_NO_TIME_LIMIT_BEFORE = -1.0
_NO_TIME_LIMIT_AFTER = 2.0**62
# The handle column of a hold on the whole organisation.
_HOLD_ORG = ""
_LIST_HOLDS = (
    "SELECT handle, set_at, set_by, note FROM audit_holds WHERE org = ? ORDER BY handle LIMIT ?"
)
_SELECT_HOLD = "SELECT handle, set_at, set_by, note FROM audit_holds WHERE org = ? AND handle = ?"
# Retention: a row is kept while a hold on its organisation, or on its actor or target, stands
# (retention.keeps_event says the same in Python; a test holds the two together). Oldest
# first along the (org, at) index, so a batch reads no more rows than it deletes (and the held
# ones it passes); a hold on the whole organisation is looked up once, not per row.
_PRUNE_AUDIT = (
    "DELETE FROM audit WHERE id IN ("
    " SELECT id FROM audit WHERE org = ? AND at < ?"
    " AND NOT EXISTS (SELECT 1 FROM audit_holds WHERE org = ? AND handle = '')"
    " AND NOT EXISTS (SELECT 1 FROM audit_holds h WHERE h.org = audit.org"
    "  AND h.handle IN (COALESCE(audit.actor, ''), COALESCE(audit.target, '')))"
    " ORDER BY at, id LIMIT ?)"
)
# An invite ended when it was used or revoked, else when it expired (retention.keeps_invite).
_PURGE_INVITES = (
    "DELETE FROM invites WHERE org = ? AND COALESCE(used_at, revoked_at, expires_at) < ?"
    " AND NOT EXISTS (SELECT 1 FROM audit_holds h WHERE h.org = invites.org"
    "  AND h.handle IN ('', COALESCE(invites.created_by, ''), COALESCE(invites.used_by, '')))"
)


def _hold(row: Any) -> AuditHold:
    handle, set_at, set_by, note = row
    if handle == _HOLD_ORG:
        return AuditHold(HoldScope.ORGANISATION, None, int(set_at), set_by, note)
    return AuditHold(HoldScope.HANDLE, handle, int(set_at), set_by, note)


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


def handle_allowed(handle: str) -> bool:
    """True when ``handle`` fits the grammar and is not reserved."""
    return ids.is_handle(handle) and handle not in RESERVED_HANDLES


def open_relay_store(path: str | os.PathLike[str]) -> SqliteRelayStore:
    """Open (creating 0600, or upgrading) the relay database at ``path``.

    :raises StoreError: it (or its -wal/-shm) is writable by group or others, someone else's,
        or a symlink; the message names the file and the fix.
    """
    from agentcall.filetrust import PrivateFileError, prepare_database_file

    try:
        prepare_database_file(path)
    except PrivateFileError as exc:
        raise StoreError(f"relay database {exc}") from None
    return SqliteRelayStore(SqliteRegistry(open_database(path, RELAY_SCHEMA).connection))


def _member(row: Any) -> Member:
    org, handle, role, agent_kind, created_at = row
    return Member(
        org=org,
        handle=handle,
        role=MemberRole(role),
        agent_kind=None if agent_kind is None else AgentKind(agent_kind),
        created_at=created_at,
    )


def _member_info(row: Any) -> MemberInfo:
    handle, role, agent_kind, created_at, last_seen, removed_at, removed_by = row
    return MemberInfo(
        handle=handle,
        role=MemberRole(role),
        status=MemberStatus.ACTIVE if removed_at is None else MemberStatus.REMOVED,
        enrolled_at=int(created_at),
        last_seen=None if last_seen is None else int(last_seen),
        agent_kind=None if agent_kind is None else AgentKind(agent_kind),
        removed_at=None if removed_at is None else int(removed_at),
        removed_by=removed_by,
    )


def _invite_info(row: Any, now: float) -> InviteInfo:
    (invite_id, org, role, created_by, created_at, expires_at, description) = row[:7]
    used_at, used_by, revoked_at = row[7:]
    if used_at is not None:
        status = InviteStatus.USED
    elif revoked_at is not None:
        status = InviteStatus.REVOKED
    elif now >= expires_at:
        status = InviteStatus.EXPIRED
    else:
        status = InviteStatus.ACTIVE
    return InviteInfo(
        id=invite_id,
        org=org,
        role=MemberRole(role),
        status=status,
        created_by=created_by,
        created_at=created_at,
        expires_at=expires_at,
        description=description,
        used_by=used_by,
    )


# Members whose published key records the registry keeps decoded (least recently read go first).
KEYS_CACHED = 4096
# Members whose existence handle_exists remembers; past this many it asks the database.
MEMBERS_REMEMBERED = 65_536


class SqliteRegistry:
    """The relay's registry, synchronously, on one connection from
    :func:`agentcall.db.open_database`: the methods of
    :class:`~agentcall.relay.store_interface.RelayStore` returning their values (or raising)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        if conn.isolation_level is not None:
            # Python's implicit transactions would commit in the middle of ours.
            raise ValueError("the connection must be in autocommit mode (isolation_level=None)")
        # Deleted rows are overwritten with zeros, so the ciphertext of a job that ended or
        # expired does not linger in free pages of the file. Set here, per connection, because
        # the default depends on how SQLite was built (SQLITE_SECURE_DELETE). What remains is
        # the WAL, whose old frames are overwritten as it is checkpointed and reused.
        conn.execute("PRAGMA secure_delete = ON")
        self._conn = conn
        # Published key records, as fetch_keys last read them. Only this registry writes them
        # (publish_identity, publish_encryption drop the entry), and the relay reads a caller's
        # records on every call to attach them to incoming_call: decoding two signed records
        # each time cost more than the rest of the call's store work together.
        self._keys: collections.OrderedDict[tuple[str, str], KeysResponse | None] = (
            collections.OrderedDict()
        )
        # (org, handle) of members handle_exists has found (see there).
        self._members_found: set[tuple[str, str]] = set()
        # The sealed bytes the mailbox holds for every callee together, summed from the rows
        # when first asked and then moved by each committed decide_jobs (the only writer of
        # jobs, on this connection: one relay process per database). None: not counted yet.
        self._held_bytes: int | None = None

    def close(self) -> None:
        self._conn.close()

    # --- orgs and members ---------------------------------------------------------------

    def ping(self) -> None:
        """A query that touches the database file (``/readyz``); raises StoreError if not."""
        self._read("SELECT COUNT(*) FROM orgs", ())

    def probe(self, now: float) -> None:
        """A write as large as the largest answer the relay stores, which must reach the
        storage: raises StoreError while such writes fail."""
        with transaction(self._conn) as conn:
            conn.execute(
                "INSERT INTO store_probe (id, written_at, ballast) VALUES (1, ?, zeroblob(?))"
                " ON CONFLICT (id) DO UPDATE"
                " SET written_at = excluded.written_at, ballast = excluded.ballast",
                (now, limits.MAX_RESPONSE_FRAME_BYTES),
            )

    def ensure_org(self, org: str, now: float) -> bool:
        if not ids.is_org(org):
            raise ValueError("not a valid organisation name")
        with transaction(self._conn):
            cursor = self._conn.execute(
                "INSERT OR IGNORE INTO orgs (org, created_at) VALUES (?, ?)", (org, now)
            )
        return cursor.rowcount == 1

    def org_exists(self, org: str) -> bool:
        row = self._read("SELECT 1 FROM orgs WHERE org = ?", (org,))
        return row is not None

    def handle_exists(self, org: str, handle: str) -> bool:
        # Asked on every call. A member found stays remembered until removed (remove_member
        # forgets it), so only a handle not found yet goes to the database each time: a
        # registration made since is seen at once.
        key = (org, handle)
        if key in self._members_found:
            return True
        row = self._read(
            "SELECT 1 FROM members WHERE org = ? AND handle = ? AND removed_at IS NULL", key
        )
        if row is None:
            return False
        if len(self._members_found) < MEMBERS_REMEMBERED:
            self._members_found.add(key)
        return True

    def _handle_reserved(self, org: str, handle: str) -> bool:
        """True when any row holds ``handle``, a removed member's included."""
        row = self._read("SELECT 1 FROM members WHERE org = ? AND handle = ?", (org, handle))
        return row is not None

    def list_members(self, org: str, *, after: str = "", limit: int) -> list[MemberInfo]:
        """Members of ``org`` (removed ones included) with handles after ``after``, by handle."""
        if not 1 <= limit <= limits.MAX_MEMBERS_LISTED:
            raise ValueError(f"limit must be 1..{limits.MAX_MEMBERS_LISTED}")
        return [_member_info(row) for row in self._read_all(_LIST_MEMBERS, (org, after, limit))]

    def remove_member(
        self, org: str, handle: str, *, release: bool, actor: str, now: float
    ) -> MemberInfo:
        """Remove ``@org/handle``: its token dies and its published keys are withdrawn, in one
        transaction with the audit row. The row stays, so the handle stays reserved, unless
        ``release`` (which may also free the handle of a member removed earlier).

        404 ``not_found``; 409 ``last_admin`` for the organisation's only admin; 409
        ``handle_busy`` for a release while the mailbox still keeps jobs of the handle (a new
        owner would see them listed).
        """
        self._keys.pop((org, handle), None)
        # Forgotten before the change, so no call is routed to them once it has committed.
        self._members_found.discard((org, handle))
        with transaction(self._conn):
            row = self._read(_SELECT_MEMBER_INFO, (org, handle))
            if row is None:
                raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such member")
            info = _member_info(row)
            if info.status is MemberStatus.ACTIVE:
                if info.role is MemberRole.ADMIN and self._admins(org) <= 1:
                    raise ApiError(
                        409,
                        ApiErrorCode.LAST_ADMIN,
                        "the organisation's only admin cannot be removed; make another "
                        "member admin first",
                    )
                self._conn.execute(
                    "UPDATE members SET removed_at = ?, removed_by = ?, token_hash = ?,"
                    " offline_delivery = 0 WHERE org = ? AND handle = ?",
                    (now, actor, _REMOVED_HASH_MARK, org, handle),
                )
                store_keys.withdraw(self._conn, org, handle)
                self._audit(
                    audit.MEMBER_REMOVE,
                    org,
                    actor=actor,
                    target=handle,
                    at=now,
                    detail=f"role={info.role}",
                )
                info = attrs.evolve(
                    info, status=MemberStatus.REMOVED, removed_at=int(now), removed_by=actor
                )
            if release:
                kept = self._read(_JOBS_KEPT_UNTIL, (org, handle, handle))
                if kept is not None and kept[0] is not None:
                    until = kept[0] + limits.MAILBOX_METADATA_GRACE_S
                    raise ApiError(
                        409,
                        ApiErrorCode.HANDLE_BUSY,
                        "the relay keeps mailbox jobs of this handle until "
                        f"{_utc(until)}; release it after that",
                    )
                self._conn.execute(
                    "DELETE FROM members WHERE org = ? AND handle = ?", (org, handle)
                )
                self._audit(audit.MEMBER_RELEASE, org, actor=actor, target=handle, at=now)
                info = attrs.evolve(info, status=MemberStatus.RELEASED)
        return info

    def set_member_role(
        self, org: str, handle: str, role: MemberRole, *, actor: str, now: float
    ) -> MemberInfo:
        """Give an active member ``role``; the same role again changes nothing.

        404 ``not_found`` (removed members included); 409 ``last_admin`` when the organisation
        would be left without an admin.
        """
        role = MemberRole(role)
        with transaction(self._conn):
            row = self._read(_SELECT_MEMBER_INFO, (org, handle))
            if row is None or _member_info(row).status is not MemberStatus.ACTIVE:
                raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such member")
            info = _member_info(row)
            if info.role is role:
                return info
            if info.role is MemberRole.ADMIN and self._admins(org) <= 1:
                raise ApiError(
                    409,
                    ApiErrorCode.LAST_ADMIN,
                    "the organisation's only admin cannot step down; make another member "
                    "admin first",
                )
            self._conn.execute(
                "UPDATE members SET role = ? WHERE org = ? AND handle = ?",
                (role.value, org, handle),
            )
            self._audit(
                audit.MEMBER_ROLE,
                org,
                actor=actor,
                target=handle,
                at=now,
                detail=f"{info.role}->{role}",
            )
        return attrs.evolve(info, role=role)

    def recover(
        self,
        org: str,
        handle: str,
        previous: SignedIdentityRecord,
        statement: SignedRecoveryStatement,
        new_identity: SignedIdentityRecord,
        now: float,
    ) -> str:
        """Move an active member to ``new_identity`` with a fresh token (returned); the
        statement was checked against ``previous`` (:func:`agentcall.relay.api_rules.
        check_recovery`). Audited. 403 ``recovery_refused`` for a removed or unknown member."""
        self._keys.pop((org, handle), None)
        token = ids.mint_token()
        with transaction(self._conn):
            if self.get_member(org, handle) is None:
                raise ApiError(403, ApiErrorCode.RECOVERY_REFUSED, "recovery refused")
            store_keys.recover(self._conn, org, handle, previous, statement, new_identity, now)
            self._conn.execute(
                "UPDATE members SET token_hash = ? WHERE org = ? AND handle = ?",
                (hash_secret(token), org, handle),
            )
            self._audit(audit.RECOVERY_REDEEM, org, actor=handle, target=handle, at=now)
        return token

    def rotate_token(self, org: str, handle: str, token: str, now: float) -> None:
        """Replace an active member's token hash with ``token``'s; audited. The old token no
        longer authenticates once this returns. 404 ``not_found`` for anyone else."""
        if ids.TOKEN_RE.match(token) is None:
            raise ApiError(400, ApiErrorCode.BAD_REQUEST, "not a valid token")
        with transaction(self._conn):
            cursor = self._conn.execute(
                "UPDATE members SET token_hash = ? WHERE org = ? AND handle = ?"
                " AND removed_at IS NULL",
                (hash_secret(token), org, handle),
            )
            if cursor.rowcount != 1:
                raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such member")
            self._audit(audit.MEMBER_CREDENTIALS_ROTATED, org, actor=handle, target=handle, at=now)

    def record_seen(self, seen: Sequence[tuple[str, str, float]]) -> None:
        """Raise the last-seen time of each ``(org, handle, at)``, in one transaction."""
        if not seen:
            return
        with transaction(self._conn):
            self._conn.executemany(
                "UPDATE members SET last_seen = MAX(COALESCE(last_seen, 0), ?)"
                " WHERE org = ? AND handle = ? AND removed_at IS NULL",
                [(at, org, handle) for org, handle, at in seen],
            )

    def _admins(self, org: str) -> int:
        return int(self._read(_COUNT_ADMINS, (org,))[0])

    def get_member(self, org: str, handle: str) -> Member | None:
        row = self._read(_SELECT_MEMBER, (org, handle))
        return None if row is None else _member(row)

    def authenticate(self, org: str, handle: str, token: str) -> Member | None:
        row = self._read(_SELECT_MEMBER_AND_HASH, (org, handle))
        if row is None:
            secret_matches(token, _NO_MEMBER_HASH)
            return None
        if not secret_matches(token, row[5]):
            return None
        return _member(row[:5])

    # --- invites ------------------------------------------------------------------------

    def create_invite(
        self,
        org: str,
        *,
        created_by: str | None,
        role: MemberRole,
        expires_in_days: int,
        description: str | None,
        now: float,
    ) -> tuple[str, InviteInfo]:
        role = MemberRole(role)
        if (
            isinstance(expires_in_days, bool)
            or not isinstance(expires_in_days, int)
            or not limits.INVITE_MIN_DAYS <= expires_in_days <= limits.INVITE_MAX_DAYS
        ):
            raise ApiError(
                400,
                ApiErrorCode.BAD_REQUEST,
                f"expires_in_days must be {limits.INVITE_MIN_DAYS}..{limits.INVITE_MAX_DAYS}",
            )
        if description is not None and len(description) > limits.MAX_INVITE_DESCRIPTION_CHARS:
            raise ApiError(
                400,
                ApiErrorCode.BAD_REQUEST,
                f"description is longer than {limits.MAX_INVITE_DESCRIPTION_CHARS} characters",
            )
        secret = ids.mint_token()
        invite_id = hash_secret(secret)
        # Whole seconds: the API shows invite times as integers, and expiry is compared with
        # exactly the number people see.
        created_at = int(now)
        expires_at = created_at + expires_in_days * _DAY_S
        with transaction(self._conn):
            if not self.org_exists(org):
                raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such organisation")
            cursor = self._conn.execute(
                _INSERT_INVITE_UNDER_CAP,
                (
                    invite_id,
                    org,
                    role.value,
                    created_by,
                    created_at,
                    expires_at,
                    description,
                    org,
                    now,
                    limits.MAX_ACTIVE_INVITES_PER_ORG,
                ),
            )
            if cursor.rowcount != 1:
                raise ApiError(
                    409,
                    ApiErrorCode.TOO_MANY_INVITES,
                    f"at most {limits.MAX_ACTIVE_INVITES_PER_ORG} active invites per organisation",
                )
            self._audit(
                audit.INVITE_ISSUE,
                org,
                actor=created_by,
                target=invite_id,
                at=now,
                detail=f"role={role}",
            )
        info = InviteInfo(
            id=invite_id,
            org=org,
            role=role,
            status=InviteStatus.ACTIVE,
            created_by=created_by,
            created_at=created_at,
            expires_at=expires_at,
            description=description,
        )
        return secret, info

    def list_invites(self, org: str, now: float) -> list[InviteInfo]:
        rows = self._read_all(_LIST_INVITES, (org, now, limits.MAX_INVITES_LISTED))
        return [_invite_info(row, now) for row in rows]

    def revoke_invite(
        self, org: str, invite_id: str, *, actor: str | None, now: float
    ) -> InviteInfo:
        with transaction(self._conn):
            row = self._read(_SELECT_INVITE, (invite_id, org))
            if row is None:
                raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such invite")
            info = _invite_info(row, now)
            if info.status is InviteStatus.USED:
                raise ApiError(409, ApiErrorCode.INVITE_USED, "the invite was already used")
            if info.status is not InviteStatus.REVOKED:
                self._conn.execute(
                    "UPDATE invites SET revoked_at = ? WHERE id = ?", (now, invite_id)
                )
                self._audit(audit.INVITE_REVOKE, org, actor=actor, target=invite_id, at=now)
                info = attrs.evolve(info, status=InviteStatus.REVOKED)
        return info

    def register(
        self, org: str, secret: str, handle: str, agent_kind: AgentKind | None, now: float
    ) -> tuple[Member, str]:
        if not handle_allowed(handle):
            raise ApiError(400, ApiErrorCode.HANDLE_INVALID, "the handle is not allowed")
        kind = None if agent_kind is None else AgentKind(agent_kind)
        invite_id = hash_secret(secret)
        with transaction(self._conn):
            row = self._read(_SELECT_INVITE, (invite_id, org))
            # Invite checks come before the handle check, so that nobody without a valid
            # invite can probe which handles exist.
            if row is None:
                raise ApiError(404, ApiErrorCode.INVITE_UNKNOWN, "no such invite")
            status = _invite_info(row, now).status
            if status is InviteStatus.USED:
                raise ApiError(410, ApiErrorCode.INVITE_USED, "the invite was already used")
            if status is InviteStatus.REVOKED:
                raise ApiError(410, ApiErrorCode.INVITE_REVOKED, "the invite was revoked")
            if status is InviteStatus.EXPIRED:
                raise ApiError(410, ApiErrorCode.INVITE_EXPIRED, "the invite has expired")
            if self._handle_reserved(org, handle):
                # A removed member's handle too, until an admin releases it: whoever takes it
                # next must not be mistaken for the person who had it.
                raise ApiError(409, ApiErrorCode.HANDLE_TAKEN, "the handle is already taken")
            role = MemberRole(row[2])
            token = ids.mint_token()
            self._conn.execute(
                "INSERT INTO members (org, handle, role, token_hash, agent_kind, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    org,
                    handle,
                    role.value,
                    hash_secret(token),
                    None if kind is None else kind.value,
                    now,
                ),
            )
            self._conn.execute(
                "UPDATE invites SET used_at = ?, used_by = ? WHERE id = ?", (now, handle, invite_id)
            )
            self._audit(audit.INVITE_REDEEM, org, actor=handle, target=invite_id, at=now)
            self._audit(
                audit.MEMBER_REGISTER,
                org,
                actor=handle,
                target=handle,
                at=now,
                detail=f"role={role}",
            )
        member = Member(org=org, handle=handle, role=role, agent_kind=kind, created_at=now)
        return member, token

    # --- published keys -----------------------------------------------------------------

    def publish_identity(
        self, org: str, handle: str, signed: SignedIdentityRecord, now: float
    ) -> None:
        self._keys.pop((org, handle), None)
        with transaction(self._conn):
            done = store_keys.insert_identity(self._conn, org, handle, signed, now)
            if done is store_keys.Published.NEW:
                self._audit(audit.KEYS_IDENTITY_PUBLISH, org, actor=handle, target=handle, at=now)
            elif done is store_keys.Published.RECOVERY_KEY:
                self._audit(audit.RECOVERY_ISSUE, org, actor=handle, target=handle, at=now)

    def publish_encryption(
        self, org: str, handle: str, signed: SignedEncryptionKeyRecord, now: float
    ) -> None:
        self._keys.pop((org, handle), None)
        with transaction(self._conn):
            store_keys.insert_encryption(self._conn, org, handle, signed, now)
            self._audit(
                audit.KEYS_ENCRYPTION_PUBLISH,
                org,
                actor=handle,
                target=handle,
                at=now,
                detail=f"epoch={signed.record.epoch}",
            )

    def fetch_keys(self, org: str, handle: str) -> KeysResponse | None:
        key = (org, handle)
        if key in self._keys:
            self._keys.move_to_end(key)
            return self._keys[key]
        try:
            found = store_keys.fetch_keys(self._conn, org, handle)
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc
        self._keys[key] = found
        if len(self._keys) > KEYS_CACHED:
            self._keys.popitem(last=False)
        return found

    def publish_card(self, org: str, handle: str, signed: SignedCardRecord, now: float) -> None:
        with transaction(self._conn):
            if store_keys.put_card(self._conn, org, handle, signed, now):
                self._audit(
                    audit.CARD_PUBLISH,
                    org,
                    actor=handle,
                    target=handle,
                    at=now,
                    detail=f"tasks={len(signed.record.tasks)}",
                )

    def fetch_card(self, org: str, handle: str) -> SignedCardRecord | None:
        return self._reading(store_keys.fetch_card, org, handle)

    # --- audit --------------------------------------------------------------------------

    def record(self, entry: AuditEntry) -> None:
        try:
            self._audit(
                entry.event,
                entry.org,
                actor=entry.actor,
                target=entry.target,
                at=entry.at,
                detail=entry.detail,
                call_id=entry.call_id,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc

    def record_many(self, entries: Sequence[AuditEntry]) -> None:
        """Every row in one transaction: a batch is written whole or not at all."""
        unknown = [entry.event for entry in entries if entry.event not in audit.EVENTS]
        if unknown:
            raise ValueError(f"not an audit event: {unknown[0]!r}")
        if not entries:
            return
        if len(entries) == 1:
            # One statement is its own transaction; BEGIN and COMMIT would only add ~20%.
            self.record(entries[0])
            return
        rows = [
            (
                entry.at,
                entry.org,
                entry.event,
                entry.actor,
                entry.target,
                entry.call_id,
                None if entry.detail is None else entry.detail[: limits.MAX_DETAIL_CHARS],
            )
            for entry in entries
        ]
        with transaction(self._conn):
            # One prepared statement for the whole batch.
            self._conn.executemany(_INSERT_AUDIT, rows)

    def audit_rows(
        self,
        org: str,
        *,
        limit: int = 100,
        after_id: int = 0,
        up_to_id: int | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[AuditRow]:
        if not 1 <= limit <= MAX_AUDIT_PAGE:
            raise ValueError(f"limit must be 1..{MAX_AUDIT_PAGE}")
        rows = self._read_all(
            "SELECT id, at, org, event, actor, target, call_id, detail FROM audit"
            " WHERE org = ? AND id > ? AND id <= ? AND at >= ? AND at < ? ORDER BY id LIMIT ?",
            (
                org,
                after_id,
                _NO_ID_LIMIT if up_to_id is None else up_to_id,
                _NO_TIME_LIMIT_BEFORE if since is None else since,
                _NO_TIME_LIMIT_AFTER if until is None else until,
                limit,
            ),
        )
        return [AuditRow(*row) for row in rows]

    def last_audit_id(self, org: str) -> int:
        """The id of the organisation's newest audit row, 0 without one."""
        row = self._read("SELECT MAX(id) FROM audit WHERE org = ?", (org,))
        return 0 if row is None or row[0] is None else int(row[0])

    # --- legal holds and retention ------------------------------------------------------

    def list_holds(self, org: str) -> list[AuditHold]:
        rows = self._read_all(_LIST_HOLDS, (org, limits.MAX_AUDIT_HOLDS))
        return [_hold(row) for row in rows]

    def set_hold(
        self, org: str, handle: str | None, *, note: str | None, actor: str, now: float
    ) -> AuditHold:
        """Hold the whole organisation (``handle`` None) or one handle; audited. A hold that
        already stands is kept as it is (its note too) and answered."""
        if handle is not None and not ids.is_handle(handle):
            raise ValueError("not a valid handle")
        key = _HOLD_ORG if handle is None else handle
        with transaction(self._conn):
            row = self._read(_SELECT_HOLD, (org, key))
            if row is not None:
                return _hold(row)
            count = self._read("SELECT COUNT(*) FROM audit_holds WHERE org = ?", (org,))[0]
            if count >= limits.MAX_AUDIT_HOLDS:
                raise ApiError(
                    409,
                    ApiErrorCode.TOO_MANY_HOLDS,
                    f"at most {limits.MAX_AUDIT_HOLDS} legal holds per organisation; "
                    "hold the whole organisation instead",
                )
            self._conn.execute(
                "INSERT INTO audit_holds (org, handle, set_at, set_by, note)"
                " VALUES (?, ?, ?, ?, ?)",
                (org, key, now, actor, note),
            )
            scope = HoldScope.ORGANISATION if handle is None else HoldScope.HANDLE
            self._audit(
                audit.AUDIT_HOLD_SET, org, actor=actor, target=handle, at=now, detail=str(scope)
            )
        return AuditHold(scope=scope, handle=handle, set_at=int(now), set_by=actor, note=note)

    def clear_hold(self, org: str, handle: str | None, *, actor: str, now: float) -> AuditHold:
        """Take a hold off; audited. 404 ``not_found`` when no such hold stands."""
        key = _HOLD_ORG if handle is None else handle
        with transaction(self._conn):
            row = self._read(_SELECT_HOLD, (org, key))
            if row is None:
                what = "the organisation" if handle is None else handle
                raise ApiError(404, ApiErrorCode.NOT_FOUND, f"no legal hold on {what}")
            self._conn.execute("DELETE FROM audit_holds WHERE org = ? AND handle = ?", (org, key))
            held = _hold(row)
            self._audit(
                audit.AUDIT_HOLD_CLEAR,
                org,
                actor=actor,
                target=handle,
                at=now,
                detail=str(held.scope),
            )
        return held

    def retention_orgs(self) -> list[str]:
        """Every organisation, and the relay-wide rows' org (``audit.RELAY_WIDE``), first."""
        rows = self._read_all("SELECT org FROM orgs ORDER BY org", ())
        return [audit.RELAY_WIDE, *(org for (org,) in rows)]

    def prune_audit(self, org: str, before: float, limit: int) -> int:
        """Delete up to ``limit`` of the organisation's audit rows older than ``before`` that
        no legal hold covers (:func:`agentcall.relay.retention.keeps_event`), oldest first, in
        one transaction; how many."""
        if not 1 <= limit <= limits.RETENTION_BATCH_ROWS:
            raise ValueError(f"limit must be 1..{limits.RETENTION_BATCH_ROWS}")
        try:
            with transaction(self._conn):
                cursor = self._conn.execute(_PRUNE_AUDIT, (org, before, org, limit))
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc
        return int(cursor.rowcount)

    def purge_invites(self, org: str, before: float) -> int:
        """Delete the organisation's invites that ended (used, revoked or expired) before
        ``before`` and no legal hold covers (:func:`agentcall.relay.retention.keeps_invite`);
        how many. Invites are few (a cap on active ones), so one transaction."""
        try:
            with transaction(self._conn):
                cursor = self._conn.execute(_PURGE_INVITES, (org, before))
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc
        return int(cursor.rowcount)

    def submissions_since(self, since: float) -> list[Submission]:
        # Per organisation so each query walks the (org, at) index, not the whole audit table.
        # A queued call used up the pair's budget like one that rang.
        found: list[Submission] = []
        for (org,) in self._read_all("SELECT org FROM orgs ORDER BY org", ()):
            rows = self._read_all(
                "SELECT actor, target, at FROM audit WHERE org = ? AND at >= ?"
                " AND event IN (?, ?) AND actor IS NOT NULL AND target IS NOT NULL"
                " ORDER BY at, id",
                (org, since, audit.CALL_SUBMIT, audit.JOB_QUEUE),
            )
            found += [Submission(org, caller, callee, at) for caller, callee, at in rows]
        found.sort(key=lambda submission: submission.at)
        return found

    # --- the offline mailbox ------------------------------------------------------------

    def decide_jobs(
        self,
        scope: JobScope,
        decide: Decide,
        *,
        actor: str | None,
        at: float,
        sealed: SealedBytes | None = None,
    ) -> list[Decision] | Refused:
        def write_audit(
            event: str,
            org: str,
            who: str | None,
            target: str | None,
            job_id: str,
            detail: str | None,
        ) -> None:
            self._audit(event, org, actor=who, target=target, at=at, detail=detail, call_id=job_id)

        # A decision that keeps sealed bytes is one somebody is told was kept: a queued call
        # (the caller gets call_queued) or a stored answer (the callee gets its
        # acknowledgement). Those survive power loss; leases and renewals need not.
        kept = durable_transaction if sealed is not None else transaction
        with kept(self._conn):
            result, moved = store_jobs.decide(
                self._conn, scope, decide, actor=actor, sealed=sealed, write_audit=write_audit
            )
        # Only once committed: a transaction that failed (COMMIT included) was rolled back.
        if self._held_bytes is not None:
            self._held_bytes += moved
        return result

    def mailbox_bytes_held(self) -> int:
        if self._held_bytes is None:
            self._held_bytes = self._reading(store_jobs.held_bytes)
        return self._held_bytes

    def get_job(self, job_id: str) -> StoredJob | None:
        return self._reading(store_jobs.get, job_id)

    def jobs_of(self, org: str, handle: str, limit: int) -> list[Job]:
        return self._reading(store_jobs.of_member, org, handle, limit)

    def next_job_deadline(self, metadata_grace_s: float) -> float | None:
        return self._reading(store_jobs.next_deadline, metadata_grace_s)

    def mailbox_status(self, org: str, handle: str) -> MailboxStatus | None:
        return self._reading(store_jobs.status, org, handle)

    def set_offline_delivery(self, org: str, handle: str, enabled: bool, now: float) -> None:
        with transaction(self._conn):
            if store_jobs.set_opt_in(self._conn, org, handle, enabled):
                detail = "on" if enabled else "off"
                self._audit(
                    audit.MEMBER_OFFLINE_DELIVERY,
                    org,
                    actor=handle,
                    target=handle,
                    at=now,
                    detail=detail,
                )

    # --- helpers ------------------------------------------------------------------------

    def _reading(self, query: Callable[..., T], *args: object) -> T:
        try:
            return query(self._conn, *args)
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc

    def _read(self, sql: str, params: tuple[object, ...]) -> Any:
        try:
            return self._conn.execute(sql, params).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc

    def _read_all(self, sql: str, params: tuple[object, ...]) -> list[Any]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc

    def _audit(
        self,
        event: str,
        org: str,
        *,
        actor: str | None,
        target: str | None,
        at: float,
        detail: str | None = None,
        call_id: str | None = None,
    ) -> None:
        if event not in audit.EVENTS:
            raise ValueError(f"not an audit event: {event!r}")
        if detail is not None:
            detail = detail[: limits.MAX_DETAIL_CHARS]
        self._conn.execute(_INSERT_AUDIT, (at, org, event, actor, target, call_id, detail))


class SqliteRelayStore:
    """:class:`~agentcall.relay.store_interface.RelayStore` over a :class:`SqliteRegistry`.

    Each method runs its query at once and returns an already-fired Deferred: the value, or
    the ``ApiError``/``StoreError``/``ValueError`` as a failure.
    """

    def __init__(self, registry: SqliteRegistry) -> None:
        self.registry = registry
        # Told of every storage fault (a full disk, an I/O error): the relay's storage watch.
        self._on_fault: Callable[[StorageFault, str], object] = lambda _fault, _operation: None

    def close(self) -> None:
        self.registry.close()

    def ping(self) -> Deferred[None]:
        return self._run(self.registry.ping)

    def probe(self, now: float) -> Deferred[None]:
        # Not reported to the watch: it asked, and a probe that fails is no new failed operation.
        try:
            self.registry.probe(now)
        except Exception as exc:
            return defer.fail(storage_fault(exc) or exc)
        return defer.succeed(None)

    def watch_faults(self, report: Callable[[StorageFault, str], object]) -> None:
        self._on_fault = report

    def _run(self, step: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        """``step`` now, as a fired Deferred; an error that is the storage failing comes out
        as a :class:`StorageFault` (whatever layer raised it) and is reported first."""
        try:
            return defer.succeed(step(*args, **kwargs))
        except Exception as exc:
            fault = storage_fault(exc)
            if fault is None:
                return defer.fail()
            self._on_fault(fault, step.__name__)
            return defer.fail(fault)

    def ensure_org(self, org: str, now: float) -> Deferred[bool]:
        return self._run(self.registry.ensure_org, org, now)

    def org_exists(self, org: str) -> Deferred[bool]:
        return self._run(self.registry.org_exists, org)

    def handle_exists(self, org: str, handle: str) -> Deferred[bool]:
        return self._run(self.registry.handle_exists, org, handle)

    def get_member(self, org: str, handle: str) -> Deferred[Member | None]:
        return self._run(self.registry.get_member, org, handle)

    def authenticate(self, org: str, handle: str, token: str) -> Deferred[Member | None]:
        return self._run(self.registry.authenticate, org, handle, token)

    def list_members(self, org: str, *, after: str = "", limit: int) -> Deferred[list[MemberInfo]]:
        return self._run(self.registry.list_members, org, after=after, limit=limit)

    def remove_member(
        self, org: str, handle: str, *, release: bool, actor: str, now: float
    ) -> Deferred[MemberInfo]:
        return self._run(
            self.registry.remove_member, org, handle, release=release, actor=actor, now=now
        )

    def set_member_role(
        self, org: str, handle: str, role: MemberRole, *, actor: str, now: float
    ) -> Deferred[MemberInfo]:
        return self._run(self.registry.set_member_role, org, handle, role, actor=actor, now=now)

    def record_seen(self, seen: Sequence[tuple[str, str, float]]) -> Deferred[None]:
        return self._run(self.registry.record_seen, seen)

    def rotate_token(self, org: str, handle: str, token: str, now: float) -> Deferred[None]:
        return self._run(self.registry.rotate_token, org, handle, token, now)

    def recover(
        self,
        org: str,
        handle: str,
        previous: SignedIdentityRecord,
        statement: SignedRecoveryStatement,
        new_identity: SignedIdentityRecord,
        now: float,
    ) -> Deferred[str]:
        return self._run(self.registry.recover, org, handle, previous, statement, new_identity, now)

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
        return self._run(
            self.registry.create_invite,
            org,
            created_by=created_by,
            role=role,
            expires_in_days=expires_in_days,
            description=description,
            now=now,
        )

    def list_invites(self, org: str, now: float) -> Deferred[list[InviteInfo]]:
        return self._run(self.registry.list_invites, org, now)

    def revoke_invite(
        self, org: str, invite_id: str, *, actor: str | None, now: float
    ) -> Deferred[InviteInfo]:
        return self._run(self.registry.revoke_invite, org, invite_id, actor=actor, now=now)

    def register(
        self, org: str, secret: str, handle: str, agent_kind: AgentKind | None, now: float
    ) -> Deferred[tuple[Member, str]]:
        return self._run(self.registry.register, org, secret, handle, agent_kind, now)

    def publish_identity(
        self, org: str, handle: str, signed: SignedIdentityRecord, now: float
    ) -> Deferred[None]:
        return self._run(self.registry.publish_identity, org, handle, signed, now)

    def publish_encryption(
        self, org: str, handle: str, signed: SignedEncryptionKeyRecord, now: float
    ) -> Deferred[None]:
        return self._run(self.registry.publish_encryption, org, handle, signed, now)

    def fetch_keys(self, org: str, handle: str) -> Deferred[KeysResponse | None]:
        return self._run(self.registry.fetch_keys, org, handle)

    def publish_card(
        self, org: str, handle: str, signed: SignedCardRecord, now: float
    ) -> Deferred[None]:
        return self._run(self.registry.publish_card, org, handle, signed, now)

    def fetch_card(self, org: str, handle: str) -> Deferred[SignedCardRecord | None]:
        return self._run(self.registry.fetch_card, org, handle)

    def record(self, entry: AuditEntry) -> Deferred[None]:
        return self._run(self.registry.record, entry)

    def record_many(self, entries: Sequence[AuditEntry]) -> Deferred[None]:
        return self._run(self.registry.record_many, entries)

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
        return self._run(
            self.registry.audit_rows,
            org,
            limit=limit,
            after_id=after_id,
            up_to_id=up_to_id,
            since=since,
            until=until,
        )

    def last_audit_id(self, org: str) -> Deferred[int]:
        return self._run(self.registry.last_audit_id, org)

    def list_holds(self, org: str) -> Deferred[list[AuditHold]]:
        return self._run(self.registry.list_holds, org)

    def set_hold(
        self, org: str, handle: str | None, *, note: str | None, actor: str, now: float
    ) -> Deferred[AuditHold]:
        return self._run(self.registry.set_hold, org, handle, note=note, actor=actor, now=now)

    def clear_hold(
        self, org: str, handle: str | None, *, actor: str, now: float
    ) -> Deferred[AuditHold]:
        return self._run(self.registry.clear_hold, org, handle, actor=actor, now=now)

    def retention_orgs(self) -> Deferred[list[str]]:
        return self._run(self.registry.retention_orgs)

    def prune_audit(self, org: str, before: float, limit: int) -> Deferred[int]:
        return self._run(self.registry.prune_audit, org, before, limit)

    def purge_invites(self, org: str, before: float) -> Deferred[int]:
        return self._run(self.registry.purge_invites, org, before)

    def submissions_since(self, since: float) -> Deferred[list[Submission]]:
        return self._run(self.registry.submissions_since, since)

    def decide_jobs(
        self,
        scope: JobScope,
        decide: Decide,
        *,
        actor: str | None,
        at: float,
        sealed: SealedBytes | None = None,
    ) -> Deferred[list[Decision] | Refused]:
        return self._run(
            self.registry.decide_jobs, scope, decide, actor=actor, at=at, sealed=sealed
        )

    def get_job(self, job_id: str) -> Deferred[StoredJob | None]:
        return self._run(self.registry.get_job, job_id)

    def mailbox_bytes_held(self) -> Deferred[int]:
        return self._run(self.registry.mailbox_bytes_held)

    def jobs_of(self, org: str, handle: str, limit: int) -> Deferred[list[Job]]:
        return self._run(self.registry.jobs_of, org, handle, limit)

    def next_job_deadline(self, metadata_grace_s: float) -> Deferred[float | None]:
        return self._run(self.registry.next_job_deadline, metadata_grace_s)

    def mailbox_status(self, org: str, handle: str) -> Deferred[MailboxStatus | None]:
        return self._run(self.registry.mailbox_status, org, handle)

    def set_offline_delivery(
        self, org: str, handle: str, enabled: bool, now: float
    ) -> Deferred[None]:
        return self._run(self.registry.set_offline_delivery, org, handle, enabled, now)
