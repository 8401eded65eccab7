"""The offline mailbox's decisions: which job is queued, delivered, retried, ended or forgotten.

Pure: no sockets, no reactor, no store, no clock (``now`` is passed in). Every function reads a
mapping of :class:`Job` values keyed by job id and returns what should change, as a value: a
:class:`Decision` (the job's new row, or ``None`` when it is forgotten, the :data:`Effect` values
the relay must carry out, and the audit event names the change implies) or a :class:`Refused`
with its reason. Nothing is raised for a refusal and nothing is mutated; :class:`Mailbox` is the
in-memory dict that applies decisions. A store persists ``Decision.job`` as one row and rebuilds
the mapping from its rows, so the core replays from storage as it is. A caller may pass only the
rows that matter: the caller's and the callee's jobs for :func:`enqueue`, the callee's for
:func:`next_delivery`.

The relay sees sizes, never content: a job records the sealed request's and answer's lengths.

States and the operations that move a job between them::

      enqueue              next_delivery                  accept
    ----------> QUEUED ---------------------> DELIVERED ----------> RUNNING
                 ^   |                         |     |                |
                 |   | cancel                  |     | answer, fail,  | answer, fail,
                 |   v                         |     | cancel_done    | cancel_done, lease
                 | CANCELLED                   |     v                v lapsed or not held
                 |                             |   ANSWERED  FAILED (reason)  CANCELLED
                 +-----------------------------+
                   lease lapsed, not held or         at the 3rd attempt instead:
                   declined; fewer than 3 attempts   FAILED delivery_failed

    QUEUED, DELIVERED or RUNNING at created_at + 72 h ----------------> EXPIRED

    FAILED indeterminate_execution by a lapsed running lease (lapsed), before created_at + 72 h:
      answer -> ANSWERED;  fail -> FAILED (the listener's reason; indeterminate confirms it)

A result can overtake the relay's view: an accept lost on the way (the listener's journal holds
the job, the relay let the delivery lapse back to ``queued``) is still followed by the job's
result, which :func:`answer` and :func:`fail` take from ``queued`` too; a late ``job_accepted``
for a job delivered before is taken from ``queued`` as well, so a retry does not spend the
attempts of a job that is already running. A renew of a job not yet seen running is taken as its
lost accept (:func:`renew`).

A running job whose lease lapses (its listener stopped renewing) ends ``failed`` with
``indeterminate_execution``: the agent may have run, and a job runs at most once. Its listener
may only have lost its connection for longer than a lease, so until the job's expiry a result
it sends after all (an answer, or a failure it reports) still replaces that verdict
(``Job.lapsed``); its accepts and renews are refused ``lapsed``, never told to cancel. This
cannot run a job twice: a job that was running is never delivered again. Leases and
expiry are taken by :func:`sweep`; the relay calls it on a timer at :func:`next_deadline`, and
at its start-up first gives every held lease a grace (:func:`restart_grace`).

A lease need not wait to lapse when its callee's listener says it is held for nobody: a
listener that (re)connects lists every job it holds (:func:`reconcile`), and each other lease of
that callee ends at once exactly as a lapse would end it (a delivered job queued again, a running
one failed ``indeterminate_execution``). So a lease held for a listener that died, graced or
not, never keeps the callee's one delivery at a time from their new listener.

Cancelling a delivered or running job does not end it at once: it is marked, the listener is
told (:class:`TellListenerCancel`) and the job ends ``cancelled`` on :func:`cancel_done` or when
its lease lapses; an answer or failure that wins the race ends it as reported.

Ciphertext: the sealed request is dropped when the job is answered (the answer replaces it) or
ends any other way; the answer is dropped at ``expires_at`` (created + 72 h). Metadata stays
visible :data:`~agentcall.limits.MAILBOX_METADATA_GRACE_S` longer, then the job is forgotten.
A job in a terminal state (answered, failed, cancelled, expired) never changes state again,
except a running job the relay failed when its lease lapsed: the result of that run, when it
comes from its callee before the job's expiry, ends it as reported (``answered``, or ``failed``
with the listener's reason) instead.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Mapping

import attrs

from agentcall import limits
from agentcall.relay import audit
from agentcall.wire import http

# The one definition of each is the wire's: the API shows exactly the states decided here.
JobState = http.JobState
FailureReason = http.JobFailureReason

Member = tuple[str, str]
"""(org, handle): who acts on a job."""


HOLDING_LEASE = frozenset({JobState.DELIVERED, JobState.RUNNING})
OUTSTANDING = frozenset({JobState.QUEUED}) | HOLDING_LEASE
TERMINAL = frozenset(JobState) - OUTSTANDING
# A result may come for a job the relay has put back in the queue (its accept was lost).
_RESULT_FROM = OUTSTANDING
_ACCEPTABLE = frozenset({JobState.QUEUED, JobState.DELIVERED})


class Refusal(enum.StrEnum):
    BUSY = "busy"  # the caller already has the maximum of outstanding jobs
    CALLEE_QUEUE_FULL = "callee_queue_full"
    CALLEE_BYTES_FULL = "callee_bytes_full"
    # The relay already holds its cap of sealed bytes for every callee together.
    RELAY_BYTES_FULL = "relay_bytes_full"
    TOO_LARGE = "too_large"  # larger than a callee's whole byte cap: could never be queued
    DUPLICATE_JOB = "duplicate_job"
    UNKNOWN_JOB = "unknown_job"  # also a job that is not the asker's: existence is not revealed
    ENDED = "ended"  # the job is in a terminal state
    EXPIRED = "expired"  # past expires_at, not yet swept
    WRONG_STATE = "wrong_state"
    CANCEL_PENDING = "cancel_pending"
    # The relay failed the running job when its lease lapsed: it is not running as far as the
    # relay knows, but its listener should finish it, because its result is still taken.
    LAPSED = "lapsed"


_positive = attrs.validators.gt(0)
_positive_s = attrs.validators.gt(0.0)

# Sealed bytes the relay holds for every callee together (``--mailbox-max-total-bytes``): the
# mailboxes of 64 callees each at their own cap, or about 2,700 requests of the largest size,
# and hundreds of thousands of ordinary ones, so an organisation meets it only when something
# fills mailboxes on purpose; then 1 GiB for 72 hours is what the relay's disk gives up.
MAX_HELD_BYTES_TOTAL = 1024**3


@attrs.frozen
class MailboxLimits:
    """The numbers, each with the product's default (the per-callee caps are relay options)."""

    ttl_s: float = attrs.field(default=limits.MAILBOX_TTL_S, validator=_positive_s)
    metadata_grace_s: float = attrs.field(
        default=limits.MAILBOX_METADATA_GRACE_S, validator=_positive_s
    )
    lease_s: float = attrs.field(default=limits.MAILBOX_LEASE_S, validator=_positive_s)
    max_attempts: int = attrs.field(default=limits.MAILBOX_MAX_ATTEMPTS, validator=_positive)
    max_outstanding_per_caller: int = attrs.field(
        default=limits.MAILBOX_MAX_OUTSTANDING_PER_CALLER, validator=_positive
    )
    max_queued_per_callee: int = attrs.field(
        default=limits.MAILBOX_MAX_QUEUED_PER_CALLEE, validator=_positive
    )
    max_queued_bytes_per_callee: int = attrs.field(
        default=limits.MAILBOX_MAX_QUEUED_BYTES_PER_CALLEE, validator=_positive
    )
    # Every callee's mailbox together, counted as the per-callee cap counts one (held_bytes).
    max_held_bytes_total: int = attrs.field(default=MAX_HELD_BYTES_TOTAL, validator=_positive)


