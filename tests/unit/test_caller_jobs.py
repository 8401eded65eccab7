"""The caller's mailbox: queueing a call, keeping what opens its answer, fetching and
cancelling jobs, and believing an answer on exactly the terms of a live call's."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer

from agentcall import limits
from agentcall.caller import jobs
from agentcall.caller.call import CallResult, place
from agentcall.caller.jobs import JobStatus, JobUnavailable
from agentcall.caller.jobstore import SentJob
from agentcall.client.api import Credentials, RelayUnreachable
from agentcall.crypto.pins import Pin
from agentcall.db import open_database
from agentcall.errors import ApiError, ApiErrorCode, CallErrorCode, StoreError
from agentcall.local.config import Config
from agentcall.local.home import Home
from agentcall.local.keystore import LocalKeys
from agentcall.local.statedb import STATE_SCHEMA, SqlitePinStorage, StateDb
from agentcall.relayurl import RelayUrl
from agentcall.wire import codec
from agentcall.wire.frames import CallError, CallOutcome, CallQueued, CallRequest, CallStatus
from agentcall.wire.http import JobFailureReason, JobInfo, JobSide, JobState
from agentcall.wire.payloads import CallFailure, Reply
from tests.unit.cli_helpers import NOW, ORIGIN, install, run_with_clock
from tests.unit.crypto_helpers import Party, make_party
from tests.unit.mailbox_helpers import (
    ANN,
    EXPIRES,
    JOB_ID,
    KEN,
    OTHER_JOB,
    FakeJobRelay,
    answered,
    job,
    remember,
    seal_answer,
    seal_request,
)
from tests.unit.test_caller import FakeDirectory, served
from tests.unit.test_db_engine import only_version


@pytest.fixture
def ann(tmp_path: Path) -> tuple[Home, Config, LocalKeys]:
    return install(tmp_path / "ann")


@pytest.fixture
def ken() -> Party:
    return make_party(KEN, origin=ORIGIN)


# --- the sent-jobs store -------------------------------------------------------------------------


def a_sent_job(ann: Any, ken: Party, job_id: str = JOB_ID, expires_at: float = EXPIRES) -> SentJob:
    _sealed, request = seal_request(ann[2], ken)
    return SentJob(job_id, KEN, request, ken.identity_pub, NOW, expires_at)


def test_a_sent_job_survives_reopening_and_is_kept_per_relay(ann: Any, ken: Party) -> None:
    """What opens an answer later is on disk, under the relay it was sent through."""
    sent = a_sent_job(ann, ken)
    db = StateDb.open(ann[0])
    db.sent_jobs(ORIGIN).remember(sent, NOW)
    db.close()
    db = StateDb.open(ann[0])
    try:
        assert db.sent_jobs(ORIGIN).get(JOB_ID) == sent
        assert db.sent_jobs("other.example").get(JOB_ID) is None
        assert db.sent_jobs(ORIGIN).get(OTHER_JOB) is None
        assert db.sent_jobs(ORIGIN).forget(JOB_ID)
        assert db.sent_jobs(ORIGIN).get(JOB_ID) is None
    finally:
        db.close()


def test_sent_jobs_are_pruned_a_day_after_they_expire(ann: Any, ken: Party) -> None:
    """A row lives until expires_at + MAILBOX_METADATA_GRACE_S, like the job at the relay."""
    db = StateDb.open(ann[0])
    try:
        store = db.sent_jobs(ORIGIN)
        store.remember(a_sent_job(ann, ken, expires_at=NOW + 10), NOW)
        end = NOW + 10 + limits.MAILBOX_METADATA_GRACE_S
        assert store.prune(end - 1) == 0
        assert store.get(JOB_ID) is not None
        # Remembering another job prunes on the way.
        store.remember(a_sent_job(ann, ken, OTHER_JOB, expires_at=end + 100), end)
        assert store.get(JOB_ID) is None
        assert store.get(OTHER_JOB) is not None
    finally:
        db.close()


@pytest.mark.parametrize(
    ("column", "value"),
    [("request", b"{not json"), ("request", "text, not a blob"), ("address", "@acme/bob")],
)
def test_a_damaged_row_is_no_record(ann: Any, ken: Party, column: str, value: object) -> None:
    """A row that does not decode, or whose request names another callee, is never used."""
    db = StateDb.open(ann[0])
    try:
        db.sent_jobs(ORIGIN).remember(a_sent_job(ann, ken), NOW)
        db.connection.execute(f"UPDATE jobs_out SET {column} = ?", (value,))
        assert db.sent_jobs(ORIGIN).get(JOB_ID) is None
    finally:
        db.close()


def test_a_request_for_another_relay_is_not_stored(ann: Any, ken: Party) -> None:
    db = StateDb.open(ann[0])
    try:
        with pytest.raises(ValueError, match="another relay"):
            db.sent_jobs("other.example").remember(a_sent_job(ann, ken), NOW)
    finally:
        db.close()


def test_a_closed_database_is_a_store_error(ann: Any) -> None:
    db = StateDb.open(ann[0])
    db.close()
    with pytest.raises(StoreError):
        db.sent_jobs(ORIGIN).get(JOB_ID)


def test_a_version_three_database_upgrades_and_keeps_its_rows(
    ann: Any, ken: Party, tmp_path: Path
) -> None:
    """The previous release's state.sqlite keeps its pins and journal and gains jobs_out."""
    home: Home = ann[0]
    home.create_private(home.state_db_path)
    old = open_database(home.state_db_path, only_version(STATE_SCHEMA, 3, tmp_path / "v3"))
    SqlitePinStorage(old.connection).put(_a_pin(ken))
    old.connection.execute(
        "INSERT INTO journal (job_id, state, accepted_at, updated_at) VALUES (?, ?, ?, ?)",
        (OTHER_JOB, "accepted", NOW, NOW),
    )
    with pytest.raises(sqlite3.OperationalError):
        old.connection.execute("SELECT * FROM jobs_out")
    old.connection.close()

    db = StateDb.open(home)
    try:
        assert db.connection.execute("SELECT version FROM version").fetchone() == (
            STATE_SCHEMA.newest,
        )
        assert db.pins.get(ORIGIN, KEN) == _a_pin(ken)
        assert db.connection.execute("SELECT job_id FROM journal").fetchall() == [(OTHER_JOB,)]
        db.sent_jobs(ORIGIN).remember(a_sent_job(ann, ken), NOW)
        assert db.sent_jobs(ORIGIN).get(JOB_ID) is not None
    finally:
        db.close()


