"""The offline mailbox's pure core: caps, fair delivery under leases, outcomes, expiry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcall import limits
from agentcall.relay import audit
from agentcall.relay.mailbox import (
    HOLDING_LEASE,
    OUTSTANDING,
    TERMINAL,
    Decision,
    DropCiphertext,
    DropRequest,
    FailureReason,
    Forget,
    Job,
    JobState,
    Mailbox,
    MailboxLimits,
    Refusal,
    Refused,
    TellListenerCancel,
    accept,
    answer,
    cancel,
    cancel_done,
    decline,
    enqueue,
    fail,
    held_bytes,
    next_deadline,
    next_delivery,
    reconcile,
    renew,
    restart_grace,
    revoke,
    sweep,
)
from tests.hypothesis_profiles import examples

CAPS = MailboxLimits()
ORG = "acme"
KEN = (ORG, "ken")
ANA = (ORG, "ana")
T0 = 1_000_000.0
TTL = limits.MAILBOX_TTL_S
GRACE = limits.MAILBOX_METADATA_GRACE_S
LEASE = limits.MAILBOX_LEASE_S


def ok(result: Decision | Refused | None) -> Decision:
    assert isinstance(result, Decision), result
    return result


def queue(
    box: Mailbox,
    job_id: str,
    *,
    caller: str = "ana",
    callee: str = "ken",
    size: int = 100,
    now: float = T0,
    caps: MailboxLimits = CAPS,
    held_total: int | None = None,
) -> Decision | Refused:
    """Enqueue into ``box``; the relay-wide total is the box's own unless one is given."""
    if held_total is None:
        held_total = total(box)
    result = enqueue(
        box.jobs,
        caps,
        job_id=job_id,
        org=ORG,
        caller=caller,
        callee=callee,
        request_bytes=size,
        now=now,
        held_total=held_total,
    )
    if isinstance(result, Decision):
        box.apply(result)
    return result


def total(box: Mailbox) -> int:
    return sum(held_bytes(job) for job in box.jobs.values())


def deliver(box: Mailbox, now: float = T0, callee: str = "ken") -> Decision:
    return box.apply(ok(next_delivery(box.jobs, CAPS, ORG, callee, now)))


def run(box: Mailbox, step: Callable[[], Decision | Refused | None]) -> Decision:
    return box.apply(ok(step()))


def swept(box: Mailbox, now: float) -> list[Decision]:
    return [box.apply(d) for d in sweep(box.jobs, CAPS, now)]


def state(box: Mailbox, job_id: str) -> JobState:
    return box.jobs[job_id].state


# --- enqueue and caps -----------------------------------------------------------------------------


def test_enqueue_keeps_metadata_for_72_hours_and_audits_a_queue() -> None:
    """A queued job records sizes and times, never content, and implies job.queue."""
    box = Mailbox()
    decision = ok(queue(box, "j1", size=1234))
    assert decision.audit == (audit.JOB_QUEUE,)
    assert decision.effects == ()
    job = box.jobs["j1"]
    assert (job.state, job.request_bytes, job.attempts) == (JobState.QUEUED, 1234, 0)
    assert (job.created_at, job.expires_at) == (T0, T0 + 72 * 3600)
    assert job.holds_ciphertext and job.lease_until is None


def test_the_eleventh_outstanding_job_of_a_caller_is_busy() -> None:
    """Ten outstanding jobs per caller across callees; the eleventh is refused busy."""
    box = Mailbox()
    for i in range(10):
        ok(queue(box, f"j{i}", callee=("ken", "lee")[i % 2]))
    assert queue(box, "j10", callee="max") == Refused(Refusal.BUSY)
    assert "j10" not in box.jobs
    # Another caller is unaffected, and an ended job frees its slot.
    ok(queue(box, "b1", caller="bo"))
    run(box, lambda: cancel(box.jobs, "j0", ANA, T0))
    ok(queue(box, "j10"))


def test_delivered_and_running_jobs_count_as_outstanding() -> None:
    caps = attrs.evolve(CAPS, max_outstanding_per_caller=2)
    box = Mailbox()
    ok(queue(box, "j1", caps=caps))
    ok(queue(box, "j2", caps=caps, callee="lee"))
    deliver(box)
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    assert queue(box, "j3", caps=caps) == Refused(Refusal.BUSY)


def test_per_callee_queue_length_cap() -> None:
    caps = attrs.evolve(CAPS, max_queued_per_callee=3)
    box = Mailbox()
    for i, caller in enumerate(["ana", "bo", "cy"]):
        ok(queue(box, f"j{i}", caller=caller, caps=caps))
    assert queue(box, "j3", caller="di", caps=caps) == Refused(Refusal.CALLEE_QUEUE_FULL)
    ok(queue(box, "j4", caller="di", callee="lee", caps=caps))


def test_per_callee_stored_bytes_cap() -> None:
    """Bytes of requests held for a callee stay at or under the cap; exactly full is allowed."""
    caps = attrs.evolve(CAPS, max_queued_bytes_per_callee=1000)
    box = Mailbox()
    ok(queue(box, "j1", size=600, caps=caps))
    assert queue(box, "j2", caller="bo", size=401, caps=caps) == Refused(Refusal.CALLEE_BYTES_FULL)
    ok(queue(box, "j3", caller="bo", size=400, caps=caps))
    # An answered job no longer holds its request, only its (smaller) answer.
    deliver(box)
    run(box, lambda: answer(box.jobs, "j1", KEN, 50, T0))
    ok(queue(box, "j4", caller="cy", size=550, caps=caps))


def test_answers_held_for_a_callee_count_toward_its_byte_cap_until_dropped() -> None:
    """A callee's mailbox is its waiting requests plus the answers the relay holds for its jobs
    (until their expiry): answering does not make room for unbounded new requests."""
    caps = attrs.evolve(CAPS, max_queued_bytes_per_callee=1000)
    box = Mailbox()
    ok(queue(box, "j1", size=100, caps=caps))
    deliver(box)
    run(box, lambda: answer(box.jobs, "j1", KEN, 900, T0))
    assert queue(box, "j2", caller="bo", size=101, caps=caps) == Refused(Refusal.CALLEE_BYTES_FULL)
    ok(queue(box, "j3", caller="bo", size=100, caps=caps, now=T0 + 1))
    # Another callee's answers are not ken's.
    ok(queue(box, "l1", caller="cy", callee="lee", size=1000, caps=caps))
    swept(box, T0 + TTL)  # j1's answer is dropped at its expiry; j3 still waits
    ok(queue(box, "j4", caller="bo", size=900, caps=caps, now=T0 + TTL))


