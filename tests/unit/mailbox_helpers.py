"""Shared pieces of the caller-side mailbox tests: a relay's job routes in memory, jobs, answers."""

from __future__ import annotations

from typing import Any

import attrs
from twisted.internet import defer, task

from agentcall import limits
from agentcall.caller.jobstore import SentJob
from agentcall.crypto import envelope
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.local.home import Home
from agentcall.local.keystore import LocalKeys
from agentcall.local.statedb import StateDb
from agentcall.wire.frames import SealedEnvelope
from agentcall.wire.http import (
    JobInfo,
    JobList,
    JobSide,
    JobState,
    MemberRole,
    OfflineDelivery,
    WhoAmIResponse,
)
from agentcall.wire.payloads import CallFailure, Reply, RequestPayload
from tests.unit.cli_helpers import NOW, ORIGIN
from tests.unit.crypto_helpers import Party

JOB_ID = "1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b"
OTHER_JOB = "9f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
ANN = "@acme/ann"
KEN = "@acme/ken"
EXPIRES = int(NOW + limits.MAILBOX_TTL_S)


def job(**changes: Any) -> JobInfo:
    fields: dict[str, Any] = {
        "job_id": JOB_ID,
        "side": JobSide.SENT,
        "caller": ANN,
        "callee": KEN,
        "state": JobState.QUEUED,
        "created_at": int(NOW),
        "expires_at": EXPIRES,
        "attempts": 0,
    }
    fields.update(changes)
    return JobInfo(**fields)


def seal_request(keys: LocalKeys, callee: Party, message: str = "why is the build red?") -> Any:
    """(sealed, request) as ``place`` seals a request that may be queued."""
    return envelope.seal_request(
        sender=keys.identity,
        sender_address=ANN,
        recipient_identity=callee.identity.record,
        recipient_encryption=callee.enc_record,
        relay_origin=ORIGIN,
        message=message,
        task=None,
        context_id=None,
        now=NOW,
        validity_s=limits.MAX_ENVELOPE_VALIDITY_S,
    )


def seal_answer(
    keys: LocalKeys, responder: Party, request: RequestPayload, outcome: Reply | CallFailure
) -> SealedEnvelope:
    """The callee's answer to ``request``, sealed to live as long as a job's answer may."""
    return envelope.seal_response(
        responder=responder.identity_key,
        request=request,
        outcome=outcome,
        caller_encryption=keys.current_record.record,
        now=request.issued_at,
        validity_s=limits.MAX_ENVELOPE_VALIDITY_S,
    )


def remember(home: Home, request: RequestPayload, callee: Party, job_id: str = JOB_ID) -> None:
    """The row ``place`` stores when the relay answers call_queued."""
    db = StateDb.open(home)
    try:
        db.sent_jobs(ORIGIN).remember(
            SentJob(job_id, KEN, request, callee.identity_pub, NOW, float(EXPIRES)), NOW
        )
    finally:
        db.close()


def answered(answer: SealedEnvelope, **changes: Any) -> JobInfo:
    return job(state=JobState.ANSWERED, terminal="completed", answer=answer, attempts=1, **changes)


@attrs.define
class FakeJobRelay:
    """The relay's job and member routes in memory.

    ``script`` is what successive looks at the job return (the last one repeats). A pending
    job asked with a wait is held for that wait on ``clock`` (set by the test's work), as the
    relay's long poll is; ``early`` answers at once instead, like a relay ignoring the wait.
    """

    script: list[JobInfo] = attrs.field(factory=lambda: [job()])
    listed: list[JobInfo] = attrs.field(factory=list)
    fail: Exception | None = None
    cancel_answer: JobInfo | Exception | None = None
    offline_delivery: bool = False
    early: bool = False
    clock: Any = None
    asked: list[tuple[str, ...]] = attrs.field(factory=list)

    def _fail(self) -> defer.Deferred[Any] | None:
        return None if self.fail is None else defer.fail(self.fail)

    def list_jobs(self) -> defer.Deferred[JobList]:
        self.asked.append(("list",))
        return self._fail() or defer.succeed(JobList(jobs=tuple(self.listed)))

    def get_job(self, job_id: str, wait_s: int = 0) -> defer.Deferred[JobInfo]:
        self.asked.append(("get", job_id, str(wait_s)))
        if len(self.asked) > 100:
            raise AssertionError("the job is polled in a tight loop")
        if not isinstance(wait_s, int) or not 0 <= wait_s <= limits.MAILBOX_MAX_WAIT_S:
            raise AssertionError(f"a wait the relay refuses: {wait_s!r}")
        failed = self._fail()
        if failed is not None:
            return failed
        if job_id != self.script[0].job_id:
            return defer.fail(ApiError(404, ApiErrorCode.NOT_FOUND, "no such job"))
        info = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        pending = info.state in (JobState.QUEUED, JobState.DELIVERED, JobState.RUNNING)
        if pending and wait_s and not self.early:
            later: defer.Deferred[JobInfo] = task.deferLater(self.clock, wait_s, lambda: info)
            return later
        return defer.succeed(info)

    def cancel_job(self, job_id: str) -> defer.Deferred[JobInfo]:
        self.asked.append(("cancel", job_id))
        answer = self.cancel_answer or job(state=JobState.CANCELLED)
        if isinstance(answer, Exception):
            return defer.fail(answer)
        return defer.succeed(answer)

    def whoami(self) -> defer.Deferred[WhoAmIResponse]:
        self.asked.append(("whoami",))
        me = WhoAmIResponse(
            org="acme",
            handle="ann",
            address=ANN,
            role=MemberRole.MEMBER,
            relay_origin=ORIGIN,
            offline_delivery=self.offline_delivery,
        )
        return self._fail() or defer.succeed(me)

    def set_offline_delivery(self, enabled: bool) -> defer.Deferred[OfflineDelivery]:
        self.asked.append(("offline", str(enabled)))
        failed = self._fail()
        if failed is not None:
            return failed
        self.offline_delivery = enabled
        return defer.succeed(OfflineDelivery(enabled=enabled))
