"""The offline mailbox's desk with the call book, on a Clock and the real SQLite store."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, cast

import attrs
import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from agentcall import limits
from agentcall.errors import ApiError, ApiErrorCode, CallErrorCode, StorageFault, StoreError
from agentcall.relay import audit
from agentcall.relay.calls import CallBook
from agentcall.relay.jobs import DECLINE_REST_S, SWEEP_RETRY_S, JobDesk
from agentcall.relay.mailbox import FailureReason, JobState, MailboxLimits
from agentcall.relay.ratelimit import SlidingWindowLimiter
from agentcall.relay.store import SqliteRelayStore, open_relay_store
from agentcall.relay.store_interface import Member, RelayStore
from agentcall.relay.storewatch import PROBE_EVERY_S, StorageWatch
from agentcall.relay.switchboard import Switchboard
from agentcall.testing.channels import MemoryDirectory, RecordingChannel
from agentcall.wire import codec
from agentcall.wire.frames import (
    CallError,
    CallOutcome,
    CallQueued,
    CallRequest,
    CallStatus,
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
    SealedEnvelope,
    Terminal,
)
from agentcall.wire.http import JobInfo, MemberRole
from tests.unit.relay_helpers import (
    FillingConnection,
    HeldStore,
    fill_disk_of,
    fired,
    sealed_looking,
)

ORIGIN = "relay.example"
T0 = 1_750_000_000.0
LEASE = limits.MAILBOX_LEASE_S
TTL = limits.MAILBOX_TTL_S
GRACE = limits.MAILBOX_METADATA_GRACE_S
CORRELATION = "c0ffee" + "0" * 26
HANDLES = ("ana", "bob", "cy", "ken", "lee")


def request(caller: str = "ana", to: str = "ken", *, queue: bool = True) -> CallRequest:
    envelope = sealed_looking(Direction.REQUEST, f"@acme/{caller}", f"@acme/{to}", ORIGIN)
    return CallRequest(envelope=envelope, correlation_id=CORRELATION, queue=queue)


def answer_envelope(caller: str = "ana", callee: str = "ken", **header: Any) -> SealedEnvelope:
    envelope = sealed_looking(Direction.RESPONSE, f"@acme/{callee}", f"@acme/{caller}", ORIGIN)
    return attrs.evolve(envelope, **header)


def member(handle: str) -> Member:
    return Member(org="acme", handle=handle, role=MemberRole.MEMBER, agent_kind=None, created_at=0)


class Desk:
    """A call book and a job desk over one SQLite file, with recording channels."""

    def __init__(
        self,
        path: Path,
        *,
        clock: Clock | None = None,
        caps: MailboxLimits | None = None,
        wrap: Any = None,
        fresh: bool = True,
        keys: bool = False,
    ) -> None:
        self.clock = clock or Clock()
        if self.clock.seconds() < T0:
            self.clock.advance(T0)
        self.sqlite: SqliteRelayStore = open_relay_store(path)
        if fresh:
            fired(self.sqlite.ensure_org("acme", T0))
            for handle in HANDLES:
                secret, _ = fired(
                    self.sqlite.create_invite(
                        "acme",
                        created_by=None,
                        role=MemberRole.MEMBER,
                        expires_in_days=7,
                        description=None,
                        now=T0,
                    )
                )
                fired(self.sqlite.register("acme", secret, handle, None, T0))
        self.store: RelayStore = wrap(self.sqlite) if wrap is not None else self.sqlite
        self.board = Switchboard()
        self.limiter = SlidingWindowLimiter(limits.CALLS_PER_HOUR_PER_PAIR, limits.RATE_WINDOW_S)
        jobs = itertools.count(1)
        calls = itertools.count(1)
        self.desk = JobDesk(
            self.clock,
            self.store,
            self.board,
            ORIGIN,
            caps,
            live_call_to=lambda org, handle: self.book.has_call_to(org, handle),
            mint_job_id=lambda: f"00000000-0000-4000-8000-{next(jobs):012d}",
            keys=self.store if keys else None,
        )
        self.book = CallBook(
            self.clock,
            self.board,
            MemoryDirectory(("acme", h) for h in HANDLES),
            self.store,
            self.limiter,
            ORIGIN,
            mint_call_id=lambda: f"00000000-0000-4000-9000-{next(calls):012d}",
            desk=self.desk,
            keys=self.store if keys else None,
        )
        self.desk.start()

    def opt_in(self, handle: str = "ken", enabled: bool = True) -> None:
        fired(self.sqlite.set_offline_delivery("acme", handle, enabled, self.clock.seconds()))

    def listen(self, handle: str = "ken", *, mailbox: bool = True) -> RecordingChannel:
        channel = RecordingChannel(f"{handle}-listener")
        self.board.attach_listener("acme", handle, channel)
        self.desk.listener_attached("acme", handle, channel, mailbox=mailbox)
        return channel

    def gone(self, handle: str, channel: RecordingChannel) -> None:
        self.board.detach_listener("acme", handle, channel)
        self.desk.listener_gone("acme", handle, channel)

    def call(self, caller: str = "ana", to: str = "ken", *, queue: bool = True) -> RecordingChannel:
        channel = RecordingChannel(f"{caller}-caller")
        self.book.submit("acme", caller, to, channel, request(caller, to, queue=queue))
        return channel

    def queued(self, caller: str = "ana", to: str = "ken") -> str:
        """Queue a call; its job id."""
        channel = self.call(caller, to)
        (frame,) = channel.sent
        assert isinstance(frame, CallQueued), frame
        return frame.job_id

    def send(self, channel: RecordingChannel, frame: Frame, handle: str = "ken") -> None:
        self.desk.from_listener("acme", handle, channel, frame)

    def job(self, job_id: str) -> Any:
        stored = fired(self.sqlite.get_job(job_id))
        assert stored is not None
        return stored

    def state(self, job_id: str) -> JobState:
        state: JobState = self.job(job_id).job.state
        return state

    def events(self, job_id: str) -> list[str]:
        rows = fired(self.sqlite.audit_rows("acme", limit=500))
        return [row.event for row in rows if row.call_id == job_id]


@pytest.fixture
def relay(tmp_path: Path) -> Desk:
    desk = Desk(tmp_path / "relay.sqlite")
    desk.opt_in("ken")
    return desk


def deliveries(channel: RecordingChannel) -> list[str]:
    return [frame.job_id for frame in channel.of_type(JobDelivery)]


# --- queueing ---------------------------------------------------------------------------------


def test_a_call_to_an_opted_in_callee_who_is_offline_is_queued(relay: Desk) -> None:
    caller = relay.call()
    (queued,) = caller.sent
    assert isinstance(queued, CallQueued)
    assert queued.expires_at == int(T0 + TTL)
    assert caller.closes and caller.closes[0][1] == "queued"
    stored = relay.job(queued.job_id)
    assert stored.job.state is JobState.QUEUED and stored.job.caller == "ana"
    assert stored.request is not None and b"Q2lwaGVydGV4dC" in stored.request
    assert relay.events(queued.job_id) == [audit.JOB_QUEUE]
    # It used up one call of the pair's hour, as a call that rang would have.
    assert relay.limiter.retry_after(("acme", "ana", "ken"), T0) == 0
    assert relay.limiter.tracked_keys() == 1


def test_a_call_to_a_callee_busy_with_a_live_call_is_queued(relay: Desk) -> None:
    ken = relay.listen()
    first = relay.call("bob", queue=False)
    assert isinstance(first.sent[0], CallStatus) and ken.of_type(IncomingCall)
    second = relay.call("ana")
    assert isinstance(second.sent[0], CallQueued)
    assert len(ken.of_type(IncomingCall)) == 1 and not ken.of_type(JobDelivery)


def test_a_callee_holding_a_job_is_busy_for_queueable_calls(relay: Desk) -> None:
    first = relay.queued("bob")
    ken = relay.listen()
    assert deliveries(ken) == [first]
    later = relay.call("ana")
    assert isinstance(later.sent[0], CallQueued)
    assert not ken.of_type(IncomingCall)
    # A call that may not be queued rings as today; the listener itself answers it.
    live = relay.call("cy", queue=False)
    assert isinstance(live.sent[0], CallStatus) and len(ken.of_type(IncomingCall)) == 1


@pytest.mark.parametrize("opted_in", [False, True])
def test_without_opt_in_or_with_queue_false_nothing_changes(tmp_path: Path, opted_in: bool) -> None:
    relay = Desk(tmp_path / "r.sqlite")
    relay.opt_in("ken", opted_in)
    caller = relay.call(queue=not opted_in)
    (error,) = caller.sent
    assert isinstance(error, CallError) and error.code is CallErrorCode.OFFLINE
    assert fired(relay.sqlite.jobs_of("acme", "ana", 10)) == []


def test_an_opted_out_callee_gets_no_new_jobs(relay: Desk) -> None:
    relay.queued()
    relay.opt_in("ken", False)
    caller = relay.call("bob")
    assert isinstance(caller.sent[0], CallError) and caller.sent[0].code is CallErrorCode.OFFLINE


def test_call_queued_only_after_the_commit(tmp_path: Path) -> None:
    held: list[HeldStore] = []

    def wrap(store: SqliteRelayStore) -> RelayStore:
        held.append(HeldStore(store, "decide_jobs"))
        return cast(RelayStore, held[0])

    relay = Desk(tmp_path / "r.sqlite", wrap=wrap)
    relay.opt_in("ken")
    caller = relay.call()
    assert caller.sent == [] and not caller.closes
    assert fired(relay.sqlite.jobs_of("acme", "ana", 10)) == []
    held[0].release()
    (queued,) = caller.sent
    assert isinstance(queued, CallQueued)
    assert relay.state(queued.job_id) is JobState.QUEUED


def test_a_failing_store_acknowledges_nothing(tmp_path: Path) -> None:
    held: list[HeldStore] = []

    def wrap(store: SqliteRelayStore) -> RelayStore:
        held.append(HeldStore(store, "decide_jobs"))
        return cast(RelayStore, held[0])

    relay = Desk(tmp_path / "r.sqlite", wrap=wrap)
    relay.opt_in("ken")
    caller = relay.call()
    with capturedLogs() as logged:
        held[0].fail(StoreError("database error: disk I/O error"))
    assert not caller.of_type(CallQueued)
    assert caller.closes == [(1000, "internal error")]
    assert "job_enqueue_failed" in [e.get("event") for e in logged]
    assert fired(relay.sqlite.jobs_of("acme", "ana", 10)) == []
    assert relay.limiter.tracked_keys() == 0


def test_the_eleventh_outstanding_job_of_a_caller_is_refused_busy(relay: Desk) -> None:
    relay.opt_in("lee")
    for i in range(10):
        relay.queued("ana", ("ken", "lee")[i % 2])
    caller = relay.call("ana", "ken")
    (error,) = caller.sent
    assert isinstance(error, CallError) and error.code is CallErrorCode.BUSY
    assert error.detail is not None and "10 calls waiting" in error.detail
    assert len(fired(relay.sqlite.jobs_of("acme", "ana", 50))) == 10


def test_the_callee_caps_are_refused_busy_with_a_clear_detail(tmp_path: Path) -> None:
    caps = MailboxLimits(max_queued_per_callee=2, max_queued_bytes_per_callee=100_000)
    relay = Desk(tmp_path / "r.sqlite", caps=caps)
    relay.opt_in("ken")
    relay.queued("ana")
    relay.queued("bob")
    (error,) = relay.call("cy").sent
    assert isinstance(error, CallError) and error.code is CallErrorCode.BUSY
    assert error.detail == "that handle's mailbox is full (2 calls waiting)"


def test_an_answer_held_for_the_callee_fills_its_mailbox(tmp_path: Path) -> None:
    """The answer the relay holds for one of ken's jobs counts in ken's byte cap."""
    env = answer_envelope()
    answer_bytes = len(codec.encode(env))
    request_bytes = len(codec.encode(request().envelope))
    caps = MailboxLimits(max_queued_bytes_per_callee=answer_bytes + request_bytes)
    relay = Desk(tmp_path / "r.sqlite", caps=caps)
    relay.opt_in("ken")
    job_id = relay.queued("ana")
    ken = relay.listen()
    relay.send(ken, JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=env))
    assert relay.job(job_id).job.answer_bytes == answer_bytes
    relay.gone("ken", ken)
    relay.queued("bob")  # exactly full: the answer and one request
    (error,) = relay.call("cy").sent
    assert isinstance(error, CallError) and error.code is CallErrorCode.BUSY
    assert error.detail is not None and error.detail.startswith("that handle's mailbox is full")


def test_a_request_larger_than_the_callee_byte_cap_is_refused(tmp_path: Path) -> None:
    relay = Desk(tmp_path / "r.sqlite", caps=MailboxLimits(max_queued_bytes_per_callee=100))
    relay.opt_in("ken")
    (error,) = relay.call().sent
    assert isinstance(error, CallError) and error.code is CallErrorCode.BUSY
    assert error.detail == "the request is larger than that handle's mailbox can hold"


# --- delivery ---------------------------------------------------------------------------------


def test_a_job_is_delivered_when_a_mailbox_listener_attaches(relay: Desk) -> None:
    job_id = relay.queued()
    plain = relay.listen(mailbox=False)
    assert not plain.of_type(JobDelivery)
    ken = relay.listen()
    (delivery,) = ken.of_type(JobDelivery)
    assert (delivery.job_id, delivery.from_, delivery.attempt) == (job_id, "ana", 1)
    assert delivery.envelope == request().envelope
    assert delivery.expires_at == int(T0 + TTL)
    assert relay.state(job_id) is JobState.DELIVERED
    assert relay.events(job_id) == [audit.JOB_QUEUE, audit.JOB_DELIVER]


def test_a_queueable_call_to_an_idle_listener_rings_live(relay: Desk) -> None:
    ken = relay.listen()
    caller = relay.call("bob")
    assert isinstance(caller.sent[0], CallStatus) and len(ken.of_type(IncomingCall)) == 1
    assert fired(relay.sqlite.jobs_of("acme", "bob", 10)) == []


def test_the_next_job_is_delivered_after_one_ends_and_after_a_live_call(relay: Desk) -> None:
    ken = relay.listen()
    live = relay.call("cy", queue=False)
    (ring,) = live.sent
    assert isinstance(ring, CallStatus)
    first, second = relay.queued("ana"), relay.queued("bob")
    assert deliveries(ken) == []
    # The live call ends: the desk hands out the first job.
    outcome = CallOutcome(
        call_id=ring.call_id, terminal=Terminal.COMPLETED, envelope=answer_envelope("cy")
    )
    relay.book.from_listener("acme", "ken", ken, outcome)
    assert deliveries(ken) == [first]
    relay.send(
        ken, JobResult(job_id=first, terminal=Terminal.COMPLETED, envelope=answer_envelope())
    )
    assert deliveries(ken) == [first, second]


def test_delivery_is_fair_across_callers(relay: Desk) -> None:
    anas = [relay.queued("ana") for _ in range(3)]
    bobs = relay.queued("bob")
    ken = relay.listen()
    for _ in range(4):
        job_id = deliveries(ken)[-1]
        caller = relay.job(job_id).job.caller
        env = answer_envelope(caller)
        relay.send(ken, JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=env))
    assert deliveries(ken) == [anas[0], bobs, anas[1], anas[2]]


def test_accept_renew_and_a_lapsed_run_is_indeterminate(relay: Desk) -> None:
    job_id = relay.queued()
    ken = relay.listen()
    relay.clock.advance(5)
    relay.send(ken, JobAccepted(job_id=job_id))
    assert relay.state(job_id) is JobState.RUNNING
    for _ in range(5):
        relay.clock.advance(limits.MAILBOX_RENEW_S)
        relay.send(ken, JobRenew(job_id=job_id))
    assert relay.state(job_id) is JobState.RUNNING
    relay.clock.advance(LEASE)
    job = relay.job(job_id).job
    assert (job.state, job.reason) == (JobState.FAILED, FailureReason.INDETERMINATE_EXECUTION)
    assert relay.job(job_id).request is None
    assert relay.events(job_id)[-1] == audit.JOB_FAIL


def test_a_delivery_never_accepted_is_retried_then_fails_after_three(relay: Desk) -> None:
    job_id = relay.queued()
    ken = relay.listen()
    relay.clock.advance(LEASE - 0.5)
    assert deliveries(ken) == [job_id]
    relay.clock.advance(0.5)
    assert [d.attempt for d in ken.of_type(JobDelivery)] == [1, 2]
    relay.clock.advance(LEASE)
    assert [d.attempt for d in ken.of_type(JobDelivery)] == [1, 2, 3]
    relay.clock.advance(LEASE)
    job = relay.job(job_id).job
    assert (job.state, job.reason, job.attempts) == (
        JobState.FAILED,
        FailureReason.DELIVERY_FAILED,
        3,
    )
    assert len(deliveries(ken)) == 3


def test_a_declining_listener_rests_then_gets_the_next_job(relay: Desk) -> None:
    """A decline gives the attempt back and pauses deliveries to that listener (it is busy
    with something this relay does not see), so a busy callee never burns a job's attempts."""
    first, second = relay.queued("ana"), relay.queued("bob")
    ken = relay.listen()
    relay.send(ken, JobDeclined(job_id=first))
    assert deliveries(ken) == [first]
    assert relay.job(first).job.attempts == 0 and relay.state(first) is JobState.QUEUED
    relay.clock.advance(DECLINE_REST_S - 1)
    assert deliveries(ken) == [first]
    relay.clock.advance(1)
    # bob has not been served yet, so his job goes first.
    assert deliveries(ken) == [first, second]
    for _ in range(5):
        relay.send(ken, JobDeclined(job_id=deliveries(ken)[-1]))
        relay.clock.advance(DECLINE_REST_S)
    # Offered in turn, never failed: each holds at most the attempt it is out on now.
    assert len(deliveries(ken)) == 7
    assert {relay.state(first), relay.state(second)} == {JobState.QUEUED, JobState.DELIVERED}
    assert relay.job(first).job.attempts + relay.job(second).job.attempts == 1