@attrs.frozen
class Job:
    """One job's row: metadata and sizes only, never a sealed byte.

    ``last_delivery`` is the callee-wide sequence number of the job's latest delivery (0 when
    never delivered); fairness is derived from it, so it survives a restart with the rows.
    ``holds_ciphertext`` says whether the store still keeps sealed bytes for the job.
    ``lapsed`` marks a job the relay itself failed ``indeterminate_execution`` because its lease
    lapsed while it was running (not one its listener reported failed): the one terminal row a
    later result from its listener may still replace.
    """

    job_id: str
    org: str
    caller: str
    callee: str
    request_bytes: int = attrs.field(validator=_positive)
    created_at: float
    expires_at: float
    state: JobState = JobState.QUEUED
    reason: FailureReason | None = None
    attempts: int = 0
    lease_until: float | None = None
    answer_bytes: int | None = None
    cancel_requested: bool = False
    holds_ciphertext: bool = True
    last_delivery: int = 0
    lapsed: bool = False

    def __attrs_post_init__(self) -> None:
        # Rows come back from storage: refuse ones no sequence of decisions can produce.
        if (self.reason is not None) != (self.state is JobState.FAILED):
            raise ValueError("a failure reason goes with the failed state, and only with it")
        if (self.lease_until is not None) != (self.state in HOLDING_LEASE):
            raise ValueError("a lease goes with the delivered and running states only")
        if (self.answer_bytes is not None) != (self.state is JobState.ANSWERED):
            raise ValueError("an answer size goes with the answered state only")
        if self.attempts < 0 or self.last_delivery < 0:
            raise ValueError("attempts and last_delivery cannot be negative")
        if self.lapsed and self.reason is not FailureReason.INDETERMINATE_EXECUTION:
            raise ValueError("only a job failed indeterminate_execution can have lapsed")

    @property
    def caller_member(self) -> Member:
        return (self.org, self.caller)

    @property
    def callee_member(self) -> Member:
        return (self.org, self.callee)