def test_a_request_larger_than_the_whole_byte_cap_is_too_large() -> None:
    caps = attrs.evolve(CAPS, max_queued_bytes_per_callee=1000)
    assert queue(Mailbox(), "j1", size=1001, caps=caps) == Refused(Refusal.TOO_LARGE)


def test_default_byte_cap_holds_the_largest_request() -> None:
    assert limits.MAILBOX_MAX_QUEUED_BYTES_PER_CALLEE > limits.MAX_REQUEST_CIPHERTEXT_BYTES
    ok(queue(Mailbox(), "j1", size=limits.MAX_REQUEST_CIPHERTEXT_BYTES))


def test_the_relay_wide_byte_cap_refuses_new_requests_to_anyone() -> None:
    """Every callee's mailbox together stays at or under the relay's cap (exactly full is
    allowed); a refusal changes nothing that is kept, and a new request fits again once
    something is dropped."""
    caps = attrs.evolve(CAPS, max_held_bytes_total=1000)
    box = Mailbox()
    ok(queue(box, "j1", size=600, caps=caps))
    kept = dict(box.jobs)
    refused = queue(box, "l1", caller="bo", callee="lee", size=401, caps=caps)
    assert refused == Refused(Refusal.RELAY_BYTES_FULL)
    assert box.jobs == kept
    ok(queue(box, "l2", caller="bo", callee="lee", size=400, caps=caps))
    assert total(box) == 1000
    run(box, lambda: cancel(box.jobs, "j1", ANA, T0))
    ok(queue(box, "m1", caller="cy", callee="mo", size=600, caps=caps))


def test_the_relay_wide_total_comes_from_the_caller_not_the_rows_in_scope() -> None:
    """The rows a store hands an enqueue are the caller's and the callee's only; what everyone
    else's mailboxes hold comes in as ``held_total``."""
    caps = attrs.evolve(CAPS, max_held_bytes_total=1000)
    box = Mailbox()
    assert queue(box, "j1", size=100, caps=caps, held_total=901) == Refused(
        Refusal.RELAY_BYTES_FULL
    )
    ok(queue(box, "j1", size=100, caps=caps, held_total=900))


def test_answers_held_count_toward_the_relay_wide_cap() -> None:
    caps = attrs.evolve(CAPS, max_held_bytes_total=1000)
    box = Mailbox()
    ok(queue(box, "j1", size=100, caps=caps))
    deliver(box)
    run(box, lambda: answer(box.jobs, "j1", KEN, 900, T0))
    assert total(box) == 900
    assert queue(box, "l1", caller="bo", callee="lee", size=101, caps=caps) == Refused(
        Refusal.RELAY_BYTES_FULL
    )
    swept(box, T0 + TTL)  # the answer is dropped at its expiry
    ok(queue(box, "l1", caller="bo", callee="lee", size=1000, caps=caps, now=T0 + TTL))


def test_the_callers_and_the_callees_own_caps_are_named_before_the_relays() -> None:
    """A caller told ``relay_bytes_full`` could do nothing about it; one told its own cap or
    the callee's can."""
    caps = attrs.evolve(
        CAPS,
        max_outstanding_per_caller=1,
        max_queued_bytes_per_callee=500,
        max_held_bytes_total=500,
    )
    box = Mailbox()
    ok(queue(box, "j1", size=500, caps=caps))
    assert queue(box, "j2", size=1, caps=caps) == Refused(Refusal.BUSY)
    assert queue(box, "j3", caller="bo", size=1, caps=caps) == Refused(Refusal.CALLEE_BYTES_FULL)
    assert queue(box, "l1", caller="bo", callee="lee", size=1, caps=caps) == Refused(
        Refusal.RELAY_BYTES_FULL
    )


@pytest.mark.parametrize(
    ("changes", "held"),
    [
        ({}, 100),
        ({"state": JobState.DELIVERED, "attempts": 1, "lease_until": T0 + LEASE}, 100),
        ({"state": JobState.RUNNING, "attempts": 1, "lease_until": T0 + LEASE}, 100),
        ({"state": JobState.ANSWERED, "attempts": 1, "answer_bytes": 70}, 70),
        ({"state": JobState.ANSWERED, "answer_bytes": 70, "holds_ciphertext": False}, 0),
        ({"state": JobState.CANCELLED, "holds_ciphertext": False}, 0),
        ({"state": JobState.EXPIRED, "holds_ciphertext": False}, 0),
    ],
)
def test_what_a_job_holds_is_its_request_while_outstanding_then_its_answer(
    changes: dict[str, Any], held: int
) -> None:
    assert held_bytes(attrs.evolve(Job("j1", ORG, "ana", "ken", 100, T0, T0 + TTL), **changes)) == (
        held
    )


def test_duplicate_job_id_is_refused() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    assert queue(box, "j1", caller="bo") == Refused(Refusal.DUPLICATE_JOB)


def test_an_empty_request_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="request_bytes"):
        queue(Mailbox(), "j1", size=0)


# --- delivery, leases, retries -------------------------------------------------------------------


def test_delivery_takes_a_lease_and_accept_starts_running() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    d = deliver(box, T0 + 5)
    assert d.audit == (audit.JOB_DELIVER,)
    job = box.jobs["j1"]
    assert (job.state, job.attempts, job.lease_until) == (JobState.DELIVERED, 1, T0 + 5 + LEASE)
    a = run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0 + 6))
    assert a.audit == (audit.JOB_ACCEPT,)
    assert (state(box, "j1"), box.jobs["j1"].lease_until) == (JobState.RUNNING, T0 + 6 + LEASE)
    r = run(box, lambda: renew(box.jobs, CAPS, "j1", KEN, T0 + 30))
    assert r.audit == () and box.jobs["j1"].lease_until == T0 + 30 + LEASE
    # Renewed in time, the run outlives its first lease.
    assert swept(box, T0 + 40) == []


def test_one_delivery_at_a_time_per_callee() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    ok(queue(box, "j2", caller="bo"))
    ok(queue(box, "l1", callee="lee"))
    deliver(box)
    assert next_delivery(box.jobs, CAPS, ORG, "ken", T0) is None
    deliver(box, callee="lee")  # another callee is independent
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    assert next_delivery(box.jobs, CAPS, ORG, "ken", T0) is None
    run(box, lambda: answer(box.jobs, "j1", KEN, 10, T0 + 1))
    assert ok(next_delivery(box.jobs, CAPS, ORG, "ken", T0 + 1)).job_id == "j2"


def test_nothing_to_deliver() -> None:
    assert next_delivery({}, CAPS, ORG, "ken", T0) is None


