"""The offline mailbox's desk: the Twisted glue between sockets, the store and the pure core.

Every decision is made by :mod:`agentcall.relay.mailbox` inside one store transaction
(:meth:`~agentcall.relay.store_interface.JobStore.decide_jobs`); the desk only acts on what was
committed: it tells a caller ``call_queued`` after the job is stored, hands a job to an idle
mailbox-capable listener (``job_delivery``), acknowledges a listener's result after it is stored
(``job_ack``), tells a listener to drop a job (``cancel_job``), runs the sweep on a timer armed
at the store's next deadline, and releases long-polls when a job ends.

The store is the truth, so several relays may share it: the desk keeps in memory only what
belongs to this process (which listener sockets said ``mailbox=1``, which of them it handed
a lease, what each said it holds, the sweep timer, the waiting HTTP requests). A job ended by
another relay wakes no waiter here; the waiter's own timeout answers it, and the client asks
again.

A mailbox listener's first frame, ``jobs_held``, lists every job it holds (running there, or
its result unacknowledged). Every other lease of that callee's ends at once, as if it had
lapsed (:func:`~agentcall.relay.mailbox.reconcile`), unless this process handed it to a
session of theirs that is still open (a session being replaced may be accepting it this very
moment; only it can say): those are judged when that session is gone. So a relay restart's
grace holds back only the leases of listeners that have not come back, and a lease held for a
listener that died never keeps its callee's next job from the listener that replaced it. A
listener that predates ``jobs_held`` sends none: its leases lapse as before. With several
relays, a session open on another relay is not seen here; two installations of one identity
listening through two relays at once could then have a delivery reclaimed from one and given
to the other (the single-relay replacement above prevents this).

With several relays, nothing tells one relay what happened on another. A job queued through
relay A for a callee whose listener is attached to relay B is delivered by B only when
something happens on B: the listener (re)attaches there, or the callee's state changes there
(a job of theirs ends, is declined or lapses in B's sweep, a live call to them ends on B). Until
then it waits in the store, even though that listener is idle. Waking the other relays (a
PostgreSQL ``LISTEN``/``NOTIFY`` on enqueue, say) is future work.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet import defer
from twisted.python.failure import Failure

from agentcall import ids, limits
from agentcall.errors import ApiError, ApiErrorCode, CallErrorCode, MalformedFrame, StorageFault
from agentcall.logevents import Logger
from agentcall.relay import api_rules, mailbox
from agentcall.relay.callerkeys import attachable_keys
from agentcall.relay.calls import Pending, Timer, route_problem
from agentcall.relay.mailbox import (
    Decision,
    DropCiphertext,
    DropRequest,
    MailboxLimits,
    Refusal,
    Refused,
    TellListenerCancel,
)
from agentcall.relay.metrics import NO_METRICS, RelayEvents
from agentcall.relay.store_interface import (
    JobsDue,
    JobsHeld,
    JobsOf,
    JobStore,
    KeySource,
    MailboxStatus,
    Member,
    OneJob,
    SealedBytes,
    StoredJob,
)
from agentcall.relay.switchboard import Channel, Switchboard
from agentcall.wire import codec
from agentcall.wire import frames as fr
from agentcall.wire.http import JobInfo
from agentcall.wire.keyrecords import KeysResponse

_log = Logger(namespace="agentcall.relay.jobs")

# After a sweep the store could not run, try again this much later (a periodic job never dies).
SWEEP_RETRY_S = 60.0
# A listener that declined a delivery is busy with something this relay does not see (a call
# through another relay, an agent still running after its call timed out) or is stopping: offer
# it nothing for this long, unless it is seen to become free sooner (its live call ends here, or
# it reconnects). Without the pause a busy listener would be offered the queue in a tight loop.
DECLINE_REST_S = limits.MAILBOX_LEASE_S

_ERRORS = {
    fr.JobError.INDETERMINATE_EXECUTION: mailbox.FailureReason.INDETERMINATE_EXECUTION,
    fr.JobError.REJECTED: mailbox.FailureReason.REJECTED,
}
# Refusals after which a listener still holding the job should stop working on it. Not LAPSED:
# the relay failed that run only because its lease lapsed, and still takes its result.
_OVER = frozenset({Refusal.ENDED, Refusal.EXPIRED})


def queue_refusal(reason: Refusal, caps: MailboxLimits) -> str:
    """What a caller is told when its call cannot be queued (``call_error busy``)."""
    if reason is Refusal.BUSY:
        return (
            f"you have {caps.max_outstanding_per_caller} calls waiting in mailboxes; "
            "cancel one or wait for an answer"
        )
    if reason is Refusal.CALLEE_QUEUE_FULL:
        return f"that handle's mailbox is full ({caps.max_queued_per_callee} calls waiting)"
    if reason is Refusal.CALLEE_BYTES_FULL:
        return (
            "that handle's mailbox is full (its waiting calls and the answers it holds use all "
            "the space it may have); try again later"
        )
    if reason is Refusal.RELAY_BYTES_FULL:
        return (
            "the relay's mailbox storage is full (calls waiting for everyone use all the space "
            "it keeps for them); try again later"
        )
    if reason is Refusal.TOO_LARGE:
        return "the request is larger than that handle's mailbox can hold"
    return "the call could not be queued; try again"


def _listed(result: Decision | Refused | None) -> list[Decision] | Refused:
    if result is None:
        return []
    return result if isinstance(result, Refused) else [result]


class JobDesk:
    """The offline mailbox of one relay process, over the shared store."""

    def __init__(
        self,
        clock: Timer,
        store: JobStore,
        switchboard: Switchboard,
        relay_origin: str,
        caps: MailboxLimits | None = None,
        *,
        live_call_to: Callable[[str, str], bool] = lambda _org, _handle: False,
        mint_job_id: Callable[[], str] = ids.mint_job_id,
        keys: KeySource | None = None,
        metrics: RelayEvents = NO_METRICS,
    ) -> None:
        self._clock = clock
        self._store = store
        self._switchboard = switchboard
        self._origin = relay_origin
        self.caps = caps or MailboxLimits()
        self._live_call_to = live_call_to
        self._mint_job_id = mint_job_id
        # Where the caller's records come from, to attach to job_delivery (None: not attached).
        self._keys = keys
        self._metrics = metrics
        # Listener sockets of this process that said mailbox=1, by identity.
        self._mailbox_listeners: dict[tuple[str, str], Channel] = {}
        # Leases this process handed to mailbox sessions still open, by identity: job id to the
        # session sent it. Only that session can say it does not hold the job (a replaced one
        # may be accepting it right now), so another session's jobs_held never ends them.
        self._handed: dict[tuple[str, str], dict[str, Channel]] = {}
        # What the current mailbox session of each identity said it holds (jobs_held), kept to
        # reconcile again once a session it replaced is gone.
        self._held: dict[tuple[str, str], frozenset[str]] = {}
        # Deliveries being decided or sent, by callee, and the reconciles waiting for them.
        self._delivering: dict[tuple[str, str], int] = {}
        self._reconcile_due: set[tuple[str, str]] = set()
        self._waiters: dict[str, list[defer.Deferred[None]]] = {}
        self._sweep: Pending | None = None
        self._sweep_at: float | None = None
        # Callees whose listener declined a delivery, with the timer that ends their rest.
        self._resting: dict[tuple[str, str], Pending] = {}
        # No sweep is armed before the restart grace is committed (see start).
        self._graced = False
        self._grace_retry: Pending | None = None
        # Between a storage fault and the probe write that ends it: no sweep is armed.
        self._storage_failing = False

    def start(self) -> defer.Deferred[None]:
        """Give every held lease the restart grace, then arm the sweep from the store (jobs
        outlive the process).

        The sweep stays unarmed until the grace is committed: leases that lapsed while the
        relay was down would otherwise fail running jobs before their listeners could
        reconnect. If the store cannot take the grace now it is tried again later; meanwhile no
        lease lapses, the safe side for jobs that run at most once. With several relays over
        one store, a restart also lengthens leases held through the others, by at most the
        grace: a lapse is noticed that much later, nothing more."""
        now = self._clock.seconds()
        self._grace_retry = None

        def decide(jobs: mailbox.Jobs) -> list[Decision]:
            return mailbox.restart_grace(jobs, now)

        def graced(result: list[Decision] | Refused) -> defer.Deferred[None]:
            if not isinstance(result, Refused) and result:
                _log.info("job_leases_graced", jobs=len(result))
            self._graced = True
            self._report_held()
            return self._rearm()

        def failed(failure: Failure) -> None:
            _log.failure("job_restart_grace_failed", failure=failure)
            self._grace_retry = self._clock.callLater(SWEEP_RETRY_S, self.start)

        decided = self._store.decide_jobs(JobsHeld(), decide, actor=None, at=now)
        return decided.addCallbacks(graced, failed)

    def storage_failing(self) -> None:
        """The storage stopped taking writes: no sweep until it recovers.

        No renewal can be stored meanwhile, so a sweep that ran the moment space returned
        would lapse the leases of listeners that renewed all along; :meth:`storage_recovered`
        gives them their grace first, then arms the sweep again."""
        self._storage_failing = True
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()
        self._sweep = self._sweep_at = None

    def storage_recovered(self) -> None:
        """The storage takes writes again after failing: carry on with what it refused.

        While it failed, no renewal could be stored, so every held lease gets ``lease_s`` from
        now (as a restart gives its grace) before the sweep runs again; each listener that is
        attached here and may be idle is offered its next job (a delivery that failed is not
        retried otherwise while the listener stays connected)."""
        self._storage_failing = False
        if not self._graced:
            # The start-up grace failed with the storage: it is given now, in full.
            if self._grace_retry is not None and self._grace_retry.active():
                self._grace_retry.cancel()
            self.start().addCallback(lambda _: self._kick_attached())
            return
        now = self._clock.seconds()
        lease_s = self.caps.lease_s

        def decide(jobs: mailbox.Jobs) -> list[Decision]:
            return mailbox.restart_grace(jobs, now, lease_s)

        def graced(result: list[Decision] | Refused) -> None:
            if not isinstance(result, Refused) and result:
                _log.info("job_leases_graced", jobs=len(result), why="storage_recovered")
            self._report_held()
            self._rearm()
            self._kick_attached()

        decided = self._store.decide_jobs(JobsHeld(), decide, actor=None, at=now)
        decided.addCallbacks(graced, self._failed, errbackArgs=("job_recovery_failed", None))

    def _kick_attached(self) -> None:
        for org, handle in sorted(self._mailbox_listeners):
            # A reconciliation the failing store could not take is taken now; the core hands
            # out one lease per callee at a time, so the two never deliver twice.
            self._reconcile(org, handle)
            self._kick(org, handle)

    def stop(self) -> None:
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()
        self._sweep = self._sweep_at = None
        if self._grace_retry is not None and self._grace_retry.active():
            self._grace_retry.cancel()
        self._grace_retry = None
        for key in list(self._resting):
            self._stop_resting(*key)

    # --- the caller's side (CallBook) ------------------------------------------------------

    def status(self, org: str, callee: str) -> defer.Deferred[MailboxStatus | None]:
        return self._store.mailbox_status(org, callee)

    def enqueue(
        self, org: str, caller: str, callee: str, request: fr.CallRequest
    ) -> defer.Deferred[fr.CallQueued | fr.CallError]:
        """Store the request as a job; ``call_queued`` once committed, or ``call_error busy``
        (every cap a queued call meets, the relay-wide one included, refuses it as ``busy``:
        the code a client already knows to try again later on, and the detail says which)."""
        now = self._clock.seconds()
        job_id = self._mint_job_id()
        sealed = codec.encode(request.envelope)
        caps = self.caps

        def decide_with(held_total: int) -> defer.Deferred[list[Decision] | Refused]:
            self._metrics.mailbox_held(held_total)

            def decide(jobs: mailbox.Jobs) -> list[Decision] | Refused:
                return _listed(
                    mailbox.enqueue(
                        jobs,
                        caps,
                        job_id=job_id,
                        org=org,
                        caller=caller,
                        callee=callee,
                        request_bytes=len(sealed),
                        now=now,
                        held_total=held_total,
                    )
                )

            return self._store.decide_jobs(
                JobsOf(org, (caller, callee)),
                decide,
                actor=caller,
                at=now,
                sealed=SealedBytes(job_id, request=sealed),
            )

        def stored(result: list[Decision] | Refused) -> fr.CallQueued | fr.CallError:
            if isinstance(result, Refused):
                _log.info("job_refused", org=org, caller=caller, reason=str(result.reason))
                self._metrics.job_refused(str(result.reason))
                detail = queue_refusal(result.reason, caps)
                return fr.CallError(code=CallErrorCode.BUSY, detail=detail)
            self._after(result)
            self._report_held()
            (decision,) = result
            expires_at = decision.job.expires_at if decision.job is not None else now
            _log.info("job_queued", job_id=job_id, org=org, caller=caller, callee=callee)
            return fr.CallQueued(job_id=job_id, expires_at=int(expires_at))

        return self._store.mailbox_bytes_held().addCallback(decide_with).addCallback(stored)

    def live_call_ended(self, org: str, callee: str) -> None:
        """The last live call to ``callee`` on this relay ended: they may be free for a job."""
        self._stop_resting(org, callee)
        self._kick(org, callee)

    # --- the callee's listener ---------------------------------------------------------------

    def listener_attached(self, org: str, handle: str, channel: Channel, *, mailbox: bool) -> None:
        # A new session has said nothing yet about what it holds.
        self._held.pop((org, handle), None)
        if not mailbox:
            self._mailbox_listeners.pop((org, handle), None)
            return
        self._mailbox_listeners[(org, handle)] = channel
        self._stop_resting(org, handle)
        self._kick(org, handle)

    def listener_gone(self, org: str, handle: str, channel: Channel) -> None:
        # What it held stays out until its lease lapses (a reconnected session may still finish
        # it), or until the identity's current session says it does not hold it.
        key = (org, handle)
        if self._mailbox_listeners.get(key) is channel:
            del self._mailbox_listeners[key]
            self._held.pop(key, None)
        handed = self._handed.get(key, {})
        released = [job_id for job_id, to in handed.items() if to is channel]
        for job_id in released:
            del handed[job_id]
        if not handed:
            self._handed.pop(key, None)
        if released and key in self._held:
            # A session the current one replaced is gone: its leases are judged now.
            self._reconcile(org, handle)

    def from_listener(
        self, org: str, handle: str, channel: Channel, frame: fr.Frame
    ) -> defer.Deferred[None]:
        """A job frame from the listener session of ``@org/handle`` (about its own jobs only)."""
        now = self._clock.seconds()
        by = (org, handle)
        caps = self.caps
        if isinstance(frame, fr.JobResult):
            return self._result(org, handle, channel, frame, now)
        if isinstance(frame, fr.JobsHeld):
            return self._jobs_held(org, handle, channel, frame)
        choose: Callable[[mailbox.Jobs], Decision | Refused | None]
        if isinstance(frame, fr.JobAccepted):
            choose = lambda jobs: mailbox.accept(jobs, caps, frame.job_id, by, now)  # noqa: E731
        elif isinstance(frame, fr.JobDeclined):
            choose = lambda jobs: mailbox.decline(jobs, caps, frame.job_id, by, now)  # noqa: E731
        elif isinstance(frame, fr.JobRenew):
            choose = lambda jobs: mailbox.renew(jobs, caps, frame.job_id, by, now)  # noqa: E731
        else:
            _log.info("listener_job_frame_ignored", org=org, handle=handle, frame_type=frame.type)
            return defer.succeed(None)
        job_id = frame.job_id

        def done(result: list[Decision] | Refused) -> None:
            if isinstance(result, Refused):
                _log.info("job_frame_refused", job_id=job_id, org=org, reason=str(result.reason))
                if result.reason in _OVER:
                    channel.send(fr.CancelJob(job_id=job_id))
                return
            if isinstance(frame, fr.JobDeclined):
                self._rest(org, handle)
            for decision in result:
                if decision.job is not None and decision.job.state in mailbox.HOLDING_LEASE:
                    # Taken on this session (a late accept, a renew of a job the relay had put
                    # back): a reconciliation against an older jobs_held must not reclaim it.
                    self._hand(by, decision.job_id, channel)
            self._after(result)
            if any(d.job is not None and d.job.cancel_requested for d in result):
                # The listener may have missed the first cancel_job (it was offline then).
                channel.send(fr.CancelJob(job_id=job_id))

        decided = self._store.decide_jobs(
            OneJob(job_id), lambda jobs: _listed(choose(jobs)), actor=handle, at=now
        )
        return decided.addCallback(done).addErrback(self._failed, "job_frame_failed", job_id)

    def _jobs_held(
        self, org: str, handle: str, channel: Channel, frame: fr.JobsHeld
    ) -> defer.Deferred[None]:
        key = (org, handle)
        if self._mailbox_listeners.get(key) is not channel:
            # Not (or no longer) the identity's mailbox session: it speaks for nothing here.
            _log.info("jobs_held_ignored", org=org, handle=handle)
            return defer.succeed(None)
        self._held[key] = frozenset(frame.job_ids)
        return self._reconcile(org, handle)

    def _reconcile(self, org: str, handle: str) -> defer.Deferred[None]:
        """End each lease of ``@org/handle`` that their current session does not hold and that
        was not handed to a session of theirs still open here (:func:`mailbox.reconcile`)."""
        key = (org, handle)
        held = self._held.get(key)
        if held is None:
            return defer.succeed(None)
        if self._delivering.get(key):
            # A lease being handed out now is not yet noted as handed: wait for it.
            self._reconcile_due.add(key)
            return defer.succeed(None)
        # Taken now: the decision may run in a database thread, reading only what it closes over.
        holding = held | frozenset(self._handed.get(key, {}))
        now = self._clock.seconds()
        caps = self.caps

        def decide(jobs: mailbox.Jobs) -> list[Decision]:
            return mailbox.reconcile(jobs, caps, key, holding, now)

        def done(result: list[Decision] | Refused) -> None:
            if isinstance(result, Refused):  # pragma: no cover - reconcile never refuses
                return
            if result:
                _log.info("job_leases_reclaimed", org=org, handle=handle, jobs=len(result))
            self._after(result)

        decided = self._store.decide_jobs(JobsOf(org, (handle,)), decide, actor=handle, at=now)
        return decided.addCallback(done).addErrback(self._failed, "job_reconcile_failed", None)

    def _result(
        self, org: str, handle: str, channel: Channel, frame: fr.JobResult, now: float
    ) -> defer.Deferred[None]:
        by = (org, handle)
        job_id = frame.job_id
        envelope = frame.envelope
        answer = None if envelope is None else codec.encode(envelope)
        origin = self._origin

        def decide(jobs: mailbox.Jobs) -> list[Decision] | Refused:
            if frame.error is fr.JobError.CANCELED:
                return _listed(mailbox.cancel_done(jobs, job_id, by, now))
            if frame.error is not None:
                return _listed(mailbox.fail(jobs, job_id, by, _ERRORS[frame.error], now))
            if envelope is None or answer is None:  # pragma: no cover - JobResult guarantees it
                return Refused(Refusal.WRONG_STATE)
            job = jobs.get(job_id)
            if job is not None:
                # Checked like a live call's outcome, against the job's own caller.
                problem = route_problem(
                    envelope,
                    fr.Direction.RESPONSE,
                    origin=origin,
                    org=job.org,
                    sender=job.callee,
                    to=job.caller,
                )
                if problem is not None:
                    reason = mailbox.FailureReason.REJECTED
                    return _listed(mailbox.fail(jobs, job_id, by, reason, now))
            return _listed(mailbox.answer(jobs, job_id, by, len(answer), now))

        sealed = None
        if answer is not None and frame.terminal is not None:
            sealed = SealedBytes(job_id, answer=answer, terminal=frame.terminal)

        def done(result: list[Decision] | Refused) -> None:
            if isinstance(result, Refused):
                # Acknowledged all the same: nobody needs it any more, so it stops coming.
                _log.info("job_result_dropped", job_id=job_id, org=org, reason=str(result.reason))
            else:
                for decision in result:
                    state = decision.job.state if decision.job is not None else None
                    _log.info("job_result_stored", job_id=job_id, org=org, state=str(state))
                self._after(result)
            channel.send(fr.JobAck(job_id=job_id))

        def unstored(failure: Failure) -> None:
            # Not stored, so not acknowledged. A storage fault passes: the listener keeps the
            # lease and tries again on this connection (one that predates job_nack ignores it
            # and sends the result again on its next connection). Anything else is a bug that
            # a retry every 30 s would only repeat: the result comes again on a new connection.
            self._failed(failure, "job_result_failed", job_id)
            fault = failure.value
            if isinstance(fault, StorageFault):
                channel.send(fr.JobNack(job_id=job_id, code=fault.code))

        decided = self._store.decide_jobs(
            OneJob(job_id), decide, actor=handle, at=now, sealed=sealed
        )
        return decided.addCallbacks(done, unstored)

    # --- the caller over HTTP -----------------------------------------------------------------

    def cancel(self, member: Member, job_id: str) -> defer.Deferred[JobInfo]:
        """The caller cancels its job; 404 for a job that is not theirs, 409 once it ended."""
        now = self._clock.seconds()
        by = (member.org, member.handle)

        def decide(jobs: mailbox.Jobs) -> list[Decision] | Refused:
            return _listed(mailbox.cancel(jobs, job_id, by, now))

        def done(result: list[Decision] | Refused) -> defer.Deferred[JobInfo]:
            if isinstance(result, Refused):
                if result.reason is Refusal.UNKNOWN_JOB:
                    raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such job")
                if result.reason in _OVER:
                    raise ApiError(409, ApiErrorCode.JOB_ENDED, "the job has already ended")
                # CANCEL_PENDING: cancelling twice is harmless; the job is shown as it is.
            else:
                _log.info("job_cancel", job_id=job_id, org=member.org)
                self._after(result)
            return self.job_for(member, job_id, 0)

        scope = OneJob(job_id)
        return self._store.decide_jobs(scope, decide, actor=member.handle, at=now).addCallback(done)

    def revoke(self, org: str, handle: str, *, actor: str) -> defer.Deferred[int]:
        """``@org/handle`` was removed: every outstanding job they sent or would answer ends
        failed ``revoked`` (callers waiting on one are woken); how many ended."""
        now = self._clock.seconds()
        member = (org, handle)
        self._mailbox_listeners.pop(member, None)
        self._held.pop(member, None)

        def decide(jobs: mailbox.Jobs) -> list[Decision]:
            return mailbox.revoke(jobs, member, now)

        def done(result: list[Decision] | Refused) -> int:
            if isinstance(result, Refused):  # pragma: no cover - revoke never refuses
                return 0
            if result:
                _log.info("jobs_revoked", org=org, handle=handle, jobs=len(result))
            self._after(result)
            return len(result)

        scope = JobsOf(org, (handle,))
        return self._store.decide_jobs(scope, decide, actor=actor, at=now).addCallback(done)

    def job_for(self, member: Member, job_id: str, wait_s: int) -> defer.Deferred[JobInfo]:
        """The job as ``member`` may see it; with ``wait_s``, once it has ended or the time is
        up. Cancelling the returned Deferred (the HTTP client went away) releases the wait."""

        def seen(stored: StoredJob | None) -> JobInfo | defer.Deferred[JobInfo]:
            info = api_rules.job_info(stored, member)
            if wait_s <= 0 or info.state not in _WAITING:
                return info
            return self._wait(job_id, wait_s).addCallback(lambda _: self.job_for(member, job_id, 0))

        return self._store.get_job(job_id).addCallback(seen)

    def _wait(self, job_id: str, wait_s: float) -> defer.Deferred[None]:
        timer: list[Pending] = []

        def forget(waiter: defer.Deferred[None]) -> None:
            waiting = self._waiters.get(job_id, [])
            if waiter in waiting:
                waiting.remove(waiter)
            if not waiting:
                self._waiters.pop(job_id, None)
            if timer and timer[0].active():
                timer[0].cancel()

        waiter: defer.Deferred[None] = defer.Deferred(canceller=forget)

        def time_up() -> None:
            forget(waiter)
            waiter.callback(None)

        timer.append(self._clock.callLater(wait_s, time_up))
        waiter.addBoth(_passing(lambda: forget(waiter)))
        self._waiters.setdefault(job_id, []).append(waiter)
        return waiter

    def waiting(self) -> int:
        """How many long-polls are held (for tests and the operator's view)."""
        return sum(len(w) for w in self._waiters.values())

    # --- after a commit ---------------------------------------------------------------------

    def _after(self, decisions: list[Decision]) -> None:
        """Carry out what the store has committed: tell listeners, wake long-polls, deliver the
        next job to whoever may now be free, and re-arm the sweep."""
        free: set[tuple[str, str]] = set()
        dropped = False
        for decision in decisions:
            for effect in decision.effects:
                dropped = dropped or isinstance(effect, DropRequest | DropCiphertext)
                if isinstance(effect, TellListenerCancel):
                    listener = self._switchboard.listener_for(effect.org, effect.callee)
                    if listener is not None:
                        listener.send(fr.CancelJob(job_id=effect.job_id))
            job = decision.job
            if job is None or job.state in mailbox.TERMINAL:
                self._wake(decision.job_id)
            if job is not None and job.state not in mailbox.HOLDING_LEASE:
                free.add(job.callee_member)
                self._hand(job.callee_member, job.job_id, None)
        for org, callee in sorted(free):
            self._kick(org, callee)
        if dropped:
            # Sealed bytes were dropped (or an answer replaced its request): the total moved.
            self._report_held()
        self._rearm()

    def _report_held(self) -> None:
        """Tell the metrics what the mailbox now holds in all (a store failure is logged)."""
        asked = self._store.mailbox_bytes_held().addCallback(self._metrics.mailbox_held)
        asked.addErrback(self._failed, "job_bytes_held_failed", None)

    def _wake(self, job_id: str) -> None:
        for waiter in list(self._waiters.pop(job_id, [])):
            waiter.callback(None)

    def _rest(self, org: str, callee: str) -> None:
        self._stop_resting(org, callee)
        self._resting[(org, callee)] = self._clock.callLater(
            DECLINE_REST_S, self._rested, org, callee
        )

    def _rested(self, org: str, callee: str) -> None:
        self._resting.pop((org, callee), None)
        self._kick(org, callee)

    def _stop_resting(self, org: str, callee: str) -> None:
        timer = self._resting.pop((org, callee), None)
        if timer is not None and timer.active():
            timer.cancel()

    def _hand(self, key: tuple[str, str], job_id: str, channel: Channel | None) -> None:
        """Note that ``channel`` was handed the lease of ``job_id`` (None: nobody holds it)."""
        handed = self._handed.setdefault(key, {})
        if channel is None:
            handed.pop(job_id, None)
        else:
            handed[job_id] = channel
        if not handed:
            del self._handed[key]

    def _kick(self, org: str, callee: str) -> None:
        """Hand the callee's next job to their listener if it takes jobs, is idle, and has not
        just declined one."""
        channel = self._mailbox_listeners.get((org, callee))
        if channel is None or self._switchboard.listener_for(org, callee) is not channel:
            return
        if (org, callee) in self._resting:
            return
        if self._live_call_to(org, callee):
            return
        now = self._clock.seconds()
        caps = self.caps

        def decide(jobs: mailbox.Jobs) -> list[Decision] | Refused:
            return _listed(mailbox.next_delivery(jobs, caps, org, callee, now))

        key = (org, callee)
        self._delivering[key] = self._delivering.get(key, 0) + 1
        decided = self._store.decide_jobs(JobsOf(org, (callee,)), decide, actor=None, at=now)
        decided.addCallback(self._deliver, org, callee)
        decided.addErrback(self._failed, "job_delivery_failed", None)
        decided.addBoth(self._delivered, key)

    def _delivered(self, _: object, key: tuple[str, str]) -> None:
        """A delivery was decided and sent (or not): a reconcile it held back may run now."""
        left = self._delivering.pop(key, 1) - 1
        if left:
            self._delivering[key] = left
        elif key in self._reconcile_due:
            self._reconcile_due.discard(key)
            self._reconcile(*key)

    def _deliver(
        self, result: list[Decision] | Refused, org: str, callee: str
    ) -> defer.Deferred[None] | None:
        if isinstance(result, Refused) or not result:
            return None
        (decision,) = result
        self._rearm()
        key = (org, callee)
        self._hand(key, decision.job_id, self._mailbox_listeners.get(key))

        def with_keys(
            stored: StoredJob | None,
        ) -> defer.Deferred[tuple[StoredJob | None, KeysResponse | None]]:
            # The caller's records as they are now, not when the job was queued: the caller
            # may have rotated since, and the answer is sealed to its newest epoch.
            if stored is None:
                return defer.succeed((None, None))
            found = attachable_keys(self._keys, org, stored.job.caller)
            return found.addCallback(lambda keys: (stored, keys))

        def send(found: tuple[StoredJob | None, KeysResponse | None]) -> None:
            stored, caller_keys = found
            channel = self._mailbox_listeners.get((org, callee))
            if stored is None or stored.request is None or channel is None:
                # Gone meanwhile (cancelled, or the listener left): the lease takes it back.
                return
            job = stored.job
            self._hand(key, job.job_id, channel)
            try:
                envelope = codec.decode(
                    stored.request, fr.SealedEnvelope, max_bytes=len(stored.request)
                )
            except MalformedFrame:
                _log.error("job_request_unreadable", job_id=job.job_id, org=org)
                return
            _log.info("job_delivered", job_id=job.job_id, org=org, attempt=job.attempts)
            channel.send(
                fr.JobDelivery(
                    job_id=job.job_id,
                    from_=job.caller,
                    envelope=envelope,
                    expires_at=int(job.expires_at),
                    attempt=job.attempts,
                    caller_keys=caller_keys,
                )
            )

        return self._store.get_job(decision.job_id).addCallback(with_keys).addCallback(send)

    # --- the sweep ----------------------------------------------------------------------------

    def _rearm(self) -> defer.Deferred[None]:
        asked = self._store.next_job_deadline(self.caps.metadata_grace_s)
        armed = asked.addCallback(self._arm)
        return armed.addErrback(self._failed, "job_sweep_arm_failed", None)

    def _arm(self, at: float | None) -> None:
        """Sweep at ``at`` unless an earlier sweep is already armed: an early sweep decides
        nothing and re-arms, a late one would leave a lease or an expiry waiting."""
        if at is None or not self._graced or self._storage_failing:
            return
        if self._sweep is not None and self._sweep.active() and self._sweep_at is not None:
            if self._sweep_at <= at:
                return
            self._sweep.cancel()
        self._sweep_at = at
        self._sweep = self._clock.callLater(max(0.0, at - self._clock.seconds()), self._run_sweep)

    def _run_sweep(self) -> None:
        # The timer's own time, never earlier: a float rounding must not leave it undecided.
        now = max(self._clock.seconds(), self._sweep_at or 0.0)
        self._sweep = self._sweep_at = None
        caps = self.caps

        def decide(jobs: mailbox.Jobs) -> list[Decision]:
            return mailbox.sweep(jobs, caps, now)

        def swept(result: list[Decision] | Refused) -> None:
            if isinstance(result, Refused):  # pragma: no cover - a sweep never refuses
                return
            if result:
                _log.info("jobs_swept", decisions=len(result))
            self._after(result)

        def failed(failure: Failure) -> None:
            _log.failure("job_sweep_failed", failure=failure)
            self._arm(self._clock.seconds() + SWEEP_RETRY_S)

        scope = JobsDue(now, caps.metadata_grace_s)
        self._store.decide_jobs(scope, decide, actor=None, at=now).addCallbacks(swept, failed)

    def _failed(self, failure: Failure, event: str, job_id: str | None) -> None:
        # Logged and absorbed: a store failure must not become an unhandled error in a Deferred.
        _log.failure(event, failure=failure, job_id=job_id)


_WAITING = frozenset(mailbox.OUTSTANDING)


def _passing(step: Callable[[], object]) -> Callable[[object], object]:
    def run(result: object) -> object:
        step()
        return result

    return run