def held_bytes(job: Job) -> int:
    """The sealed bytes the relay holds for ``job``: its request while it is outstanding, its
    answer until that is dropped at expiry."""
    request = job.request_bytes if job.state in OUTSTANDING else 0
    answer = (job.answer_bytes or 0) if job.holds_ciphertext else 0
    return request + answer


@attrs.frozen
class DropRequest:
    """Delete the job's sealed request; its answer replaces it."""

    job_id: str


@attrs.frozen
class DropCiphertext:
    """Delete every sealed byte kept for the job (request and answer)."""

    job_id: str


@attrs.frozen
class TellListenerCancel:
    """Tell the callee's listener to drop the delivery or kill the run."""

    job_id: str
    org: str
    callee: str


@attrs.frozen
class Forget:
    """Delete the job's row: its metadata is no longer visible."""

    job_id: str


Effect = DropRequest | DropCiphertext | TellListenerCancel | Forget


@attrs.frozen
class Decision:
    """What changes: the job's new row (``None``: forgotten), effects, audit event names."""

    job_id: str
    job: Job | None
    effects: tuple[Effect, ...] = ()
    audit: tuple[str, ...] = ()


@attrs.frozen
class Refused:
    reason: Refusal


Jobs = Mapping[str, Job]


# --- the caller's side ------------------------------------------------------------------------


def enqueue(
    jobs: Jobs,
    caps: MailboxLimits,
    *,
    job_id: str,
    org: str,
    caller: str,
    callee: str,
    request_bytes: int,
    now: float,
    held_total: int,
) -> Decision | Refused:
    """Queue a sealed request of ``request_bytes`` (ValueError if not positive) for ``callee``.

    The callee's byte cap bounds their whole mailbox: the requests waiting for them plus the
    answers the relay still holds for their jobs (kept until expiry, 72 h), so answering jobs
    does not make room for an unbounded amount of ciphertext on the relay's disk. It is checked
    here, when a request comes in: an answer is stored whatever its size (refusing it would
    lose a job that ran), so a callee's mailbox may pass the cap by as much as its answers are
    larger than their requests, and then takes no new request until enough of it is dropped.

    ``held_total`` is what every callee's mailbox holds together (:func:`held_bytes` summed
    over all jobs, which ``jobs`` need not contain): past ``caps.max_held_bytes_total`` with
    this request, it is refused, and like the callee's cap this bounds only new requests."""
    job = Job(job_id, org, caller, callee, request_bytes, now, now + caps.ttl_s)
    if job_id in jobs:
        return Refused(Refusal.DUPLICATE_JOB)
    if request_bytes > caps.max_queued_bytes_per_callee:
        return Refused(Refusal.TOO_LARGE)
    # The caller's own cap first: it is the one the caller can do something about.
    if _count(jobs, lambda j: j.caller_member == job.caller_member) >= (
        caps.max_outstanding_per_caller
    ):
        return Refused(Refusal.BUSY)
    waiting = [j for j in _outstanding(jobs) if j.callee_member == job.callee_member]
    if len(waiting) >= caps.max_queued_per_callee:
        return Refused(Refusal.CALLEE_QUEUE_FULL)
    if _mailbox_bytes(jobs, job.callee_member) + request_bytes > caps.max_queued_bytes_per_callee:
        return Refused(Refusal.CALLEE_BYTES_FULL)
    # Last: the relay-wide cap is the one neither the caller nor the callee can do anything about.
    if held_total + request_bytes > caps.max_held_bytes_total:
        return Refused(Refusal.RELAY_BYTES_FULL)
    return Decision(job_id, job, audit=(audit.JOB_QUEUE,))