def test_a_lapsed_lease_is_retried_then_fails_delivery_after_three_attempts() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    now = T0
    for attempt in (1, 2):
        deliver(box, now)
        assert swept(box, now + LEASE - 0.001) == []
        (d,) = swept(box, now + LEASE)
        assert d.audit == () and d.effects == ()
        assert (state(box, "j1"), box.jobs["j1"].attempts) == (JobState.QUEUED, attempt)
        assert box.jobs["j1"].lease_until is None
        now += LEASE + 1
    deliver(box, now)
    (d,) = swept(box, now + LEASE)
    job = box.jobs["j1"]
    assert (job.state, job.reason, job.attempts) == (
        JobState.FAILED,
        FailureReason.DELIVERY_FAILED,
        3,
    )
    assert d.audit == (audit.JOB_FAIL,) and d.effects == (DropCiphertext("j1"),)
    assert not job.holds_ciphertext


def test_decline_gives_the_attempt_back() -> None:
    """A busy listener says so; only silence spends attempts, so declines never fail a job."""
    box = Mailbox()
    ok(queue(box, "j1"))
    for _ in range(CAPS.max_attempts + 2):
        deliver(box)
        d = run(box, lambda: decline(box.jobs, CAPS, "j1", KEN, T0))
        job = box.jobs["j1"]
        assert (job.state, job.attempts, job.lease_until) == (JobState.QUEUED, 0, None)
        assert d.audit == () and d.effects == ()
    # Silence still counts: three lapsed leases end it.
    for n in range(CAPS.max_attempts):
        deliver(box, T0 + n * (LEASE + 1))
        swept(box, T0 + n * (LEASE + 1) + LEASE)
    assert box.jobs["j1"].reason is FailureReason.DELIVERY_FAILED


def test_a_declined_job_that_was_being_cancelled_ends_cancelled() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    run(box, lambda: cancel(box.jobs, "j1", ANA, T0))
    run(box, lambda: decline(box.jobs, CAPS, "j1", KEN, T0))
    assert state(box, "j1") is JobState.CANCELLED


def test_a_running_job_whose_lease_lapses_is_indeterminate_never_rerun() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0 + 1))
    (d,) = swept(box, T0 + 1 + LEASE)
    assert box.jobs["j1"].reason is FailureReason.INDETERMINATE_EXECUTION
    assert d.audit == (audit.JOB_FAIL,)
    assert next_delivery(box.jobs, CAPS, ORG, "ken", T0 + 100) is None


def test_listener_reports_indeterminate_after_a_restart() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    reason = FailureReason.INDETERMINATE_EXECUTION
    d = run(box, lambda: fail(box.jobs, "j1", KEN, reason, T0 + 5))
    assert (d.audit, d.effects) == ((audit.JOB_FAIL,), (DropCiphertext("j1"),))
    assert box.jobs["j1"].reason is reason


def test_answer_records_its_size_and_drops_the_request() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    d = run(box, lambda: answer(box.jobs, "j1", KEN, 777, T0 + 9))
    assert (d.audit, d.effects) == ((audit.JOB_COMPLETE,), (DropRequest("j1"),))
    job = box.jobs["j1"]
    assert (job.state, job.answer_bytes, job.lease_until) == (JobState.ANSWERED, 777, None)
    assert job.holds_ciphertext  # the answer, until 72 h
    with pytest.raises(ValueError, match="at least one byte"):
        answer({"j2": attrs.evolve(job, job_id="j2", state=JobState.RUNNING,
                                   answer_bytes=None, lease_until=T0 + 30)},
               "j2", KEN, 0, T0)  # fmt: skip


def test_a_policy_refusal_answers_a_delivered_job_without_accept() -> None:
    """``blocked`` is a sealed answer, sent before any accept."""
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    ok(answer(box.jobs, "j1", KEN, 90, T0))


def test_only_the_callee_acts_as_listener_and_only_the_caller_cancels() -> None:
    """Someone else's job looks exactly like no job."""
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    unknown = Refused(Refusal.UNKNOWN_JOB)
    assert accept(box.jobs, CAPS, "j1", ANA, T0) == unknown
    assert accept(box.jobs, CAPS, "j1", ("beta", "ken"), T0) == unknown
    assert answer(box.jobs, "j1", ANA, 5, T0) == unknown
    assert cancel(box.jobs, "j1", KEN, T0) == unknown
    assert cancel(box.jobs, "nope", ANA, T0) == unknown


def test_wrong_state_refusals() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    wrong = Refused(Refusal.WRONG_STATE)
    assert accept(box.jobs, CAPS, "j1", KEN, T0) == wrong
    assert renew(box.jobs, CAPS, "j1", KEN, T0) == wrong
    assert answer(box.jobs, "j1", KEN, 5, T0) == wrong
    deliver(box)
    assert cancel_done(box.jobs, "j1", KEN, T0) == wrong
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    assert accept(box.jobs, CAPS, "j1", KEN, T0) == wrong
    assert decline(box.jobs, CAPS, "j1", KEN, T0) == wrong


# --- fairness -----------------------------------------------------------------------------------


def test_one_callers_ten_jobs_do_not_starve_anothers_one() -> None:
    box = Mailbox()
    for i in range(10):
        ok(queue(box, f"a{i}", now=T0 + i))
    ok(queue(box, "b0", caller="bo", now=T0 + 20))
    order = []
    for step in range(11):
        d = deliver(box, T0 + 100 + step)
        order.append(d.job_id)
        box.apply(ok(answer(box.jobs, d.job_id, KEN, 1, T0 + 100 + step)))
    assert order[:2] == ["a0", "b0"]
    assert order[2:] == [f"a{i}" for i in range(1, 10)]


def test_a_retried_job_waits_behind_other_callers() -> None:
    box = Mailbox()
    ok(queue(box, "a0"))
    ok(queue(box, "b0", caller="bo", now=T0 + 1))
    deliver(box, T0 + 2)
    swept(box, T0 + 2 + LEASE)
    assert deliver(box, T0 + 100).job_id == "b0"


def test_fairness_survives_a_replay_from_rows() -> None:
    """The round-robin position is in the rows: a rebuilt mailbox picks the same job."""
    box = Mailbox()
    ok(queue(box, "a0"))
    ok(queue(box, "a1", now=T0 + 1))
    ok(queue(box, "b0", caller="bo", now=T0 + 2))
    deliver(box)
    run(box, lambda: answer(box.jobs, "a0", KEN, 1, T0 + 3))
    rebuilt = Mailbox(list(box.jobs.values()))
    assert deliver(rebuilt, T0 + 4).job_id == deliver(box, T0 + 4).job_id == "b0"


