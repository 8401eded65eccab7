"""The mailbox half of the relay store on a real SQLite file: rows, sealed bytes, the opt-in,
deadlines, the scope of a sweep, and the upgrade from schema v1."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcall import limits
from agentcall.db import open_database
from agentcall.errors import ApiError, StoreError
from agentcall.relay import audit, mailbox, store_jobs
from agentcall.relay.audit import AuditEntry
from agentcall.relay.mailbox import Decision, Job, JobState, MailboxLimits, Refusal, Refused
from agentcall.relay.store import (
    RELAY_SCHEMA,
    SqliteRegistry,
    SqliteRelayStore,
    open_relay_store,
)
from agentcall.relay.store_interface import (
    JobsDue,
    JobsHeld,
    JobsOf,
    MailboxStatus,
    OneJob,
    SealedBytes,
    StoredJob,
    Submission,
)
from agentcall.wire.frames import Terminal
from agentcall.wire.http import MemberRole
from tests.hypothesis_profiles import examples
from tests.unit.relay_helpers import Fired
from tests.unit.test_db_engine import only_version

T0 = 1_750_000_000.0
CAPS = MailboxLimits()
J1 = "00000000-0000-4000-8000-000000000001"
REQUEST = b'{"ct":"sealed-request-bytes"}'
ANSWER = b'{"ct":"sealed-answer-bytes"}'


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Fired]:
    opened = Fired(open_relay_store(tmp_path / "relay.sqlite"))
    opened.ensure_org("acme", T0)
    for handle in ("ana", "ken"):
        secret, _ = opened.create_invite(
            "acme",
            created_by=None,
            role=MemberRole.MEMBER,
            expires_in_days=7,
            description=None,
            now=T0,
        )
        opened.register("acme", secret, handle, None, T0)
    yield opened
    opened.close()


def enqueue(store: Fired, job_id: str = J1, *, now: float = T0, caller: str = "ana") -> object:
    def decide(jobs: mailbox.Jobs) -> list[Decision] | Refused:
        result = mailbox.enqueue(
            jobs,
            CAPS,
            job_id=job_id,
            org="acme",
            caller=caller,
            callee="ken",
            request_bytes=len(REQUEST),
            now=now,
            held_total=0,
        )
        return [result] if isinstance(result, Decision) else result

    return store.decide_jobs(
        JobsOf("acme", (caller, "ken")),
        decide,
        actor=caller,
        at=now,
        sealed=SealedBytes(job_id, request=REQUEST),
    )


def one(
    store: Fired, job_id: str, step: object, *, actor: str | None = "ken", **kw: object
) -> object:
    def decide(jobs: mailbox.Jobs) -> list[Decision] | Refused:
        result = step(jobs)  # type: ignore[operator]
        if result is None:
            return []
        return [result] if isinstance(result, Decision) else result

    return store.decide_jobs(OneJob(job_id), decide, actor=actor, at=T0 + 1, **kw)


def audit_of(store: Fired, job_id: str) -> list[tuple[str, str | None, str | None, str | None]]:
    return [
        (row.event, row.actor, row.target, row.detail)
        for row in store.audit_rows("acme", limit=500)
        if row.call_id == job_id
    ]


def test_an_enqueue_stores_the_row_the_request_and_its_audit_row(store: Fired) -> None:
    decisions = enqueue(store)
    assert isinstance(decisions, list) and len(decisions) == 1
    stored = store.get_job(J1)
    assert stored == StoredJob(decisions[0].job, request=REQUEST)
    assert audit_of(store, J1) == [(audit.JOB_QUEUE, "ana", "ken", f"bytes={len(REQUEST)}")]


def test_a_refusal_writes_nothing(store: Fired) -> None:
    enqueue(store)
    rows = len(store.audit_rows("acme", limit=500))
    assert enqueue(store) == Refused(Refusal.DUPLICATE_JOB)
    assert len(store.audit_rows("acme", limit=500)) == rows
    assert audit_of(store, J1) == [(audit.JOB_QUEUE, "ana", "ken", f"bytes={len(REQUEST)}")]


def test_a_new_job_without_its_request_is_refused_and_rolled_back(store: Fired) -> None:
    def decide(jobs: mailbox.Jobs) -> list[Decision]:
        job = Job(J1, "acme", "ana", "ken", 10, T0, T0 + 10)
        return [Decision(J1, job, audit=(audit.JOB_QUEUE,))]

    with pytest.raises(ValueError, match="sealed request"):
        store.decide_jobs(OneJob(J1), decide, actor="ana", at=T0)
    assert store.get_job(J1) is None and audit_of(store, J1) == []


def test_an_answer_replaces_the_request(store: Fired) -> None:
    enqueue(store)
    store.decide_jobs(
        JobsOf("acme", ("ken",)),
        lambda jobs: [mailbox.next_delivery(jobs, CAPS, "acme", "ken", T0)],
        actor=None,
        at=T0,
    )
    sealed = SealedBytes(J1, answer=ANSWER, terminal=Terminal.COMPLETED)
    one(
        store,
        J1,
        lambda jobs: mailbox.answer(jobs, J1, ("acme", "ken"), len(ANSWER), T0 + 1),
        sealed=sealed,
    )
    stored = store.get_job(J1)
    assert (stored.request, stored.answer, stored.terminal) == (None, ANSWER, Terminal.COMPLETED)
    assert stored.job.state is JobState.ANSWERED
    assert audit_of(store, J1)[1:] == [
        (audit.JOB_DELIVER, None, "ken", "attempt=1"),
        (audit.JOB_COMPLETE, "ken", "ana", "completed"),
    ]


def test_an_answer_without_its_bytes_is_refused(store: Fired) -> None:
    enqueue(store)
    store.decide_jobs(
        JobsOf("acme", ("ken",)),
        lambda jobs: [mailbox.next_delivery(jobs, CAPS, "acme", "ken", T0)],
        actor=None,
        at=T0,
    )
    with pytest.raises(ValueError, match="sealed answer"):
        one(store, J1, lambda jobs: mailbox.answer(jobs, J1, ("acme", "ken"), 5, T0 + 1))
    assert store.get_job(J1).job.state is JobState.DELIVERED


def test_ending_drops_every_sealed_byte_and_forgetting_the_row(store: Fired) -> None:
    enqueue(store)
    one(store, J1, lambda jobs: mailbox.cancel(jobs, J1, ("acme", "ana"), T0), actor="ana")
    stored = store.get_job(J1)
    assert (stored.job.state, stored.request, stored.answer) == (JobState.CANCELLED, None, None)
    later = T0 + CAPS.ttl_s + CAPS.metadata_grace_s
    store.decide_jobs(
        JobsDue(later, CAPS.metadata_grace_s),
        lambda jobs: mailbox.sweep(jobs, CAPS, later),
        actor=None,
        at=later,
    )
    assert store.get_job(J1) is None


def test_jobs_of_lists_both_sides_newest_first_and_bounded(store: Fired) -> None:
    for i in range(3):
        enqueue(store, f"00000000-0000-4000-8000-00000000000{i}", now=T0 + i)
    ana = [job.job_id[-1] for job in store.jobs_of("acme", "ana", 10)]
    ken = [job.job_id[-1] for job in store.jobs_of("acme", "ken", 2)]
    assert (ana, ken) == (["2", "1", "0"], ["2", "1"])
    assert store.jobs_of("acme", "bob", 10) == []


def test_mailbox_status_and_the_opt_in(store: Fired) -> None:
    assert store.mailbox_status("acme", "ken") == MailboxStatus(False, False)
    assert store.mailbox_status("acme", "nobody") is None
    store.set_offline_delivery("acme", "ken", True, T0)
    store.set_offline_delivery("acme", "ken", True, T0 + 1)
    store.set_offline_delivery("acme", "ken", False, T0 + 2)
    rows = [
        (r.event, r.actor, r.detail)
        for r in store.audit_rows("acme", limit=500)
        if r.event == audit.MEMBER_OFFLINE_DELIVERY
    ]
    assert rows == [
        (audit.MEMBER_OFFLINE_DELIVERY, "ken", "on"),
        (audit.MEMBER_OFFLINE_DELIVERY, "ken", "off"),
    ]
    with pytest.raises(ApiError) as missing:
        store.set_offline_delivery("acme", "nobody", True, T0)
    assert missing.value.status == 404
    store.set_offline_delivery("acme", "ken", True, T0)
    enqueue(store)
    store.decide_jobs(
        JobsOf("acme", ("ken",)),
        lambda jobs: [mailbox.next_delivery(jobs, CAPS, "acme", "ken", T0)],
        actor=None,
        at=T0,
    )
    assert store.mailbox_status("acme", "ken") == MailboxStatus(True, True)


def test_queued_calls_count_in_the_restored_rate_windows(store: Fired) -> None:
    enqueue(store)
    store.record(AuditEntry(audit.CALL_SUBMIT, "acme", "ana", "ken", "c1", T0 + 5, None))
    assert store.submissions_since(T0) == [
        Submission("acme", "ana", "ken", T0),
        Submission("acme", "ana", "ken", T0 + 5),
    ]


def test_a_row_no_decision_can_produce_is_a_store_error(store: Fired, tmp_path: Path) -> None:
    enqueue(store)
    raw = sqlite3.connect(tmp_path / "relay.sqlite")
    raw.execute("UPDATE jobs SET reason = 'rejected' WHERE job_id = ?", (J1,))
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="no decision can produce"):
        store.get_job(J1)


def test_a_v1_database_upgrades_with_its_members_opted_out(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    old = open_database(path, only_version(RELAY_SCHEMA, 1, tmp_path / "v1")).connection
    old.execute("INSERT INTO orgs (org, created_at) VALUES ('acme', 1)")
    old.execute(
        "INSERT INTO members (org, handle, role, token_hash, agent_kind, created_at)"
        " VALUES ('acme', 'ken', 'member', ?, NULL, 1)",
        ("0" * 64,),
    )
    old.close()
    upgraded = Fired(open_relay_store(path))
    assert upgraded.mailbox_status("acme", "ken") == MailboxStatus(False, False)
    upgraded.set_offline_delivery("acme", "ken", True, T0)
    assert upgraded.mailbox_status("acme", "ken") == MailboxStatus(True, False)
    upgraded.close()


# --- the sweep's scope and deadline match the core's over every row ----------------------------

ops = st.lists(
    st.tuples(
        st.sampled_from(["enqueue", "deliver", "accept", "answer", "wait"]),
        st.sampled_from([1.0, limits.MAILBOX_LEASE_S, 3600.0, limits.MAILBOX_TTL_S / 2]),
    ),
    max_size=25,
)


def _op(name: str, job_id: str, target: str, now: float, jobs: mailbox.Jobs) -> object:
    """One operation of the random sequences below, as the core decides it over ``jobs``."""
    ken = ("acme", "ken")
    if name == "enqueue":
        return mailbox.enqueue(
            jobs, CAPS, job_id=job_id, org="acme", caller="ana", callee="ken", request_bytes=10,
            now=now, held_total=0,
        )  # fmt: skip
    if name == "deliver":
        return mailbox.next_delivery(jobs, CAPS, "acme", "ken", now)
    if name == "accept":
        return mailbox.accept(jobs, CAPS, target, ken, now)
    if name == "answer":
        return mailbox.answer(jobs, target, ken, 5, now)
    return None


def _as_decisions(result: object) -> list[Decision]:
    return [result] if isinstance(result, Decision) else []


@settings(max_examples=examples(60), deadline=None)
@given(ops)
def test_the_due_scope_and_the_deadline_agree_with_the_core(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, float]]
) -> None:
    """Whatever the rows, the store's sweep scope and deadline are the core's over all rows."""
    path = tmp_path_factory.mktemp("due") / "relay.sqlite"
    store = Fired(open_relay_store(path))
    # Another connection to the file, as a relay started afresh would count from it.
    restarted = sqlite3.connect(path)
    box = mailbox.Mailbox()
    now = T0
    for serial, (name, wait) in enumerate(steps):
        job_id = f"00000000-0000-4000-8000-{serial:012d}"
        ids = sorted(box.jobs)
        target = ids[serial % len(ids)] if ids else job_id
        if name == "wait":
            now += wait
        sealed = None
        if name == "enqueue":
            sealed = SealedBytes(job_id, request=REQUEST)
        elif name == "answer":
            sealed = SealedBytes(target, answer=ANSWER, terminal=Terminal.FAILED)
        op = functools.partial(_op, name, job_id, target, now)
        for decision in _as_decisions(op(box.jobs)):
            box.apply(decision)
        store.decide_jobs(
            JobsOf("acme", ("ana", "ken")),
            lambda jobs, op=op: _as_decisions(op(jobs)),
            actor=None,
            at=now,
            sealed=sealed,
        )
        # The rows in the file are the core's rows.
        assert {j.job_id: j for j in store.jobs_of("acme", "ken", 500)} == box.jobs
        deadline = store.next_job_deadline(CAPS.metadata_grace_s)
        assert deadline == mailbox.next_deadline(box.jobs, CAPS)
        expected = mailbox.sweep(box.jobs, CAPS, now)
        sweep = functools.partial(mailbox.sweep, caps=CAPS, now=now)
        due = JobsDue(now, CAPS.metadata_grace_s)
        assert store.decide_jobs(due, sweep, actor=None, at=now) == expected
        for decision in expected:
            box.apply(decision)
        # The running total is the core's count over every row, and so is a fresh count.
        held = sum(mailbox.held_bytes(job) for job in box.jobs.values())
        assert store.mailbox_bytes_held() == held == store_jobs.held_bytes(restarted)
    restarted.close()
    store.close()


def test_holds_ciphertext_matches_the_sealed_table(store: Fired, tmp_path: Path) -> None:
    enqueue(store)
    raw = sqlite3.connect(tmp_path / "relay.sqlite")
    assert raw.execute("SELECT COUNT(*) FROM job_sealed").fetchone() == (1,)
    raw.close()
    one(store, J1, lambda jobs: mailbox.cancel(jobs, J1, ("acme", "ana"), T0), actor="ana")
    raw = sqlite3.connect(tmp_path / "relay.sqlite")
    assert raw.execute("SELECT COUNT(*) FROM job_sealed").fetchone() == (0,)
    raw.close()
    assert attrs.asdict(store.get_job(J1).job)["holds_ciphertext"] is False


def test_the_held_scope_loads_every_delivered_and_running_job_only(store: Fired) -> None:
    j2, j3 = (f"00000000-0000-4000-8000-00000000000{i}" for i in (2, 3))
    for job_id in (J1, j2, j3):
        enqueue(store, job_id)
    store.decide_jobs(
        JobsOf("acme", ("ken",)),
        lambda jobs: [mailbox.next_delivery(jobs, CAPS, "acme", "ken", T0)],
        actor=None,
        at=T0,
    )
    one(store, j2, lambda jobs: mailbox.cancel(jobs, j2, ("acme", "ana"), T0), actor="ana")
    seen: list[mailbox.Jobs] = []

    def look(jobs: mailbox.Jobs) -> list[Decision]:
        seen.append(jobs)
        return []

    store.decide_jobs(JobsHeld(), look, actor=None, at=T0)
    assert [(job.job_id, job.state) for job in seen[0].values()] == [(J1, JobState.DELIVERED)]


def insecure_connection(path: Path) -> sqlite3.Connection:
    """A relay database connection with secure_delete off, as SQLite builds without
    SQLITE_SECURE_DELETE open it (Debian's build turns it on by default; others do not)."""
    conn = open_database(path, RELAY_SCHEMA).connection
    conn.execute("PRAGMA secure_delete = OFF")
    return conn


def test_the_registry_turns_secure_delete_on_whatever_the_build(tmp_path: Path) -> None:
    conn = insecure_connection(tmp_path / "relay.sqlite")
    SqliteRegistry(conn)
    assert conn.execute("PRAGMA secure_delete").fetchone() == (1,)
    conn.close()


def test_dropped_ciphertext_is_not_left_in_the_file(tmp_path: Path) -> None:
    """A cancelled job's request is zeroed in the file, not left readable in a free cell."""
    path = tmp_path / "relay.sqlite"
    conn = insecure_connection(path)
    store = Fired(SqliteRelayStore(SqliteRegistry(conn)))
    marker = b"dropped-ciphertext-" * 8
    store.decide_jobs(
        JobsOf("acme", ("ana", "ken")),
        lambda jobs: [
            mailbox.enqueue(
                jobs, CAPS, job_id=J1, org="acme", caller="ana", callee="ken",
                request_bytes=len(marker), now=T0, held_total=0,
            )
        ],
        actor="ana",
        at=T0,
        sealed=SealedBytes(J1, request=marker),
    )  # fmt: skip
    one(store, J1, lambda jobs: mailbox.cancel(jobs, J1, ("acme", "ana"), T0), actor="ana")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    files = [p for p in tmp_path.iterdir() if p.name.startswith("relay.sqlite")]
    assert files and not any(marker in p.read_bytes() for p in files)
    store.close()


def test_a_v2_database_upgrades_with_its_failed_jobs_keeping_their_verdict(
    tmp_path: Path,
) -> None:
    """A v2 row cannot say whether the relay or the listener failed the job: it stays final."""
    path = tmp_path / "old.sqlite"
    old = open_database(path, only_version(RELAY_SCHEMA, 2, tmp_path / "v2")).connection
    old.execute(
        "INSERT INTO jobs (job_id, org, caller, callee, request_bytes, created_at, expires_at,"
        " state, reason, attempts, lease_until, answer_bytes, cancel_requested,"
        " holds_ciphertext, last_delivery) VALUES (?, 'acme', 'ana', 'ken', 10, ?, ?, 'failed',"
        " 'indeterminate_execution', 1, NULL, NULL, 0, 0, 1)",
        (J1, T0, T0 + CAPS.ttl_s),
    )
    old.close()
    upgraded = Fired(open_relay_store(path))
    job = upgraded.get_job(J1).job
    assert (job.state, job.lapsed) == (JobState.FAILED, False)
    upgraded.close()


def test_a_lapsed_run_and_its_late_answer_are_stored(store: Fired) -> None:
    enqueue(store)
    ken = ("acme", "ken")
    store.decide_jobs(
        JobsOf("acme", ("ken",)),
        lambda jobs: [mailbox.next_delivery(jobs, CAPS, "acme", "ken", T0)],
        actor=None,
        at=T0,
    )
    one(store, J1, lambda jobs: mailbox.accept(jobs, CAPS, J1, ken, T0))
    lapsed_at = T0 + 1 + CAPS.lease_s
    store.decide_jobs(
        JobsDue(lapsed_at, CAPS.metadata_grace_s),
        lambda jobs: mailbox.sweep(jobs, CAPS, lapsed_at),
        actor=None,
        at=lapsed_at,
    )
    job = store.get_job(J1).job
    indeterminate = mailbox.FailureReason.INDETERMINATE_EXECUTION
    assert (job.state, job.reason, job.lapsed) == (JobState.FAILED, indeterminate, True)
    sealed = SealedBytes(J1, answer=ANSWER, terminal=Terminal.COMPLETED)
    later = lapsed_at + 60
    one(store, J1, lambda jobs: mailbox.answer(jobs, J1, ken, len(ANSWER), later), sealed=sealed)
    stored = store.get_job(J1)
    assert (stored.job.state, stored.job.lapsed, stored.answer) == (
        JobState.ANSWERED,
        False,
        ANSWER,
    )


def test_the_bytes_held_are_kept_across_restarts_and_failed_transactions(tmp_path: Path) -> None:
    """The running total starts from the rows (a relay restarted with jobs kept), moves with
    every commit (a request queued, replaced by its answer, dropped at expiry), and a
    transaction that fails moves it not at all."""
    path = tmp_path / "relay.sqlite"
    store = Fired(open_relay_store(path))

    def restarted() -> Fired:
        """The store closed and opened again: its total counted afresh from the rows."""
        held = store.mailbox_bytes_held()
        store.close()
        again = Fired(open_relay_store(path))
        assert again.mailbox_bytes_held() == held
        return again

    assert store.mailbox_bytes_held() == 0
    j2 = "00000000-0000-4000-8000-000000000002"
    enqueue(store, J1)
    enqueue(store, j2)
    assert store.mailbox_bytes_held() == 2 * len(REQUEST)
    store = restarted()

    def unsealed(jobs: mailbox.Jobs) -> list[Decision]:
        job = Job("00000000-0000-4000-8000-000000000003", "acme", "ana", "ken", 10, T0, T0 + 10)
        return [Decision(job.job_id, job)]

    with pytest.raises(ValueError):
        store.decide_jobs(JobsOf("acme", ("ana", "ken")), unsealed, actor="ana", at=T0)
    assert store.mailbox_bytes_held() == 2 * len(REQUEST)
    ken = ("acme", "ken")
    store.decide_jobs(
        JobsOf("acme", ("ken",)),
        lambda jobs: [mailbox.next_delivery(jobs, CAPS, "acme", "ken", T0)],
        actor=None,
        at=T0,
    )
    sealed = SealedBytes(J1, answer=ANSWER, terminal=Terminal.COMPLETED)
    one(store, J1, lambda jobs: mailbox.answer(jobs, J1, ken, len(ANSWER), T0), sealed=sealed)
    assert store.mailbox_bytes_held() == len(ANSWER) + len(REQUEST)
    store = restarted()
    expiry = T0 + CAPS.ttl_s
    store.decide_jobs(
        JobsDue(expiry, CAPS.metadata_grace_s),
        lambda jobs: mailbox.sweep(jobs, CAPS, expiry),
        actor=None,
        at=expiry,
    )
    assert store.get_job(J1).job.state is JobState.ANSWERED  # kept, its answer dropped
    assert store.mailbox_bytes_held() == 0
    store = restarted()
    store.close()


def test_the_total_is_counted_once_not_on_every_ask(tmp_path: Path) -> None:
    """Asking for the total does not sum the table again (the relay asks before every enqueue):
    a row changed behind the registry's back is not seen until it counts afresh."""
    path = tmp_path / "relay.sqlite"
    store = Fired(open_relay_store(path))
    enqueue(store, J1)
    assert store.mailbox_bytes_held() == len(REQUEST)
    behind = sqlite3.connect(path)
    with behind:
        behind.execute("UPDATE jobs SET request_bytes = 1000")
    behind.close()
    assert store.mailbox_bytes_held() == len(REQUEST)
    store.close()
    restarted = Fired(open_relay_store(path))
    assert restarted.mailbox_bytes_held() == 1000
    restarted.close()


def test_a_queued_call_and_a_stored_answer_are_kept_against_power_loss(store: Fired) -> None:
    """The commits behind call_queued (the request kept) and behind an answer's acknowledgement
    (the answer kept) run with synchronous = FULL; a decision that keeps no sealed bytes (a
    cancel, a lease, a renewal) does not pay for it."""
    conn = store.wrapped.registry._conn
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    enqueue(store)
    assert "PRAGMA synchronous = FULL" in seen
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # back to NORMAL
    seen.clear()
    one(store, J1, lambda jobs: mailbox.cancel(jobs, J1, ("acme", "ana"), T0), actor="ana")
    assert "COMMIT" in seen and "PRAGMA synchronous = FULL" not in seen