def cancel(jobs: Jobs, job_id: str, by: Member, now: float) -> Decision | Refused:
    """The caller cancels: a queued job ends at once; a delivered or running one is marked and
    its listener told."""
    job = _own(jobs, job_id, by, caller=True, now=now)
    if isinstance(job, Refused):
        return job
    if job.state is JobState.QUEUED:
        return _end(job, JobState.CANCELLED, (audit.JOB_CANCEL,))
    if job.cancel_requested:
        return Refused(Refusal.CANCEL_PENDING)
    marked = attrs.evolve(job, cancel_requested=True)
    return Decision(job_id, marked, (_tell(job),), (audit.JOB_CANCEL,))


# --- the callee's listener ----------------------------------------------------------------------


def next_delivery(
    jobs: Jobs, caps: MailboxLimits, org: str, callee: str, now: float
) -> Decision | None:
    """The job to hand a ready listener now, under a lease; ``None`` while one is already out
    (one at a time) or nothing is waiting.

    Fair across callers: the caller served least recently goes first (never served beats
    everyone), then within a caller the oldest job. Sweep before asking: a lapsed lease still
    counts as out until :func:`sweep` has taken it back.
    """
    mine = [j for j in jobs.values() if j.callee_member == (org, callee)]
    if any(j.state in HOLDING_LEASE for j in mine):
        return None
    waiting = [j for j in mine if j.state is JobState.QUEUED and now < j.expires_at]
    if not waiting:
        return None
    served: dict[str, int] = {}
    for j in mine:
        served[j.caller] = max(served.get(j.caller, 0), j.last_delivery)
    job = min(waiting, key=lambda j: (served[j.caller], j.created_at, j.job_id))
    delivered = attrs.evolve(
        job,
        state=JobState.DELIVERED,
        attempts=job.attempts + 1,
        lease_until=now + caps.lease_s,
        last_delivery=max(j.last_delivery for j in mine) + 1,
    )
    return Decision(job.job_id, delivered, audit=(audit.JOB_DELIVER,))


def accept(
    jobs: Jobs, caps: MailboxLimits, job_id: str, by: Member, now: float
) -> Decision | Refused:
    """The listener admitted the delivered job and starts it: running, with a fresh lease.

    Also from ``queued`` when the job was delivered before and no other job of the callee is
    out: the accept came after its lease had lapsed, and the listener's journal holds it."""
    if _lapsed(jobs, job_id, by):
        return Refused(Refusal.LAPSED)
    job = _delivered_before(jobs, job_id, by, now, _ACCEPTABLE)
    if isinstance(job, Refused):
        return job
    if job.state is JobState.QUEUED and any(
        j.state in HOLDING_LEASE for j in jobs.values() if j.callee_member == by
    ):
        # Another job is out already: one lease at a time per callee, so this one stays queued.
        return Refused(Refusal.WRONG_STATE)
    running = attrs.evolve(job, state=JobState.RUNNING, lease_until=now + caps.lease_s)
    return Decision(job_id, running, audit=(audit.JOB_ACCEPT,))


def renew(
    jobs: Jobs, caps: MailboxLimits, job_id: str, by: Member, now: float
) -> Decision | Refused:
    """The agent is still running: the lease runs ``lease_s`` from now.

    A renew of a job the relay still sees as delivered (or back in ``queued`` after a delivery)
    is taken as its accept, under the same rule as :func:`accept`: only a listener whose journal
    accepted the job renews it, so its ``job_accepted`` was lost (the socket dropped, or the
    relay stopped before it was stored). Refusing would let the lease lapse, deliver the job
    again and end it ``delivery_failed`` while its agent runs, dropping the answer.

    A renew of a job the relay failed when its lease lapsed is refused ``lapsed``: it stays
    failed unless its result comes (:func:`answer`)."""
    if _lapsed(jobs, job_id, by):
        return Refused(Refusal.LAPSED)
    job = _own(jobs, job_id, by, caller=False, now=now)
    if isinstance(job, Refused):
        return job
    if job.state is not JobState.RUNNING:
        return accept(jobs, caps, job_id, by, now)
    return Decision(job_id, attrs.evolve(job, lease_until=now + caps.lease_s))