def test_a_declining_listener_is_offered_a_job_when_it_reconnects(relay: Desk) -> None:
    job_id = relay.queued("ana")
    ken = relay.listen()
    relay.send(ken, JobDeclined(job_id=job_id))
    again = relay.listen()
    assert deliveries(again) == [job_id]


def test_results_are_stored_then_acked(tmp_path: Path) -> None:
    held: list[HeldStore] = []

    def wrap(store: SqliteRelayStore) -> RelayStore:
        held.append(HeldStore(store))
        return cast(RelayStore, held[0])

    relay = Desk(tmp_path / "r.sqlite", wrap=wrap)
    relay.opt_in("ken")
    job_id = relay.queued()
    ken = relay.listen()
    held[0]._holding.add("decide_jobs")
    env = answer_envelope()
    relay.send(ken, JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=env))
    assert not ken.of_type(JobAck) and relay.state(job_id) is JobState.DELIVERED
    held[0].release()
    assert ken.of_type(JobAck) == [JobAck(job_id=job_id)]
    stored = relay.job(job_id)
    assert (stored.job.state, stored.terminal, stored.request) == (
        JobState.ANSWERED,
        Terminal.COMPLETED,
        None,
    )
    assert stored.answer is not None and stored.job.answer_bytes == len(stored.answer)
    assert relay.events(job_id)[-1] == audit.JOB_COMPLETE


