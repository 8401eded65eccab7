"""The listener's side of the offline mailbox: job frames in, job frames out, over the real
pipeline (the in-memory harness of ``test_listener_core.py``), a fake runner, a Clock, and the
execution journal in a real ``state.sqlite`` that a test can reopen as after a ``kill -9``.

Answers are opened with the caller's key, as the caller would when it fetches the job.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import capturedLogs
from zope.interface import implementer

from agentcall import limits
from agentcall.crypto import envelope as crypto_envelope
from agentcall.db import open_database
from agentcall.errors import CallErrorCode, StoreError
from agentcall.listener import core
from agentcall.listener.calllog import CallStatus
from agentcall.listener.journal import (
    Delivery,
    Entry,
    IJournal,
    Indeterminate,
    JobState,
    Redeliver,
    SqliteJournal,
    StepRefused,
    StoredReply,
)
from agentcall.listener.mailboxdesk import (
    RESULT_RETRY_FIRST_S,
    RESULT_RETRY_MAX_S,
    MailboxDesk,
    result_of,
    stored_result,
)
from agentcall.listener.policy import Access, CallerRule, Policy
from agentcall.listener.runner import AgentRun, OutputParser, RunResult
from agentcall.listener.service import make_listener_service
from agentcall.local.home import Home
from agentcall.local.statedb import STATE_SCHEMA, StateDb
from agentcall.wire import codec
from agentcall.wire.frames import (
    CallAccepted,
    CallOutcome,
    CallStarted,
    CancelCall,
    CancelJob,
    Direction,
    Frame,
    JobAccepted,
    JobAck,
    JobDeclined,
    JobDelivery,
    JobError,
    JobNack,
    JobRenew,
    JobResult,
    JobsHeld,
    SealedEnvelope,
    Terminal,
)
from agentcall.wire.payloads import CallFailure, Reply, RequestPayload
from tests.unit.crypto_helpers import NOW, ORIGIN
from tests.unit.test_listener_core import FakeRun, Harness, fired, install
from tests.unit.test_listener_stages import ANN, KEN, MALLORY, MESSAGE, run_result

JOB = "5e3f8a1b-2c4d-4e6f-8a0b-1c2d3e4f5a6b"
OTHER_JOB = "6f4a9b2c-3d5e-4f70-9b1c-2d3e4f5a6b7c"
LIVE_CALL = "0b6e0c1e-7a51-4b51-9a3d-2f0d6f1c9e11"
DAY = 24 * 3600.0


@implementer(IJournal)
class RecordingJournal:
    """The SQLite journal, with each step written into the harness's event list."""

    def __init__(self, inner: SqliteJournal, events: list[object]) -> None:
        self.inner = inner
        self.events = events

    def get(self, job_id: str) -> Entry | None:
        return self.inner.get(job_id)

    def deliver(
        self, job_id: str, *, expires_at: float, running_here: bool, now: float
    ) -> Delivery:
        decision = self.inner.deliver(
            job_id, expires_at=expires_at, running_here=running_here, now=now
        )
        self.events.append(("journal", type(decision).__name__))
        return decision

    def start(self, job_id: str, now: float) -> Entry | StepRefused:
        self.events.append(("journal", "start"))
        return self.inner.start(job_id, now)

    def seal(self, job_id: str, reply: StoredReply, now: float) -> Entry | StepRefused:
        self.events.append(("journal", "seal"))
        return self.inner.seal(job_id, reply, now)

    def acknowledge(self, job_id: str, now: float) -> Entry | StepRefused:
        self.events.append(("journal", "acknowledge"))
        return self.inner.acknowledge(job_id, now)

    def restart(self, now: float) -> tuple[Redeliver | Indeterminate, ...]:
        return self.inner.restart(now)

    def prune(self, now: float) -> int:
        return self.inner.prune(now)


@attrs.define
class JobHarness(Harness):
    """The pipeline harness with a spawner that notes, at spawn time, what the journal file
    says about the job as another process would read it (only committed rows)."""

    db_path: Path | None = None
    events: list[object] = attrs.field(factory=list)

    def spawn(
        self, run: AgentRun, parser: OutputParser
    ) -> tuple[defer.Deferred[RunResult], FakeRun]:
        self.events.append(("spawn", committed_state(self.db_path, JOB)))
        return super().spawn(run, parser)

    def send(self, frame: Frame) -> bool:
        self.events.append(("send", frame.type))
        return super().send(frame)


def committed_state(path: Path | None, job_id: str) -> str | None:
    if path is None:
        return None
    other = sqlite3.connect(path)
    try:
        row = other.execute("SELECT state FROM journal WHERE job_id = ?", (job_id,)).fetchone()
    finally:
        other.close()
    return None if row is None else str(row[0])


