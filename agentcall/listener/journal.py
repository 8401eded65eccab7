"""The execution journal for mailbox jobs: a job delivered by the relay is run at most once.

Each job id moves through ``accepted → started → sealed → acknowledged``. The row saying
``accepted`` is committed (fsynced) *before* the agent starts, so after a ``kill -9`` the journal
knows every job that may have run:

- a job found ``accepted`` or ``started`` on restart may have run (the agent could have done its
  work and been killed before the answer was sealed): it is never run again, and its stored
  reply becomes the error ``indeterminate_execution``, reported to the relay;
- a job found ``sealed`` (its reply stored, not yet acknowledged by the relay) is re-delivered
  from the stored reply, never re-run;
- a second delivery of a known job id is never run: the stored reply if there is one, else
  ``indeterminate_execution`` (or nothing, if the job is running in this process right now).

A stored reply is the encoded ``job_result`` exactly as sent to the relay (ciphertext and
routing only), or a :class:`~agentcall.wire.frames.JobError` the listener reports in clear. Rows
are pruned :data:`HORIZON_S` (the 72 h mailbox TTL plus the allowed clock skew) after acceptance;
:func:`on_delivery` refuses a new job whose expiry lies further ahead than that, so no job can
outlive its row. The desk passes the relay's expiry capped at its own ``now`` plus the TTL (a
relay whose clock runs ahead must not get every fresh job refused), so the desk's deliveries never
meet this refusal; a job delivered again after its row is pruned is still never run, because its
sealed request's signed expiry has passed by then (the pipeline refuses to open it) and the
replay window keeps its request id until that expiry.

Pure rules (:func:`on_delivery`, :func:`on_restart`, :func:`start`, :func:`seal`,
:func:`acknowledge`) take ``now`` and return values; :class:`SqliteJournal` keeps the rows in
``state.sqlite``, one transaction per step. :mod:`agentcall.listener.mailboxdesk` drives it.
"""

from __future__ import annotations

import enum
import math
import sqlite3
from collections.abc import Callable, Iterable
from typing import Final

import attrs
from zope.interface import Interface, implementer

from agentcall import limits
from agentcall.db import durable_transaction, transaction
from agentcall.errors import StoreError
from agentcall.ids import JOB_ID_RE
from agentcall.wire.frames import JobError

INDETERMINATE_EXECUTION: Final = JobError.INDETERMINATE_EXECUTION
# How long a row is kept, and so how far ahead a new job's (relay-stamped) expiry may lie.
HORIZON_S: Final = limits.MAILBOX_TTL_S + limits.CLOCK_SKEW_S


class JobState(enum.StrEnum):
    ACCEPTED = "accepted"  # committed before the agent starts
    STARTED = "started"  # the agent was started
    SEALED = "sealed"  # the reply is stored; the relay has not acknowledged it
    ACKNOWLEDGED = "acknowledged"  # the relay has the reply


MIGHT_HAVE_RUN: Final = frozenset({JobState.ACCEPTED, JobState.STARTED})
REPLIED: Final = frozenset({JobState.SEALED, JobState.ACKNOWLEDGED})