def test_a_failing_store_sends_no_ack(tmp_path: Path) -> None:
    held: list[HeldStore] = []

    def wrap(store: SqliteRelayStore) -> RelayStore:
        held.append(HeldStore(store))
        return cast(RelayStore, held[0])

    relay = Desk(tmp_path / "r.sqlite", wrap=wrap)
    relay.opt_in("ken")
    job_id = relay.queued()
    ken = relay.listen()
    held[0]._holding.add("decide_jobs")
    relay.send(ken, JobResult(job_id=job_id, error=JobError.INDETERMINATE_EXECUTION))
    with capturedLogs() as logged:
        held[0].fail(StorageFault(CallErrorCode.UNAVAILABLE, "the storage is failing: I/O"))
    assert not ken.of_type(JobAck)
    # Told, so it keeps the lease and sends the result again on this connection.
    assert ken.of_type(JobNack) == [JobNack(job_id=job_id, code=CallErrorCode.UNAVAILABLE)]
    assert "job_result_failed" in [e.get("event") for e in logged]


# --- a full disk ----------------------------------------------------------------------------------


def watched(relay: Desk) -> tuple[FillingConnection, StorageWatch]:
    """The desk's store on a disk that can fill, watched as the relay's composition does."""
    disk = fill_disk_of(relay.sqlite)
    watch = StorageWatch(relay.clock, relay.sqlite.probe)
    relay.sqlite.watch_faults(watch.fault)
    watch.when_failing(relay.desk.storage_failing)
    watch.when_recovered(relay.desk.storage_recovered)
    return disk, watch