class Mailbox:
    """A listener's pipeline and mailbox desk over ``state.sqlite`` at ``path``."""

    def __init__(self, path: Path, **harness: Any) -> None:
        self.path = path
        self.h = JobHarness(db_path=path, **harness)
        self.conn = open_database(path, STATE_SCHEMA).connection
        self.journal = RecordingJournal(SqliteJournal(self.conn), self.h.events)
        self.desk = MailboxDesk(self.h.pipeline, self.journal, send=self.h.send, clock=self.h.clock)
        self.desk.start()
        self.requests: dict[str, RequestPayload] = {}

    def restarted(self, **harness: Any) -> Mailbox:
        """The same state.sqlite in a new process; this one is gone without another commit."""
        self.conn.close()
        return Mailbox(self.path, clock=self.h.clock, **harness)

    def deliver(
        self,
        job_id: str = JOB,
        *,
        sender: Any = ANN,
        from_: str = "ann",
        expires_at: float | None = None,
        sealed: SealedEnvelope | None = None,
        attempt: int = 1,
    ) -> None:
        if sealed is None:
            sealed, request = seal_job(sender)
            self.requests[job_id] = request
        frame = JobDelivery(
            job_id=job_id,
            from_=from_,
            envelope=sealed,
            expires_at=int(NOW + limits.MAILBOX_TTL_S if expires_at is None else expires_at),
            attempt=attempt,
        )
        self.desk.on_frame(frame)

    def results(self) -> list[JobResult]:
        return [frame for frame in self.h.sent if isinstance(frame, JobResult)]

    def answer(self, result: JobResult, job_id: str = JOB) -> tuple[Reply | CallFailure, int]:
        """Open a job's sealed answer as the caller does; also its validity in seconds."""
        assert result.envelope is not None
        payload = crypto_envelope.open_response(
            result.envelope,
            my_key=ANN.enc_key,
            my_record=ANN.enc_record,
            request=self.requests[job_id],
            responder_identity_pub=KEN.identity_pub,
            now=self.h.clock.seconds() + DAY,  # fetched a day later
        )
        return payload.outcome, payload.expires_at - payload.issued_at

    def entry(self, job_id: str = JOB) -> Entry | None:
        return self.journal.get(job_id)


def seal_job(sender: Any = ANN, message: str = MESSAGE) -> tuple[SealedEnvelope, RequestPayload]:
    """A request sealed to be queued: valid for the mailbox's whole lifetime."""
    return crypto_envelope.seal_request(
        sender=sender.identity_key,
        sender_address=sender.address,
        recipient_identity=KEN.identity.record,
        recipient_encryption=KEN.enc_record,
        relay_origin=ORIGIN,
        message=message,
        task=None,
        context_id=None,
        now=NOW,
        validity_s=limits.MAX_ENVELOPE_VALIDITY_S,
    )


@pytest.fixture
def box(tmp_path: Path) -> Mailbox:
    return Mailbox(tmp_path / "state.sqlite")


CALL_FRAMES = (CallAccepted, CallStarted, CallOutcome)


# --- a job runs once and is answered --------------------------------------------------------------


def test_a_delivered_job_runs_once_through_the_pipeline_and_is_answered(box: Mailbox) -> None:
    """job_accepted, the agent with the caller's message, then one sealed job_result that the
    caller opens days later; no call frame reaches the relay."""
    box.deliver()
    assert box.h.sent == [JobAccepted(job_id=JOB)]
    [run] = box.h.runs
    assert MESSAGE in run.run.stdin.decode()
    assert box.h.pipeline.running_call_id == JOB
    run.finish(run_result(stdout=b"Because the cache is stale."))
    [result] = box.results()
    assert result.terminal is Terminal.COMPLETED and result.error is None
    outcome, validity = box.answer(result)
    assert outcome == Reply(text="Because the cache is stale.", task="ask")
    assert validity == limits.MAX_ENVELOPE_VALIDITY_S
    assert not any(isinstance(frame, CALL_FRAMES) for frame in box.h.sent)
    [record] = box.h.records
    assert (record.call_id, record.status, record.caller) == (JOB, CallStatus.OK, "@acme/ann")
    entry = box.entry()
    assert entry is not None and entry.state is JobState.SEALED
    assert entry.reply == StoredReply(sealed=codec.encode(result))
    assert box.desk.unacknowledged == (JOB,)
    assert box.h.pipeline.running_call_id is None


