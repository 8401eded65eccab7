"""The execution journal: the at-most-once rules on plain values, the SQLite store across
reopening (a ``kill -9`` between any two steps), and a property over crash/redelivery runs."""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zope.interface.verify import verifyObject

from agentcall import limits
from agentcall.db import open_database
from agentcall.errors import StoreError
from agentcall.listener.journal import (
    INDETERMINATE_EXECUTION,
    INDETERMINATE_REPLY,
    Entry,
    IJournal,
    Indeterminate,
    InProgress,
    JobState,
    Redeliver,
    RefusalReason,
    Refused,
    Run,
    SqliteJournal,
    StepRefused,
    StoredReply,
    acknowledge,
    on_delivery,
    on_restart,
    seal,
    start,
)
from agentcall.local.statedb import STATE_SCHEMA

NOW = 1_750_000_000.0
TTL = limits.MAILBOX_TTL_S
SKEW = limits.CLOCK_SKEW_S
# Job ids are minted by the relay as uuid4, like call ids.
JOB = "3f2b6c1e-7a51-4b51-9a3d-2f0d6f1c9e11"
OTHER = "4a3c7d2f-8b62-4c62-8b4e-3a1e7a2d0f22"
EXPIRES = NOW + 3600
CIPHERTEXT = b"\x00sealed-outcome\xff"
ANSWER = StoredReply(sealed=CIPHERTEXT)


def entry(state: JobState, reply: StoredReply | None = None, job_id: str = JOB) -> Entry:
    return Entry(job_id, state, NOW, NOW, reply)


def deliver(found: Entry | None, *, running_here: bool = False, now: float = NOW) -> object:
    return on_delivery(found, JOB, expires_at=EXPIRES, running_here=running_here, now=now)


# --- values -------------------------------------------------------------------------------------


def test_a_stored_reply_is_ciphertext_or_an_error_code() -> None:
    """Exactly one of the two; the ciphertext is kept out of repr."""
    assert CIPHERTEXT not in repr(ANSWER).encode()
    assert INDETERMINATE_REPLY.error == INDETERMINATE_EXECUTION
    for bad in (
        {},
        {"sealed": CIPHERTEXT, "error": "agent_error"},
        {"sealed": b""},
        {"sealed": "text, not bytes"},
        {"error": "Not A Code"},
    ):
        with pytest.raises(ValueError):
            StoredReply(**bad)


def test_an_entry_holds_a_reply_exactly_when_replied() -> None:
    """accepted/started carry no reply; sealed/acknowledged must carry one; ids are checked."""
    for state in (JobState.ACCEPTED, JobState.STARTED):
        with pytest.raises(ValueError):
            entry(state, ANSWER)
    for state in (JobState.SEALED, JobState.ACKNOWLEDGED):
        with pytest.raises(ValueError):
            entry(state)
    with pytest.raises(ValueError):
        Entry("short", JobState.ACCEPTED, NOW, NOW)
    with pytest.raises(ValueError):
        Entry(JOB, JobState.ACCEPTED, float("nan"), NOW)
    with pytest.raises(ValueError):
        Entry(JOB, "running", NOW, NOW)


# --- decisions on a delivery --------------------------------------------------------------------


def test_an_unknown_job_runs_after_its_accepted_row() -> None:
    """The only way to Run: the journal has never seen the job; the row to commit comes along."""
    assert deliver(None) == Run(JOB, Entry(JOB, JobState.ACCEPTED, NOW, NOW))


@pytest.mark.parametrize("state", [JobState.ACCEPTED, JobState.STARTED])
def test_a_known_job_that_may_have_run_is_indeterminate(state: JobState) -> None:
    """Found accepted/started and not running here: never run, the verdict is stored."""
    decision = deliver(entry(state), now=NOW + 5)
    assert decision == Indeterminate(
        JOB, Entry(JOB, JobState.SEALED, NOW, NOW + 5, INDETERMINATE_REPLY)
    )
    assert isinstance(decision, Indeterminate)
    assert decision.reply.error == INDETERMINATE_EXECUTION


@pytest.mark.parametrize("state", [JobState.ACCEPTED, JobState.STARTED])
def test_a_duplicate_of_a_job_running_here_waits_for_it(state: JobState) -> None:
    """A redelivery while this process runs the job changes nothing."""
    assert deliver(entry(state), running_here=True) == InProgress(JOB)


