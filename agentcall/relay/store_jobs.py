"""The offline-mailbox half of the relay store: job rows, their sealed bytes, the opt-in.

Functions here run on the connection of :class:`~agentcall.relay.store.SqliteRegistry`, which
opens the transaction; :func:`decide` writes the audit rows of what it decided through the
``audit`` callable it is handed, inside that same transaction. A job's row holds exactly the
fields of :class:`~agentcall.relay.mailbox.Job` (metadata and sizes); its sealed bytes live in
``job_sealed`` and never leave this module except to be forwarded verbatim.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

from agentcall.errors import ApiError, ApiErrorCode, StoreError
from agentcall.relay import audit, mailbox
from agentcall.relay.mailbox import Decision, DropCiphertext, DropRequest, Job, Refused
from agentcall.relay.store_interface import (
    Decide,
    JobScope,
    JobsDue,
    JobsOf,
    MailboxStatus,
    OneJob,
    SealedBytes,
    StoredJob,
)
from agentcall.wire.frames import Terminal

# (event, org, actor, target, job id, detail); the registry adds the time and writes the row.
AuditWrite = Callable[[str, str, str | None, str | None, str, str | None], None]

# Statements spelled out in full (no string building), so each one can be read as it runs.
_SELECT_ONE = (
    "SELECT job_id, org, caller, callee, request_bytes, created_at, expires_at, state, reason,"
    " attempts, lease_until, answer_bytes, cancel_requested, holds_ciphertext, last_delivery,"
    " lapsed FROM jobs WHERE job_id = ?"
)
# Two indexed lookups rather than one OR, which would scan the table.
_SELECT_OF_MEMBER = (
    "SELECT job_id, org, caller, callee, request_bytes, created_at, expires_at, state, reason,"
    " attempts, lease_until, answer_bytes, cancel_requested, holds_ciphertext, last_delivery,"
    " lapsed FROM jobs WHERE org = ? AND caller = ?"
    " UNION"
    " SELECT job_id, org, caller, callee, request_bytes, created_at, expires_at, state, reason,"
    " attempts, lease_until, answer_bytes, cancel_requested, holds_ciphertext, last_delivery,"
    " lapsed FROM jobs WHERE org = ? AND callee = ?"
)
_LIST_OF_MEMBER = (
    "SELECT job_id, org, caller, callee, request_bytes, created_at, expires_at, state, reason,"
    " attempts, lease_until, answer_bytes, cancel_requested, holds_ciphertext, last_delivery,"
    " lapsed FROM jobs WHERE org = ? AND caller = ?"
    " UNION"
    " SELECT job_id, org, caller, callee, request_bytes, created_at, expires_at, state, reason,"
    " attempts, lease_until, answer_bytes, cancel_requested, holds_ciphertext, last_delivery,"
    " lapsed FROM jobs WHERE org = ? AND callee = ?"
    " ORDER BY created_at DESC, job_id DESC LIMIT ?"
)
# Placeholders: now (leases), now (expiry), now - grace (forgetting).
_SELECT_DUE = (
    "SELECT job_id, org, caller, callee, request_bytes, created_at, expires_at, state, reason,"
    " attempts, lease_until, answer_bytes, cancel_requested, holds_ciphertext, last_delivery,"
    " lapsed FROM jobs WHERE (lease_until IS NOT NULL AND lease_until <= ?)"
    " OR (expires_at <= ? AND (state IN ('queued', 'delivered', 'running')"
    "     OR holds_ciphertext = 1))"
    " OR expires_at <= ?"
)
# The partial index jobs_by_lease holds exactly these rows.
_SELECT_HELD = (
    "SELECT job_id, org, caller, callee, request_bytes, created_at, expires_at, state, reason,"
    " attempts, lease_until, answer_bytes, cancel_requested, holds_ciphertext, last_delivery,"
    " lapsed FROM jobs WHERE lease_until IS NOT NULL"
)
# mailbox.held_bytes in SQL: the request while outstanding, the answer while it is held.
_SUM_HELD = (
    "SELECT COALESCE(SUM("
    "CASE WHEN state IN ('queued', 'delivered', 'running') THEN request_bytes ELSE 0 END"
    " + CASE WHEN holds_ciphertext = 1 THEN COALESCE(answer_bytes, 0) ELSE 0 END), 0)"
    " FROM jobs"
)
_INSERT = (
    "INSERT INTO jobs (job_id, org, caller, callee, request_bytes, created_at, expires_at,"
    " state, reason, attempts, lease_until, answer_bytes, cancel_requested, holds_ciphertext,"
    " last_delivery, lapsed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_UPDATE = (
    "UPDATE jobs SET org = ?, caller = ?, callee = ?, request_bytes = ?, created_at = ?,"
    " expires_at = ?, state = ?, reason = ?, attempts = ?, lease_until = ?, answer_bytes = ?,"
    " cancel_requested = ?, holds_ciphertext = ?, last_delivery = ?, lapsed = ?"
    " WHERE job_id = ?"
)


def _job(row: Any) -> Job:
    (job_id, org, caller, callee, request_bytes, created_at, expires_at, state, reason) = row[:9]
    attempts, lease_until, answer_bytes, cancel_requested, holds, last_delivery, lapsed = row[9:]
    try:
        return Job(
            job_id=job_id,
            org=org,
            caller=caller,
            callee=callee,
            request_bytes=request_bytes,
            created_at=created_at,
            expires_at=expires_at,
            state=mailbox.JobState(state),
            reason=None if reason is None else mailbox.FailureReason(reason),
            attempts=attempts,
            lease_until=lease_until,
            answer_bytes=answer_bytes,
            cancel_requested=bool(cancel_requested),
            holds_ciphertext=bool(holds),
            last_delivery=last_delivery,
            lapsed=bool(lapsed),
        )
    except ValueError as exc:
        raise StoreError(f"job {job_id} has a row no decision can produce: {exc}") from exc


def _fields(job: Job) -> tuple[object, ...]:
    """The row's values in column order after ``job_id``."""
    return (
        job.org,
        job.caller,
        job.callee,
        job.request_bytes,
        job.created_at,
        job.expires_at,
        job.state.value,
        None if job.reason is None else job.reason.value,
        job.attempts,
        job.lease_until,
        job.answer_bytes,
        int(job.cancel_requested),
        int(job.holds_ciphertext),
        job.last_delivery,
        int(job.lapsed),
    )