def test_a_job_queued_two_days_ago_still_opens_and_runs(box: Mailbox) -> None:
    """The request was sealed for 72 h; the listener came back on day 2."""
    box.h.clock.advance(2 * DAY)
    box.deliver()
    assert len(box.h.runs) == 1
    box.h.runs[0].finish(run_result(stdout=b"late but here"))
    outcome, _ = box.answer(box.results()[0])
    assert outcome == Reply(text="late but here", task="ask")


def test_the_largest_answer_is_stored_and_sent_again_whole(box: Mailbox) -> None:
    """A reply at the reply limit still makes a job_result the journal gives back intact."""
    box.deliver()
    box.h.runs[0].finish(run_result(stdout=("ü" * limits.MAX_REPLY_BYTES).encode()))
    box.desk.relay_ready()
    first, again = box.results()
    assert first == again
    outcome, _ = box.answer(again)
    assert isinstance(outcome, Reply) and len(outcome.text.encode()) == limits.MAX_REPLY_BYTES


def test_the_journal_commits_before_the_agent_is_spawned(box: Mailbox) -> None:
    """THE ORDER: accepted row committed, job_accepted sent, started committed, then spawn;
    the result is stored before it is sent."""
    box.deliver()
    box.h.runs[0].finish(run_result(stdout=b"done"))
    assert box.h.events == [
        ("journal", "Run"),
        ("send", "job_accepted"),
        ("journal", "start"),
        ("spawn", "started"),  # as another connection reads the file at spawn time
        ("journal", "seal"),
        ("send", "job_result"),
    ]


# --- admission is unchanged -----------------------------------------------------------------------


def test_a_caller_blocked_since_queueing_gets_a_sealed_blocked_answer(box: Mailbox) -> None:
    """Admitted at delivery like a live call, before the text enters any prompt: no prompt,
    no process; the job's result is a sealed blocked failure."""
    box.h.policy = Policy(callers=[CallerRule("ann", Access.BLOCKED)])
    box.deliver()
    assert (box.h.prompts, box.h.runs) == ([], [])
    [accepted, result] = box.h.sent
    assert accepted == JobAccepted(job_id=JOB)
    assert isinstance(result, JobResult) and result.terminal is Terminal.FAILED
    outcome, validity = box.answer(result)
    assert isinstance(outcome, CallFailure) and outcome.code is CallErrorCode.BLOCKED
    assert validity == limits.MAX_ENVELOPE_VALIDITY_S
    assert box.h.records[-1].status is CallStatus.BLOCKED
    assert box.h.events.count(("journal", "start")) == 0


@pytest.mark.parametrize("case", ["tampered", "forged sender"])
def test_a_delivery_that_does_not_open_is_rejected_and_runs_nothing(
    box: Mailbox, case: str
) -> None:
    """A sealed request whose route header is ours but that does not verify for the
    relay-verified caller: journalled, then error rejected."""
    sealed, _ = seal_job()
    if case == "tampered":
        ct = sealed.ct
        sealed = attrs.evolve(sealed, ct=ct[:-3] + ("A" if ct[-3] != "A" else "B") + ct[-2:])
    else:
        sealed, _ = seal_job(MALLORY)
        sealed = attrs.evolve(sealed, from_="@acme/ann")
    box.deliver(sealed=sealed)
    assert box.h.sent == [
        JobAccepted(job_id=JOB),
        JobResult(job_id=JOB, error=JobError.REJECTED),
    ]
    assert (box.h.prompts, box.h.runs) == ([], [])
    assert box.entry() == Entry(
        JOB, JobState.SEALED, NOW, NOW, StoredReply(error=JobError.REJECTED)
    )


@pytest.mark.parametrize(
    "case",
    [
        "a response",
        "through another relay",
        "to someone else",
        "from another caller",
        "from another org",
    ],
)
def test_a_delivery_not_routed_to_us_is_rejected_and_writes_nothing(
    box: Mailbox, case: str
) -> None:
    """The envelope's clear route header must be a request from the delivery's caller, in
    this org, to this listener, through this relay: checked before any journal row."""
    sealed, _ = seal_job()
    from_ = "ann"
    if case == "a response":
        sealed = attrs.evolve(sealed, direction=Direction.RESPONSE)
    elif case == "through another relay":
        sealed = attrs.evolve(sealed, relay_origin="relay.elsewhere.example")
    elif case == "to someone else":
        sealed = attrs.evolve(sealed, to="@acme/mallory")
    elif case == "from another caller":
        from_ = "mallory"  # the relay says mallory sent ann's request
    else:
        sealed = attrs.evolve(sealed, from_="@other/ann")
    box.deliver(sealed=sealed, from_=from_)
    assert box.h.sent == [JobResult(job_id=JOB, error=JobError.REJECTED)]
    assert box.h.events == [("send", "job_result")]  # no journal step at all
    assert committed_state(box.path, JOB) is None
    assert (box.h.prompts, box.h.runs) == ([], [])