def decline(
    jobs: Jobs, caps: MailboxLimits, job_id: str, by: Member, now: float
) -> Decision | Refused:
    """The listener cannot take the delivered job now (busy with a call the relay did not see,
    or stopping): the job waits in the queue again and the attempt is given back, because the
    listener said so and nothing ran. Only silence (a lapsed lease) spends attempts, so a busy
    callee never turns a job into ``delivery_failed``; the relay waits before delivering to a
    listener that declined (:class:`~agentcall.relay.jobs.JobDesk`)."""
    job = _own(jobs, job_id, by, caller=False, now=now, states={JobState.DELIVERED})
    if isinstance(job, Refused):
        return job
    if job.cancel_requested:
        return _end(job, JobState.CANCELLED, ())
    waiting = attrs.evolve(
        job, state=JobState.QUEUED, lease_until=None, attempts=max(0, job.attempts - 1)
    )
    return Decision(job_id, waiting)


def answer(
    jobs: Jobs, job_id: str, by: Member, answer_bytes: int, now: float
) -> Decision | Refused:
    """A sealed answer came back (a refusal by the callee's policy, such as ``blocked``, is an
    answer too, so a delivered job may be answered without an accept). From ``queued`` as well:
    the result of a job whose accept was lost. And from a job the relay failed when its lease
    lapsed, until its expiry: the run did end, and its caller may still fetch the answer."""
    job = _result_for(jobs, job_id, by, now)
    if isinstance(job, Refused):
        return job
    if answer_bytes < 1:
        raise ValueError("an answer has at least one byte")
    answered = attrs.evolve(
        job,
        state=JobState.ANSWERED,
        reason=None,
        answer_bytes=answer_bytes,
        lease_until=None,
        holds_ciphertext=True,
        lapsed=False,
    )
    return Decision(job_id, answered, (DropRequest(job_id),), (audit.JOB_COMPLETE,))


def fail(
    jobs: Jobs, job_id: str, by: Member, reason: FailureReason, now: float
) -> Decision | Refused:
    """The listener reports that the job failed (for instance indeterminate after a restart);
    from ``queued`` and after a lapse as well, like :func:`answer`.

    ``indeterminate_execution`` for a job the relay already failed so when its lease lapsed
    (or :func:`reconcile` ended it) confirms that verdict: it becomes final, audited once."""
    job = _result_for(jobs, job_id, by, now)
    if isinstance(job, Refused):
        return job
    if job.lapsed and reason is FailureReason.INDETERMINATE_EXECUTION:
        return Decision(job_id, attrs.evolve(job, lapsed=False))
    return _end(job, JobState.FAILED, (audit.JOB_FAIL,), reason)


def cancel_done(jobs: Jobs, job_id: str, by: Member, now: float) -> Decision | Refused:
    """The listener dropped the delivery or killed the run it was told to cancel."""
    job = _own(jobs, job_id, by, caller=False, now=now, states=HOLDING_LEASE)
    if isinstance(job, Refused):
        return job
    if not job.cancel_requested:
        return Refused(Refusal.WRONG_STATE)
    return _end(job, JobState.CANCELLED, ())


# --- the relay's own decisions ------------------------------------------------------------------


def revoke(jobs: Jobs, member: Member, now: float) -> list[Decision]:
    """``member`` left the organisation: every outstanding job they sent or would answer fails."""
    return [
        _end(job, JobState.FAILED, (audit.JOB_FAIL,), FailureReason.REVOKED, tell=True)
        for job in _sorted(_outstanding(jobs))
        if member in (job.caller_member, job.callee_member)
    ]


def sweep(jobs: Jobs, caps: MailboxLimits, now: float) -> list[Decision]:
    """Everything time decides at ``now``: lapsed leases, expiry at 72 h (ciphertext dropped),
    forgetting 24 h later. Idempotent: sweeping again at the same ``now`` decides nothing."""
    decisions = []
    for job in _sorted(jobs.values()):
        decision = _sweep_one(job, caps, now)
        if decision is not None:
            decisions.append(decision)
    return decisions


