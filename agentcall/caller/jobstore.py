"""The ``jobs_out`` table of state.sqlite: the mailbox jobs this installation queued as a caller.

When the relay keeps a call as a job, the answer comes back hours later, long after the process
that sealed the request is gone. Opening that answer needs what the live call held in memory:
the request as sent (the answer is verified against its hash) and the callee's identity key
pinned when it was sealed. Both are kept here, per relay, until the job's metadata is gone at
the relay too (``expires_at`` + ``MAILBOX_METADATA_GRACE_S``).

Only storage lives here; opening an answer is :mod:`agentcall.caller.jobs`. The state database
(:mod:`agentcall.local.statedb`) builds this store on its connection, so this module imports
neither of them.
"""

from __future__ import annotations

import sqlite3

import attrs

from agentcall import ids, limits
from agentcall.db import transaction
from agentcall.errors import MalformedFrame, StoreError
from agentcall.wire import codec
from agentcall.wire import fields as f
from agentcall.wire.payloads import RequestPayload


@attrs.frozen
class SentJob:
    """A job we queued: enough to open and verify its answer later."""

    job_id: str = attrs.field(validator=f.job_id)
    address: str = attrs.field(validator=f.address)
    request: RequestPayload
    identity_pub: str = attrs.field(validator=f.b64url(43, min_chars=43))
    created_at: float
    expires_at: float

    def __attrs_post_init__(self) -> None:
        # The request names its callee; a row where they differ is not one we wrote.
        if self.request.to != self.address:
            raise ValueError("the stored request is not addressed to the job's callee")


_INSERT = (
    "INSERT INTO jobs_out"
    " (relay_origin, job_id, address, request, identity_pub, created_at, expires_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (relay_origin, job_id) DO UPDATE SET"
    " address = excluded.address, request = excluded.request,"
    " identity_pub = excluded.identity_pub, created_at = excluded.created_at,"
    " expires_at = excluded.expires_at"
)
_SELECT = (
    "SELECT job_id, address, request, identity_pub, created_at, expires_at FROM jobs_out"
    " WHERE relay_origin = ? AND job_id = ?"
)
_DELETE = "DELETE FROM jobs_out WHERE relay_origin = ? AND job_id = ?"
_PRUNE = "DELETE FROM jobs_out WHERE expires_at + ? <= ?"


def _execute(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> sqlite3.Cursor:
    try:
        return conn.execute(sql, params)
    except sqlite3.Error as exc:
        raise StoreError(f"state database (sent jobs): {exc}") from exc


def _row(row: tuple[object, ...], relay_origin: str) -> SentJob | None:
    job_id, address, raw, identity_pub, created_at, expires_at = row
    try:
        if not isinstance(raw, bytes):
            raise TypeError("request is not a blob")
        request = codec.decode(raw, RequestPayload, max_bytes=limits.MAX_REQUEST_FRAME_BYTES)
        if request.relay_origin != relay_origin:
            raise ValueError("the stored request is for another relay")
        return SentJob(
            job_id,  # type: ignore[arg-type]
            address,  # type: ignore[arg-type]
            request,
            identity_pub,  # type: ignore[arg-type]
            float(created_at),  # type: ignore[arg-type]
            float(expires_at),  # type: ignore[arg-type]
        )
    except (MalformedFrame, TypeError, ValueError):
        # A damaged row is no record: its answer is then refused, never opened on a guess.
        return None


class SqliteSentJobs:
    """Sent jobs in the ``jobs_out`` table, for the relay at ``relay_origin``."""

    def __init__(self, conn: sqlite3.Connection, relay_origin: str) -> None:
        if ids.RELAY_ORIGIN_RE.match(relay_origin) is None:
            raise ValueError(f"not a relay origin: {relay_origin!r}")
        self._conn = conn
        self._origin = relay_origin

    def remember(self, job: SentJob, now: float) -> None:
        """Keep ``job`` (replacing a row with its id) and drop rows past their grace."""
        if job.request.relay_origin != self._origin:
            raise ValueError("the request was sealed for another relay")
        row = (
            self._origin,
            job.job_id,
            job.address,
            codec.encode(job.request),
            job.identity_pub,
            job.created_at,
            job.expires_at,
        )
        with transaction(self._conn) as conn:
            conn.execute(_INSERT, row)
            conn.execute(_PRUNE, (limits.MAILBOX_METADATA_GRACE_S, now))

    def get(self, job_id: str) -> SentJob | None:
        """The job with ``job_id``, or None (never sent from here, pruned, or damaged)."""
        found = _execute(self._conn, _SELECT, (self._origin, job_id)).fetchone()
        return None if found is None else _row(found, self._origin)

    def forget(self, job_id: str) -> bool:
        return _execute(self._conn, _DELETE, (self._origin, job_id)).rowcount > 0

    def prune(self, now: float) -> int:
        return _execute(self._conn, _PRUNE, (limits.MAILBOX_METADATA_GRACE_S, now)).rowcount