def test_a_call_queued_on_a_full_disk_is_refused_storage_full_in_words(relay: Desk) -> None:
    disk, watch = watched(relay)
    disk.full = True
    caller = relay.call()
    [refused] = caller.sent
    assert isinstance(refused, CallError) and refused.code is CallErrorCode.STORAGE_FULL
    assert refused.detail is not None and "try again later" in refused.detail
    assert caller.closes and caller.closes[0][1] == "storage_full"
    assert watch.failing is not None
    disk.full = False
    assert fired(relay.sqlite.jobs_of("acme", "ana", 10)) == []
    assert relay.limiter.tracked_keys() == 0


def test_a_result_unstored_on_a_full_disk_is_nacked_and_its_resend_stored(relay: Desk) -> None:
    disk, watch = watched(relay)
    job_id = relay.queued()
    ken = relay.listen()
    relay.send(ken, JobAccepted(job_id=job_id))
    disk.full = True
    result = JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=answer_envelope())
    relay.send(ken, result)
    assert ken.of_type(JobNack) == [JobNack(job_id=job_id, code=CallErrorCode.STORAGE_FULL)]
    assert not ken.of_type(JobAck) and relay.state(job_id) is JobState.RUNNING
    # Full for longer than a lease: nothing lapses meanwhile (the sweep cannot write either),
    # and once writes work the lease is given a fresh one before any sweep.
    relay.clock.pump([PROBE_EVERY_S] * int(3 * LEASE / PROBE_EVERY_S))
    disk.full = False
    relay.clock.advance(PROBE_EVERY_S)
    assert watch.failing is None
    assert relay.job(job_id).job.lease_until >= relay.clock.seconds() + LEASE - 1
    relay.send(ken, result)  # the listener's resend, on the same connection
    assert ken.of_type(JobAck) == [JobAck(job_id=job_id)]
    assert relay.state(job_id) is JobState.ANSWERED


def test_a_delivery_that_failed_is_made_once_writes_work_without_a_reconnect(relay: Desk) -> None:
    disk, watch = watched(relay)
    job_id = relay.queued()
    disk.full = True
    ken = relay.listen()
    assert deliveries(ken) == [] and watch.failing is not None
    relay.clock.pump([PROBE_EVERY_S] * 3)
    assert deliveries(ken) == []
    disk.full = False
    relay.clock.advance(PROBE_EVERY_S)
    assert deliveries(ken) == [job_id]
    assert relay.state(job_id) is JobState.DELIVERED


def test_results_for_unknown_ended_or_someone_elses_jobs_are_acked(relay: Desk) -> None:
    job_id, other = relay.queued("ana"), relay.queued("bob")
    ken = relay.listen()
    relay.send(ken, JobResult(job_id=job_id, error=JobError.REJECTED))
    failed = relay.job(job_id).job
    assert (failed.state, failed.reason) == (JobState.FAILED, FailureReason.REJECTED)
    relay.send(ken, JobResult(job_id=job_id, error=JobError.REJECTED))
    unknown = "00000000-0000-4000-8000-00000000ffff"
    relay.send(ken, JobResult(job_id=unknown, error=JobError.REJECTED))
    assert ken.of_type(JobAck) == [JobAck(job_id=j) for j in (job_id, job_id, unknown)]
    # Someone else's job: acked exactly like an unknown one, and untouched.
    assert deliveries(ken) == [job_id, other]
    lee = relay.listen("lee")
    relay.send(lee, JobResult(job_id=other, error=JobError.REJECTED), handle="lee")
    assert lee.of_type(JobAck) == [JobAck(job_id=other)]
    assert relay.state(other) is JobState.DELIVERED


def test_a_result_after_the_delivery_lapsed_back_to_the_queue_is_its_result(relay: Desk) -> None:
    job_id = relay.queued()
    ken = relay.listen()
    relay.gone("ken", ken)  # the accept was lost with the connection
    relay.clock.advance(LEASE)
    assert relay.state(job_id) is JobState.QUEUED
    back = relay.listen()
    relay.send(back, JobResult(job_id=job_id, terminal=Terminal.FAILED, envelope=answer_envelope()))
    assert relay.state(job_id) is JobState.ANSWERED
    assert back.of_type(JobAck) == [JobAck(job_id=job_id)]