def _a_pin(ken: Party) -> Pin:
    return Pin(ORIGIN, KEN, ken.identity_pub, "SHA256:" + "0" * 32, int(NOW), 1)


# --- placing a call that may be queued -----------------------------------------------------------


@attrs.define
class QueueingRelay:
    """The call socket: records the request frame and answers as told."""

    answer: CallOutcome | CallError | CallQueued
    frames: list[CallRequest] = attrs.field(factory=list)

    def dial(
        self,
        _reactor: Any,
        _relay_url: RelayUrl,
        _credentials: Credentials,
        _handle: str,
        frame: CallRequest,
        **_kw: Any,
    ) -> defer.Deferred[CallOutcome | CallError | CallQueued]:
        self.frames.append(frame)
        return defer.succeed(self.answer)


def place_with(
    ann: Any,
    ken: Party,
    relay: QueueingRelay,
    notes: list[str] | None = None,
    *,
    queue: bool | None = None,
) -> CallResult:
    home, config, keys = ann

    async def work(reactor: Any) -> CallResult:
        seen: list[CallStatus] = []
        # queue None: the option is left out, to see the default.
        options: dict[str, Any] = {} if queue is None else {"queue": queue}
        return await place(
            reactor,
            home,
            config,
            keys,
            KEN,
            "why is the build red?",
            None,
            seen.append,
            api=FakeDirectory({"ken": served(ken)}),
            dial=relay.dial,
            on_note=(notes if notes is not None else []).append,
            **options,
        )

    return run_with_clock(work)