def restart_grace(
    jobs: Jobs, now: float, grace_s: float = limits.MAILBOX_RESTART_GRACE_S
) -> list[Decision]:
    """At the relay's start-up: every held lease runs at least ``grace_s`` from ``now``.

    While the relay was down no listener could renew, so leases lapsed that say nothing about
    the listeners; sweeping them at once would fail running jobs ``indeterminate_execution``
    (and drop the answers that follow) before any listener could reconnect. A lease already
    longer is kept; nothing is audited (no job changes state). The grace protects only a
    listener that comes back: one that reconnects and reports what it holds ends the rest of
    its leases at once (:func:`reconcile`), so a lease held for a dead listener stalls nobody;
    one that never comes back (or predates the report) leaves them to lapse after the grace."""
    decisions = []
    for job in _sorted(jobs.values()):
        if job.lease_until is not None and job.lease_until < now + grace_s:
            decisions.append(Decision(job.job_id, attrs.evolve(job, lease_until=now + grace_s)))
    return decisions


def reconcile(
    jobs: Jobs, caps: MailboxLimits, member: Member, holding: Collection[str], now: float
) -> list[Decision]:
    """``member``'s listener holds exactly the jobs in ``holding``: every other lease of
    theirs is held for nobody and ends now, as it would when it lapsed.

    ``holding`` is what the listener reports (running there, or answered and not yet
    acknowledged; its journal knows both across a crash) together with what the relay handed
    to any session of theirs still open, which only that session can speak for. A delivered
    job outside it was never taken (taking it means journalling it first): queued again with
    the attempt spent, so a job that kills its listener on arrival still ends
    ``delivery_failed``, and cancelled instead when its caller asked. A running one may have
    run, somewhere: failed ``indeterminate_execution``, never delivered again, and marked
    ``lapsed`` so that a result of that run, should one come after all, still ends it. Jobs
    past their expiry are the sweep's. Idempotent; nothing is refused."""
    return [
        _lapse(job, caps)
        for job in _sorted(jobs.values())
        if job.callee_member == member
        and job.state in HOLDING_LEASE
        and job.job_id not in holding
        and now < job.expires_at
    ]


def next_deadline(jobs: Jobs, caps: MailboxLimits) -> float | None:
    """The earliest time :func:`sweep` would decide something (``None``: never)."""
    times = []
    for job in jobs.values():
        times.append(job.expires_at + caps.metadata_grace_s)
        if job.state in OUTSTANDING or job.holds_ciphertext:
            times.append(job.expires_at)
        if job.lease_until is not None:
            times.append(job.lease_until)
    return min(times, default=None)


class Mailbox:
    """The jobs in memory, keyed by job id: the functions above decide, :meth:`apply` applies."""

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        self.jobs: dict[str, Job] = {job.job_id: job for job in jobs}

    def apply(self, decision: Decision) -> Decision:
        if decision.job is None:
            self.jobs.pop(decision.job_id, None)
        else:
            self.jobs[decision.job_id] = decision.job
        return decision


# --- helpers --------------------------------------------------------------------------------------


def _outstanding(jobs: Jobs) -> list[Job]:
    return [j for j in jobs.values() if j.state in OUTSTANDING]


def _mailbox_bytes(jobs: Jobs, callee: Member) -> int:
    """The sealed bytes the relay holds in ``callee``'s mailbox: requests waiting for them and
    the answers to their jobs it still holds (until expiry)."""
    return sum(held_bytes(j) for j in jobs.values() if j.callee_member == callee)


def _count(jobs: Jobs, match: Callable[[Job], bool]) -> int:
    return sum(1 for j in _outstanding(jobs) if match(j))


def _sorted(jobs: Iterable[Job]) -> list[Job]:
    return sorted(jobs, key=lambda j: (j.created_at, j.job_id))


def _tell(job: Job) -> TellListenerCancel:
    return TellListenerCancel(job.job_id, job.org, job.callee)


