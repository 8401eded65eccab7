"""The caller's side of mailbox jobs: list them, fetch one (waiting if asked), cancel one.

A queued call (:func:`agentcall.caller.call.place` with a ``call_queued`` answer) is a job at
the relay. Its answer is the same sealed ``call_outcome`` envelope a live call gets; it is
opened here with the request and the pinned identity stored when the job was queued
(:mod:`agentcall.caller.jobstore`), through :func:`agentcall.caller.call.open_answer`, so it is
believed on exactly the same terms as a live call's answer: our key, the callee's pinned
identity, the hash of the request we sent.

A job that ended without an answer becomes a :class:`CallResult` with the error code the spec
gives it (``failed`` with its reason, ``cancelled`` → ``canceled``, ``expired``). Trouble that
is not the job's outcome (unknown job, relay unreachable, no local record) raises
:class:`JobUnavailable` with a code for ``--json``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs
from twisted.internet import defer, task

from agentcall import ids, limits
from agentcall.caller.call import CallResult, open_answer
from agentcall.client.api import RelayUnreachable
from agentcall.errors import AgentCallError, ApiError, ApiErrorCode, CallErrorCode
from agentcall.local.home import Home
from agentcall.local.keystore import LocalKeys
from agentcall.local.statedb import StateDb
from agentcall.wire.http import (
    PENDING_JOB_STATES,
    JobFailureReason,
    JobInfo,
    JobList,
    JobSide,
    JobState,
)

PENDING_STATES = PENDING_JOB_STATES
# A relay that answers a long poll early without news is asked again only after this pause.
MIN_POLL_INTERVAL_S = 1.0

_FAILURE_CODES = {
    JobFailureReason.DELIVERY_FAILED: CallErrorCode.DELIVERY_FAILED,
    JobFailureReason.INDETERMINATE_EXECUTION: CallErrorCode.INDETERMINATE_EXECUTION,
    JobFailureReason.REVOKED: CallErrorCode.REVOKED,
    # The listener refused the sealed request (did not open or verify, or a replay).
    JobFailureReason.REJECTED: CallErrorCode.PROTOCOL_ERROR,
}


class JobRoutes(Protocol):
    """The relay's job routes; :class:`~agentcall.client.api.RelayApi` is one."""

    def list_jobs(self) -> defer.Deferred[JobList]: ...

    def get_job(self, job_id: str, wait_s: int = 0) -> defer.Deferred[JobInfo]: ...

    def cancel_job(self, job_id: str) -> defer.Deferred[JobInfo]: ...