@settings(max_examples=examples(200))
@given(
    arrivals=st.lists(
        st.tuples(st.sampled_from(["ana", "bo", "cy", "di"]), st.integers(0, 50)),
        min_size=1,
        max_size=30,
    ),
    lapses=st.lists(st.booleans(), max_size=60),
)
def test_delivery_never_serves_a_caller_twice_while_another_waits(
    arrivals: list[tuple[str, int]], lapses: list[bool]
) -> None:
    """Whatever the arrivals and lapsed leases, no caller is served twice in a row while
    another caller has a queued job; within a caller, the oldest goes first."""
    caps = attrs.evolve(CAPS, max_outstanding_per_caller=30, max_queued_per_callee=100)
    box = Mailbox()
    for i, (caller, at) in enumerate(arrivals):
        queue(box, f"j{i:02}", caller=caller, now=T0 + at, caps=caps)
    now = T0 + 60
    previous: str | None = None
    outcomes = iter(lapses)
    while True:
        waiting = [j for j in box.jobs.values() if j.state is JobState.QUEUED]
        d = next_delivery(box.jobs, caps, ORG, "ken", now)
        if d is None:
            assert not waiting
            break
        job = box.apply(d).job
        assert job is not None
        if any(j.caller != previous for j in waiting):
            assert job.caller != previous
        mine = [j for j in waiting if j.caller == job.caller]
        assert (job.created_at, job.job_id) == min((j.created_at, j.job_id) for j in mine)
        previous = job.caller
        if next(outcomes, False):
            now += LEASE
            swept(box, now)
        else:
            box.apply(ok(answer(box.jobs, job.job_id, KEN, 1, now)))
        now += 1


# --- cancel ------------------------------------------------------------------------------------


def test_cancel_a_queued_job_removes_it_from_the_queue() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    d = run(box, lambda: cancel(box.jobs, "j1", ANA, T0 + 1))
    assert (d.audit, d.effects) == ((audit.JOB_CANCEL,), (DropCiphertext("j1"),))
    assert state(box, "j1") is JobState.CANCELLED
    assert next_delivery(box.jobs, CAPS, ORG, "ken", T0 + 2) is None


@pytest.mark.parametrize("started", [False, True])
def test_cancel_a_held_job_tells_the_listener_then_ends_on_its_word(started: bool) -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    if started:
        run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    d = run(box, lambda: cancel(box.jobs, "j1", ANA, T0 + 1))
    assert d.effects == (TellListenerCancel("j1", ORG, "ken"),)
    assert d.audit == (audit.JOB_CANCEL,)
    assert state(box, "j1") in HOLDING_LEASE and box.jobs["j1"].cancel_requested
    assert cancel(box.jobs, "j1", ANA, T0 + 2) == Refused(Refusal.CANCEL_PENDING)
    done = run(box, lambda: cancel_done(box.jobs, "j1", KEN, T0 + 3))
    assert (done.audit, done.effects) == ((), (DropCiphertext("j1"),))
    assert state(box, "j1") is JobState.CANCELLED


@pytest.mark.parametrize("started", [False, True])
def test_a_cancelled_job_whose_lease_lapses_ends_cancelled_not_retried(started: bool) -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    if started:
        run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    run(box, lambda: cancel(box.jobs, "j1", ANA, T0 + 1))
    swept(box, T0 + LEASE)
    assert state(box, "j1") is JobState.CANCELLED


def test_an_answer_that_wins_the_race_with_cancel_ends_the_job_answered() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    run(box, lambda: cancel(box.jobs, "j1", ANA, T0 + 1))
    run(box, lambda: answer(box.jobs, "j1", KEN, 12, T0 + 2))
    assert state(box, "j1") is JobState.ANSWERED


# --- expiry --------------------------------------------------------------------------------------


@pytest.mark.parametrize("hold", ["queued", "delivered", "running"])
def test_an_outstanding_job_expires_at_72_hours(hold: str) -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    if hold != "queued":
        deliver(box, T0 + TTL - 20)
    if hold == "running":
        run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0 + TTL - 10))
    assert swept(box, T0 + TTL - 0.001) == []
    (d,) = swept(box, T0 + TTL)
    assert d.audit == (audit.JOB_EXPIRE,)
    told = (TellListenerCancel("j1", ORG, "ken"),) if hold != "queued" else ()
    assert d.effects == (DropCiphertext("j1"), *told)
    job = box.jobs["j1"]
    assert (job.state, job.holds_ciphertext, job.lease_until) == (JobState.EXPIRED, False, None)
    # Metadata is visible 24 hours more, then forgotten.
    assert swept(box, T0 + TTL + GRACE - 0.001) == []
    (gone,) = swept(box, T0 + TTL + GRACE)
    assert (gone.job, gone.effects, gone.audit) == (None, (Forget("j1"),), ())
    assert box.jobs == {}


def test_an_expired_queued_job_is_never_delivered_nor_acted_on_before_the_sweep() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    assert next_delivery(box.jobs, CAPS, ORG, "ken", T0 + TTL) is None
    deliver(box, T0 + TTL - 1)
    assert accept(box.jobs, CAPS, "j1", KEN, T0 + TTL) == Refused(Refusal.EXPIRED)
    assert cancel(box.jobs, "j1", ANA, T0 + TTL) == Refused(Refusal.EXPIRED)


def test_an_answer_is_dropped_at_72_hours_and_its_metadata_forgotten_24_later() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    run(box, lambda: answer(box.jobs, "j1", KEN, 5, T0 + 1))
    (d,) = swept(box, T0 + TTL)
    assert (d.effects, d.audit) == ((DropCiphertext("j1"),), ())
    job = box.jobs["j1"]
    assert (job.state, job.answer_bytes, job.holds_ciphertext) == (JobState.ANSWERED, 5, False)
    assert swept(box, T0 + TTL + 1) == []
    (gone,) = swept(box, T0 + TTL + GRACE)
    assert gone.effects == (Forget("j1"),)


def test_a_late_sweep_expires_drops_and_forgets_in_one_decision() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    (d,) = swept(box, T0 + TTL + GRACE + 5)
    assert d.job is None and d.audit == (audit.JOB_EXPIRE,)
    assert d.effects == (DropCiphertext("j1"), Forget("j1"))


def test_next_deadline_is_the_earliest_thing_time_decides() -> None:
    box = Mailbox()
    assert next_deadline(box.jobs, CAPS) is None
    ok(queue(box, "j1"))
    assert next_deadline(box.jobs, CAPS) == T0 + TTL
    deliver(box, T0 + 7)
    assert next_deadline(box.jobs, CAPS) == T0 + 7 + LEASE
    run(box, lambda: answer(box.jobs, "j1", KEN, 1, T0 + 8))
    assert next_deadline(box.jobs, CAPS) == T0 + TTL
    swept(box, T0 + TTL)
    assert next_deadline(box.jobs, CAPS) == T0 + TTL + GRACE