def _own(
    jobs: Jobs,
    job_id: str,
    by: Member,
    *,
    caller: bool,
    now: float,
    states: Iterable[JobState] = OUTSTANDING,
) -> Job | Refused:
    """The job if ``by`` is its caller (or callee) and it is live in one of ``states``."""
    job = jobs.get(job_id)
    if job is None or by != (job.caller_member if caller else job.callee_member):
        return Refused(Refusal.UNKNOWN_JOB)
    if job.state in TERMINAL:
        return Refused(Refusal.ENDED)
    if now >= job.expires_at:
        return Refused(Refusal.EXPIRED)
    if job.state not in frozenset(states):
        return Refused(Refusal.WRONG_STATE)
    return job


def _delivered_before(
    jobs: Jobs, job_id: str, by: Member, now: float, states: Iterable[JobState]
) -> Job | Refused:
    """The callee's live job in ``states``; a queued one only if it was delivered before (a
    job never handed out cannot have been accepted or answered)."""
    job = _own(jobs, job_id, by, caller=False, now=now, states=states)
    if isinstance(job, Job) and job.state is JobState.QUEUED and job.attempts == 0:
        return Refused(Refusal.WRONG_STATE)
    return job


def _lapsed(jobs: Jobs, job_id: str, by: Member) -> bool:
    """True when the callee ``by``'s job ended because the relay saw its running lease lapse."""
    job = jobs.get(job_id)
    return job is not None and job.lapsed and job.callee_member == by


def _result_for(jobs: Jobs, job_id: str, by: Member, now: float) -> Job | Refused:
    """The job a result from its callee ``by`` may end: live and delivered before, or failed by
    the relay when its running lease lapsed and not yet expired."""
    if _lapsed(jobs, job_id, by):
        job = jobs[job_id]
        return Refused(Refusal.EXPIRED) if now >= job.expires_at else job
    return _delivered_before(jobs, job_id, by, now, _RESULT_FROM)


def _end(
    job: Job,
    state: JobState,
    events: tuple[str, ...],
    reason: FailureReason | None = None,
    *,
    tell: bool = False,
    lapsed: bool = False,
) -> Decision:
    """``job`` ends in ``state``: no lease, no sealed byte kept; with ``tell``, a listener
    holding the job is told to drop it (when the relay, not the listener, ends it); with
    ``lapsed``, marked as a running job the relay failed because its lease lapsed."""
    ended = attrs.evolve(
        job, state=state, reason=reason, lease_until=None, holds_ciphertext=False, lapsed=lapsed
    )
    effects: tuple[Effect, ...] = (DropCiphertext(job.job_id),)
    if tell and job.state in HOLDING_LEASE:
        effects += (_tell(job),)
    return Decision(job.job_id, ended, effects, events)


def _lapse(job: Job, caps: MailboxLimits) -> Decision:
    """A delivered job's attempt is over without an accept, or a running job's lease lapsed."""
    if job.cancel_requested:
        return _end(job, JobState.CANCELLED, ())
    if job.state is JobState.RUNNING:
        # Accepted means it may have run: at most once, so never delivered again. Marked as the
        # relay's own verdict, so a result its listener sends after all still replaces it.
        reason = FailureReason.INDETERMINATE_EXECUTION
        return _end(job, JobState.FAILED, (audit.JOB_FAIL,), reason, lapsed=True)
    if job.attempts >= caps.max_attempts:
        return _end(job, JobState.FAILED, (audit.JOB_FAIL,), FailureReason.DELIVERY_FAILED)
    return Decision(job.job_id, attrs.evolve(job, state=JobState.QUEUED, lease_until=None))


def _sweep_one(job: Job, caps: MailboxLimits, now: float) -> Decision | None:
    decision = None
    if now >= job.expires_at:
        if job.state in OUTSTANDING:
            decision = _end(job, JobState.EXPIRED, (audit.JOB_EXPIRE,), tell=True)
        elif job.holds_ciphertext:
            dropped = attrs.evolve(job, holds_ciphertext=False)
            decision = Decision(job.job_id, dropped, (DropCiphertext(job.job_id),))
    elif job.lease_until is not None and now >= job.lease_until:
        return _lapse(job, caps)
    if now >= job.expires_at + caps.metadata_grace_s:
        earlier = decision or Decision(job.job_id, job)
        return attrs.evolve(earlier, job=None, effects=(*earlier.effects, Forget(job.job_id)))
    return decision