@pytest.mark.parametrize(
    ("expires_at", "runs"),
    [
        (NOW, False),  # expired
        (NOW + limits.MAILBOX_TTL_S, True),  # queued just now
    ],
)
def test_a_delivery_out_of_its_lifetime_is_rejected_unwritten(
    box: Mailbox, expires_at: float, runs: bool
) -> None:
    box.deliver(expires_at=expires_at)
    if runs:
        assert box.h.sent == [JobAccepted(job_id=JOB)] and len(box.h.runs) == 1
    else:
        assert box.h.sent == [JobResult(job_id=JOB, error=JobError.REJECTED)]
        assert (box.h.runs, box.entry()) == ([], None)


def test_a_relay_clock_ten_minutes_ahead_does_not_get_fresh_jobs_refused(box: Mailbox) -> None:
    """The relay stamps expires_at by its clock, well past the journal's skew allowance; the
    job still runs (the sealed request's own expiry is what bounds it)."""
    box.deliver(expires_at=NOW + limits.MAILBOX_TTL_S + 600)
    assert box.h.sent == [JobAccepted(job_id=JOB)]
    assert len(box.h.runs) == 1


# --- one at a time --------------------------------------------------------------------------------


def test_a_delivery_while_a_call_runs_is_declined_and_nothing_is_written(box: Mailbox) -> None:
    box.h.place(call_id=LIVE_CALL)
    box.h.sent.clear()
    box.deliver()
    assert box.h.sent == [JobDeclined(job_id=JOB)]
    assert box.entry() is None
    assert len(box.h.runs) == 1


def test_a_delivery_while_stopping_is_declined(box: Mailbox) -> None:
    box.h.pipeline.shutdown(5.0)
    box.deliver()
    assert box.h.sent == [JobDeclined(job_id=JOB)]
    assert (box.entry(), box.h.runs) == (None, [])


def test_a_second_job_while_one_runs_is_declined(box: Mailbox) -> None:
    box.deliver()
    box.deliver(OTHER_JOB)
    assert box.h.sent == [JobAccepted(job_id=JOB), JobDeclined(job_id=OTHER_JOB)]
    assert box.entry(OTHER_JOB) is None


def test_a_live_call_during_a_job_is_busy(box: Mailbox) -> None:
    """The job holds the one-call slot from its accept, before its request is even opened."""
    box.h.directory.hold = True  # the job's caller keys are still being fetched
    box.deliver()
    box.h.directory.hold = False  # the live call's come at once: it reaches the queue first
    box.h.place(call_id=LIVE_CALL)
    box.h.directory.release()
    live = [f for f in box.h.sent if isinstance(f, CallOutcome)]
    assert [f.call_id for f in live] == [LIVE_CALL]
    busy = box.h.outcome(box.h.sent.index(live[0]))
    assert isinstance(busy, CallFailure) and busy.code is CallErrorCode.BUSY
    assert len(box.h.runs) == 1  # the job's agent
    assert box.h.pipeline.running_call_id == JOB


def test_a_repeated_delivery_of_the_running_job_says_accepted_again(box: Mailbox) -> None:
    """The relay redelivers only a job it holds as delivered: it lost our accept. Nothing is
    run or written again."""
    box.deliver()
    box.deliver(attempt=2)
    assert box.h.sent == [JobAccepted(job_id=JOB), JobAccepted(job_id=JOB)]
    assert len(box.h.runs) == 1
    entry = box.entry()
    assert entry is not None and entry.state is JobState.STARTED


def test_an_accept_sent_with_no_relay_is_sent_on_the_next_ready(box: Mailbox) -> None:
    box.h.connected = False
    box.deliver()
    assert box.h.sent == []
    box.h.connected = True
    box.desk.relay_ready()
    assert box.h.sent == [JobAccepted(job_id=JOB)]
    assert len(box.h.runs) == 1


def test_every_ready_says_accepted_for_the_running_job_before_stored_results(
    box: Mailbox,
) -> None:
    """A job answered while the relay was away, then another one running: on the next ready
    the relay hears the running job's accept first, then the stored result."""
    box.deliver(OTHER_JOB)
    box.h.connected = False
    box.h.runs[0].finish(run_result(stdout=b"the first answer"))
    box.deliver()
    box.h.connected = True
    box.desk.relay_ready()
    [result] = box.results()
    assert result.job_id == OTHER_JOB
    assert box.h.sent[1:] == [JobAccepted(job_id=JOB), result]