# --- revocation and terminal states ----------------------------------------------------------


def test_revoking_a_member_fails_every_job_they_sent_or_would_answer() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    ok(queue(box, "j2", caller="bo"))
    ok(queue(box, "j3", caller="ken", callee="lee"))
    ok(queue(box, "j4", caller="bo", callee="lee"))
    deliver(box)
    decisions = [box.apply(d) for d in revoke(box.jobs, KEN, T0 + 1)]
    assert [d.job_id for d in decisions] == ["j1", "j2", "j3"]
    assert decisions[0].effects == (DropCiphertext("j1"), TellListenerCancel("j1", ORG, "ken"))
    assert all(box.jobs[j].reason is FailureReason.REVOKED for j in ("j1", "j2", "j3"))
    assert state(box, "j4") is JobState.QUEUED


def ended_jobs() -> list[Job]:
    base = Job("j1", ORG, "ana", "ken", 10, T0, T0 + TTL, holds_ciphertext=False)
    return [
        attrs.evolve(base, state=JobState.ANSWERED, answer_bytes=3, holds_ciphertext=True),
        attrs.evolve(base, state=JobState.FAILED, reason=FailureReason.DELIVERY_FAILED),
        attrs.evolve(base, state=JobState.CANCELLED, cancel_requested=True),
        attrs.evolve(base, state=JobState.EXPIRED),
    ]


@pytest.mark.parametrize("job", ended_jobs(), ids=lambda j: str(j.state))
def test_no_operation_moves_a_job_out_of_a_terminal_state(job: Job) -> None:
    jobs = {"j1": job}
    ended = Refused(Refusal.ENDED)
    assert accept(jobs, CAPS, "j1", KEN, T0) == ended
    assert renew(jobs, CAPS, "j1", KEN, T0) == ended
    assert decline(jobs, CAPS, "j1", KEN, T0) == ended
    assert answer(jobs, "j1", KEN, 4, T0) == ended
    assert fail(jobs, "j1", KEN, FailureReason.REJECTED, T0) == ended
    assert cancel_done(jobs, "j1", KEN, T0) == ended
    assert cancel(jobs, "j1", ANA, T0) == ended
    assert revoke(jobs, KEN, T0) == []
    assert next_delivery(jobs, CAPS, ORG, "ken", T0) is None
    assert sweep(jobs, CAPS, T0 + TTL - 1) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"state": JobState.FAILED},
        {"reason": FailureReason.REVOKED},
        {"lease_until": T0},
        {"state": JobState.RUNNING},
        {"answer_bytes": 4},
        {"attempts": -1},
    ],
)
def test_a_row_no_decision_can_produce_is_refused(changes: dict[str, Any]) -> None:
    """Rows read back from storage are checked on the way in."""
    base = Job("j1", ORG, "ana", "ken", 10, T0, T0 + TTL)
    with pytest.raises(ValueError):
        attrs.evolve(base, **changes)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        MailboxLimits(lease_s=0)
    with pytest.raises(ValueError):
        MailboxLimits(max_attempts=0)


# --- random operation sequences -------------------------------------------------------------------

CALLERS = ["ana", "bo", "cy"]
CALLEES = ["ken", "lee"]
SMALL = MailboxLimits(
    max_outstanding_per_caller=3,
    max_queued_per_callee=4,
    max_queued_bytes_per_callee=1000,
    max_held_bytes_total=1500,
)
operations = st.one_of(
    st.tuples(st.just("enqueue"), st.sampled_from(CALLERS), st.sampled_from(CALLEES),
              st.integers(1, 600)),
    st.tuples(st.just("deliver"), st.sampled_from(CALLEES)),
    st.tuples(st.sampled_from(["accept", "renew", "decline", "answer", "fail", "cancel_done",
                               "cancel", "cancel_as_callee"]), st.integers(0, 15)),
    st.tuples(st.just("revoke"), st.sampled_from(CALLERS + CALLEES)),
    st.tuples(st.just("wait"), st.sampled_from([1.0, LEASE, 3600.0, TTL / 2, GRACE])),
    st.tuples(st.just("reconcile"), st.sampled_from(CALLEES), st.sets(st.integers(0, 15))),
)  # fmt: skip


def step(box: Mailbox, op: tuple[object, ...], now: float, serial: int) -> list[Decision]:
    """One random operation against ``box``; the decisions it produced (none when refused)."""
    name = op[0]
    jobs = box.jobs
    if name == "enqueue":
        _, caller, callee, size = op
        assert isinstance(caller, str) and isinstance(callee, str) and isinstance(size, int)
        result: Decision | Refused | None = enqueue(
            jobs, SMALL, job_id=f"j{serial:03}", org=ORG, caller=caller, callee=callee,
            request_bytes=size, now=now, held_total=total(box),
        )  # fmt: skip
    elif name == "deliver":
        assert isinstance(op[1], str)
        result = next_delivery(jobs, SMALL, ORG, op[1], now)
    elif name in ("revoke", "wait"):
        many = revoke(jobs, (ORG, str(op[1])), now) if name == "revoke" else []
        return [box.apply(d) for d in many]
    elif name == "reconcile":
        _, callee, picks = op
        assert isinstance(picks, set)
        ids = sorted(jobs)
        holding = {ids[i % len(ids)] for i in picks} if ids else set()
        return [box.apply(d) for d in reconcile(jobs, SMALL, (ORG, str(callee)), holding, now)]
    else:
        ids = sorted(jobs)
        assert isinstance(op[1], int)
        if not ids:
            return []
        job = jobs[ids[op[1] % len(ids)]]
        callee = job.callee_member
        result = {
            "accept": lambda: accept(jobs, SMALL, job.job_id, callee, now),
            "renew": lambda: renew(jobs, SMALL, job.job_id, callee, now),
            "decline": lambda: decline(jobs, SMALL, job.job_id, callee, now),
            "answer": lambda: answer(jobs, job.job_id, callee, 7, now),
            "fail": lambda: fail(jobs, job.job_id, callee, FailureReason.REJECTED, now),
            "cancel_done": lambda: cancel_done(jobs, job.job_id, callee, now),
            "cancel": lambda: cancel(jobs, job.job_id, job.caller_member, now),
            "cancel_as_callee": lambda: cancel(jobs, job.job_id, callee, now),
        }[str(name)]()
    return [box.apply(result)] if isinstance(result, Decision) else []