@pytest.mark.parametrize(
    "header",
    [
        {"direction": Direction.REQUEST},
        {"from_": "@acme/lee"},
        {"to": "@acme/bob"},
        {"relay_origin": "other.example"},
    ],
)
def test_a_forged_answer_route_fails_the_job_rejected(relay: Desk, header: dict[str, Any]) -> None:
    job_id = relay.queued()
    ken = relay.listen()
    forged = answer_envelope(**header)
    relay.send(ken, JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=forged))
    stored = relay.job(job_id)
    assert (stored.job.state, stored.job.reason) == (JobState.FAILED, FailureReason.REJECTED)
    assert stored.answer is None and stored.request is None
    assert ken.of_type(JobAck) == [JobAck(job_id=job_id)]


# --- cancel and fetch -----------------------------------------------------------------------


def test_cancel_a_queued_job(relay: Desk) -> None:
    job_id = relay.queued()
    info = fired(relay.desk.cancel(member("ana"), job_id))
    assert info.state is JobState.CANCELLED
    assert relay.job(job_id).request is None
    with pytest.raises(ApiError) as again:
        fired(relay.desk.cancel(member("ana"), job_id))
    assert (again.value.status, again.value.code) == (409, ApiErrorCode.JOB_ENDED)
    ken = relay.listen()
    assert deliveries(ken) == []


def test_cancel_a_running_job_tells_the_listener(relay: Desk) -> None:
    job_id = relay.queued()
    ken = relay.listen()
    relay.send(ken, JobAccepted(job_id=job_id))
    info = fired(relay.desk.cancel(member("ana"), job_id))
    assert (info.state, info.cancel_requested) == (JobState.RUNNING, True)
    assert ken.of_type(CancelJob) == [CancelJob(job_id=job_id)]
    # Cancelling twice is harmless.
    assert fired(relay.desk.cancel(member("ana"), job_id)).cancel_requested
    relay.send(ken, JobResult(job_id=job_id, error=JobError.CANCELED))
    assert relay.state(job_id) is JobState.CANCELLED
    assert ken.of_type(JobAck) == [JobAck(job_id=job_id)]


def test_a_renewing_listener_that_missed_the_cancel_is_told_again(relay: Desk) -> None:
    job_id = relay.queued()
    ken = relay.listen()
    relay.send(ken, JobAccepted(job_id=job_id))
    relay.gone("ken", ken)
    fired(relay.desk.cancel(member("ana"), job_id))
    back = relay.listen()
    relay.send(back, JobRenew(job_id=job_id))
    assert back.of_type(CancelJob) == [CancelJob(job_id=job_id)]


@pytest.mark.parametrize("asker", ["ken", "bob"])
def test_someone_elses_job_is_404_to_cancel_and_to_fetch(relay: Desk, asker: str) -> None:
    job_id = relay.queued()
    for attempt in (
        lambda: relay.desk.cancel(member(asker), job_id),
        lambda: relay.desk.job_for(member("bob"), job_id, 0),
        lambda: relay.desk.job_for(member("ana"), "00000000-0000-4000-8000-0000000000ff", 0),
    ):
        with pytest.raises(ApiError) as refused:
            fired(attempt())
        assert (refused.value.status, refused.value.code) == (404, ApiErrorCode.NOT_FOUND)
    assert relay.state(job_id) is JobState.QUEUED


def test_the_caller_fetches_the_answer_and_the_callee_does_not(relay: Desk) -> None:
    job_id = relay.queued()
    ken = relay.listen()
    env = answer_envelope()
    relay.send(ken, JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=env))
    mine = fired(relay.desk.job_for(member("ana"), job_id, 0))
    assert (mine.state, mine.answer, mine.terminal) == (JobState.ANSWERED, env, Terminal.COMPLETED)
    theirs = fired(relay.desk.job_for(member("ken"), job_id, 0))
    assert theirs.answer is None and theirs.state is JobState.ANSWERED


def test_a_long_poll_wakes_when_the_job_ends(relay: Desk) -> None:
    job_id = relay.queued()
    got: list[JobInfo] = []
    relay.desk.job_for(member("ana"), job_id, 30).addCallback(got.append)
    relay.clock.advance(10)
    assert got == [] and relay.desk.waiting() == 1
    ken = relay.listen()
    relay.send(
        ken, JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=answer_envelope())
    )
    assert [info.state for info in got] == [JobState.ANSWERED]
    assert got[0].answer is not None and relay.desk.waiting() == 0
    # The timer went with it: nothing fires later.
    relay.clock.advance(30)
    assert len(got) == 1


def test_a_long_poll_times_out_with_the_state_as_it_is(relay: Desk) -> None:
    job_id = relay.queued()
    got: list[JobInfo] = []
    relay.desk.job_for(member("ana"), job_id, 5).addCallback(got.append)
    relay.clock.advance(4.9)
    assert got == []
    relay.clock.advance(0.1)
    assert [info.state for info in got] == [JobState.QUEUED]
    assert relay.desk.waiting() == 0


def test_a_cancelled_long_poll_holds_nothing(relay: Desk) -> None:
    job_id = relay.queued()
    errors: list[Any] = []
    waiting: Deferred[JobInfo] = relay.desk.job_for(member("ana"), job_id, 30)
    waiting.addErrback(errors.append)
    waiting.cancel()
    assert relay.desk.waiting() == 0 and errors and errors[0].check(CancelledError)
    assert relay.clock.getDelayedCalls() == [] or all(
        call.getTime() != T0 + 30 for call in relay.clock.getDelayedCalls()
    )


# --- time and restarts ------------------------------------------------------------------------


def test_a_job_expires_at_72_hours_and_is_forgotten_24_later(relay: Desk) -> None:
    job_id = relay.queued()
    relay.clock.advance(TTL)
    stored = relay.job(job_id)
    assert (stored.job.state, stored.request) == (JobState.EXPIRED, None)
    relay.clock.advance(GRACE)
    assert fired(relay.sqlite.get_job(job_id)) is None