@pytest.mark.parametrize(
    ("option", "queue", "validity"),
    [
        (None, True, limits.MAX_ENVELOPE_VALIDITY_S),
        (True, True, limits.MAX_ENVELOPE_VALIDITY_S),
        (False, False, limits.CALL_DEADLINE_S),
    ],
)
def test_the_queue_flag_and_the_validity_follow_the_option(
    ann: Any, ken: Party, option: bool | None, queue: bool, validity: float
) -> None:
    """A call that may be queued asks for it and is sealed to live 72 h; --no-queue neither."""
    relay = QueueingRelay(CallError(code="offline"))
    result = place_with(ann, ken, relay, queue=option)
    assert result.code is CallErrorCode.OFFLINE
    (frame,) = relay.frames
    assert frame.queue is queue
    request = _opened_request(ann, ken, frame)
    assert request.expires_at - request.issued_at == int(validity)


def _opened_request(ann: Any, ken: Party, frame: CallRequest) -> Any:
    from agentcall.crypto import envelope

    return envelope.open_request(
        frame.envelope,
        my_key=ken.enc_key,
        my_record=ken.enc_record,
        relay_origin=ORIGIN,
        expected_from=ANN,
        expected_to=KEN,
        sender_identity_pub=ann[2].identity.public_b64,
        now=NOW,
    )


def test_a_queued_call_is_a_result_with_its_job_stored_locally(ann: Any, ken: Party) -> None:
    """call_queued ends the call with the job; the request sent and ken's pinned identity
    are in state.sqlite, so the answer can be opened by a later process."""
    relay = QueueingRelay(CallQueued(job_id=JOB_ID, expires_at=EXPIRES))
    result = place_with(ann, ken, relay)
    assert result.queued and not result.ok
    assert result.job is not None
    assert (result.job.job_id, result.job.expires_at) == (JOB_ID, EXPIRES)
    assert (result.address, result.code, result.reply) == (KEN, None, None)
    db = StateDb.open(ann[0])
    try:
        stored = db.sent_jobs(ORIGIN).get(JOB_ID)
    finally:
        db.close()
    assert stored is not None
    assert stored.request == _opened_request(ann, ken, relay.frames[0])
    assert (stored.address, stored.identity_pub, stored.expires_at) == (
        KEN,
        ken.identity_pub,
        EXPIRES,
    )