@pytest.mark.parametrize("state", [JobState.SEALED, JobState.ACKNOWLEDGED])
@pytest.mark.parametrize("running_here", [False, True])
@pytest.mark.parametrize("reply", [ANSWER, INDETERMINATE_REPLY])
def test_a_job_with_a_stored_reply_is_redelivered(
    state: JobState, running_here: bool, reply: StoredReply
) -> None:
    """A sealed (or acknowledged) job is answered from the journal, never re-run."""
    decision = deliver(entry(state, reply), running_here=running_here)
    assert decision == Redeliver(JOB, reply)


def test_a_new_job_out_of_its_validity_is_refused() -> None:
    """Expired, or expiring later than a journal row lives: not run, nothing written."""
    on = on_delivery
    assert on(None, JOB, expires_at=NOW, running_here=False, now=NOW) == Refused(
        JOB, RefusalReason.EXPIRED
    )
    assert on(None, JOB, expires_at=NOW + TTL + SKEW + 1, running_here=False, now=NOW) == Refused(
        JOB, RefusalReason.EXPIRY_TOO_FAR
    )
    # The relay stamps the expiry by its own clock; one a little ahead of ours is allowed.
    assert isinstance(on(None, JOB, expires_at=NOW + TTL + SKEW, running_here=False, now=NOW), Run)
    # A known job is answered from its row even once expired.
    found = entry(JobState.SEALED, ANSWER)
    assert on(found, JOB, expires_at=NOW, running_here=False, now=NOW + 1) == Redeliver(JOB, ANSWER)


def test_an_entry_of_another_job_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        on_delivery(entry(JobState.SEALED, ANSWER, OTHER), JOB, expires_at=EXPIRES,
                    running_here=False, now=NOW)  # fmt: skip


# --- restart ------------------------------------------------------------------------------------


def test_restart_rules() -> None:
    """accepted/started → indeterminate; sealed → redeliver; acknowledged → nothing."""
    later = NOW + 60
    for state in (JobState.ACCEPTED, JobState.STARTED):
        assert on_restart(entry(state), later) == Indeterminate(
            JOB, Entry(JOB, JobState.SEALED, NOW, later, INDETERMINATE_REPLY)
        )
    assert on_restart(entry(JobState.SEALED, ANSWER), later) == Redeliver(JOB, ANSWER)
    assert on_restart(entry(JobState.ACKNOWLEDGED, ANSWER), later) is None


# --- steps --------------------------------------------------------------------------------------


def test_steps_follow_the_states_exhaustively() -> None:
    """Every step from every state (and from no row): the next entry or a refusal."""
    later = NOW + 1
    reply_for = {JobState.SEALED: ANSWER, JobState.ACKNOWLEDGED: ANSWER}
    for state in [None, *JobState]:
        found = None if state is None else entry(state, reply_for.get(state))
        started = start(found, JOB, later)
        sealed = seal(found, JOB, ANSWER, later)
        acked = acknowledge(found, JOB, later)
        if state is JobState.ACCEPTED:
            assert started == Entry(JOB, JobState.STARTED, NOW, later)
        else:
            assert started == StepRefused(JOB, "start", state)
        if state in (JobState.ACCEPTED, JobState.STARTED):
            assert sealed == Entry(JOB, JobState.SEALED, NOW, later, ANSWER)
        else:
            assert sealed == StepRefused(JOB, "seal", state)
        if state is JobState.SEALED:
            assert acked == Entry(JOB, JobState.ACKNOWLEDGED, NOW, later, ANSWER)
        elif state is JobState.ACKNOWLEDGED:
            assert acked == found
        else:
            assert acked == StepRefused(JOB, "acknowledge", state)


def test_a_clock_that_went_back_never_dates_an_update_before_acceptance() -> None:
    assert start(entry(JobState.ACCEPTED), JOB, NOW - 10) == Entry(JOB, JobState.STARTED, NOW, NOW)


# --- the store ----------------------------------------------------------------------------------


def open_journal(path: Path) -> tuple[sqlite3.Connection, SqliteJournal]:
    conn = open_database(path, STATE_SCHEMA).connection
    return conn, SqliteJournal(conn)