# --- at most once across restarts and redeliveries ------------------------------------------------


@pytest.mark.parametrize("spawned", [False, True], ids=["accepted", "started"])
def test_after_a_kill_a_job_that_may_have_run_is_indeterminate_and_never_spawned(
    box: Mailbox, spawned: bool
) -> None:
    if not spawned:
        box.h.directory.hold = True  # killed while the request was being opened
    box.deliver()
    assert len(box.h.runs) == int(spawned)
    again = box.restarted()
    assert again.desk.unacknowledged == (JOB,)
    indeterminate = JobResult(job_id=JOB, error=JobError.INDETERMINATE_EXECUTION)
    again.desk.relay_ready()
    assert again.h.sent == [indeterminate]
    again.deliver(attempt=2)
    assert again.h.sent == [indeterminate, indeterminate]
    assert (again.h.runs, again.h.prompts) == ([], [])


def test_a_sealed_unacknowledged_result_is_sent_again_never_rerun(box: Mailbox) -> None:
    """On every ready, on a redelivery, and after a restart: the stored result, no new run."""
    box.deliver()
    box.h.runs[0].finish(run_result(stdout=b"the answer"))
    [result] = box.results()
    box.desk.relay_ready()
    box.deliver(attempt=2)
    assert box.results() == [result, result, result]
    assert len(box.h.runs) == 1
    again = box.restarted()
    again.desk.relay_ready()
    again.deliver(attempt=3)
    assert again.h.sent == [result, result]
    assert again.h.runs == []


def test_an_ack_stops_the_resending(box: Mailbox) -> None:
    box.deliver()
    box.h.runs[0].finish(run_result(stdout=b"the answer"))
    box.desk.on_frame(JobAck(job_id=JOB))
    entry = box.entry()
    assert entry is not None and entry.state is JobState.ACKNOWLEDGED
    sent = len(box.h.sent)
    box.desk.relay_ready()
    assert len(box.h.sent) == sent
    again = box.restarted()
    again.desk.relay_ready()
    assert again.h.sent == []


def test_results_wait_for_a_connection(box: Mailbox) -> None:
    """Finished while the relay was away: stored, then sent on the next ready."""
    box.deliver()
    box.h.connected = False
    box.h.runs[0].finish(run_result(stdout=b"the answer"))
    assert box.results() == []
    box.h.connected = True
    box.desk.relay_ready()
    [result] = box.results()
    assert box.answer(result)[0] == Reply(text="the answer", task="ask")


def test_an_ack_for_a_result_never_journalled_is_harmless(box: Mailbox) -> None:
    box.desk.on_frame(JobAck(job_id=OTHER_JOB))
    assert box.entry(OTHER_JOB) is None and box.h.sent == []


# --- cancel and renew -----------------------------------------------------------------------------


def test_cancelling_a_running_job_kills_the_agent_and_reports_canceled(box: Mailbox) -> None:
    box.deliver()
    box.desk.on_frame(CancelJob(job_id=JOB))
    [run] = box.h.runs
    assert run.cancels == 1
    assert box.results() == []  # only once the process group is gone
    run.finish(run_result(exit_code=None, signal=15, cancelled=True))
    assert box.results() == [JobResult(job_id=JOB, error=JobError.CANCELED)]
    assert box.entry() == Entry(
        JOB, JobState.SEALED, NOW, NOW, StoredReply(error=JobError.CANCELED)
    )
    assert box.h.records[-1].status is CallStatus.CANCELED
    assert box.h.pipeline.running_call_id is None


def test_a_job_cut_by_the_listener_stopping_ends_indeterminate_not_answered(box: Mailbox) -> None:
    """SIGTERM mid-run: the agent is stopped and the job's result is the journal's
    indeterminate_execution, as for a listener that died; never a sealed answer."""
    box.deliver()
    [run] = box.h.runs
    stopped = box.h.pipeline.shutdown(5.0)
    assert run.cancels == 1
    run.finish(run_result(exit_code=None, signal=15, cancelled=True))
    assert fired(stopped)
    indeterminate = JobError.INDETERMINATE_EXECUTION
    assert box.results() == [JobResult(job_id=JOB, error=indeterminate)]
    assert box.entry() == Entry(JOB, JobState.SEALED, NOW, NOW, StoredReply(error=indeterminate))
    assert box.h.events[-2:] == [("journal", "seal"), ("send", "job_result")]
    assert box.desk.unacknowledged == (JOB,)
    record = box.h.records[-1]
    assert (record.call_id, record.status, record.error) == (
        JOB,
        CallStatus.CANCELED,
        core.STOPPED_DETAIL,
    )
    assert box.h.pipeline.running_call_id is None