def test_a_job_that_cannot_be_stored_is_reported_not_hidden(
    ann: Any, ken: Party, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job exists at the relay either way; the person is told its answer won't open here."""

    def broken(self: Any, _job: SentJob, _now: float) -> None:
        raise StoreError("disk full")

    monkeypatch.setattr("agentcall.caller.jobstore.SqliteSentJobs.remember", broken)
    notes: list[str] = []
    result = place_with(ann, ken, QueueingRelay(CallQueued(job_id=JOB_ID, expires_at=1)), notes)
    assert result.queued
    assert any("disk full" in note and f"jobs cancel {KEN} {JOB_ID}" in note for note in notes)


# --- fetching a job ------------------------------------------------------------------------------


def fetch(
    ann: Any, relay: FakeJobRelay, *, wait_s: float = 0, address: str = KEN, job_id: str = JOB_ID
) -> tuple[JobStatus, float]:
    home, _config, keys = ann

    async def work(reactor: Any) -> tuple[JobStatus, float]:
        relay.clock = reactor
        start = reactor.seconds()
        status = await jobs.fetch(
            reactor, home, keys, ORIGIN, relay, address, job_id, wait_s=wait_s
        )
        return status, reactor.seconds() - start

    return run_with_clock(work)


def queued_and_answered(
    ann: Any, ken: Party, outcome: Reply | CallFailure, *, responder: Party | None = None
) -> FakeJobRelay:
    """A job whose request is stored here and whose answer the relay holds."""
    _sealed, request = seal_request(ann[2], ken)
    remember(ann[0], request, ken)
    answer = seal_answer(ann[2], responder or ken, request, outcome)
    return FakeJobRelay(script=[answered(answer)])


def test_an_answered_job_opens_into_the_result_a_live_call_gives(ann: Any, ken: Party) -> None:
    """The reply, its task and conversation: as CallResult, with the job id as the call id."""
    reply = Reply(text="the arm64 runner ran out of disk", task="ask", context_id="ctx_" + "c" * 22)
    status, _took = fetch(ann, queued_and_answered(ann, ken, reply))
    assert not status.pending
    assert status.result is not None
    assert status.result.reply == reply
    assert (status.result.address, status.result.call_id) == (KEN, JOB_ID)


def test_a_sealed_failure_is_the_answer_too(ann: Any, ken: Party) -> None:
    """A policy refusal (blocked) reached the caller as a sealed answer: its code and detail."""
    failure = CallFailure(code="blocked", detail="not from you")
    status, _took = fetch(ann, queued_and_answered(ann, ken, failure))
    assert status.result is not None
    assert (status.result.code, status.result.detail) == (CallErrorCode.BLOCKED, "not from you")


def test_an_answer_signed_by_another_identity_is_refused(ann: Any, ken: Party) -> None:
    """An answer that does not verify against the identity pinned when the call was sealed is a
    protocol error; its text is never shown."""
    impostor = attrs.evolve(ken, identity_key=make_party(KEN, origin=ORIGIN).identity_key)
    relay = queued_and_answered(ann, ken, Reply(text="trust me"), responder=impostor)
    status, _took = fetch(ann, relay)
    assert status.result is not None
    assert status.result.code is CallErrorCode.PROTOCOL_ERROR
    assert status.result.reply is None
    assert "could not be verified" in (status.result.detail or "")


def test_an_answer_to_another_request_is_refused(ann: Any, ken: Party) -> None:
    """An answer bound to another request's hash (say, an earlier job's) does not verify."""
    _sealed, stored = seal_request(ann[2], ken, "the question we asked")
    remember(ann[0], stored, ken)
    _other_sealed, other = seal_request(ann[2], ken, "another question")
    answer = seal_answer(ann[2], ken, other, Reply(text="an answer to something else"))
    status, _took = fetch(ann, FakeJobRelay(script=[answered(answer)]))
    assert status.result is not None
    assert status.result.code is CallErrorCode.PROTOCOL_ERROR
    assert status.result.reply is None


def test_an_answer_under_a_changed_pin_is_refused(ann: Any, ken: Party) -> None:
    """The stored pin is what counts: a row pinned to another identity refuses ken's answer."""
    _sealed, request = seal_request(ann[2], ken)
    remember(ann[0], request, make_party(KEN, origin=ORIGIN))
    answer = seal_answer(ann[2], ken, request, Reply(text="hi"))
    status, _took = fetch(ann, FakeJobRelay(script=[answered(answer)]))
    assert status.result is not None
    assert status.result.code is CallErrorCode.PROTOCOL_ERROR


def test_an_answer_without_a_local_record_cannot_be_opened(ann: Any, ken: Party) -> None:
    """A job placed from another installation: a clear local error, nothing guessed."""
    _sealed, request = seal_request(ann[2], ken)
    answer = seal_answer(ann[2], ken, request, Reply(text="hi"))
    with pytest.raises(JobUnavailable) as refused:
        fetch(ann, FakeJobRelay(script=[answered(answer)]))
    assert refused.value.code == "local_error"
    assert "no record of job" in str(refused.value)


@pytest.mark.parametrize(
    ("state", "reason", "code"),
    [
        (JobState.FAILED, JobFailureReason.DELIVERY_FAILED, CallErrorCode.DELIVERY_FAILED),
        (
            JobState.FAILED,
            JobFailureReason.INDETERMINATE_EXECUTION,
            CallErrorCode.INDETERMINATE_EXECUTION,
        ),
        (JobState.FAILED, JobFailureReason.REVOKED, CallErrorCode.REVOKED),
        (JobState.FAILED, JobFailureReason.REJECTED, CallErrorCode.PROTOCOL_ERROR),
        (JobState.CANCELLED, None, CallErrorCode.CANCELED),
        (JobState.EXPIRED, None, CallErrorCode.EXPIRED),
    ],
)
def test_a_job_that_ended_without_an_answer_has_its_code(
    ann: Any, state: JobState, reason: JobFailureReason | None, code: CallErrorCode
) -> None:
    """Each way a job ends unanswered maps to the error code the spec gives it."""
    status, _took = fetch(ann, FakeJobRelay(script=[job(state=state, reason=reason, attempts=3)]))
    assert status.result is not None
    assert status.result.code is code
    assert JOB_ID in (status.result.detail or "")


def test_a_pending_job_without_wait_is_asked_once(ann: Any) -> None:
    relay = FakeJobRelay(script=[job(state=JobState.RUNNING)])
    status, took = fetch(ann, relay)
    assert status.pending and status.result is None
    assert (relay.asked, took) == ([("get", JOB_ID, "0")], 0)


def test_waiting_loops_long_polls_until_the_deadline(ann: Any) -> None:
    """--wait 100 is held by the relay at most 30 s at a time: 30, 30, 30, 10, then pending."""
    relay = FakeJobRelay(script=[job(state=JobState.QUEUED)])
    status, took = fetch(ann, relay, wait_s=100)
    assert status.pending
    assert [int(asked[2]) for asked in relay.asked] == [30, 30, 30, 10]
    assert took == 100


def test_waiting_stops_as_soon_as_the_job_ends(ann: Any, ken: Party) -> None:
    """The answer arriving during the second poll ends the wait then, not at the deadline."""
    answered_relay = queued_and_answered(ann, ken, Reply(text="done"))
    relay = FakeJobRelay(
        script=[job(state=JobState.QUEUED), job(state=JobState.RUNNING), *answered_relay.script],
        early=False,
    )
    status, took = fetch(ann, relay, wait_s=600)
    assert status.result is not None and status.result.text == "done"
    assert len(relay.asked) == 3 and took == 60


def test_a_relay_answering_at_once_is_not_polled_in_a_tight_loop(ann: Any) -> None:
    """A relay that ignores the wait is asked again only after a pause, and the deadline holds."""
    relay = FakeJobRelay(script=[job(state=JobState.QUEUED)], early=True)
    status, took = fetch(ann, relay, wait_s=5)
    assert status.pending
    assert len(relay.asked) <= 6
    assert 5 <= took <= 6


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (ApiError(404, ApiErrorCode.NOT_FOUND, "no"), "not_found"),
        (ApiError(401, ApiErrorCode.UNAUTHORIZED, "who?"), "unauthorized"),
        (ApiError(500, ApiErrorCode.INTERNAL, "oops"), "protocol_error"),
        (RelayUnreachable("relay.example refused the connection"), "connection_failed"),
    ],
)
def test_looking_failures_have_codes(ann: Any, failure: Exception, code: str) -> None:
    relay = FakeJobRelay(fail=failure)
    with pytest.raises(JobUnavailable) as refused:
        fetch(ann, relay)
    assert refused.value.code == code