class Reopening:
    """A state.sqlite file whose journal is reopened at will, as after a kill -9."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn, self.journal = open_journal(path)

    def reopen(self) -> SqliteJournal:
        # Closing without any further commit is what a killed process leaves behind: only what
        # each step already committed.
        self.conn.close()
        self.conn, self.journal = open_journal(self.path)
        return self.journal


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Reopening]:
    reopening = Reopening(tmp_path / "state.sqlite")
    yield reopening
    reopening.conn.close()


def test_store_provides_its_interface(db: Reopening) -> None:
    assert verifyObject(IJournal, db.journal)


def store_deliver(journal: SqliteJournal, now: float = NOW, running_here: bool = False) -> object:
    return journal.deliver(JOB, expires_at=EXPIRES, running_here=running_here, now=now)


def test_accepted_is_committed_before_the_run_decision_returns(db: Reopening) -> None:
    """The Run decision comes back only once the accepted row is on disk."""
    assert isinstance(store_deliver(db.journal), Run)
    other = sqlite3.connect(db.path)
    try:
        assert other.execute("SELECT job_id, state FROM journal").fetchall() == [(JOB, "accepted")]
    finally:
        other.close()
    # The stricter sync used for that commit is not left on for everything else.
    assert db.conn.execute("PRAGMA synchronous").fetchone()[0] == 1


@pytest.mark.parametrize("crash_after", ["deliver", "start"])
def test_a_kill_before_the_reply_is_never_run_again(db: Reopening, crash_after: str) -> None:
    """kill -9 after accepted or started: the restart reports indeterminate, and every later
    delivery of the job is answered from that verdict."""
    assert isinstance(store_deliver(db.journal), Run)
    if crash_after == "start":
        assert isinstance(db.journal.start(JOB, NOW + 1), Entry)
    journal = db.reopen()
    reports = journal.restart(NOW + 10)
    assert reports == (
        Indeterminate(JOB, Entry(JOB, JobState.SEALED, NOW, NOW + 10, INDETERMINATE_REPLY)),
    )
    journal = db.reopen()
    assert store_deliver(journal, NOW + 20) == Redeliver(JOB, INDETERMINATE_REPLY)
    # The report is repeated on every restart until the relay acknowledges it.
    assert journal.restart(NOW + 30) == (Redeliver(JOB, INDETERMINATE_REPLY),)
    assert isinstance(journal.acknowledge(JOB, NOW + 31), Entry)
    journal = db.reopen()
    assert journal.restart(NOW + 40) == ()
    assert store_deliver(journal, NOW + 50) == Redeliver(JOB, INDETERMINATE_REPLY)


def test_a_sealed_reply_survives_a_kill_and_is_redelivered(db: Reopening) -> None:
    """kill -9 after sealing: the stored ciphertext is sent again, byte for byte."""
    store_deliver(db.journal)
    db.journal.start(JOB, NOW + 1)
    db.journal.seal(JOB, ANSWER, NOW + 2)
    journal = db.reopen()
    assert journal.restart(NOW + 3) == (Redeliver(JOB, ANSWER),)
    journal = db.reopen()
    assert store_deliver(journal, NOW + 4) == Redeliver(JOB, ANSWER)
    assert journal.acknowledge(JOB, NOW + 5) == Entry(
        JOB, JobState.ACKNOWLEDGED, NOW, NOW + 5, ANSWER
    )
    journal = db.reopen()
    assert journal.restart(NOW + 6) == ()
    assert journal.get(JOB) == Entry(JOB, JobState.ACKNOWLEDGED, NOW, NOW + 5, ANSWER)


def test_each_step_is_committed_on_its_own(db: Reopening) -> None:
    """Reopening after every step finds exactly the state that step wrote."""
    steps = [
        (lambda j: store_deliver(j), JobState.ACCEPTED),
        (lambda j: j.start(JOB, NOW + 1), JobState.STARTED),
        (lambda j: j.seal(JOB, ANSWER, NOW + 2), JobState.SEALED),
        (lambda j: j.acknowledge(JOB, NOW + 3), JobState.ACKNOWLEDGED),
    ]
    for step, state in steps:
        step(db.journal)
        found = db.reopen().get(JOB)
        assert found is not None
        assert found.state is state


def test_a_duplicate_while_running_here_changes_nothing(db: Reopening) -> None:
    store_deliver(db.journal)
    db.journal.start(JOB, NOW + 1)
    assert store_deliver(db.journal, NOW + 2, running_here=True) == InProgress(JOB)
    assert db.journal.get(JOB) == Entry(JOB, JobState.STARTED, NOW, NOW + 1)


def test_store_steps_out_of_order_are_refused_and_write_nothing(db: Reopening) -> None:
    assert db.journal.start(JOB, NOW) == StepRefused(JOB, "start", None)
    assert db.journal.seal(JOB, ANSWER, NOW) == StepRefused(JOB, "seal", None)
    assert db.journal.acknowledge(JOB, NOW) == StepRefused(JOB, "acknowledge", None)
    assert db.journal.get(JOB) is None
    store_deliver(db.journal)
    assert db.journal.acknowledge(JOB, NOW) == StepRefused(JOB, "acknowledge", JobState.ACCEPTED)
    assert db.journal.get(JOB) == Entry(JOB, JobState.ACCEPTED, NOW, NOW)


def test_a_refused_delivery_writes_nothing(db: Reopening) -> None:
    journal = db.journal
    assert journal.deliver(JOB, expires_at=NOW, running_here=False, now=NOW) == Refused(
        JOB, RefusalReason.EXPIRED
    )
    assert journal.get(JOB) is None
    with pytest.raises(ValueError):
        journal.deliver("../etc", expires_at=EXPIRES, running_here=False, now=NOW)


def test_only_ciphertext_is_stored(db: Reopening) -> None:
    """The reply column holds the sealed bytes given, nothing decoded from them."""
    store_deliver(db.journal)
    db.journal.seal(JOB, ANSWER, NOW + 1)
    rows = db.conn.execute("SELECT reply_sealed, reply_error FROM journal").fetchall()
    assert rows == [(CIPHERTEXT, None)]


def test_a_corrupt_row_may_have_run(db: Reopening) -> None:
    """A row that does not read as an entry is never taken for a new job."""
    store_deliver(db.journal)
    db.conn.execute("UPDATE journal SET updated_at = 'garbage'")
    with pytest.raises(StoreError, match="corrupt"):
        db.journal.get(JOB)
    assert isinstance(store_deliver(db.journal, NOW + 1), Indeterminate)
    store_deliver(db.journal)
    db.conn.execute("UPDATE journal SET accepted_at = 'x', updated_at = 'y'")
    # Even a stored reply is given up for the verdict: the row cannot be trusted to say more.
    (report,) = db.journal.restart(NOW + 2)
    assert isinstance(report, Indeterminate)
    # A row with no usable job id matches no delivery and is skipped.
    db.conn.execute("UPDATE journal SET job_id = 'bad id', state = 'started',"
                    " reply_sealed = NULL, reply_error = NULL")  # fmt: skip
    assert db.journal.restart(NOW + 3) == ()


def test_the_schema_refuses_inconsistent_rows(db: Reopening) -> None:
    """A reply without a replied state (or the reverse) cannot even be written."""
    for values in [
        (JOB, "accepted", NOW, NOW, CIPHERTEXT, None),
        (JOB, "sealed", NOW, NOW, None, None),
        (JOB, "sealed", NOW, NOW, CIPHERTEXT, "agent_error"),
        (JOB, "running", NOW, NOW, None, None),
    ]:
        with pytest.raises(sqlite3.IntegrityError):
            db.conn.execute("INSERT INTO journal VALUES (?, ?, ?, ?, ?, ?)", values)


def test_prune_drops_rows_after_the_mailbox_retention(db: Reopening) -> None:
    """Rows live MAILBOX_TTL_S (72 h) plus the clock skew after acceptance, whatever their
    state."""
    store_deliver(db.journal)
    db.journal.deliver(OTHER, expires_at=EXPIRES, running_here=False, now=NOW + 100)
    db.journal.seal(OTHER, ANSWER, NOW + 101)
    assert (TTL, SKEW) == (72 * 3600, 120)
    assert db.journal.prune(NOW + TTL + SKEW - 1) == 0
    assert db.journal.prune(NOW + TTL + SKEW) == 1
    assert db.journal.get(JOB) is None
    assert db.journal.prune(NOW + TTL + SKEW + 100) == 1
    assert db.conn.execute("SELECT COUNT(*) FROM journal").fetchone() == (0,)


def test_a_pruned_job_delivered_again_is_expired_not_run(db: Reopening) -> None:
    """The reason new jobs must expire within the retention: a pruned job is not new."""
    latest = NOW + TTL + SKEW
    db.journal.deliver(JOB, expires_at=latest, running_here=False, now=NOW)
    assert db.journal.prune(latest) == 1
    assert db.journal.deliver(JOB, expires_at=latest, running_here=False, now=latest) == Refused(
        JOB, RefusalReason.EXPIRED
    )


def test_a_closed_database_is_a_store_error(db: Reopening) -> None:
    db.conn.close()
    with pytest.raises(StoreError):
        db.journal.get(JOB)
    with pytest.raises(StoreError):
        db.journal.prune(NOW)
    with pytest.raises(StoreError):
        store_deliver(db.journal)
    with pytest.raises(StoreError):
        db.journal.start(JOB, NOW)
    db.conn, db.journal = open_journal(db.path)


# --- the property -------------------------------------------------------------------------------

JOBS = [f"{c * 8}-7a51-4b51-9a3d-2f0d6f1c9e11" for c in "abc"]
EVENTS = st.one_of(
    st.tuples(st.just("deliver"), st.sampled_from(JOBS)),
    st.tuples(st.just("start"), st.sampled_from(JOBS)),
    st.tuples(st.just("seal"), st.sampled_from(JOBS)),
    st.tuples(st.just("ack"), st.sampled_from(JOBS)),
    st.tuples(st.just("crash"), st.just("")),
    st.tuples(st.just("restart"), st.just("")),
    st.tuples(st.just("prune"), st.just("")),
    st.tuples(st.just("wait"), st.sampled_from(["", "day"])),
)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(EVENTS, max_size=30),
    lifetimes=st.lists(st.floats(min_value=3600, max_value=TTL + SKEW), min_size=3, max_size=3),
)
def test_no_crash_restart_or_redelivery_ever_runs_a_job_twice(
    events: list[tuple[str, str]], lifetimes: list[float]
) -> None:
    """Any interleaving of deliveries, steps, kill -9, restarts, prunes and time passing: each
    job's agent is started at most once, and a job with a stored reply keeps that reply."""
    expires = {job: NOW + life for job, life in zip(JOBS, lifetimes, strict=True)}
    runs = dict.fromkeys(JOBS, 0)
    running: set[str] = set()
    replies: dict[str, StoredReply] = {}
    now = NOW
    with tempfile.TemporaryDirectory() as tmp:
        db = Reopening(Path(tmp) / "state.sqlite")
        try:
            for kind, job in events:
                now += 1
                if kind == "deliver":
                    decision = db.journal.deliver(
                        job, expires_at=expires[job], running_here=job in running, now=now
                    )
                    if isinstance(decision, Run):
                        runs[job] += 1
                        running.add(job)
                    elif isinstance(decision, Indeterminate):
                        replies.setdefault(job, decision.reply)
                    elif isinstance(decision, Redeliver):
                        assert decision.reply == replies[job]
                elif kind == "start" and job in running:
                    db.journal.start(job, now)
                elif kind == "seal" and job in running:
                    sealed = db.journal.seal(job, StoredReply(sealed=job.encode()), now)
                    assert isinstance(sealed, Entry)
                    assert sealed.reply is not None
                    replies[job] = sealed.reply
                    running.discard(job)
                elif kind == "ack":
                    db.journal.acknowledge(job, now)
                elif kind == "crash":
                    # kill -9: nothing runs any more; deliveries may come before the restart.
                    running.clear()
                    db.reopen()
                elif kind == "restart" and not running:
                    # The start-up pass: it runs before this process starts any agent.
                    for report in db.journal.restart(now):
                        replies.setdefault(report.job_id, report.reply)
                        assert report.reply == replies[report.job_id]
                elif kind == "prune":
                    db.journal.prune(now)
                elif kind == "wait":
                    now += 24 * 3600 if job == "day" else 60
                assert all(count <= 1 for count in runs.values()), runs
        finally:
            db.conn.close()
