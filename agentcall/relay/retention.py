"""Retention: audit rows and ended invites older than the retention period are deleted, except
what a legal hold covers.

The decision is pure: :func:`keeps_event` and :func:`keeps_invite` say, for a ``cutoff`` that
:meth:`RetentionPolicy.cutoff` derives from ``now``, whether a row stays. The store says the
same in SQL (``SqliteRegistry.prune_audit``, ``purge_invites``), reading the holds inside each
delete's transaction, so a hold set while a pass runs protects what is still there; a test holds
the SQL and these functions together on a real SQLite file.

:class:`Retention` runs one pass over every organisation: deletes in batches of
``limits.RETENTION_BATCH_ROWS`` (one transaction each) with a reactor turn between them, so a
year of rows going at once never stalls the relay, then writes one ``audit.prune`` row per
organisation that lost any. The relay's tap runs a pass at start and then daily.

A hold on the organisation keeps all of its rows and invites; a hold on a handle keeps the rows
naming it as actor or target and the invites it created or redeemed. Relay-wide rows
(``auth.failed``, org ``audit.RELAY_WIDE``) belong to no organisation and no hold covers them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

import attrs
from twisted.internet import task
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.logevents import Logger
from agentcall.relay import audit
from agentcall.relay.audit import AuditEntry
from agentcall.relay.store_interface import AuditRow

DAY_S = 86_400.0

_log = Logger(namespace="agentcall.relay.retention")


@attrs.frozen
class HoldKey:
    """What a legal hold covers: the whole organisation (``handle`` None) or one handle."""

    org: str
    handle: str | None = None


@attrs.frozen
class RetentionPolicy:
    """Keep rows for ``days`` days (the relay option ``--audit-retention-days``)."""

    days: int = attrs.field(default=limits.AUDIT_RETENTION_DAYS)

    @days.validator
    def _check(self, _attribute: object, value: int) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 1 <= value <= limits.AUDIT_RETENTION_MAX_DAYS
        ):
            raise ValueError(f"retention must be 1..{limits.AUDIT_RETENTION_MAX_DAYS} days")

    def cutoff(self, now: float) -> float:
        """Rows from before this time are old enough to go."""
        return now - self.days * DAY_S


def _held(org: str, handles: Collection[str | None], holds: Collection[HoldKey]) -> bool:
    if HoldKey(org) in holds:
        return True
    return any(handle is not None and HoldKey(org, handle) in holds for handle in handles)


def keeps_event(row: AuditRow, cutoff: float, holds: Collection[HoldKey]) -> bool:
    """True when retention keeps ``row``: it is from ``cutoff`` or later, or a hold on its
    organisation, its actor or its target stands."""
    return row.at >= cutoff or _held(row.org, (row.actor, row.target), holds)


@attrs.frozen
class EndedInvite:
    """What retention looks at of an invite: when it ended (used, revoked, else expiry) and
    who created and who redeemed it."""

    org: str
    ended_at: float
    created_by: str | None
    used_by: str | None


def keeps_invite(invite: EndedInvite, cutoff: float, holds: Collection[HoldKey]) -> bool:
    """True when retention keeps the invite: it ended at ``cutoff`` or later (an active one
    has not ended), or a hold on its organisation, its creator or its redeemer stands."""
    return invite.ended_at >= cutoff or _held(
        invite.org, (invite.created_by, invite.used_by), holds
    )


@attrs.frozen
class PruneReport:
    """What one pass deleted, per organisation (only those that lost something)."""

    cutoff: float
    events: Mapping[str, int]
    invites: Mapping[str, int]


class RetentionStore(Protocol):
    """What a pass needs of the store (part of ``AuditArchive`` and ``AuditSink``)."""

    def retention_orgs(self) -> Deferred[list[str]]: ...

    def prune_audit(self, org: str, before: float, limit: int) -> Deferred[int]: ...

    def purge_invites(self, org: str, before: float) -> Deferred[int]: ...

    def record(self, entry: AuditEntry) -> Deferred[None]: ...


class Retention:
    """Runs retention passes over ``store``, reading ``now`` from ``clock``."""

    def __init__(
        self,
        store: RetentionStore,
        clock: IReactorTime,
        policy: RetentionPolicy,
        *,
        batch: int = limits.RETENTION_BATCH_ROWS,
    ) -> None:
        if not 1 <= batch <= limits.RETENTION_BATCH_ROWS:
            raise ValueError(f"batch must be 1..{limits.RETENTION_BATCH_ROWS}")
        self._store = store
        self._clock = clock
        self.policy = policy
        self._batch = batch
        self._waiting: list[Deferred[PruneReport]] = []
        self.passes = 0

    def run(self) -> Deferred[PruneReport]:
        """One pass; asked while one runs, the answer is that pass's (no second one starts)."""
        mine: Deferred[PruneReport] = Deferred()
        self._waiting.append(mine)
        if len(self._waiting) == 1:
            Deferred.fromCoroutine(self._pass()).addBoth(self._finished)
        return mine

    def run_logged(self) -> Deferred[None]:
        """:meth:`run` for a timer: a failure is logged, never raised (a failing call would
        stop a ``TimerService`` for good). Fires once the pass is over, so passes never overlap."""
        finished: Deferred[None] = self.run().addCallbacks(
            self._report, lambda failure: _log.failure("retention_failed", failure=failure)
        )
        return finished

    def _finished(self, result: PruneReport | Failure) -> None:
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(result)

    def _report(self, report: PruneReport) -> None:
        _log.info(
            "retention_pruned",
            days=self.policy.days,
            before=int(report.cutoff),
            events=sum(report.events.values()),
            invites=sum(report.invites.values()),
            orgs=len(set(report.events) | set(report.invites)),
        )

    async def _pass(self) -> PruneReport:
        self.passes += 1
        now = self._clock.seconds()
        cutoff = self.policy.cutoff(now)
        events: dict[str, int] = {}
        invites: dict[str, int] = {}
        for org in await self._store.retention_orgs():
            deleted = 0
            while True:
                got = await self._store.prune_audit(org, cutoff, self._batch)
                deleted += got
                if got < self._batch:
                    break
                # Let the reactor serve others between two transactions of deletes.
                await task.deferLater(self._clock, 0, lambda: None)
            purged = 0 if org == audit.RELAY_WIDE else await self._store.purge_invites(org, cutoff)
            if deleted:
                events[org] = deleted
            if purged:
                invites[org] = purged
            if org != audit.RELAY_WIDE and (deleted or purged):
                await self._store.record(
                    AuditEntry(
                        event=audit.AUDIT_PRUNE,
                        org=org,
                        actor=None,
                        target=None,
                        call_id=None,
                        at=now,
                        detail=f"events={deleted} invites={purged} before={int(cutoff)}",
                    )
                )
        return PruneReport(cutoff=cutoff, events=events, invites=invites)