def _job_id(_inst: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not JOB_ID_RE.match(value):
        raise ValueError(f"{attribute.name}: not a job id")


def _time(_inst: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{attribute.name}: not a finite time")


@attrs.frozen
class StoredReply:
    """The job's final reply: the sealed outcome (ciphertext), or an error code, never both."""

    sealed: bytes | None = attrs.field(default=None, repr=False)
    error: JobError | None = attrs.field(
        default=None, converter=attrs.converters.optional(JobError)
    )

    def __attrs_post_init__(self) -> None:
        if (self.sealed is None) == (self.error is None):
            raise ValueError("a stored reply is either sealed or an error code")
        if self.sealed is not None and (type(self.sealed) is not bytes or not self.sealed):
            raise ValueError("sealed: not ciphertext bytes")


INDETERMINATE_REPLY: Final = StoredReply(error=INDETERMINATE_EXECUTION)


@attrs.frozen
class Entry:
    """One job's row in the journal."""

    job_id: str = attrs.field(validator=_job_id)
    state: JobState = attrs.field(converter=JobState)
    accepted_at: float = attrs.field(validator=_time)
    updated_at: float = attrs.field(validator=_time)
    reply: StoredReply | None = None

    def __attrs_post_init__(self) -> None:
        if (self.reply is not None) != (self.state in REPLIED):
            raise ValueError("reply: stored exactly when the job is sealed or acknowledged")


# --- decisions on a delivery --------------------------------------------------------------------


@attrs.frozen
class Run:
    """Unknown job: ``write`` (state ``accepted``) is committed first; then start the agent."""

    job_id: str
    write: Entry


@attrs.frozen
class Redeliver:
    """Send ``reply`` for the job again; do not run it."""

    job_id: str
    reply: StoredReply


@attrs.frozen
class Indeterminate:
    """The job may have run: never run it; commit ``write`` and report the error it stores."""

    job_id: str
    write: Entry

    @property
    def reply(self) -> StoredReply:
        return INDETERMINATE_REPLY


@attrs.frozen
class InProgress:
    """The job is running in this process: its reply will follow; nothing to do now."""

    job_id: str


class RefusalReason(enum.StrEnum):
    EXPIRED = "expired"
    EXPIRY_TOO_FAR = "expiry_too_far"


@attrs.frozen
class Refused:
    """A new job that must not run (nothing is written)."""

    job_id: str
    reason: RefusalReason


Delivery = Run | Redeliver | Indeterminate | InProgress | Refused


def _indeterminate(entry: Entry, now: float) -> Indeterminate:
    written = attrs.evolve(
        entry,
        state=JobState.SEALED,
        reply=INDETERMINATE_REPLY,
        updated_at=max(now, entry.accepted_at),
    )
    return Indeterminate(entry.job_id, written)


def on_delivery(
    entry: Entry | None, job_id: str, *, expires_at: float, running_here: bool, now: float
) -> Delivery:
    """What to do with a delivery of ``job_id`` given its journal row (None: never seen).

    ``expires_at`` is the job's expiry as the relay stamped it on the delivery (by the relay's
    clock; the desk caps it at its own ``now`` plus the TTL), not the sealed request's, which
    only the pipeline sees once it opens the request. ``running_here`` says whether this
    process is running the job's agent right now.
    """
    if entry is not None:
        if entry.job_id != job_id:
            raise ValueError("the entry belongs to another job")
        if entry.reply is not None:
            return Redeliver(job_id, entry.reply)
        if running_here:
            return InProgress(job_id)
        return _indeterminate(entry, now)
    if now >= expires_at:
        return Refused(job_id, RefusalReason.EXPIRED)
    if expires_at > now + HORIZON_S:
        # Such a job could outlive its row and, after the prune, be seen as new.
        return Refused(job_id, RefusalReason.EXPIRY_TOO_FAR)
    return Run(job_id, Entry(job_id, JobState.ACCEPTED, now, now))


def on_restart(entry: Entry, now: float) -> Redeliver | Indeterminate | None:
    """After a restart nothing is running: what to report for ``entry`` (None: nothing)."""
    if entry.state is JobState.ACKNOWLEDGED:
        return None
    if entry.reply is not None:
        return Redeliver(entry.job_id, entry.reply)
    return _indeterminate(entry, now)


# --- the steps of one run -----------------------------------------------------------------------


@attrs.frozen
class StepRefused:
    """A step that does not follow from the job's state (``None``: the job is not journalled)."""

    job_id: str
    step: str
    state: JobState | None


def start(entry: Entry | None, job_id: str, now: float) -> Entry | StepRefused:
    """The agent is about to start: ``accepted`` → ``started``."""
    if entry is None or entry.state is not JobState.ACCEPTED:
        return StepRefused(job_id, "start", None if entry is None else entry.state)
    return attrs.evolve(entry, state=JobState.STARTED, updated_at=max(now, entry.accepted_at))


def seal(entry: Entry | None, job_id: str, reply: StoredReply, now: float) -> Entry | StepRefused:
    """The reply is sealed: store it. From ``accepted`` too (refused before the agent ran)."""
    if entry is None or entry.state not in MIGHT_HAVE_RUN:
        return StepRefused(job_id, "seal", None if entry is None else entry.state)
    return attrs.evolve(
        entry, state=JobState.SEALED, reply=reply, updated_at=max(now, entry.accepted_at)
    )


def acknowledge(entry: Entry | None, job_id: str, now: float) -> Entry | StepRefused:
    """The relay has the reply: ``sealed`` → ``acknowledged`` (again: no change)."""
    if entry is not None and entry.state is JobState.ACKNOWLEDGED:
        return entry
    if entry is None or entry.state is not JobState.SEALED:
        return StepRefused(job_id, "acknowledge", None if entry is None else entry.state)
    return attrs.evolve(entry, state=JobState.ACKNOWLEDGED, updated_at=max(now, entry.accepted_at))


def prune_before(now: float) -> float:
    """Rows accepted at or before this time are dropped (their jobs have expired)."""
    return now - HORIZON_S


# --- storage ------------------------------------------------------------------------------------


class IJournal(Interface):
    """The journal's rows; every method is one durable transaction."""

    def get(job_id: str) -> Entry | None:
        """The job's row, or None (a corrupt row is a StoreError)."""

    def deliver(job_id: str, *, expires_at: float, running_here: bool, now: float) -> Delivery:
        """Decide on a delivery and commit what the decision writes, before returning it."""

    def start(job_id: str, now: float) -> Entry | StepRefused:
        """Record that the agent starts."""

    def seal(job_id: str, reply: StoredReply, now: float) -> Entry | StepRefused:
        """Store the job's reply."""

    def acknowledge(job_id: str, now: float) -> Entry | StepRefused:
        """Record that the relay has the reply."""

    def restart(now: float) -> tuple[Redeliver | Indeterminate, ...]:
        """On start-up: mark what may have run, and list every reply still to send."""

    def prune(now: float) -> int:
        """Drop rows older than HORIZON_S."""


_COLUMNS = "job_id, state, accepted_at, updated_at, reply_sealed, reply_error"
_SELECT = f"SELECT {_COLUMNS} FROM journal WHERE job_id = ?"  # noqa: S608 (constant)
_SELECT_OPEN = (
    f"SELECT {_COLUMNS} FROM journal WHERE state != 'acknowledged'"  # noqa: S608 (constant)
    " ORDER BY accepted_at, job_id"
)
_UPSERT = (
    f"INSERT INTO journal ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"  # noqa: S608 (constant)
    " ON CONFLICT (job_id) DO UPDATE SET state = excluded.state,"
    " accepted_at = excluded.accepted_at, updated_at = excluded.updated_at,"
    " reply_sealed = excluded.reply_sealed, reply_error = excluded.reply_error"
)
_PRUNE = "DELETE FROM journal WHERE accepted_at <= ?"

_Row = tuple[object, object, object, object, object, object]
_Step = Callable[[Entry | None], Entry | StepRefused]


def _entry(row: _Row) -> Entry:
    job_id, state, accepted_at, updated_at, sealed, error = row
    reply = None if sealed is None and error is None else StoredReply(sealed, error)  # type: ignore[arg-type]
    return Entry(job_id, state, accepted_at, updated_at, reply)  # type: ignore[arg-type]


def _entry_or_unknown_past(row: _Row, now: float) -> Entry:
    """A row that does not read as an entry: the job may have run (never treat it as new)."""
    try:
        return _entry(row)
    except (TypeError, ValueError):
        return Entry(str(row[0]), JobState.STARTED, now, now)


@implementer(IJournal)
class SqliteJournal:
    """Journal rows in the ``journal`` table of ``state.sqlite``."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _write(self, entry: Entry) -> None:
        reply = entry.reply
        self._conn.execute(
            _UPSERT,
            (
                entry.job_id,
                entry.state.value,
                entry.accepted_at,
                entry.updated_at,
                None if reply is None else reply.sealed,
                None if reply is None else reply.error,
            ),
        )

    def _load(self, job_id: str, now: float) -> Entry | None:
        row = self._conn.execute(_SELECT, (job_id,)).fetchone()
        return None if row is None else _entry_or_unknown_past(row, now)

    def get(self, job_id: str) -> Entry | None:
        try:
            row = self._conn.execute(_SELECT, (job_id,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"state database (journal): {exc}") from exc
        if row is None:
            return None
        try:
            return _entry(row)
        except (TypeError, ValueError):
            raise StoreError(f"state database: the journal row of {job_id} is corrupt") from None

    def deliver(
        self, job_id: str, *, expires_at: float, running_here: bool, now: float
    ) -> Delivery:
        if not JOB_ID_RE.match(job_id):
            raise ValueError("not a job id")
        # The accepted row is what stops a second run, so its commit waits for the disk even
        # against power loss, not only against a killed process.
        with durable_transaction(self._conn):
            entry = self._load(job_id, now)
            decision = on_delivery(
                entry, job_id, expires_at=expires_at, running_here=running_here, now=now
            )
            if isinstance(decision, Run | Indeterminate):
                self._write(decision.write)
        return decision

    def _step(self, job_id: str, now: float, step: _Step) -> Entry | StepRefused:
        with transaction(self._conn):
            result = step(self._load(job_id, now))
            if isinstance(result, Entry):
                self._write(result)
        return result

    def start(self, job_id: str, now: float) -> Entry | StepRefused:
        return self._step(job_id, now, lambda entry: start(entry, job_id, now))

    def seal(self, job_id: str, reply: StoredReply, now: float) -> Entry | StepRefused:
        return self._step(job_id, now, lambda entry: seal(entry, job_id, reply, now))

    def acknowledge(self, job_id: str, now: float) -> Entry | StepRefused:
        return self._step(job_id, now, lambda entry: acknowledge(entry, job_id, now))

    def restart(self, now: float) -> tuple[Redeliver | Indeterminate, ...]:
        reports: list[Redeliver | Indeterminate] = []
        with transaction(self._conn):
            for entry in _readable(self._conn.execute(_SELECT_OPEN).fetchall(), now):
                report = on_restart(entry, now)
                if isinstance(report, Indeterminate):
                    self._write(report.write)
                if report is not None:
                    reports.append(report)
        return tuple(reports)

    def prune(self, now: float) -> int:
        try:
            return self._conn.execute(_PRUNE, (prune_before(now),)).rowcount
        except sqlite3.Error as exc:
            raise StoreError(f"state database (journal): {exc}") from exc


def _readable(rows: Iterable[_Row], now: float) -> Iterable[Entry]:
    for row in rows:
        if isinstance(row[0], str) and JOB_ID_RE.match(row[0]):
            yield _entry_or_unknown_past(row, now)
        # A row without a valid job id matches no delivery; the prune drops it in time.