def test_a_lost_relay_socket_leaves_a_running_job_alone(box: Mailbox) -> None:
    """Unlike a live call, a job outlives its socket: its result waits in the journal."""
    box.deliver()
    box.h.connected = False
    box.h.pipeline.relay_lost()
    [run] = box.h.runs
    assert run.cancels == 0
    run.finish(run_result(stdout=b"done anyway"))
    box.h.connected = True
    box.desk.relay_ready()
    [result] = box.results()
    assert result.terminal is Terminal.COMPLETED


def test_cancelling_a_job_still_being_opened_spawns_nothing(box: Mailbox) -> None:
    box.h.directory.hold = True
    box.deliver()
    box.desk.on_frame(CancelJob(job_id=JOB))
    box.h.directory.release()
    assert box.results() == [JobResult(job_id=JOB, error=JobError.CANCELED)]
    assert (box.h.prompts, box.h.runs) == ([], [])


def test_cancel_of_a_job_not_running_here(box: Mailbox) -> None:
    """Never taken: canceled (nothing ran). Already answered: the stored result stands."""
    box.desk.on_frame(CancelJob(job_id=OTHER_JOB))
    assert box.h.sent == [JobResult(job_id=OTHER_JOB, error=JobError.CANCELED)]
    box.deliver()
    box.h.runs[0].finish(run_result(stdout=b"done"))
    result = box.results()[-1]
    box.desk.on_frame(CancelJob(job_id=JOB))
    assert box.results()[-1] == result and result.terminal is Terminal.COMPLETED


def test_a_live_cancel_call_does_not_touch_a_job(box: Mailbox) -> None:
    box.deliver()
    box.h.pipeline.on_frame(CancelCall(call_id=JOB))
    assert box.h.runs[0].cancels == 0


def test_a_running_job_renews_its_lease_every_renew_interval(box: Mailbox) -> None:
    box.deliver()
    renews = [JobRenew(job_id=JOB)]
    box.h.clock.advance(limits.MAILBOX_RENEW_S - 0.1)
    assert box.h.sent == [JobAccepted(job_id=JOB)]
    box.h.clock.advance(0.1)
    assert box.h.sent[1:] == renews
    box.h.clock.advance(limits.MAILBOX_RENEW_S)
    assert box.h.sent[1:] == renews * 2
    box.h.connected = False
    box.h.clock.advance(limits.MAILBOX_RENEW_S)  # a renew with no relay is simply lost
    box.h.connected = True
    box.h.clock.advance(limits.MAILBOX_RENEW_S)
    assert box.h.sent[1:] == renews * 3
    box.h.runs[0].finish(run_result(stdout=b"done"))
    box.h.clock.advance(10 * limits.MAILBOX_RENEW_S)
    assert [type(frame) for frame in box.h.sent[4:]] == [JobResult]
    assert limits.MAILBOX_RENEW_S * 3 <= limits.MAILBOX_LEASE_S


def test_a_result_the_relay_could_not_store_is_renewed_and_sent_again_with_backoff(
    box: Mailbox,
) -> None:
    """job_nack: the lease is renewed again at once and every renew interval, and the stored
    result is sent again on the same connection after 1, 2, 4 ... s (at most 30 s apart)
    until the job_ack; then both stop."""
    box.deliver()
    box.h.runs[0].finish(run_result(stdout=b"the answer"))
    [result] = box.results()
    start = len(box.h.sent)
    nack = JobNack(job_id=JOB, code=CallErrorCode.STORAGE_FULL)

    def sent_since(mark: int) -> list[Frame]:
        return box.h.sent[mark:]

    box.desk.on_frame(nack)
    assert sent_since(start) == [JobRenew(job_id=JOB)]
    box.h.clock.advance(RESULT_RETRY_FIRST_S - 0.01)
    assert sent_since(start) == [JobRenew(job_id=JOB)]
    box.h.clock.advance(0.01)
    assert sent_since(start) == [JobRenew(job_id=JOB), result]
    gaps = []
    for _ in range(7):
        mark = len(box.h.sent)
        box.desk.on_frame(nack)
        box.desk.on_frame(nack)  # a duplicate sets no second sending
        waited = 0.0
        while result not in sent_since(mark):
            box.h.clock.advance(0.5)
            waited += 0.5
        gaps.append(waited)
        assert sent_since(mark).count(result) == 1
    assert gaps == [2.0, 4.0, 8.0, 16.0, RESULT_RETRY_MAX_S, RESULT_RETRY_MAX_S, RESULT_RETRY_MAX_S]
    renews = sum(isinstance(frame, JobRenew) for frame in sent_since(start))
    assert renews >= sum(gaps) // limits.MAILBOX_RENEW_S
    box.desk.on_frame(JobAck(job_id=JOB))
    mark = len(box.h.sent)
    box.h.clock.advance(10 * RESULT_RETRY_MAX_S)
    assert sent_since(mark) == []
    entry = box.entry()
    assert entry is not None and entry.state is JobState.ACKNOWLEDGED