def test_a_job_with_someone_else_is_refused(ann: Any) -> None:
    """The pair on the command line must match: the job is with ken, not bob."""
    with pytest.raises(JobUnavailable) as refused:
        fetch(ann, FakeJobRelay(), address="@acme/bob")
    assert refused.value.code == "bad_request"
    assert "is with @acme/ken" in str(refused.value)


@pytest.mark.parametrize(("job_id", "wait"), [("not-a-job", 0), (JOB_ID, -1), (JOB_ID, 1e9)])
def test_bad_ids_and_waits_never_reach_the_relay(ann: Any, job_id: str, wait: float) -> None:
    relay = FakeJobRelay()
    with pytest.raises(JobUnavailable) as refused:
        fetch(ann, relay, job_id=job_id, wait_s=wait)
    assert refused.value.code == "bad_request"
    assert relay.asked == []


def test_a_received_job_shows_its_state_but_never_an_answer(ann: Any) -> None:
    """Ken's job to us, answered: there is nothing for us to open."""
    info = job(side=JobSide.RECEIVED, caller=KEN, callee=ANN, state=JobState.ANSWERED)
    status, _took = fetch(ann, FakeJobRelay(script=[info]))
    assert (status.address, status.result, status.pending) == (KEN, None, False)


# --- listing and cancelling ----------------------------------------------------------------------


def run_jobs(work: Any) -> Any:
    async def wrapped(_reactor: Any) -> Any:
        return await work

    return run_with_clock(wrapped)


