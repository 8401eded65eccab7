"""The listener's side of the offline mailbox: job frames from the relay in, job frames out.

A queued call reaches the listener as ``job_delivery``. The desk takes it or leaves it, and a
job it takes runs through the very same pipeline as a live call
(:meth:`~agentcall.listener.core.CallPipeline.run_job`, docs/architecture.md steps 1 to 7): opened
and verified, then admitted from the relay-verified caller and local files before its text
enters any prompt. A caller blocked since they queued the job gets a sealed ``blocked`` answer
as the job's result, exactly as a live call would.

- ``job_delivery``: while a call or job runs here, or the listener is stopping, the desk says
  ``job_declined`` and writes nothing. A delivery whose envelope is not routed as a request
  from the delivery's caller to this listener through this relay (:func:`route_problem`, no
  key needed) is answered ``rejected`` and writes nothing either: every journal row is an
  fsync'd write kept for days, and a hostile relay must not be able to make them at will.
  Otherwise the execution journal decides
  (:meth:`~agentcall.listener.journal.IJournal.deliver`, which commits the ``accepted`` row
  before it returns): run it (``job_accepted``, then the pipeline under the job id as call
  id), send its stored result again, report ``indeterminate_execution`` (it may have run
  before a crash), say ``job_accepted`` again for the run in progress, or refuse it
  (``rejected``).
- While a job runs the desk renews its lease (``job_renew`` every
  :data:`~agentcall.limits.MAILBOX_RENEW_S`), from ``job_accepted`` to its result, since the
  relay counts the job as running from the accept on. The accept itself may be lost (no
  socket when it was sent, or a relay that restarted before committing it), and a relay that
  never saw it lets the job's lease lapse and ends it ``delivery_failed`` while the agent
  runs; so ``job_accepted`` is sent again for each running job on every new relay connection
  and on a repeated delivery of the job.
- The pipeline's terminal frame becomes one ``job_result``: a sealed ``call_outcome`` becomes
  the answer with its terminal, ``call_rejected`` the error ``rejected``, ``call_cancelled``
  the error ``canceled``; a run the listener's own shutdown cut (the sink's ``stopped``, not a
  frame) the error ``indeterminate_execution``, as if the listener had died. It is stored in
  the journal *before* it is sent, and sent again on every new relay connection until the
  relay's ``job_ack``.
- ``job_nack``: the relay could not store the result (its storage is failing). The job's lease
  is renewed again and the result sent again on the same connection, after 1 s, then twice as
  long each time up to :data:`RESULT_RETRY_MAX_S`, until its ``job_ack``; waiting for a new
  connection would let the lease lapse and leave a finished answer in the journal.
- ``cancel_job``: the running job is cancelled like a live call (its process group is killed),
  and reports ``canceled`` once the agent is gone.
- ``jobs_held``: on a connection whose ``ready`` asks for it, the first frame lists every job
  held here: running, or its result not yet acknowledged (which, after a crash, includes each
  job the journal now says is indeterminate; the relay leaves those to that result, so such a
  job is reported by this side alone). The relay ends every other lease of ours at once,
  rather than letting a lease held for a listener that died keep our next job from us. Sent
  only when the list is complete (see :meth:`MailboxDesk.held`).

The journal is synchronous SQLite on the reactor thread, like the replay window and the pins.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall

from agentcall import ids, limits
from agentcall.errors import MalformedFrame, StoreError
from agentcall.listener.core import CallPipeline
from agentcall.listener.journal import (
    IJournal,
    Indeterminate,
    InProgress,
    JobState,
    Redeliver,
    Refused,
    Run,
    StepRefused,
    StoredReply,
)
from agentcall.logevents import Logger
from agentcall.wire import codec
from agentcall.wire.frames import (
    CallCancelled,
    CallOutcome,
    CallRejected,
    CancelJob,
    Direction,
    Frame,
    IncomingCall,
    JobAccepted,
    JobAck,
    JobDeclined,
    JobDelivery,
    JobError,
    JobNack,
    JobRenew,
    JobResult,
    JobsHeld,
)

_log = Logger(namespace="agentcall.listener.mailbox")

# A result the relay could not store is sent again after 1 s, 2 s, 4 s, ... at most this long
# apart: soon after the relay's storage recovers, without a tight loop while it stays full.
RESULT_RETRY_FIRST_S = 1.0
RESULT_RETRY_MAX_S = 30.0


# --- pure: frames and stored replies ------------------------------------------------------------


def incoming_of(delivery: JobDelivery) -> IncomingCall:
    """The delivered job as the pipeline's inbound call: its job id is the call id.

    A job carries no correlation id; the job id's 32 hex digits stand in for it (the logs join
    on it). It carries no roster groups either (none exist yet), so admission sees none.
    """
    return IncomingCall(
        call_id=delivery.job_id,
        from_=delivery.from_,
        envelope=delivery.envelope,
        correlation_id=delivery.job_id.replace("-", ""),
        # Verified in step 2 exactly like an incoming call's (fetched when none are attached).
        caller_keys=delivery.caller_keys,
    )


def route_problem(
    delivery: JobDelivery, *, org: str, address: str, relay_origin: str
) -> str | None:
    """Why the delivered envelope cannot be a request to us (None: its route is ours).

    These are the route checks opening the envelope makes anyway
    (:func:`~agentcall.crypto.envelope.open_request`), done on the clear header before the
    delivery is journalled, so a delivery that could never open writes nothing.
    """
    envelope = delivery.envelope
    if envelope.direction is not Direction.REQUEST:
        return "not_a_request"
    if envelope.relay_origin != relay_origin:
        return "other_relay"
    if envelope.to != address:
        return "not_to_us"
    if envelope.from_ != ids.format_address(org, delivery.from_):
        return "not_from_the_caller"
    return None


def result_of(job_id: str, frame: Frame) -> tuple[JobResult, StoredReply] | None:
    """The ``job_result`` a terminal pipeline frame becomes, and the reply the journal keeps
    for it (None: not a terminal frame)."""
    if isinstance(frame, CallOutcome):
        result = JobResult(job_id=job_id, terminal=frame.terminal, envelope=frame.envelope)
        return result, StoredReply(sealed=codec.encode(result))
    if isinstance(frame, CallRejected):
        error = JobError.REJECTED
    elif isinstance(frame, CallCancelled):
        error = JobError.CANCELED
    else:
        return None
    return JobResult(job_id=job_id, error=error), StoredReply(error=error)


def stored_result(job_id: str, reply: StoredReply) -> JobResult:
    """The ``job_result`` a stored reply is sent as (a stored frame that does not decode as
    this job's result is reported ``indeterminate_execution``: the job did run)."""
    if reply.error is not None:
        return JobResult(job_id=job_id, error=reply.error)
    try:
        frame = codec.decode_frame(reply.sealed or b"", (JobResult,))
    except MalformedFrame:
        frame = None
    if not isinstance(frame, JobResult) or frame.job_id != job_id:
        _log.warn("job_result_unreadable", job_id=job_id)
        return JobResult(job_id=job_id, error=JobError.INDETERMINATE_EXECUTION)
    return frame


# --- the desk -----------------------------------------------------------------------------------


@attrs.define(eq=False)
class _JobSink:
    """One running job's frame sink (see :class:`~agentcall.listener.effects.CallSink`)."""

    desk: MailboxDesk
    job_id: str
    renew: LoopingCall
    ended: bool = False

    def frame(self, frame: Frame) -> None:
        self.desk._job_frame(self, frame)

    def agent_starting(self) -> None:
        self.desk._job_starting(self)

    def stopped(self) -> None:
        self.desk._job_stopped(self)

    def stop_renewing(self) -> None:
        if self.renew.running:
            self.renew.stop()


@attrs.define(eq=False)
class _Resending:
    """A result the relay said it could not store: its lease renewal and its next sending."""

    renew: LoopingCall
    delay_s: float
    next_send: IDelayedCall | None = None

    def stop(self) -> None:
        if self.renew.running:
            self.renew.stop()
        if self.next_send is not None and self.next_send.active():
            self.next_send.cancel()
        self.next_send = None


class MailboxDesk:
    """Takes mailbox jobs from the relay, runs them at most once, and reports each one."""

    def __init__(
        self,
        pipeline: CallPipeline,
        journal: IJournal,
        *,
        send: Callable[[Frame], bool],
        clock: IReactorTime,
    ) -> None:
        self._pipeline = pipeline
        self._journal = journal
        self._send = send
        self._clock = clock
        self._running: dict[str, _JobSink] = {}
        # Jobs whose stored result the relay has not acknowledged, oldest first (the journal
        # holds the results; this only says which rows to look at).
        self._unacked: dict[str, None] = {}
        # Results the relay refused to store for now (job_nack), by job id.
        self._resending: dict[str, _Resending] = {}
        # Set once start() read the journal: only then is jobs_held complete.
        self._journal_read = False

    # --- state, for the service and tests ------------------------------------------------

    @property
    def unacknowledged(self) -> tuple[str, ...]:
        return tuple(self._unacked)

    # --- start-up and connections ----------------------------------------------------------

    def start(self) -> None:
        """Before the first connection: every job that may have run is indeterminate now, and
        every result the relay has not acknowledged waits for the next ``ready``.

        Nothing depends on this for safety (a redelivery of such a job is refused by the
        journal anyway); it lets the relay learn of those jobs without asking.
        """
        now = self._clock.seconds()
        try:
            pruned = self._journal.prune(now)
            reports = self._journal.restart(now)
        except StoreError:
            _log.failure("journal_restart_failed")
            return
        for report in reports:
            self._unacked[report.job_id] = None
        self._journal_read = True
        indeterminate = sum(isinstance(report, Indeterminate) for report in reports)
        _log.info(
            "journal_restarted",
            pruned=pruned,
            unacknowledged=len(reports),
            indeterminate=indeterminate,
        )

    def held(self) -> tuple[str, ...] | None:
        """Every job this listener holds, as ``jobs_held`` lists them: those running here, then
        those whose result the relay has not acknowledged (after a crash, the journal's
        indeterminate ones among them). None when it cannot say so completely: the journal
        was not read at start-up, or there are more than a report may list. An incomplete list
        would have the relay end leases held here; saying nothing leaves them to lapse."""
        if not self._journal_read:
            return None
        held = dict.fromkeys(job_id for job_id in self._running if self._runs_here(job_id))
        held.update(self._unacked)
        if len(held) > limits.MAILBOX_MAX_JOBS_HELD:
            return None
        return tuple(held)

    def relay_ready(self, *, report_held: bool = False) -> None:
        """A relay connection became usable: with ``report_held`` (its ``ready`` asked), say
        first which jobs are held here (``jobs_held``); then say ``job_accepted`` again for
        every job running here, then send every unacknowledged result again."""
        now = self._clock.seconds()
        if report_held:
            held = self.held()
            if held is None:
                _log.warn("jobs_held_unsaid", journal_read=self._journal_read)
            else:
                self._send(JobsHeld(job_ids=held))
        # The relay may never have processed the first accept; one that did takes it again as
        # a no-op. Before the results, so the relay hears of the running job first.
        for job_id in tuple(self._running):
            if self._runs_here(job_id) and not self._send(JobAccepted(job_id=job_id)):
                break
        sent = 0
        for job_id in tuple(self._unacked):
            try:
                entry = self._journal.get(job_id)
            except StoreError:
                _log.failure("journal_read_failed", job_id=job_id)
                continue
            if entry is None or entry.reply is None or entry.state is JobState.ACKNOWLEDGED:
                self._unacked.pop(job_id, None)  # pruned, or acknowledged meanwhile
                continue
            if not self._send(stored_result(job_id, entry.reply)):
                break
            sent += 1
        if sent:
            _log.info("job_results_resent", count=sent)
        try:
            self._journal.prune(now)
        except StoreError:
            _log.failure("journal_prune_failed")

    # --- frames in --------------------------------------------------------------------------

    def on_frame(self, frame: Frame) -> bool:
        """Handle a job frame from the relay; False when ``frame`` is not one (a call frame)."""
        if isinstance(frame, JobDelivery):
            self._on_delivery(frame)
        elif isinstance(frame, CancelJob):
            self._on_cancel(frame.job_id)
        elif isinstance(frame, JobAck):
            self._on_ack(frame.job_id)
        elif isinstance(frame, JobNack):
            self._on_nack(frame)
        else:
            return False
        return True

    def _on_delivery(self, delivery: JobDelivery) -> None:
        job_id = delivery.job_id
        _log.info("job_delivered", job_id=job_id, caller=delivery.from_, attempt=delivery.attempt)
        running_here = job_id in self._running
        if not running_here and not self._pipeline.can_take_job():
            # Nothing written: the relay offers the job again once this listener is idle.
            reason = "stopping" if self._pipeline.stopping else "busy"
            _log.info("job_declined", job_id=job_id, reason=reason)
            self._send(JobDeclined(job_id=job_id))
            return
        problem = route_problem(
            delivery,
            org=self._pipeline.config.org,
            address=self._pipeline.keys.address,
            relay_origin=self._pipeline.keys.relay_origin,
        )
        if problem is None:
            try:
                incoming = incoming_of(delivery)
            except ValueError:
                problem = "not_a_call"
        if problem is not None:
            _log.warn("job_refused", job_id=job_id, reason=problem)
            self._send(JobResult(job_id=job_id, error=JobError.REJECTED))
            return
        now = self._clock.seconds()
        # The relay stamps expires_at by its own clock; one running ahead by more than the
        # journal's allowed skew would get every fresh job refused. Capped at our own
        # now + TTL instead: the journal's refusal is only there so a job cannot outlive its
        # row (kept TTL + skew from now), and a job redelivered after the prune is still never
        # run, because the sealed request's own signed expiry (at most TTL after it was
        # issued) has passed by then and the replay window holds its id until that expiry.
        expires_at = min(float(delivery.expires_at), now + limits.MAILBOX_TTL_S)
        try:
            decision = self._journal.deliver(
                job_id, expires_at=expires_at, running_here=running_here, now=now
            )
        except StoreError:
            # Nothing was committed, so nothing may run; the relay retries the delivery.
            _log.failure("journal_write_failed", job_id=job_id)
            self._send(JobDeclined(job_id=job_id))
            return
        if isinstance(decision, Run):
            self._run(incoming)
        elif isinstance(decision, Redeliver):
            _log.info("job_result_redelivered", job_id=job_id)
            self._send(stored_result(job_id, decision.reply))
        elif isinstance(decision, Indeterminate):
            _log.warn("job_indeterminate", job_id=job_id)
            self._unacked[job_id] = None
            self._send(stored_result(job_id, decision.reply))
        elif isinstance(decision, InProgress):
            # A relay redelivering the job we run never got (or lost) our accept.
            _log.info("job_in_progress", job_id=job_id)
            if self._runs_here(job_id):
                self._send(JobAccepted(job_id=job_id))
        elif isinstance(decision, Refused):
            _log.info("job_refused", job_id=job_id, reason=str(decision.reason))
            self._send(JobResult(job_id=job_id, error=JobError.REJECTED))

    def _run(self, incoming: IncomingCall) -> None:
        """The ``accepted`` row is committed: take the job and run it as a call."""
        job_id = incoming.call_id
        renew = LoopingCall(self._renew, job_id)
        renew.clock = self._clock
        job = _JobSink(self, job_id, renew)
        self._running[job_id] = job
        self._send(JobAccepted(job_id=job_id))
        _log.info("job_accepted", job_id=job_id)
        renew.start(limits.MAILBOX_RENEW_S, now=False)
        try:
            # Admission happens inside, before the caller's text reaches any prompt (step 3).
            done = self._pipeline.run_job(incoming, job)
        except Exception:
            _log.failure("job_not_started", job_id=job_id)
            self._job_over(None, job, JobError.REJECTED)
            return
        done.addBoth(self._job_over, job)

    def _runs_here(self, job_id: str) -> bool:
        """Whether ``job_id`` runs here and has no result yet (so may be accepted again).

        A job with a result has said so to the relay instead; one whose result could not be
        journalled must be left to lapse into indeterminate_execution, not be said to run.
        """
        job = self._running.get(job_id)
        return job is not None and not job.ended

    def _renew(self, job_id: str) -> None:
        # A periodic job never raises (LoopingCall would stop); a missed renew is harmless.
        try:
            self._send(JobRenew(job_id=job_id))
        except Exception:
            _log.failure("job_renew_failed", job_id=job_id)

    def _on_cancel(self, job_id: str) -> None:
        if self._pipeline.cancel_running_job(job_id):
            # job_result {canceled} follows once the agent's process group is gone.
            _log.info("job_cancel_requested", job_id=job_id)
            return
        try:
            entry = self._journal.get(job_id)
        except StoreError:
            _log.failure("journal_read_failed", job_id=job_id)
            return
        if entry is None:
            # Never taken here: nothing ran, so it is cancelled as far as this side knows.
            _log.info("job_cancelled_unknown", job_id=job_id)
            self._send(JobResult(job_id=job_id, error=JobError.CANCELED))
        elif entry.reply is not None:
            # It ended already: what happened stands, cancel or not.
            self._send(stored_result(job_id, entry.reply))

    def _on_nack(self, nack: JobNack) -> None:
        job_id = nack.job_id
        if job_id not in self._unacked:
            return  # acknowledged meanwhile, or never ours
        resending = self._resending.get(job_id)
        if resending is None:
            renew = LoopingCall(self._renew, job_id)
            renew.clock = self._clock
            resending = _Resending(renew, RESULT_RETRY_FIRST_S)
            self._resending[job_id] = resending
            # Renewed now too: the relay may already count the lease down since the last one.
            renew.start(limits.MAILBOX_RENEW_S, now=True)
        elif resending.next_send is not None and resending.next_send.active():
            return  # a duplicate nack: the next sending is already set
        _log.warn(
            "job_result_unstored", job_id=job_id, code=str(nack.code), retry_in_s=resending.delay_s
        )
        resending.next_send = self._clock.callLater(resending.delay_s, self._resend, job_id)
        resending.delay_s = min(resending.delay_s * 2, RESULT_RETRY_MAX_S)

    def _resend(self, job_id: str) -> None:
        resending = self._resending.get(job_id)
        if resending is not None:
            resending.next_send = None
        try:
            entry = self._journal.get(job_id)
        except StoreError:
            _log.failure("journal_read_failed", job_id=job_id)
            return
        if entry is None or entry.reply is None or entry.state is JobState.ACKNOWLEDGED:
            self._stop_resending(job_id)
            return
        self._send(stored_result(job_id, entry.reply))

    def stop(self) -> None:
        """Stop re-sending refused results (the journal keeps them for the next start)."""
        for job_id in list(self._resending):
            self._stop_resending(job_id)

    def _stop_resending(self, job_id: str) -> None:
        resending = self._resending.pop(job_id, None)
        if resending is not None:
            resending.stop()

    def _on_ack(self, job_id: str) -> None:
        self._unacked.pop(job_id, None)
        self._stop_resending(job_id)
        try:
            acknowledged = self._journal.acknowledge(job_id, self._clock.seconds())
        except StoreError:
            # The row stays sealed: it is sent again after a restart and acknowledged again.
            _log.failure("journal_write_failed", job_id=job_id)
            return
        if isinstance(acknowledged, StepRefused):
            # A result never journalled (a refused delivery) or a job long pruned.
            _log.info("job_ack_unmatched", job_id=job_id)
        else:
            _log.info("job_acknowledged", job_id=job_id)

    # --- the running job (called by its sink) ----------------------------------------------------

    def _job_starting(self, job: _JobSink) -> None:
        try:
            started = self._journal.start(job.job_id, self._clock.seconds())
        except StoreError:
            # The committed "accepted" row already counts as "may have run": still at most once.
            _log.failure("journal_write_failed", job_id=job.job_id)
            return
        if isinstance(started, StepRefused):
            _log.warn("journal_step_refused", job_id=job.job_id, step="start")

    def _job_frame(self, job: _JobSink, frame: Frame) -> None:
        result = result_of(job.job_id, frame)
        if result is None:
            return  # accepted and started: job_accepted said it already
        self._finish(job, *result)

    def _job_stopped(self, job: _JobSink) -> None:
        # The listener's shutdown cut the agent: it may have acted, so the job ends as it
        # would had the listener died, never with a sealed answer or a run again.
        error = JobError.INDETERMINATE_EXECUTION
        self._finish(job, JobResult(job_id=job.job_id, error=error), StoredReply(error=error))

    def _finish(self, job: _JobSink, result: JobResult, reply: StoredReply) -> None:
        if job.ended:
            return
        job.ended = True
        job.stop_renewing()
        try:
            sealed = self._journal.seal(job.job_id, reply, self._clock.seconds())
        except StoreError:
            # Not sent: a result the journal does not hold could be contradicted after a
            # restart. The relay's lease lapses and the job ends indeterminate_execution.
            _log.failure("journal_write_failed", job_id=job.job_id)
            return
        if isinstance(sealed, StepRefused):
            _log.warn("journal_step_refused", job_id=job.job_id, step="seal")
            return
        self._unacked[job.job_id] = None
        sent = self._send(result)
        _log.info("job_result", job_id=job.job_id, outcome=_describe(result), sent=sent)

    def _job_over(
        self,
        _result: object,
        job: _JobSink,
        error: JobError = JobError.INDETERMINATE_EXECUTION,
    ) -> None:
        self._running.pop(job.job_id, None)
        # The pipeline always ends with a terminal frame; should it not have, the job may
        # still have run, and says so.
        self._finish(job, JobResult(job_id=job.job_id, error=error), StoredReply(error=error))


def _describe(result: JobResult) -> str:
    return str(result.error) if result.terminal is None else str(result.terminal)