class JobUnavailable(AgentCallError):
    """The job could not be looked at (as opposed to a job that failed).

    ``code`` names the reason for ``--json``: ``not_found``, ``bad_request``, ``local_error``,
    ``job_ended``, ``connection_failed``, ``unauthorized`` or ``protocol_error``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen
class JobStatus:
    """A job as the relay reports it and, once it has ended, how it ended for the caller.

    ``result`` is None while the job is pending, and for a job sent *to* us that was answered
    (its answer is the caller's, never ours to see).
    """

    info: JobInfo
    address: str  # the other party: the callee of a job we sent, the caller of one we receive
    result: CallResult | None = None

    @property
    def pending(self) -> bool:
        return self.info.state in PENDING_STATES


def peer_of(info: JobInfo) -> str:
    """The other party of a job, from the asker's side."""
    return info.peer


def ended_without_answer(info: JobInfo) -> tuple[CallErrorCode, str] | None:
    """The error code and a detail for a job that ended without an answer; None otherwise."""
    if info.state is JobState.FAILED and info.reason is not None:
        code = _FAILURE_CODES[info.reason]
        tries = f" after {info.attempts} attempt(s)" if info.attempts else ""
        return code, f"job {info.job_id} failed: {info.reason}{tries}"
    if info.state is JobState.CANCELLED:
        return CallErrorCode.CANCELED, f"job {info.job_id} was cancelled"
    if info.state is JobState.EXPIRED:
        return CallErrorCode.EXPIRED, f"job {info.job_id} expired unanswered"
    return None


async def _ask(pending: defer.Deferred[Any], job_id: str | None = None) -> Any:
    """A route's answer, its failures worded as :class:`JobUnavailable`."""
    try:
        return await pending
    except ApiError as exc:
        if exc.code is ApiErrorCode.NOT_FOUND:
            what = f"job {job_id}" if job_id else "that job"
            raise JobUnavailable(
                "not_found",
                f"the relay knows no {what} of yours (jobs are forgotten "
                f"{limits.MAILBOX_METADATA_GRACE_S / 3600:g} h after they expire)",
            ) from None
        if exc.code is ApiErrorCode.UNAUTHORIZED:
            raise JobUnavailable(
                "unauthorized",
                "the relay did not accept this installation's credentials; run `agentcall doctor`",
            ) from None
        if exc.code is ApiErrorCode.JOB_ENDED:
            raise JobUnavailable("job_ended", f"job {job_id} has already ended") from None
        raise JobUnavailable(
            "protocol_error", f"the relay refused: {exc.message} ({exc.code})"
        ) from None
    except RelayUnreachable as exc:
        raise JobUnavailable("connection_failed", f"cannot reach the relay: {exc}") from None
    except ValueError as exc:
        raise JobUnavailable("bad_request", str(exc)) from None


def _check_peer(info: JobInfo, address: str) -> None:
    peer = peer_of(info)
    if peer != address:
        # The pair on the command line names one job; a mismatch is most likely a mix-up.
        raise JobUnavailable("bad_request", f"job {info.job_id} is with {peer}, not with {address}")


@contextlib.contextmanager
def _state(home: Home) -> Iterator[StateDb]:
    try:
        db = StateDb.open(home)
    except AgentCallError as exc:
        raise JobUnavailable("local_error", f"cannot open the state database: {exc}") from None
    try:
        yield db
    finally:
        db.close()


def _settle(
    info: JobInfo, address: str, home: Home, keys: LocalKeys, relay_origin: str, now: float
) -> JobStatus:
    if info.state in PENDING_STATES:
        return JobStatus(info, address)
    elapsed = max(0.0, now - info.created_at)
    failure = ended_without_answer(info)
    if failure is not None:
        code, detail = failure
        return JobStatus(
            info, address, CallResult(address, info.job_id, elapsed, code=code, detail=detail)
        )
    if info.side is JobSide.RECEIVED:
        return JobStatus(info, address)
    if info.answer is None:
        detail = "the relay reports the job answered but sent no answer"
        result = CallResult(
            address, info.job_id, elapsed, code=CallErrorCode.PROTOCOL_ERROR, detail=detail
        )
        return JobStatus(info, address, result)
    with _state(home) as db:
        try:
            sent = db.sent_jobs(relay_origin).get(info.job_id)
        except AgentCallError as exc:
            raise JobUnavailable("local_error", f"cannot read the sent jobs: {exc}") from None
    if sent is None:
        raise JobUnavailable(
            "local_error",
            f"this installation has no record of job {info.job_id} (it was placed from another "
            "installation, or its record is damaged or gone), so its answer cannot be opened",
        )
    if sent.address != address:
        detail = f"the job was recorded here as sent to {sent.address}, not {address}"
        result = CallResult(
            address, info.job_id, elapsed, code=CallErrorCode.PROTOCOL_ERROR, detail=detail
        )
        return JobStatus(info, address, result)
    result = open_answer(
        now, elapsed, address, keys, sent.request, sent.identity_pub, info.answer, info.job_id
    )
    return JobStatus(info, address, result)


async def fetch(
    reactor: Any,
    home: Home,
    keys: LocalKeys,
    relay_origin: str,
    api: JobRoutes,
    address: str,
    job_id: str,
    *,
    wait_s: float = 0.0,
) -> JobStatus:
    """The job ``job_id`` with ``address``; waits up to ``wait_s`` for it to end.

    An answered job we sent comes back opened and verified (``result``), an ended one with its
    error code.
    """
    if not ids.is_job_id(job_id):
        raise JobUnavailable("bad_request", f"{job_id!r} is not a job id")
    _check_wait(wait_s)
    info = await _follow(reactor, api, address, job_id, wait_s)
    return _settle(info, address, home, keys, relay_origin, reactor.seconds())


def _check_wait(wait_s: float) -> None:
    if not 0 <= wait_s <= limits.MAILBOX_TTL_S:
        raise JobUnavailable("bad_request", f"the wait must be 0..{limits.MAILBOX_TTL_S:g} s")


async def _follow(
    reactor: Any, api: JobRoutes, address: str, job_id: str, wait_s: float
) -> JobInfo:
    """The job once it has ended, or as it is after ``wait_s`` (asked at least once).

    The relay's long poll holds each request at most ``MAILBOX_MAX_WAIT_S`` and answers as soon
    as the job ends, so this asks again until then or until our own deadline has passed.
    """
    deadline = reactor.seconds() + wait_s
    while True:
        remaining = deadline - reactor.seconds()
        wait = int(max(0.0, min(limits.MAILBOX_MAX_WAIT_S, remaining)))
        asked_at = reactor.seconds()
        info: JobInfo = await _ask(api.get_job(job_id, wait), job_id)
        _check_peer(info, address)
        now = reactor.seconds()
        if info.state not in PENDING_STATES or now >= deadline or wait == 0:
            return info
        if now - asked_at < MIN_POLL_INTERVAL_S:
            # A relay that answered at once with no news is not asked again in a tight loop.
            await task.deferLater(reactor, MIN_POLL_INTERVAL_S, lambda: None)


async def list_jobs(api: JobRoutes, address: str | None = None) -> list[JobInfo]:
    """Our jobs, sent and received (only those with ``address`` if given), newest first."""
    listed: JobList = await _ask(api.list_jobs())
    jobs = [info for info in listed.jobs if address is None or peer_of(info) == address]
    return sorted(jobs, key=lambda info: info.created_at, reverse=True)


async def cancel(
    reactor: Any,
    home: Home,
    relay_origin: str,
    api: JobRoutes,
    address: str,
    job_id: str,
    *,
    wait_s: float,
    on_wait: Callable[[JobInfo], None] | None = None,
) -> JobInfo:
    """Cancel a job we sent to ``address``; the job as the relay last reported it.

    The job is looked at first, so a job id paired with the wrong address (or a job sent to
    us, which only its caller may cancel) is refused before anything is changed.

    A queued job ends ``cancelled`` at once. A delivered or running one is only marked: its
    listener is told, kills the agent's process group and reports back, so this follows the
    job for up to ``wait_s`` (``on_wait`` is told first) until it ends. It usually ends
    ``cancelled``, but an answer (or a failure) that reached the relay first wins; the job
    comes back still pending when the wait ran out, or at once with ``wait_s`` 0.
    """
    if not ids.is_job_id(job_id):
        raise JobUnavailable("bad_request", f"{job_id!r} is not a job id")
    _check_wait(wait_s)
    info: JobInfo = await _ask(api.get_job(job_id), job_id)
    _check_peer(info, address)
    if info.side is JobSide.RECEIVED:
        raise JobUnavailable(
            "bad_request",
            f"job {job_id} was sent to you: only its caller can cancel it (stop your listener "
            "to stop it running)",
        )
    if info.state not in PENDING_STATES:
        raise JobUnavailable("job_ended", f"job {job_id} has already ended ({info.state})")
    try:
        done: JobInfo = await _ask(api.cancel_job(job_id), job_id)
    except JobUnavailable as exc:
        if exc.code != "job_ended":
            raise
        # It ended between our look and the cancel (its answer came in, say): what it ended
        # as is the outcome to report, exactly as if it had ended while we waited.
        done = await _ask(api.get_job(job_id), job_id)
        _check_peer(done, address)
        if done.state in PENDING_STATES:
            raise exc from None
    if done.state in PENDING_STATES and wait_s > 0:
        if on_wait is not None:
            on_wait(done)
        try:
            done = await _follow(reactor, api, address, job_id, wait_s)
        except JobUnavailable as exc:
            # The cancel itself went through; say so, or the user may think nothing happened.
            raise JobUnavailable(
                exc.code,
                f"the listener has been told to stop job {job_id}, but following it failed: "
                f"{exc} (`agentcall jobs get {address} {job_id}` shows whether it has stopped)",
            ) from None
    if done.state is JobState.CANCELLED:
        # Nothing will come back to open: the stored request (message included) can go now.
        # Any other end keeps it: an answer that won the race is opened with it.
        with contextlib.suppress(AgentCallError), _state(home) as db:
            db.sent_jobs(relay_origin).forget(job_id)
    return done