def load(conn: sqlite3.Connection, scope: JobScope) -> dict[str, Job]:
    """The rows of ``scope``, keyed by job id."""
    if isinstance(scope, OneJob):
        rows = conn.execute(_SELECT_ONE, (scope.job_id,)).fetchall()
    elif isinstance(scope, JobsOf):
        rows = []
        for handle in sorted(set(scope.handles)):
            rows += conn.execute(
                _SELECT_OF_MEMBER, (scope.org, handle, scope.org, handle)
            ).fetchall()
    elif isinstance(scope, JobsDue):
        now = scope.now
        rows = conn.execute(_SELECT_DUE, (now, now, now - scope.metadata_grace_s)).fetchall()
    else:
        rows = conn.execute(_SELECT_HELD).fetchall()
    jobs = (_job(row) for row in rows)
    return {job.job_id: job for job in jobs}


def decide(
    conn: sqlite3.Connection,
    scope: JobScope,
    choose: Decide,
    *,
    actor: str | None,
    sealed: SealedBytes | None,
    write_audit: AuditWrite,
) -> tuple[list[Decision] | Refused, int]:
    """Load ``scope``, run ``choose``, persist its decisions (inside the caller's transaction).

    Also how much the sealed bytes held for every job together moved (see :func:`held_bytes`),
    so that a running total need not be summed again."""
    before = load(conn, scope)
    chosen = choose(before)
    if isinstance(chosen, Refused):
        return chosen, 0
    decisions = list(chosen)
    moved = 0
    for decision in decisions:
        old = before.get(decision.job_id)
        _persist(conn, decision, old, sealed)
        moved += _held(decision.job) - _held(old)
        row = decision.job or old
        if row is None:  # pragma: no cover - a decision forgets only a row it was given
            raise StoreError(f"a decision forgets job {decision.job_id}, which was not loaded")
        for event in decision.audit:
            target = row.caller if actor == row.callee else row.callee
            write_audit(event, row.org, actor, target, row.job_id, _detail(event, row, sealed))
    return decisions, moved


def _held(job: Job | None) -> int:
    return 0 if job is None else mailbox.held_bytes(job)


def held_bytes(conn: sqlite3.Connection) -> int:
    """:func:`agentcall.relay.mailbox.held_bytes` summed over every job: one pass over the
    table, for a running total to start from."""
    row = conn.execute(_SUM_HELD).fetchone()
    return int(row[0])