def test_a_restart_keeps_jobs_and_answers_and_rearms_the_sweep(tmp_path: Path) -> None:
    path = tmp_path / "relay.sqlite"
    first = Desk(path)
    first.opt_in("ken")
    answered, waiting = first.queued("ana"), first.queued("bob")
    ken = first.listen()
    env = answer_envelope()
    first.send(ken, JobResult(job_id=answered, terminal=Terminal.COMPLETED, envelope=env))
    assert deliveries(ken) == [answered, waiting]
    first.desk.stop()
    first.sqlite.close()

    clock = Clock()
    clock.advance(T0 + 1)
    second = Desk(path, clock=clock, fresh=False)
    assert fired(second.desk.job_for(member("ana"), answered, 0)).answer == env
    assert second.state(waiting) is JobState.DELIVERED
    # Nobody touched the desk since the start: the sweep was armed from the store, at the end
    # of the restart grace its lease was given.
    second.clock.advance(limits.MAILBOX_RESTART_GRACE_S)
    assert second.state(waiting) is JobState.QUEUED
    back = second.listen()
    assert deliveries(back) == [waiting]


def test_a_sweep_the_store_cannot_run_is_retried(tmp_path: Path) -> None:
    held: list[HeldStore] = []

    def wrap(store: SqliteRelayStore) -> RelayStore:
        held.append(HeldStore(store))
        return cast(RelayStore, held[0])

    relay = Desk(tmp_path / "r.sqlite", wrap=wrap)
    relay.opt_in("ken")
    job_id = relay.queued()
    relay.listen()
    held[0]._holding.add("decide_jobs")
    relay.clock.advance(LEASE)
    with capturedLogs() as logged:
        held[0].fail(StoreError("database is locked"))
    assert "job_sweep_failed" in [e.get("event") for e in logged]
    held[0]._holding.clear()
    relay.clock.advance(SWEEP_RETRY_S)
    assert relay.job(job_id).job.attempts == 2


def test_a_lost_accept_is_made_good_by_the_renews_and_the_answer_is_kept(relay: Desk) -> None:
    """The relay never saw job_accepted; the running agent's renews keep the job running past
    its delivery lease, it is never delivered again, and its answer is stored."""
    job_id = relay.queued()
    ken = relay.listen()
    for _ in range(6):  # a minute of renews: twice the lease
        relay.clock.advance(limits.MAILBOX_RENEW_S)
        relay.send(ken, JobRenew(job_id=job_id))
    assert (relay.state(job_id), deliveries(ken)) == (JobState.RUNNING, [job_id])
    env = answer_envelope()
    relay.send(ken, JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=env))
    assert relay.state(job_id) is JobState.ANSWERED
    assert not ken.of_type(CancelJob)
    assert relay.events(job_id) == [
        audit.JOB_QUEUE,
        audit.JOB_DELIVER,
        audit.JOB_ACCEPT,
        audit.JOB_COMPLETE,
    ]


def test_a_restart_gives_held_jobs_a_grace_before_their_leases_lapse(tmp_path: Path) -> None:
    """The relay was down longer than a lease: the job its listener was running is not failed
    at start-up; the listener reconnects within the grace, renews, and its answer is stored."""
    path = tmp_path / "relay.sqlite"
    first = Desk(path)
    first.opt_in("ken")
    job_id = first.queued()
    first.send(first.listen(), JobAccepted(job_id=job_id))
    first.desk.stop()
    first.sqlite.close()

    clock = Clock()
    clock.advance(T0 + 10 * LEASE)  # down for ten leases
    second = Desk(path, clock=clock, fresh=False)
    second.clock.advance(limits.MAILBOX_RESTART_GRACE_S - 1)
    assert second.state(job_id) is JobState.RUNNING
    ken = second.listen()
    second.send(ken, JobRenew(job_id=job_id))
    second.send(
        ken, JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=answer_envelope())
    )
    assert second.state(job_id) is JobState.ANSWERED


def test_a_held_job_whose_listener_never_returns_lapses_after_the_restart_grace(
    tmp_path: Path,
) -> None:
    path = tmp_path / "relay.sqlite"
    first = Desk(path)
    first.opt_in("ken")
    job_id = first.queued()
    first.send(first.listen(), JobAccepted(job_id=job_id))
    first.desk.stop()
    first.sqlite.close()

    clock = Clock()
    clock.advance(T0 + 10 * LEASE)
    second = Desk(path, clock=clock, fresh=False)
    second.clock.advance(limits.MAILBOX_RESTART_GRACE_S)
    job = second.job(job_id).job
    assert (job.state, job.reason) == (JobState.FAILED, FailureReason.INDETERMINATE_EXECUTION)


def test_a_restart_grace_the_store_cannot_take_is_retried_before_any_sweep(
    tmp_path: Path,
) -> None:
    path = tmp_path / "relay.sqlite"
    first = Desk(path)
    first.opt_in("ken")
    job_id = first.queued()
    first.send(first.listen(), JobAccepted(job_id=job_id))
    first.desk.stop()
    first.sqlite.close()

    held: list[HeldStore] = []

    def wrap(store: SqliteRelayStore) -> RelayStore:
        held.append(HeldStore(store, "decide_jobs"))
        return cast(RelayStore, held[0])

    clock = Clock()
    clock.advance(T0 + 10 * LEASE)
    second = Desk(path, clock=clock, fresh=False, wrap=wrap)
    with capturedLogs() as logged:
        held[0].fail(StoreError("database is locked"))
    assert "job_restart_grace_failed" in [e.get("event") for e in logged]
    held[0]._holding.clear()
    second.clock.advance(SWEEP_RETRY_S)
    # Graced from the retry's time: no sweep ran in between to fail it.
    assert second.job(job_id).job.lease_until == T0 + 10 * LEASE + SWEEP_RETRY_S + (
        limits.MAILBOX_RESTART_GRACE_S
    )
    assert second.state(job_id) is JobState.RUNNING


def test_a_run_cut_off_longer_than_its_lease_still_delivers_its_answer(relay: Desk) -> None:
    """The listener's connection drops while its agent runs and it reconnects after the lease
    lapsed: the relay failed the job indeterminate_execution, but does not tell the listener to
    cancel its resent accept and renews, and takes the answer that follows for the caller."""
    job_id = relay.queued()
    ken = relay.listen()
    relay.send(ken, JobAccepted(job_id=job_id))
    relay.gone("ken", ken)
    relay.clock.advance(LEASE + 30)
    assert relay.job(job_id).job.reason is FailureReason.INDETERMINATE_EXECUTION
    back = relay.listen()
    relay.send(back, JobAccepted(job_id=job_id))
    relay.send(back, JobRenew(job_id=job_id))
    assert not back.of_type(CancelJob)
    env = answer_envelope()
    relay.send(back, JobResult(job_id=job_id, terminal=Terminal.COMPLETED, envelope=env))
    assert back.of_type(JobAck) == [JobAck(job_id=job_id)]
    assert fired(relay.desk.job_for(member("ana"), job_id, 0)).answer == env
    assert relay.events(job_id)[-2:] == [audit.JOB_FAIL, audit.JOB_COMPLETE]