def test_lists_are_newest_first_and_filtered_by_the_other_party() -> None:
    older = job(job_id=OTHER_JOB, created_at=int(NOW) - 60)
    received = job(
        job_id="2b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b",
        side=JobSide.RECEIVED,
        caller="@acme/bob",
        callee=ANN,
        created_at=int(NOW) + 5,
    )
    relay = FakeJobRelay(listed=[older, job(), received])
    listed = run_jobs(jobs.list_jobs(relay))
    assert [info.job_id for info in listed] == [received.job_id, JOB_ID, OTHER_JOB]
    assert [info.job_id for info in run_jobs(jobs.list_jobs(relay, "@acme/bob"))] == [
        received.job_id
    ]


def cancel(
    ann: Any, relay: FakeJobRelay, *, wait_s: float = 60, address: str = KEN
) -> tuple[JobInfo, float, list[JobInfo]]:
    """(the job as cancel leaves it, the seconds it took on the clock, what on_wait was told)."""
    told: list[JobInfo] = []

    async def work(reactor: Any) -> tuple[JobInfo, float]:
        relay.clock = reactor
        start = reactor.seconds()
        done = await jobs.cancel(
            reactor, ann[0], ORIGIN, relay, address, JOB_ID, wait_s=wait_s, on_wait=told.append
        )
        return done, reactor.seconds() - start

    done, took = run_with_clock(work)
    return done, took, told


def stored(ann: Any) -> SentJob | None:
    db = StateDb.open(ann[0])
    try:
        return db.sent_jobs(ORIGIN).get(JOB_ID)
    finally:
        db.close()


RUNNING = job(state=JobState.RUNNING, attempts=1)
STOPPING = job(state=JobState.RUNNING, attempts=1, cancel_requested=True)


def test_cancel_checks_the_job_first_then_forgets_the_stored_request(ann: Any, ken: Party) -> None:
    """A queued job of ours is cancelled at once, without waiting; its stored request goes."""
    _sealed, request = seal_request(ann[2], ken)
    remember(ann[0], request, ken)
    relay = FakeJobRelay()
    done, took, told = cancel(ann, relay)
    assert done.state is JobState.CANCELLED
    assert relay.asked == [("get", JOB_ID, "0"), ("cancel", JOB_ID)]
    assert (took, told) == (0, [])
    assert stored(ann) is None


@pytest.mark.parametrize("state", [JobState.DELIVERED, JobState.RUNNING])
def test_cancel_of_a_running_job_follows_it_until_it_is_cancelled(
    ann: Any, ken: Party, state: JobState
) -> None:
    """Marked, then long-polled: the listener stops the agent 30 s in, and the job ends
    cancelled; only then does the stored request go."""
    _sealed, request = seal_request(ann[2], ken)
    remember(ann[0], request, ken)
    marked = job(state=state, attempts=1, cancel_requested=True)
    relay = FakeJobRelay(
        script=[job(state=state, attempts=1), marked, job(state=JobState.CANCELLED, attempts=1)],
        cancel_answer=marked,
    )
    done, took, told = cancel(ann, relay)
    assert done.state is JobState.CANCELLED
    assert relay.asked == [
        ("get", JOB_ID, "0"),
        ("cancel", JOB_ID),
        ("get", JOB_ID, "30"),
        ("get", JOB_ID, "30"),
    ]
    assert (took, told) == (30, [marked])
    assert stored(ann) is None


def test_an_answer_that_wins_the_race_is_kept_and_still_opens(ann: Any, ken: Party) -> None:
    """The answer reached the relay before the listener stopped the agent: the job ends
    answered, the stored request stays, and `get` opens the answer as usual."""
    relay = queued_and_answered(ann, ken, Reply(text="done anyway"))
    answer = relay.script[0]
    relay.script = [RUNNING, answer]
    relay.cancel_answer = STOPPING
    done, _took, _told = cancel(ann, relay)
    assert done.state is JobState.ANSWERED
    assert stored(ann) is not None
    status, _took = fetch(ann, FakeJobRelay(script=[answer]))
    assert status.result is not None and status.result.reply is not None
    assert status.result.reply.text == "done anyway"