def _persist(
    conn: sqlite3.Connection, decision: Decision, old: Job | None, sealed: SealedBytes | None
) -> None:
    job_id, job = decision.job_id, decision.job
    mine = sealed if sealed is not None and sealed.job_id == job_id else None
    if job is None:
        conn.execute("DELETE FROM job_sealed WHERE job_id = ?", (job_id,))
        conn.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
        return
    if old is None:
        if mine is None or mine.request is None:
            raise ValueError(f"a new job ({job_id}) is stored with its sealed request")
        conn.execute(_INSERT, (job_id, *_fields(job)))
        conn.execute(
            "INSERT INTO job_sealed (job_id, request) VALUES (?, ?)", (job_id, mine.request)
        )
    else:
        conn.execute(_UPDATE, (*_fields(job), job_id))
        if job.state is mailbox.JobState.ANSWERED and old.state is not job.state:
            if mine is None or mine.answer is None or mine.terminal is None:
                raise ValueError(f"an answered job ({job_id}) is stored with its sealed answer")
            # The answer first: the row must never be left with neither request nor answer.
            conn.execute(
                "INSERT INTO job_sealed (job_id, answer, terminal) VALUES (?, ?, ?)"
                " ON CONFLICT (job_id) DO UPDATE SET answer = excluded.answer,"
                " terminal = excluded.terminal",
                (job_id, mine.answer, mine.terminal.value),
            )
    for effect in decision.effects:
        if isinstance(effect, DropRequest):
            conn.execute("UPDATE job_sealed SET request = NULL WHERE job_id = ?", (job_id,))
        elif isinstance(effect, DropCiphertext):
            conn.execute("DELETE FROM job_sealed WHERE job_id = ?", (job_id,))


def _detail(event: str, job: Job, sealed: SealedBytes | None) -> str | None:
    """Metadata only: sizes, attempts, reasons, terminals."""
    if event == audit.JOB_QUEUE:
        return f"bytes={job.request_bytes}"
    if event == audit.JOB_DELIVER:
        return f"attempt={job.attempts}"
    if event == audit.JOB_FAIL and job.reason is not None:
        return str(job.reason)
    if event == audit.JOB_COMPLETE and sealed is not None and sealed.terminal is not None:
        return str(sealed.terminal)
    return None


def get(conn: sqlite3.Connection, job_id: str) -> StoredJob | None:
    jobs = load(conn, OneJob(job_id))
    job = jobs.get(job_id)
    if job is None:
        return None
    row = conn.execute(
        "SELECT request, answer, terminal FROM job_sealed WHERE job_id = ?", (job_id,)
    ).fetchone()
    if row is None:
        return StoredJob(job)
    request, answer, terminal = row
    return StoredJob(
        job,
        request=None if request is None else bytes(request),
        answer=None if answer is None else bytes(answer),
        terminal=None if terminal is None else Terminal(terminal),
    )


def of_member(conn: sqlite3.Connection, org: str, handle: str, limit: int) -> list[Job]:
    rows = conn.execute(_LIST_OF_MEMBER, (org, handle, org, handle, limit)).fetchall()
    return [_job(row) for row in rows]


def next_deadline(conn: sqlite3.Connection, metadata_grace_s: float) -> float | None:
    """``mailbox.next_deadline`` over every row, from three indexed minimums."""
    lease = conn.execute("SELECT MIN(lease_until) FROM jobs").fetchone()[0]
    expiry = conn.execute(
        "SELECT MIN(expires_at) FROM jobs"
        " WHERE state IN ('queued', 'delivered', 'running') OR holds_ciphertext = 1"
    ).fetchone()[0]
    oldest = conn.execute("SELECT MIN(expires_at) FROM jobs").fetchone()[0]
    forget = None if oldest is None else oldest + metadata_grace_s
    return _earliest((lease, expiry, forget))


def _earliest(times: Iterable[float | None]) -> float | None:
    return min((t for t in times if t is not None), default=None)


def status(conn: sqlite3.Connection, org: str, handle: str) -> MailboxStatus | None:
    row = conn.execute(
        "SELECT offline_delivery, EXISTS (SELECT 1 FROM jobs WHERE org = ? AND callee = ?"
        " AND state IN ('delivered', 'running')) FROM members WHERE org = ? AND handle = ?",
        (org, handle, org, handle),
    ).fetchone()
    if row is None:
        return None
    return MailboxStatus(offline_delivery=bool(row[0]), job_out=bool(row[1]))


def set_opt_in(conn: sqlite3.Connection, org: str, handle: str, enabled: bool) -> bool:
    """Store the opt-in; True when it changed."""
    row = conn.execute(
        "SELECT offline_delivery FROM members WHERE org = ? AND handle = ?", (org, handle)
    ).fetchone()
    if row is None:
        raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such member")
    if bool(row[0]) == enabled:
        return False
    conn.execute(
        "UPDATE members SET offline_delivery = ? WHERE org = ? AND handle = ?",
        (int(enabled), org, handle),
    )
    return True
