"""The relay's audit trail: the fixed vocabulary of events, one entry, and where it is written.

An audit row is metadata: who did what to whom and when. It never carries message content,
bearer tokens or invite secrets; the store refuses any event not named here.

The rows of call transitions and front-door tallies go through :class:`BatchingAuditSink`:
what is recorded within a short window (a few milliseconds, or a bounded number of rows) is
written by one ``record_many`` (one transaction), everything waiting is written when the relay
stops, and a batch the store refuses is kept and tried again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.errors import LoggedInAggregate
from agentcall.logevents import Logger

INVITE_ISSUE = "invite.issue"
INVITE_REDEEM = "invite.redeem"
INVITE_REVOKE = "invite.revoke"
MEMBER_REGISTER = "member.register"
# An admin (actor) removed a member (target): token dead, keys withdrawn, handle reserved.
MEMBER_REMOVE = "member.remove"
# An admin freed a removed member's handle; a later owner has new keys.
MEMBER_RELEASE = "member.release"
# An admin changed a member's role; detail "member->admin" or "admin->member".
MEMBER_ROLE = "member.role"
# The member replaced its bearer token; the old one no longer authenticates.
MEMBER_CREDENTIALS_ROTATED = "member.token_rotate"
# The member published a recovery key (`agentcall recovery issue`); an older one is retired.
RECOVERY_ISSUE = "recovery.issue"
# A recovery code moved the member to a new identity key (and a new token).
RECOVERY_REDEEM = "recovery.redeem"
# The member turned the offline mailbox on or off; detail "on" or "off".
MEMBER_OFFLINE_DELIVERY = "member.offline_delivery"
KEYS_IDENTITY_PUBLISH = "keys.identity.publish"
KEYS_ENCRYPTION_PUBLISH = "keys.encryption.publish"
CARD_PUBLISH = "card.publish"
CALL_SUBMIT = "call.submit"
CALL_ACCEPT = "call.accept"
CALL_COMPLETE = "call.complete"
CALL_FAIL = "call.fail"
CALL_CANCEL = "call.cancel"
CALL_TIMEOUT = "call.timeout"
# The offline mailbox (agentcall.relay.mailbox): one row per job transition; call_id is the job id.
JOB_QUEUE = "job.queue"
JOB_DELIVER = "job.deliver"
JOB_ACCEPT = "job.accept"
JOB_COMPLETE = "job.complete"
JOB_FAIL = "job.fail"
JOB_EXPIRE = "job.expire"
JOB_CANCEL = "job.cancel"
# One row per source address and minute with a count; target is the address, never a token.
AUTH_FAILED = "auth.failed"
# An admin exported the organisation's audit rows; detail names the window asked for.
AUDIT_EXPORT = "audit.export"
# An admin put a legal hold on the organisation (target None) or on one handle (target), or
# took one off; detail is the scope, "organisation" or "handle".
AUDIT_HOLD_SET = "audit.hold.set"
AUDIT_HOLD_CLEAR = "audit.hold.clear"
# Retention deleted old rows of the organisation (actor None); detail counts them and names
# the cutoff: "events=N invites=M before=T".
AUDIT_PRUNE = "audit.prune"
# A member (actor) asked the relay whether someone else (target: a handle of their own
# organisation, else the address asked about) is online, and was refused: presence is private.
PRESENCE_REFUSED = "presence.refused"

# The org column of rows about the relay as a whole (no organisation was proven).
RELAY_WIDE = ""

EVENTS = frozenset(
    {
        INVITE_ISSUE,
        INVITE_REDEEM,
        INVITE_REVOKE,
        MEMBER_REGISTER,
        MEMBER_REMOVE,
        MEMBER_RELEASE,
        MEMBER_ROLE,
        MEMBER_CREDENTIALS_ROTATED,
        MEMBER_OFFLINE_DELIVERY,
        RECOVERY_ISSUE,
        RECOVERY_REDEEM,
        KEYS_IDENTITY_PUBLISH,
        KEYS_ENCRYPTION_PUBLISH,
        CARD_PUBLISH,
        CALL_SUBMIT,
        CALL_ACCEPT,
        CALL_COMPLETE,
        CALL_FAIL,
        CALL_CANCEL,
        CALL_TIMEOUT,
        JOB_QUEUE,
        JOB_DELIVER,
        JOB_ACCEPT,
        JOB_COMPLETE,
        JOB_FAIL,
        JOB_EXPIRE,
        JOB_CANCEL,
        AUTH_FAILED,
        AUDIT_EXPORT,
        AUDIT_HOLD_SET,
        AUDIT_HOLD_CLEAR,
        AUDIT_PRUNE,
        PRESENCE_REFUSED,
    }
)


@attrs.frozen
class AuditEntry:
    """One audit row as a core writes it (the store adds its id)."""

    event: str
    org: str
    actor: str | None
    target: str | None
    call_id: str | None
    at: float
    detail: str | None = None


class AuditSink(Protocol):
    """Where the relay writes audit rows: metadata only, never message content.

    Writers fire and forget: they add an errback that logs, so a failed write is never
    unhandled and never stops what was being audited.
    """

    def record(self, entry: AuditEntry) -> Deferred[None]:
        """Append one row; its event is from :data:`EVENTS`."""
        ...


class AuditLog(Protocol):
    """Where batches of audit rows are written (part of the relay's store interface)."""

    def record_many(self, entries: Sequence[AuditEntry]) -> Deferred[None]:
        """Append every row, in order, in one transaction: all of them or none."""
        ...


class AuditDropped(LoggedInAggregate):
    """The row was never written: the database kept refusing and the backlog was full."""


class _Pending(Protocol):
    def active(self) -> bool: ...

    def cancel(self) -> None: ...


class _Clock(Protocol):
    """What the sink needs of an ``IReactorTime`` (the reactor, or ``Clock`` in tests)."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> _Pending: ...


_log = Logger(namespace="agentcall.relay.audit")


class BatchingAuditSink:
    """An :class:`AuditSink` that writes the rows of a short window with one store call.

    :meth:`record` queues the row; the first row of a batch asks the clock for a
    ``callLater(window_s)``, and every row recorded until then goes into the same
    ``record_many``. A batch that reaches ``max_rows`` is written at the next reactor turn
    instead. A window longer than zero also keeps the write out of the turn right after the
    frames it audits: the reactor sends them first, so the database is not on a call's path.
    The Deferred of :meth:`record` fires once the row is written; :meth:`flush` (the relay is
    stopping) writes what waits at once.

    A batch the store refuses is
    logged (``audit_batch_failed``) and put back in front of newer rows, to be tried again
    ``retry_s`` later; rows that arrive meanwhile wait for that retry rather than hammering a
    failing database. At most ``max_pending`` rows wait: past that the oldest are
    dropped, their Deferreds failing with :class:`AuditDropped` (``audit_dropped``, counted).
    One batch is in flight at a time, so rows reach the store in the order they were recorded.
    """

    def __init__(
        self,
        log: AuditLog,
        clock: _Clock,
        *,
        max_pending: int = limits.AUDIT_MAX_PENDING,
        retry_s: float = limits.AUDIT_RETRY_S,
        window_s: float = limits.AUDIT_WINDOW_S,
        max_rows: int = limits.AUDIT_BATCH_ROWS,
    ) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        if max_rows < 1 or window_s < 0:
            raise ValueError("max_rows must be at least 1 and window_s not negative")
        self._log = log
        self._clock = clock
        self._max_pending = max_pending
        self._retry_s = retry_s
        self._window_s = window_s
        self._max_rows = max_rows
        self._pending: list[tuple[AuditEntry, Deferred[None]]] = []
        self._due: _Pending | None = None
        # The armed write is for the next turn (a full batch), not the end of a window.
        self._due_now = False
        # Waiting out a refused batch's retry_s: no earlier write, however many rows come.
        self._retrying = False
        self._writing = False
        self.batches = 0  # store calls made (for tests and the bench)
        self.dropped = 0
        # Told of each refused batch (the relay's metrics count database errors).
        self.on_failure: Callable[[], None] | None = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def record(self, entry: AuditEntry) -> Deferred[None]:
        written: Deferred[None] = Deferred()
        self._pending.append((entry, written))
        self._trim()
        if len(self._pending) >= self._max_rows:
            self._arm_now()
        else:
            self._arm(self._window_s)
        return written

    def flush(self) -> None:
        """Write what is waiting now (the relay is stopping), unless a batch is in flight."""
        if self._due is not None and self._due.active():
            self._due.cancel()
        self._due = None
        self._due_now = self._retrying = False
        self._write()

    # --- internals ----------------------------------------------------------------------

    def _arm(self, delay: float) -> None:
        if self._writing or (self._due is not None and self._due.active()):
            return
        self._due = self._clock.callLater(delay, self._turn)
        self._due_now = delay == 0

    def _arm_now(self) -> None:
        """A full batch goes at the next turn, ahead of its window (not ahead of a retry)."""
        if self._writing or self._retrying or self._due_now:
            return
        if self._due is not None and self._due.active():
            self._due.cancel()
        self._due = None
        self._arm(0.0)

    def _turn(self) -> None:
        self._due = None
        self._due_now = False
        self._retrying = False
        self._write()

    def _write(self) -> None:
        if self._writing or not self._pending:
            return
        batch, self._pending = self._pending, []
        self._writing = True
        self.batches += 1
        written = defer.maybeDeferred(self._log.record_many, [entry for entry, _ in batch])
        written.addCallbacks(
            self._written, self._refused, callbackArgs=(batch,), errbackArgs=(batch,)
        )

    def _written(self, _result: object, batch: list[tuple[AuditEntry, Deferred[None]]]) -> None:
        self._writing = False
        for _entry, done in batch:
            done.callback(None)
        if self._pending:
            # What came while the batch was in flight: a full batch now, else its window.
            if len(self._pending) >= self._max_rows:
                self._arm(0.0)
            else:
                self._arm(self._window_s)

    def _refused(self, failure: Failure, batch: list[tuple[AuditEntry, Deferred[None]]]) -> None:
        self._writing = False
        # Kept, in front of what came since: a busy database is no reason to forget.
        self._pending = batch + self._pending
        if self.on_failure is not None:
            self.on_failure()
        _log.failure(
            "audit_batch_failed",
            failure=failure,
            rows=len(batch),
            waiting=len(self._pending),
            retry_in_s=self._retry_s,
        )
        self._trim()
        self._retrying = True
        self._arm(self._retry_s)

    def _trim(self) -> None:
        excess = len(self._pending) - self._max_pending
        if excess <= 0:
            return
        dropped, self._pending = self._pending[:excess], self._pending[excess:]
        self.dropped += excess
        _log.warn("audit_dropped", rows=excess, dropped_total=self.dropped)
        for entry, done in dropped:
            done.errback(Failure(AuditDropped(f"{entry.event} row dropped: backlog full")))