# --- a reconnected listener says which jobs it holds (jobs_held) ------------------------------

RESTART_GRACE = limits.MAILBOX_RESTART_GRACE_S
INDETERMINATE = FailureReason.INDETERMINATE_EXECUTION


def restarted_with_a_held_job(tmp_path: Path, *, accepted: bool) -> tuple[Desk, str, str]:
    """ken's listener took ana's job (delivered, or accepted too), bob queued one behind it,
    then the relay went down for ten leases and ken's listener died; the relay is back up.
    The restarted desk, the held job and the waiting one."""
    path = tmp_path / "relay.sqlite"
    first = Desk(path)
    first.opt_in("ken")
    held = first.queued("ana")
    old = first.listen()
    assert deliveries(old) == [held]
    if accepted:
        first.send(old, JobAccepted(job_id=held))
    waiting = first.queued("bob")
    first.desk.stop()
    first.sqlite.close()
    clock = Clock()
    clock.advance(T0 + 10 * LEASE)
    second = Desk(path, clock=clock, fresh=False)
    assert second.job(held).job.lease_until == clock.seconds() + RESTART_GRACE
    return second, held, waiting


@pytest.mark.parametrize("accepted", [False, True], ids=["delivered", "running"])
def test_after_a_relay_restart_a_lease_held_for_a_dead_listener_starves_nobody(
    tmp_path: Path, accepted: bool
) -> None:
    """Issue 25, finding 4: the restart grace kept the dead listener's lease for 120 s and,
    one job out per callee, ken's new listener got nothing meanwhile. It says it holds
    nothing: that lease ends on the spot (a delivery is queued again, a run may have run and
    fails indeterminate_execution) and the next job goes out on the same tick."""
    relay, held, waiting = restarted_with_a_held_job(tmp_path, accepted=accepted)
    ken = relay.listen()
    assert deliveries(ken) == []  # the graced lease is ken's one job out
    with capturedLogs() as logged:
        relay.send(ken, JobsHeld(job_ids=()))
    assert deliveries(ken) == [waiting]  # bob's: ana was served last
    [reclaimed] = [e for e in logged if e.get("event") == "job_leases_reclaimed"]
    assert (reclaimed["handle"], reclaimed["jobs"]) == ("ken", 1)
    job = relay.job(held).job
    if accepted:
        assert (job.state, job.reason, job.lapsed) == (JobState.FAILED, INDETERMINATE, True)
        assert relay.job(held).request is None
        assert relay.events(held) == [
            audit.JOB_QUEUE,
            audit.JOB_DELIVER,
            audit.JOB_ACCEPT,
            audit.JOB_FAIL,
        ]
    else:
        # Never taken: delivered again later, its attempt spent.
        assert (job.state, job.attempts, job.lease_until) == (JobState.QUEUED, 1, None)
        relay.send(ken, JobResult(job_id=waiting, error=JobError.REJECTED))
        assert deliveries(ken) == [waiting, held]
        assert relay.job(held).job.attempts == 2


def test_a_listener_that_says_nothing_waits_out_the_restart_grace_as_before(
    tmp_path: Path,
) -> None:
    """A listener older than jobs_held: its leases still lapse only after the grace."""
    relay, held, waiting = restarted_with_a_held_job(tmp_path, accepted=False)
    ken = relay.listen()
    relay.clock.advance(RESTART_GRACE - 1)
    assert deliveries(ken) == []
    relay.clock.advance(1)
    assert deliveries(ken) == [waiting]
    assert relay.state(held) is JobState.QUEUED


def test_a_job_the_reconnected_listener_holds_keeps_its_lease_and_its_result_counts(
    tmp_path: Path,
) -> None:
    relay, held, waiting = restarted_with_a_held_job(tmp_path, accepted=True)
    ken = relay.listen()
    relay.send(ken, JobsHeld(job_ids=(held,)))
    assert relay.state(held) is JobState.RUNNING and deliveries(ken) == []
    env = answer_envelope()
    relay.send(ken, JobResult(job_id=held, terminal=Terminal.COMPLETED, envelope=env))
    assert relay.state(held) is JobState.ANSWERED
    assert deliveries(ken) == [waiting]


@pytest.mark.parametrize("back_after_grace", [False, True])
def test_a_run_the_restarted_listener_reports_indeterminate_ends_once(
    tmp_path: Path, back_after_grace: bool
) -> None:
    """ken's listener crashed mid-run; its journal now says the job is indeterminate, lists it
    as held and sends that result. Whether the relay's grace ran out first (its own verdict) or
    not, the job ends failed indeterminate_execution with one job.fail, and is acknowledged."""
    relay, held, waiting = restarted_with_a_held_job(tmp_path, accepted=True)
    if back_after_grace:
        relay.clock.advance(RESTART_GRACE)
        assert relay.job(held).job.lapsed
    ken = relay.listen()
    relay.send(ken, JobsHeld(job_ids=(held,)))
    relay.send(ken, JobResult(job_id=held, error=JobError.INDETERMINATE_EXECUTION))
    job = relay.job(held).job
    assert (job.state, job.reason, job.lapsed) == (JobState.FAILED, INDETERMINATE, False)
    assert relay.events(held).count(audit.JOB_FAIL) == 1
    assert ken.of_type(JobAck) == [JobAck(job_id=held)]
    assert deliveries(ken) == [waiting]


def test_a_report_never_takes_back_what_its_own_session_was_handed(relay: Desk) -> None:
    """The listener lists what it holds before the delivery made on attaching reaches it."""
    job_id = relay.queued()
    ken = relay.listen()
    assert deliveries(ken) == [job_id]
    relay.send(ken, JobsHeld(job_ids=()))
    assert relay.state(job_id) is JobState.DELIVERED
    relay.send(ken, JobAccepted(job_id=job_id))
    assert relay.state(job_id) is JobState.RUNNING
    relay.send(ken, JobsHeld(job_ids=()))  # said again: still this session's
    assert relay.state(job_id) is JobState.RUNNING