def check_invariants(box: Mailbox, before: dict[str, Job], decisions: list[Decision]) -> None:
    jobs = list(box.jobs.values())
    outstanding = [j for j in jobs if j.state in OUTSTANDING]
    for caller in CALLERS + CALLEES:
        assert sum(j.caller == caller for j in outstanding) <= SMALL.max_outstanding_per_caller
    for callee in CALLEES:
        mine = [j for j in outstanding if j.callee == callee]
        assert len(mine) <= SMALL.max_queued_per_callee
        assert sum(j.request_bytes for j in mine) <= SMALL.max_queued_bytes_per_callee
        assert sum(j.state in HOLDING_LEASE for j in mine) <= 1
    for job in jobs:
        assert 0 <= job.attempts <= SMALL.max_attempts
        assert job.state is JobState.QUEUED or job.attempts >= 1 or job.state in TERMINAL
        if job.state in TERMINAL - {JobState.ANSWERED}:
            assert not job.holds_ciphertext
        old = before.get(job.job_id)
        if old is not None and old.state is JobState.RUNNING:
            # At most once: a job that may have run is never handed out again.
            assert job.state not in (JobState.QUEUED, JobState.DELIVERED)
        if old is not None and old.state in TERMINAL:
            if old.lapsed and not job.lapsed:
                # The one way out of a terminal state: the result of a run whose lease lapsed.
                assert job.state in (JobState.ANSWERED, JobState.FAILED)
            else:
                assert attrs.evolve(job, holds_ciphertext=old.holds_ciphertext) == old
    for d in decisions:
        assert set(d.audit) <= audit.EVENTS
        if d.job is None:
            assert Forget(d.job_id) in d.effects
        if d.job_id not in before:
            # Answers may still grow the total past the cap; a newly queued job never does.
            assert total(box) <= SMALL.max_held_bytes_total


def check_swept(box: Mailbox, now: float) -> None:
    """After a sweep, nothing time should have decided is left undecided."""
    for job in box.jobs.values():
        assert now < job.expires_at + SMALL.metadata_grace_s
        if now >= job.expires_at:
            assert job.state in TERMINAL and not job.holds_ciphertext
        if job.lease_until is not None:
            assert now < job.lease_until
    assert sweep(box.jobs, SMALL, now) == []
    deadline = next_deadline(box.jobs, SMALL)
    assert deadline is None or deadline > now


@settings(max_examples=examples(1000))
@given(st.lists(operations, max_size=60))
def test_random_operation_sequences_keep_every_invariant(ops: list[tuple[object, ...]]) -> None:
    box = Mailbox()
    now = T0
    for serial, op in enumerate(ops):
        if op[0] == "wait":
            assert isinstance(op[1], float)
            now += op[1]
        before = dict(box.jobs)
        decisions = step(box, op, now, serial)
        decisions += [box.apply(d) for d in sweep(box.jobs, SMALL, now)]
        check_invariants(box, before, decisions)
        check_swept(box, now)


# --- results that overtake the relay's view ----------------------------------------------


def lapse_once(box: Mailbox) -> None:
    """Deliver j1 and let its lease lapse: it is back in the queue after one attempt."""
    deliver(box)
    swept(box, T0 + LEASE)
    assert (state(box, "j1"), box.jobs["j1"].attempts) == (JobState.QUEUED, 1)


def test_the_states_are_the_wires_one_definition() -> None:
    from agentcall.wire import http

    assert JobState is http.JobState and FailureReason is http.JobFailureReason


def test_a_result_for_a_job_back_in_the_queue_is_taken_as_its_result() -> None:
    """The accept was lost, the delivery lapsed; the answer that follows still ends the job."""
    box = Mailbox()
    ok(queue(box, "j1"))
    lapse_once(box)
    d = run(box, lambda: answer(box.jobs, "j1", KEN, 321, T0 + LEASE + 5))
    assert (d.audit, d.effects) == ((audit.JOB_COMPLETE,), (DropRequest("j1"),))
    assert (state(box, "j1"), box.jobs["j1"].answer_bytes) == (JobState.ANSWERED, 321)


def test_a_failure_for_a_job_back_in_the_queue_ends_it() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    lapse_once(box)
    reason = FailureReason.INDETERMINATE_EXECUTION
    run(box, lambda: fail(box.jobs, "j1", KEN, reason, T0 + LEASE + 5))
    assert (state(box, "j1"), box.jobs["j1"].reason) == (JobState.FAILED, reason)


def test_a_job_never_delivered_takes_no_result_and_no_accept() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    wrong = Refused(Refusal.WRONG_STATE)
    assert fail(box.jobs, "j1", KEN, FailureReason.REJECTED, T0) == wrong
    assert accept(box.jobs, CAPS, "j1", KEN, T0) == wrong
    assert state(box, "j1") is JobState.QUEUED


def test_a_late_accept_runs_a_job_back_in_the_queue_unless_another_is_out() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    ok(queue(box, "j2", caller="bo", now=T0 + 1))
    lapse_once(box)
    later = T0 + LEASE + 1
    # bo's job is out now: j1's late accept would make two at once.
    assert deliver(box, later).job_id == "j2"
    assert accept(box.jobs, CAPS, "j1", KEN, later) == Refused(Refusal.WRONG_STATE)
    run(box, lambda: decline(box.jobs, CAPS, "j2", KEN, later))
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, later + 1))
    job = box.jobs["j1"]
    assert (job.state, job.lease_until, job.attempts) == (JobState.RUNNING, later + 1 + LEASE, 1)


# --- a renew stands for a lost accept ------------------------------------------------------------


def test_a_renew_of_a_delivered_job_is_taken_as_its_lost_accept() -> None:
    """The accept never reached the relay, but the agent runs and renews: running, not retried."""
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    d = run(box, lambda: renew(box.jobs, CAPS, "j1", KEN, T0 + 10))
    assert d.audit == (audit.JOB_ACCEPT,)
    job = box.jobs["j1"]
    assert (job.state, job.lease_until, job.attempts) == (JobState.RUNNING, T0 + 10 + LEASE, 1)


def test_a_renew_of_a_job_back_in_the_queue_runs_it_unless_another_is_out() -> None:
    """The same rule as a late accept: delivered before, and no other job of the callee out."""
    box = Mailbox()
    ok(queue(box, "j1"))
    ok(queue(box, "j2", caller="bo", now=T0 + 1))
    lapse_once(box)
    later = T0 + LEASE + 1
    assert deliver(box, later).job_id == "j2"
    assert renew(box.jobs, CAPS, "j1", KEN, later) == Refused(Refusal.WRONG_STATE)
    run(box, lambda: decline(box.jobs, CAPS, "j2", KEN, later))
    d = run(box, lambda: renew(box.jobs, CAPS, "j1", KEN, later + 1))
    assert d.audit == (audit.JOB_ACCEPT,)
    job = box.jobs["j1"]
    assert (job.state, job.lease_until, job.attempts) == (JobState.RUNNING, later + 1 + LEASE, 1)


# --- a relay restart gives held leases a grace ---------------------------------------------------