def test_an_answer_that_came_between_the_look_and_the_cancel_is_reported(
    ann: Any, ken: Party
) -> None:
    """The relay refuses the cancel (job_ended) because the job was just answered: that is
    the same race, reported as answered rather than as an error."""
    relay = queued_and_answered(ann, ken, Reply(text="just in time"))
    relay.script = [RUNNING, relay.script[0]]
    relay.cancel_answer = ApiError(409, ApiErrorCode.JOB_ENDED, "ended")
    done, took, told = cancel(ann, relay)
    assert done.state is JobState.ANSWERED
    assert relay.asked == [("get", JOB_ID, "0"), ("cancel", JOB_ID), ("get", JOB_ID, "0")]
    assert (took, told) == (0, [])
    assert stored(ann) is not None


def test_cancel_stops_following_when_the_wait_runs_out(ann: Any, ken: Party) -> None:
    """Still running after 45 s: returned as it is (pending), the stored request kept, the
    relay never asked to hold a request longer than its long poll allows."""
    _sealed, request = seal_request(ann[2], ken)
    remember(ann[0], request, ken)
    relay = FakeJobRelay(script=[RUNNING, STOPPING], cancel_answer=STOPPING)
    done, took, told = cancel(ann, relay, wait_s=45)
    assert (done.state, done.cancel_requested) == (JobState.RUNNING, True)
    assert [asked[2] for asked in relay.asked if asked[0] == "get"] == ["0", "30", "15"]
    assert (took, told) == (45, [STOPPING])
    assert stored(ann) is not None


def test_cancel_with_no_wait_returns_the_marked_job_at_once(ann: Any) -> None:
    relay = FakeJobRelay(script=[RUNNING, job(state=JobState.CANCELLED)], cancel_answer=STOPPING)
    done, took, told = cancel(ann, relay, wait_s=0)
    assert done == STOPPING
    assert relay.asked == [("get", JOB_ID, "0"), ("cancel", JOB_ID)]
    assert (took, told) == (0, [])


@attrs.define
class RelayLostAfterCancel(FakeJobRelay):
    """The cancel goes through, then the relay can no longer be reached."""

    def cancel_job(self, job_id: str) -> defer.Deferred[JobInfo]:
        done = super().cancel_job(job_id)
        self.fail = RelayUnreachable("relay.example refused the connection")
        return done


def test_trouble_while_following_says_the_cancel_went_through(ann: Any) -> None:
    relay = RelayLostAfterCancel(script=[RUNNING], cancel_answer=STOPPING)
    with pytest.raises(JobUnavailable) as lost:
        cancel(ann, relay)
    assert lost.value.code == "connection_failed"
    assert f"told to stop job {JOB_ID}" in str(lost.value)
    assert f"agentcall jobs get {KEN} {JOB_ID}" in str(lost.value)


@pytest.mark.parametrize(
    ("info", "address", "code"),
    [
        (job(), "@acme/bob", "bad_request"),
        (job(side=JobSide.RECEIVED, caller=KEN, callee=ANN), KEN, "bad_request"),
        (job(state=JobState.EXPIRED), KEN, "job_ended"),
    ],
)
def test_cancel_refuses_before_changing_anything(
    ann: Any, info: Any, address: str, code: str
) -> None:
    """Another person's pairing, a job sent to us, or an ended job: nothing is cancelled."""
    relay = FakeJobRelay(script=[info])
    with pytest.raises(JobUnavailable) as refused:
        cancel(ann, relay, address=address)
    assert refused.value.code == code
    assert ("cancel", JOB_ID) not in relay.asked


def test_cancel_of_a_job_that_ended_meanwhile_says_so(ann: Any) -> None:
    """The relay refuses the cancel as ended but shows nothing ended: its refusal stands."""
    relay = FakeJobRelay(cancel_answer=ApiError(409, ApiErrorCode.JOB_ENDED, "ended"))
    with pytest.raises(JobUnavailable) as refused:
        cancel(ann, relay)
    assert refused.value.code == "job_ended"


def test_stored_requests_are_encoded_wire_payloads(ann: Any, ken: Party) -> None:
    """The row holds the RequestPayload in the wire encoding (what the answer's hash binds)."""
    _sealed, request = seal_request(ann[2], ken)
    remember(ann[0], request, ken)
    db = StateDb.open(ann[0])
    try:
        (raw,) = db.connection.execute("SELECT request FROM jobs_out").fetchone()
    finally:
        db.close()
    assert raw == codec.encode(request)