def test_a_nack_for_a_job_with_no_result_waiting_is_ignored(box: Mailbox) -> None:
    box.desk.on_frame(JobNack(job_id=OTHER_JOB, code=CallErrorCode.UNAVAILABLE))
    box.h.clock.advance(10 * RESULT_RETRY_MAX_S)
    assert box.h.sent == []


# --- the pure parts -------------------------------------------------------------------------------


def test_only_terminal_frames_become_results_and_a_bad_stored_frame_is_indeterminate() -> None:
    assert result_of(JOB, CallAccepted(call_id=JOB)) is None
    assert result_of(JOB, CallStarted(call_id=JOB)) is None
    assert stored_result(JOB, StoredReply(sealed=b"not a frame")) == JobResult(
        job_id=JOB, error=JobError.INDETERMINATE_EXECUTION
    )
    other = codec.encode(JobResult(job_id=OTHER_JOB, error=JobError.REJECTED))
    assert stored_result(JOB, StoredReply(sealed=other)).error is JobError.INDETERMINATE_EXECUTION


# --- the service ----------------------------------------------------------------------------------


class FakeSocket:
    """A usable relay socket as the service's RelayLink sees it."""

    usable = True

    def __init__(self, *, jobs_held: bool = False) -> None:
        self.sent: list[Frame] = []
        # Whether its relay's ready asked for jobs_held.
        self.relay_takes_jobs_held = jobs_held

    def sendMessage(self, payload: bytes, isBinary: bool) -> None:
        self.sent.append(codec.decode_frame(payload))

    def close_normally(self) -> None:
        self.usable = False


def test_the_service_restarts_the_journal_and_routes_job_frames(tmp_path: Path) -> None:
    """At start-up a job left started by a killed listener is indeterminate, reported on the
    first ready; job frames reach the desk, call frames the pipeline."""
    environ = install(tmp_path)
    db = StateDb.open(Home.from_environ(environ))
    db.journal.deliver(JOB, expires_at=NOW + DAY, running_here=False, now=NOW)
    db.journal.start(JOB, NOW)
    db.close()
    reactor = MemoryReactorClock()
    reactor.advance(NOW + 60)
    built = make_listener_service(reactor, environ)
    socket = FakeSocket()
    built.startService()
    assert built.desk.unacknowledged == (JOB,)
    built.link.attach(socket)  # type: ignore[arg-type]
    built._relay_ready()
    assert socket.sent == [JobResult(job_id=JOB, error=JobError.INDETERMINATE_EXECUTION)]
    built._on_frame(JobAck(job_id=JOB))
    assert not built.desk.unacknowledged
    assert fired(built.stopService())
    db = StateDb.open(Home.from_environ(environ))
    entry = db.journal.get(JOB)
    db.close()
    assert entry is not None and entry.state is JobState.ACKNOWLEDGED


# --- jobs_held: what this listener holds, told to a relay that asks --------------------------


class FailingJournal(RecordingJournal):
    """The journal with chosen steps failing as a broken state database does."""

    def __init__(self, inner: SqliteJournal, events: list[object], *failing: str) -> None:
        super().__init__(inner, events)
        self.failing = set(failing)

    def seal(self, job_id: str, reply: StoredReply, now: float) -> Entry | StepRefused:
        if "seal" in self.failing:
            raise StoreError("state database (journal): disk I/O error")
        return super().seal(job_id, reply, now)

    def restart(self, now: float) -> tuple[Redeliver | Indeterminate, ...]:
        if "restart" in self.failing:
            raise StoreError("state database (journal): disk I/O error")
        return super().restart(now)


def with_journal(box: Mailbox, *failing: str) -> MailboxDesk:
    """``box``'s desk again, over its journal with ``failing`` steps, started."""
    journal = FailingJournal(box.journal.inner, box.h.events, *failing)
    box.desk = MailboxDesk(box.h.pipeline, journal, send=box.h.send, clock=box.h.clock)
    box.desk.start()
    return box.desk