RESTART = limits.MAILBOX_RESTART_GRACE_S


def test_a_restart_grace_extends_every_held_lease_and_nothing_else() -> None:
    """Leases that lapsed (or would lapse) while the relay was down run to at least now + the
    grace, so listeners can reconnect; a lease already longer and unheld jobs are untouched."""
    box = Mailbox()
    for job_id, callee in (("run", "ken"), ("out", "lee"), ("long", "max"), ("wait", "ken")):
        ok(queue(box, job_id, callee=callee))
    deliver(box)  # "run"
    run(box, lambda: accept(box.jobs, CAPS, "run", KEN, T0))
    deliver(box, callee="lee")  # "out"
    deliver(box, callee="max")  # "long"
    restarted = T0 + 3600
    box.jobs["long"] = attrs.evolve(box.jobs["long"], lease_until=restarted + 2 * RESTART)
    decisions = [box.apply(d) for d in restart_grace(box.jobs, restarted)]
    assert [(d.job_id, d.audit, d.effects) for d in decisions] == [("out", (), ()), ("run", (), ())]
    leases = {j: box.jobs[j].lease_until for j in ("run", "out", "long", "wait")}
    assert leases == {
        "run": restarted + RESTART,
        "out": restarted + RESTART,
        "long": restarted + 2 * RESTART,
        "wait": None,
    }
    assert (state(box, "run"), state(box, "out")) == (JobState.RUNNING, JobState.DELIVERED)


def test_the_restart_grace_outlasts_a_reconnect_and_one_lease() -> None:
    longest_reconnect = limits.RECONNECT_MAX_S + limits.RECONNECT_JITTER_S
    assert longest_reconnect + limits.MAILBOX_LEASE_S < RESTART


# --- the result of a run whose lease lapsed ------------------------------------------------------


def lapse_running(box: Mailbox) -> None:
    """j1 runs and its listener goes quiet: the relay fails it indeterminate_execution."""
    deliver(box)
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    swept(box, T0 + LEASE)
    job = box.jobs["j1"]
    assert (job.reason, job.lapsed) == (FailureReason.INDETERMINATE_EXECUTION, True)


def test_an_answer_after_the_relay_failed_a_lapsed_run_is_taken() -> None:
    """The listener was cut off longer than a lease, not dead: the run's answer ends the job."""
    box = Mailbox()
    ok(queue(box, "j1"))
    lapse_running(box)
    d = run(box, lambda: answer(box.jobs, "j1", KEN, 321, T0 + 600))
    assert d.audit == (audit.JOB_COMPLETE,)
    job = box.jobs["j1"]
    assert (job.state, job.reason, job.answer_bytes) == (JobState.ANSWERED, None, 321)
    assert (job.holds_ciphertext, job.lapsed) == (True, False)
    # The answer is kept, then dropped, like any other.
    assert next_deadline(box.jobs, CAPS) == T0 + TTL


def test_a_failure_the_listener_reports_after_a_lapsed_run_replaces_the_relays() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    lapse_running(box)
    d = run(box, lambda: fail(box.jobs, "j1", KEN, FailureReason.REJECTED, T0 + 600))
    assert d.audit == (audit.JOB_FAIL,)
    job = box.jobs["j1"]
    assert (job.state, job.reason, job.lapsed) == (JobState.FAILED, FailureReason.REJECTED, False)
    # Now the listener's own verdict: final like any other.
    assert answer(box.jobs, "j1", KEN, 5, T0 + 601) == Refused(Refusal.ENDED)


def test_indeterminate_reported_by_the_listener_takes_no_later_answer() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    reason = FailureReason.INDETERMINATE_EXECUTION
    run(box, lambda: fail(box.jobs, "j1", KEN, reason, T0 + 1))
    assert answer(box.jobs, "j1", KEN, 5, T0 + 2) == Refused(Refusal.ENDED)


def test_a_lapsed_run_takes_no_result_after_its_expiry_nor_from_anyone_else() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    lapse_running(box)
    assert answer(box.jobs, "j1", KEN, 5, T0 + TTL) == Refused(Refusal.EXPIRED)
    assert answer(box.jobs, "j1", ANA, 5, T0 + 600) == Refused(Refusal.UNKNOWN_JOB)
    assert state(box, "j1") is JobState.FAILED


def test_a_lapsed_run_is_not_revived_by_accepts_or_renews_nor_cancelled() -> None:
    """Refused ``lapsed`` (not ``ended``): the relay does not tell the listener to cancel, so
    the run can still finish and send its answer; the job stays failed meanwhile."""
    box = Mailbox()
    ok(queue(box, "j1"))
    lapse_running(box)
    lapsed = Refused(Refusal.LAPSED)
    assert accept(box.jobs, CAPS, "j1", KEN, T0 + 60) == lapsed
    assert renew(box.jobs, CAPS, "j1", KEN, T0 + 60) == lapsed
    assert cancel(box.jobs, "j1", ANA, T0 + 60) == Refused(Refusal.ENDED)


def test_a_lapsed_mark_goes_only_with_the_relays_indeterminate_verdict() -> None:
    failed = Job(
        "j1", ORG, "ana", "ken", 10, T0, T0 + TTL, JobState.FAILED, FailureReason.REJECTED,
        holds_ciphertext=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match="lapsed"):
        attrs.evolve(failed, lapsed=True)


# --- a listener says which jobs it holds ------------------------------------------------------

NOW = T0 + 5


def held_rows() -> list[Job]:
    """Every kind of row holding a lease: delivered (each attempt) or running, cancelled or
    not, as rows come back from storage."""
    base = Job("j1", ORG, "ana", "ken", 10, T0, T0 + TTL, last_delivery=1)
    rows = []
    for cancel_requested in (False, True):
        for attempts in range(1, CAPS.max_attempts + 1):
            rows.append(
                attrs.evolve(
                    base,
                    state=JobState.DELIVERED,
                    attempts=attempts,
                    lease_until=T0 + LEASE,
                    cancel_requested=cancel_requested,
                )
            )
        rows.append(
            attrs.evolve(
                base,
                state=JobState.RUNNING,
                attempts=1,
                lease_until=T0 + LEASE,
                cancel_requested=cancel_requested,
            )
        )
    return rows


def _row_id(job: Job) -> str:
    return f"{job.state}-attempt{job.attempts}{'-cancelling' if job.cancel_requested else ''}"