@pytest.mark.parametrize("accepted", [False, True], ids=["delivered", "running"])
def test_a_lease_handed_to_a_replaced_session_is_judged_once_that_session_is_gone(
    relay: Desk, accepted: bool
) -> None:
    """A newer session replaces the one holding ana's job. That one may be accepting it at
    this very moment (another installation of ken's, say), so the newer one's report leaves
    the lease alone while it is open; once it is gone the report settles it at once."""
    first, second = relay.queued("ana"), relay.queued("bob")
    old = relay.listen()
    assert deliveries(old) == [first]
    new = relay.listen()
    assert old.closes and deliveries(new) == []
    relay.send(new, JobsHeld(job_ids=()))
    assert relay.state(first) is JobState.DELIVERED
    if accepted:
        relay.send(old, JobAccepted(job_id=first))
        assert relay.state(first) is JobState.RUNNING
    relay.gone("ken", old)
    job = relay.job(first).job
    if accepted:
        assert (job.state, job.reason, job.lapsed) == (JobState.FAILED, INDETERMINATE, True)
        assert deliveries(new) == [second]
    else:
        assert (job.state, job.attempts) == (JobState.QUEUED, 1)
        assert deliveries(new) == [second]  # bob was never served; ana's waits its turn


def test_jobs_held_counts_only_from_the_current_mailbox_session(relay: Desk) -> None:
    job_id = relay.queued()
    old = relay.listen()
    relay.listen("ken", mailbox=False)  # replaces it; takes no jobs
    with capturedLogs() as logged:
        relay.send(old, JobsHeld(job_ids=()))
    assert "jobs_held_ignored" in [e.get("event") for e in logged]
    assert relay.state(job_id) is JobState.DELIVERED


def test_a_report_waits_for_a_delivery_being_decided_on_a_slow_store(tmp_path: Path) -> None:
    """With a store that answers later, the delivery made on attaching may still be on its way
    when the report arrives: the report is judged only once that delivery is noted as this
    session's, so it cannot take back a job the listener is about to receive."""
    held: list[HeldStore] = []

    def wrap(store: SqliteRelayStore) -> RelayStore:
        held.append(HeldStore(store))
        return cast(RelayStore, held[0])

    relay = Desk(tmp_path / "r.sqlite", wrap=wrap)
    relay.opt_in("ken")
    job_id = relay.queued()
    held[0]._holding.add("decide_jobs")
    ken = relay.listen()
    relay.send(ken, JobsHeld(job_ids=()))
    while held[0].pending:
        held[0].release()
    assert deliveries(ken) == [job_id]
    assert relay.state(job_id) is JobState.DELIVERED
    assert relay.events(job_id) == [audit.JOB_QUEUE, audit.JOB_DELIVER]


def test_a_report_the_store_cannot_take_leaves_the_leases_to_lapse(tmp_path: Path) -> None:
    held: list[HeldStore] = []

    def wrap(store: SqliteRelayStore) -> RelayStore:
        held.append(HeldStore(store))
        return cast(RelayStore, held[0])

    relay = Desk(tmp_path / "r.sqlite", wrap=wrap)
    relay.opt_in("ken")
    job_id = relay.queued()
    old = relay.listen()
    relay.gone("ken", old)
    ken = relay.listen()
    held[0]._holding.add("decide_jobs")
    relay.send(ken, JobsHeld(job_ids=()))
    with capturedLogs() as logged:
        held[0].fail(StoreError("database is locked"))
    assert "job_reconcile_failed" in [e.get("event") for e in logged]
    held[0]._holding.clear()
    assert relay.state(job_id) is JobState.DELIVERED
    relay.clock.advance(LEASE)
    assert deliveries(ken) == [job_id]


def test_no_sweep_runs_while_the_storage_fails_so_renewed_leases_get_their_grace(
    relay: Desk,
) -> None:
    """Space returns just before the sweep's retry and before any probe: the running job of a
    listener that renewed all along keeps running, and gets a lease from the recovery."""
    disk, watch = watched(relay)
    job_id = relay.queued()
    ken = relay.listen()
    relay.send(ken, JobAccepted(job_id=job_id))
    accepted = relay.clock.seconds()
    relay.clock.advance(0.5)
    disk.full = True
    relay.send(ken, JobRenew(job_id=job_id))
    assert watch.failing is not None
    while relay.clock.seconds() < accepted + LEASE + SWEEP_RETRY_S - 1:
        relay.clock.advance(0.5)
        if int((relay.clock.seconds() - accepted) * 2) % 20 == 0:
            relay.send(ken, JobRenew(job_id=job_id))
    disk.full = False
    relay.clock.advance(1.0)
    assert relay.state(job_id) is JobState.RUNNING
    relay.clock.pump([PROBE_EVERY_S] * 2)
    assert watch.failing is None
    job = relay.job(job_id).job
    assert job.state is JobState.RUNNING
    assert job.lease_until is not None and job.lease_until > relay.clock.seconds()


def test_a_job_taken_late_on_the_current_session_is_not_reclaimed_by_its_older_list(
    relay: Desk,
) -> None:
    disk, _watch = watched(relay)
    first = relay.queued("ana")
    ken = relay.listen()
    assert deliveries(ken) == [first]
    relay.send(ken, JobsHeld(job_ids=()))  # said before it took the delivery
    second = relay.queued("bob")
    relay.clock.advance(LEASE + 0.1)  # the accept of the first is late: its lease lapses
    if relay.state(second) is JobState.DELIVERED:
        relay.send(ken, JobDeclined(job_id=second))
    relay.send(ken, JobRenew(job_id=first))  # taken as the accept it missed
    assert relay.state(first) is JobState.RUNNING
    disk.full = True
    relay.send(ken, JobRenew(job_id=first))
    disk.full = False
    relay.clock.advance(PROBE_EVERY_S)  # recovery reconciles against the older list
    assert relay.state(first) is JobState.RUNNING


def test_a_result_refused_by_a_bug_is_not_nacked(tmp_path: Path) -> None:
    held: list[HeldStore] = []

    def wrap(store: SqliteRelayStore) -> RelayStore:
        held.append(HeldStore(store))
        return cast(RelayStore, held[0])

    relay = Desk(tmp_path / "r.sqlite", wrap=wrap)
    relay.opt_in("ken")
    job_id = relay.queued()
    ken = relay.listen()
    held[0]._holding.add("decide_jobs")
    relay.send(ken, JobResult(job_id=job_id, error=JobError.INDETERMINATE_EXECUTION))
    with capturedLogs():
        held[0].fail(ValueError("a bug in a decision"))
    assert not ken.of_type(JobAck) and not ken.of_type(JobNack)