def test_a_relay_that_asks_hears_first_every_job_held_here(box: Mailbox) -> None:
    """The running job, then each result not yet acknowledged; then, as before, the running
    job's accept and the results."""
    box.deliver(OTHER_JOB)
    box.h.connected = False
    box.h.runs[0].finish(run_result(stdout=b"the first answer"))
    box.deliver()
    box.h.connected = True
    box.desk.relay_ready(report_held=True)
    [result] = box.results()
    assert result.job_id == OTHER_JOB
    assert box.h.sent[1:] == [
        JobsHeld(job_ids=(JOB, OTHER_JOB)),
        JobAccepted(job_id=JOB),
        result,
    ]
    assert box.desk.held() == (JOB, OTHER_JOB)


def test_a_relay_that_does_not_ask_hears_no_jobs_held(box: Mailbox) -> None:
    box.deliver()
    box.desk.relay_ready()
    assert not [frame for frame in box.h.sent if isinstance(frame, JobsHeld)]


def test_holding_nothing_is_said_too_and_an_acknowledged_result_is_not_held(box: Mailbox) -> None:
    box.desk.relay_ready(report_held=True)
    assert box.h.sent == [JobsHeld(job_ids=())]
    box.deliver()
    box.h.runs[0].finish(run_result(stdout=b"the answer"))
    assert box.desk.held() == (JOB,)
    box.desk.on_frame(JobAck(job_id=JOB))
    assert box.desk.held() == ()


def test_after_a_crash_the_indeterminate_job_is_held_and_its_result_follows(box: Mailbox) -> None:
    """The journal made the job indeterminate at start-up: it is listed as held, so the relay
    leaves it to the listener's own result, which follows; the job is reported once."""
    box.deliver()
    again = box.restarted()
    again.desk.relay_ready(report_held=True)
    assert again.h.sent == [
        JobsHeld(job_ids=(JOB,)),
        JobResult(job_id=JOB, error=JobError.INDETERMINATE_EXECUTION),
    ]


def test_a_result_the_journal_could_not_store_is_not_held(box: Mailbox) -> None:
    """Such a run must end indeterminate_execution at the relay: it is neither said to run
    nor answered, so the relay ends it at once instead of when its lease lapses."""
    desk = with_journal(box, "seal")
    box.deliver()
    assert desk.held() == (JOB,)
    box.h.runs[0].finish(run_result(stdout=b"the answer"))
    assert box.results() == []
    assert desk.held() == ()


def test_a_listener_that_could_not_read_its_journal_says_nothing(box: Mailbox) -> None:
    """An incomplete list would have the relay end leases held here: none is sent, and the
    relay lets them lapse as for an older listener."""
    box.deliver()
    again = box.restarted()
    with capturedLogs() as logged:
        desk = with_journal(again, "restart")
        desk.relay_ready(report_held=True)
    assert desk.held() is None
    assert not [frame for frame in again.h.sent if isinstance(frame, JobsHeld)]
    [unsaid] = [e for e in logged if e.get("event") == "jobs_held_unsaid"]
    assert unsaid["journal_read"] is False


def test_more_jobs_held_than_a_report_may_list_are_not_reported(
    box: Mailbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "MAILBOX_MAX_JOBS_HELD", 0)
    box.deliver()
    box.desk.relay_ready(report_held=True)
    assert box.desk.held() is None
    assert box.h.sent == [JobAccepted(job_id=JOB), JobAccepted(job_id=JOB)]


def test_the_service_tells_a_relay_that_asks_what_it_holds(tmp_path: Path) -> None:
    environ = install(tmp_path)
    db = StateDb.open(Home.from_environ(environ))
    db.journal.deliver(JOB, expires_at=NOW + DAY, running_here=False, now=NOW)
    db.close()
    reactor = MemoryReactorClock()
    reactor.advance(NOW + 60)
    built = make_listener_service(reactor, environ)
    socket = FakeSocket(jobs_held=True)
    built.startService()
    built.link.attach(socket)  # type: ignore[arg-type]
    built._relay_ready()
    assert socket.sent == [
        JobsHeld(job_ids=(JOB,)),
        JobResult(job_id=JOB, error=JobError.INDETERMINATE_EXECUTION),
    ]
    assert fired(built.stopService())


def test_a_stopped_desk_sends_no_refused_result_again(box: Mailbox) -> None:
    box.deliver()
    box.h.runs[0].finish(run_result(stdout=b"the answer"))
    box.desk.on_frame(JobNack(job_id=JOB, code=CallErrorCode.STORAGE_FULL))
    box.desk.stop()
    mark = len(box.h.sent)
    box.h.clock.advance(10 * RESULT_RETRY_MAX_S)
    assert box.h.sent[mark:] == []
    again = box.restarted()
    again.desk.relay_ready()
    assert [type(frame) for frame in again.h.sent] == [JobResult]