@pytest.mark.parametrize("job", held_rows(), ids=_row_id)
def test_a_lease_its_listener_does_not_hold_ends_now_exactly_as_its_lapse_would(job: Job) -> None:
    """Not held: the same decision the sweep makes when the lease lapses, at once. Held: none."""
    jobs = {"j1": job}
    assert reconcile(jobs, CAPS, KEN, {"j1"}, NOW) == []
    [decision] = reconcile(jobs, CAPS, KEN, set(), NOW)
    assert [decision] == sweep(jobs, CAPS, job.lease_until or 0.0)
    ended = decision.job
    assert ended is not None and ended.lease_until is None
    if job.cancel_requested:
        assert (ended.state, decision.audit) == (JobState.CANCELLED, ())
    elif job.state is JobState.RUNNING:
        # It may have run: never delivered again, and a result of that run still counts.
        assert (ended.state, ended.reason, ended.lapsed) == (
            JobState.FAILED,
            FailureReason.INDETERMINATE_EXECUTION,
            True,
        )
        assert decision.audit == (audit.JOB_FAIL,)
    elif job.attempts >= CAPS.max_attempts:
        assert (ended.state, ended.reason) == (JobState.FAILED, FailureReason.DELIVERY_FAILED)
    else:
        # Only delivered, never taken: safe to deliver again; the attempt stays spent.
        assert (ended.state, ended.attempts, decision.audit) == (JobState.QUEUED, job.attempts, ())
        assert decision.effects == ()
    if ended.state in TERMINAL:
        assert DropCiphertext("j1") in decision.effects


@pytest.mark.parametrize("job", held_rows(), ids=_row_id)
def test_reconcile_leaves_expired_leases_to_the_sweep(job: Job) -> None:
    jobs = {"j1": job}
    assert reconcile(jobs, CAPS, KEN, set(), job.expires_at) == []
    assert reconcile(jobs, CAPS, KEN, set(), job.expires_at - 1) != []


@pytest.mark.parametrize("job", [*ended_jobs(), Job("j1", ORG, "ana", "ken", 10, T0, T0 + TTL)])
def test_reconcile_touches_no_queued_or_ended_job(job: Job) -> None:
    assert reconcile({"j1": job}, CAPS, KEN, set(), NOW) == []


def test_reconcile_touches_only_the_reporting_callees_leases() -> None:
    """Other callees' leases, and jobs ken sent, are not ken's listener's to speak for."""
    box = Mailbox()
    ok(queue(box, "to-ken"))
    ok(queue(box, "to-lee", callee="lee"))
    ok(queue(box, "from-ken", caller="ken", callee="max"))
    deliver(box)
    deliver(box, callee="lee")
    deliver(box, callee="max")
    decisions = reconcile(box.jobs, CAPS, KEN, set(), NOW)
    assert [d.job_id for d in decisions] == ["to-ken"]
    assert reconcile(box.jobs, CAPS, ("other", "ken"), set(), NOW) == []


def test_reconcile_is_idempotent_and_ordered() -> None:
    box = Mailbox()
    jobs = {
        "b": attrs.evolve(held_rows()[0], job_id="b", created_at=T0 + 1),
        "a": attrs.evolve(held_rows()[0], job_id="a", created_at=T0 + 1),
        "c": attrs.evolve(held_rows()[0], job_id="c", created_at=T0),
    }
    box.jobs.update(jobs)
    first = [box.apply(d) for d in reconcile(box.jobs, CAPS, KEN, frozenset(), NOW)]
    assert [d.job_id for d in first] == ["c", "a", "b"]
    assert reconcile(box.jobs, CAPS, KEN, frozenset(), NOW) == []


def test_a_lease_held_for_a_dead_listener_no_longer_keeps_the_next_job_back() -> None:
    """The relay restarted and graced ken's lease; ken's new listener holds nothing: the lease
    ends at once and the next job goes out now, not after the grace."""
    box = Mailbox()
    ok(queue(box, "j1"))
    ok(queue(box, "j2", caller="bo", now=T0 + 1))
    deliver(box)  # j1, to the listener that died
    restarted = T0 + 600
    for d in restart_grace(box.jobs, restarted):
        box.apply(d)
    assert next_delivery(box.jobs, CAPS, ORG, "ken", restarted + 1) is None  # starved
    for d in reconcile(box.jobs, CAPS, KEN, set(), restarted + 1):
        box.apply(d)
    # The caller served least recently first: bo's job, then ana's again.
    assert deliver(box, restarted + 1).job_id == "j2"
    assert (state(box, "j1"), box.jobs["j1"].attempts) == (JobState.QUEUED, 1)


def test_a_lease_the_reconnected_listener_holds_keeps_its_grace() -> None:
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    restarted = T0 + 600
    for d in restart_grace(box.jobs, restarted):
        box.apply(d)
    assert reconcile(box.jobs, CAPS, KEN, {"j1"}, restarted + 1) == []
    assert box.jobs["j1"].lease_until == restarted + RESTART


@pytest.mark.parametrize("then", ["answer", "indeterminate"])
def test_a_running_job_not_held_takes_the_runs_answer_and_is_failed_once(then: str) -> None:
    """Ended indeterminate by reconcile: an answer from the run (another session of the
    callee's finished it after all) still ends it answered; the listener's own
    indeterminate report confirms the verdict without a second job.fail."""
    box = Mailbox()
    ok(queue(box, "j1"))
    deliver(box)
    run(box, lambda: accept(box.jobs, CAPS, "j1", KEN, T0))
    [ended] = [box.apply(d) for d in reconcile(box.jobs, CAPS, KEN, set(), NOW)]
    assert ended.audit == (audit.JOB_FAIL,)
    reason = FailureReason.INDETERMINATE_EXECUTION
    if then == "answer":
        d = run(box, lambda: answer(box.jobs, "j1", KEN, 9, NOW + 1))
        assert d.audit == (audit.JOB_COMPLETE,)
        assert state(box, "j1") is JobState.ANSWERED
        return
    d = run(box, lambda: fail(box.jobs, "j1", KEN, reason, NOW + 1))
    assert (d.audit, d.effects) == ((), ())
    job = box.jobs["j1"]
    assert (job.state, job.reason, job.lapsed) == (JobState.FAILED, reason, False)
    # Final now: a later answer is not taken.
    assert answer(box.jobs, "j1", KEN, 9, NOW + 2) == Refused(Refusal.ENDED)


def test_indeterminate_after_a_lapse_is_audited_once() -> None:
    """The relay failed the run when its lease lapsed; the restarted listener's journal
    reports it indeterminate too: the job ends once, with one job.fail."""
    box = Mailbox()
    ok(queue(box, "j1"))
    lapse_running(box)
    reason = FailureReason.INDETERMINATE_EXECUTION
    d = run(box, lambda: fail(box.jobs, "j1", KEN, reason, T0 + 600))
    assert (d.audit, d.effects) == ((), ())
    assert (box.jobs["j1"].reason, box.jobs["j1"].lapsed) == (reason, False)
