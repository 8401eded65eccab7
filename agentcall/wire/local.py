"""The local protocol between a thin ``agentcall call`` and the running listener service.

The service listens on a private UNIX socket in the state directory
(:mod:`agentcall.listener.localsocket`). A connection carries exactly one request. A call: the
CLI writes one :class:`LocalCall` line, then the service writes :class:`LocalStatus` and
:class:`LocalNote` lines as the call goes on and one :class:`LocalEnded` line, and closes. An
``agentcall jobs`` command: one :class:`LocalJobs` line, then :class:`LocalProgress` lines and
one :class:`LocalJobsEnded` line.
Each line is one compact JSON object tagged with ``type``, decoded strictly through
:func:`agentcall.wire.codec.decode_local` (unknown keys, wrong types, oversize lines: all
:class:`~agentcall.errors.MalformedFrame`). The CLI closing the connection early hangs up: the
service cancels the call.

:class:`LocalEnded` carries everything ``agentcall call`` prints (and :class:`LocalJobsEnded`
everything ``agentcall jobs`` prints), so both paths (through the service, or dialling the
relay directly) render from the same value. Rendering stays in the CLI.

This module imports neither Twisted nor any crypto: the thin CLI imports it (and
:mod:`agentcall.wire.http`, for the job objects).
"""

from __future__ import annotations

import enum
import re
from typing import Any, ClassVar, Final

import attrs

from agentcall import limits
from agentcall.errors import CallErrorCode
from agentcall.wire import fields as f
from agentcall.wire.http import JobInfo

# What a person may type as TARGET (a contact name, a handle, an address); resolved by the
# service exactly as the CLI resolves it.
MAX_TARGET_CHARS: Final = 200
# Local error wording (a refusal's message, a failure's detail) is capped, not refused.
MAX_LOCAL_TEXT_CHARS: Final = 4000
MAX_NOTE_CHARS: Final = 4000
MIN_TIMEOUT_MS: Final = 1000
MAX_TIMEOUT_MS: Final = int(limits.CLIENT_CALL_TIMEOUT_S * 1000)
# A refusal's code: a word for scripts (bad_target, identity_changed, local_error, …).
REFUSAL_CODE_RE: Final = re.compile(r"[a-z][a-z_]{0,39}\Z")


# The states of agentcall.wire.frames.CallState, named again so that the thin CLI need not
# import every frame (tests/unit/test_wire_local.py keeps the two the same).
CALL_STATES: Final = ("ringing", "answered", "working")


def _call_state(_instance: object, _attribute: Any, value: str) -> None:
    if type(value) is not str or value not in CALL_STATES:
        raise ValueError("state: not a call state")


class EndKind(enum.StrEnum):
    ANSWER = "answer"  # an answer came back: text, task, maybe a conversation
    QUEUED = "queued"  # the relay kept the call as a mailbox job
    FAILED = "failed"  # the call ended without an answer: a CallErrorCode
    REFUSED = "refused"  # not placed, or the answer not believed: a local reason to fix


def clip(text: str, max_chars: int = MAX_LOCAL_TEXT_CHARS) -> str:
    """``text`` cut to ``max_chars`` (local wording can be long; the CLI shows less anyway)."""
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


@attrs.frozen
class LocalCall:
    """The CLI's request: the call as the person typed it (the service resolves TARGET)."""

    type: ClassVar[str] = "call"
    target: str = attrs.field(validator=f.text(MAX_TARGET_CHARS, min_chars=1))
    message: str = attrs.field(validator=f.utf8_bytes(limits.MAX_MESSAGE_BYTES, min_bytes=1))
    task: str | None = attrs.field(default=None, validator=f.optional(f.task_id))
    continue_: bool = attrs.field(default=False, validator=f.boolean)
    context_id: str | None = attrs.field(default=None, validator=f.optional(f.context_id))
    queue: bool = attrs.field(default=True, validator=f.boolean)
    timeout_ms: int = attrs.field(
        default=MAX_TIMEOUT_MS, validator=f.integer(MIN_TIMEOUT_MS, MAX_TIMEOUT_MS)
    )

    @continue_.validator
    def _one_thread(self, _attribute: Any, value: bool) -> None:
        if value and self.context_id is not None:
            raise ValueError("continue and context_id exclude each other")

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000


@attrs.frozen
class LocalStatus:
    """The call's lifecycle as the relay reports it: ringing, answered, working."""

    type: ClassVar[str] = "status"
    state: str = attrs.field(validator=_call_state)
    call_id: str = attrs.field(validator=f.call_id)


@attrs.frozen
class LocalNote:
    """A warning that does not stop the call (printed as ``agentcall: warning: …``)."""

    type: ClassVar[str] = "note"
    text: str = attrs.field(validator=f.text(MAX_NOTE_CHARS, min_chars=1))


def _code_fits(instance: LocalEnded, _attribute: Any, value: str | None) -> None:
    if instance.kind is EndKind.FAILED:
        if value is None or value not in CallErrorCode._value2member_map_:
            raise ValueError("a failed call carries a known call error code")
    elif instance.kind is EndKind.REFUSED:
        if value is None or REFUSAL_CODE_RE.match(value) is None:
            raise ValueError("a refusal carries a code")
    elif value is not None:
        raise ValueError("only a failure or a refusal carries a code")


def _shape(instance: LocalEnded, _attribute: Any, _value: object) -> None:
    """The fields each kind of ending needs, and none that belong to another kind."""
    kind = instance.kind
    if (instance.text is not None) != (kind is EndKind.ANSWER):
        raise ValueError("text comes with an answer, and only with one")
    if (instance.job_id is not None) != (kind is EndKind.QUEUED) or (
        instance.expires_at is not None
    ) != (kind is EndKind.QUEUED):
        raise ValueError("job_id and expires_at come with a queued call, and only with one")
    if (instance.message is not None) != (kind is EndKind.REFUSED):
        raise ValueError("message comes with a refusal, and only with one")
    if kind is not EndKind.FAILED and (instance.detail is not None or instance.offered):
        raise ValueError("detail and offered come with a failure only")
    if kind is not EndKind.ANSWER and instance.context_id is not None:
        raise ValueError("context_id comes with an answer only")
    if kind is EndKind.QUEUED and instance.address is None:
        raise ValueError("a queued call names its address")


@attrs.frozen
class LocalEnded:
    """How the call ended, with everything ``agentcall call`` prints about it."""

    type: ClassVar[str] = "ended"
    kind: EndKind = attrs.field(converter=EndKind)
    # The resolved address; None only when the target could not be resolved.
    address: str | None = attrs.field(default=None, validator=f.optional(f.address))
    call_id: str | None = attrs.field(default=None, validator=f.optional(f.call_id))
    # answer
    text: str | None = attrs.field(
        default=None, validator=f.optional(f.utf8_bytes(limits.MAX_REPLY_BYTES))
    )
    task: str | None = attrs.field(default=None, validator=f.optional(f.task_id))
    context_id: str | None = attrs.field(default=None, validator=f.optional(f.context_id))
    # queued
    job_id: str | None = attrs.field(default=None, validator=f.optional(f.job_id))
    expires_at: int | None = attrs.field(default=None, validator=f.optional(f.timestamp))
    # failed (a CallErrorCode) or refused (a local reason: identity_changed, bad_target, …)
    code: str | None = attrs.field(default=None, validator=_code_fits)
    detail: str | None = attrs.field(
        default=None, validator=f.optional(f.text(MAX_LOCAL_TEXT_CHARS))
    )
    offered: tuple[str, ...] = attrs.field(
        default=(), validator=f.each(f.task_id, max_items=limits.MAX_OFFERED_TASKS)
    )
    message: str | None = attrs.field(
        default=None, validator=f.optional(f.text(MAX_LOCAL_TEXT_CHARS, min_chars=1))
    )
    # The conversation this call continued has ended (the callee said context_unknown).
    ended: bool = attrs.field(default=False, validator=f.boolean)
    # The line about the open conversations, printed as `agentcall: …` before the result.
    conversation_note: str | None = attrs.field(
        default=None, validator=[f.optional(f.text(MAX_NOTE_CHARS, min_chars=1)), _shape]
    )

    @classmethod
    def refused(cls, code: str, message: str, address: str | None = None) -> LocalEnded:
        return cls(EndKind.REFUSED, address, code=code, message=clip(message))


# --- jobs: `agentcall jobs list|get|cancel` ----------------------------------------------------

JOBS_COMMANDS: Final = ("list", "get", "cancel")
MAX_JOBS_WAIT_S: Final = int(limits.MAILBOX_TTL_S)


def _jobs_command(_instance: object, _attribute: Any, value: str) -> None:
    if type(value) is not str or value not in JOBS_COMMANDS:
        raise ValueError("command: list, get or cancel")


def _jobs_request_shape(instance: LocalJobs, _attribute: Any, _value: object) -> None:
    if instance.command == "list":
        if instance.job_id is not None or instance.wait_s:
            raise ValueError("a list names no job and does not wait")
    elif instance.target is None or instance.job_id is None:
        raise ValueError("get and cancel name the other party and the job")


@attrs.frozen
class LocalJobs:
    """The CLI's ``agentcall jobs`` request: the subcommand and its arguments as typed
    (TARGET resolved by the service; the job id already checked and lowercased)."""

    type: ClassVar[str] = "jobs"
    command: str = attrs.field(validator=_jobs_command)
    target: str | None = attrs.field(
        default=None, validator=f.optional(f.text(MAX_TARGET_CHARS, min_chars=1))
    )
    job_id: str | None = attrs.field(default=None, validator=f.optional(f.job_id))
    wait_s: int = attrs.field(
        default=0, validator=[f.integer(0, MAX_JOBS_WAIT_S), _jobs_request_shape]
    )


@attrs.frozen
class LocalProgress:
    """A line for stderr while a job is followed (``waiting up to 60 s for job …``)."""

    type: ClassVar[str] = "progress"
    text: str = attrs.field(validator=f.text(MAX_NOTE_CHARS, min_chars=1))


def _job_infos(_instance: object, attribute: Any, value: object) -> None:
    if not isinstance(value, tuple) or len(value) > limits.MAX_JOBS_LISTED:
        raise ValueError(f"{attribute.name}: at most {limits.MAX_JOBS_LISTED} jobs")
    for item in value:
        _no_answer(_instance, attribute, item)


def _no_answer(_instance: object, attribute: Any, value: object) -> None:
    # The sealed answer stays in the service: what the CLI prints of it is ``result``.
    if not isinstance(value, JobInfo) or value.answer is not None:
        raise ValueError(f"{attribute.name}: a job, without its sealed answer")


def _jobs_end_shape(instance: LocalJobsEnded, _attribute: Any, _value: object) -> None:
    if (instance.code is None) != (instance.message is None):
        raise ValueError("a code comes with its message")
    if instance.code is not None and (
        instance.jobs or instance.info is not None or instance.result is not None
    ):
        raise ValueError("trouble carries no job")
    if instance.result is not None and instance.info is None:
        raise ValueError("a result comes with its job")
    if instance.jobs and instance.info is not None:
        raise ValueError("a list or one job, not both")


@attrs.frozen
class LocalJobsEnded:
    """Everything ``agentcall jobs`` prints, from either path (the service, or the relay dialled
    directly): the jobs listed, or the one job (with ``result``: how a ``get`` ended for the
    caller), or trouble (``code``, ``message``: a JobUnavailable or a refusal such as
    bad_target). ``now`` is when it was looked at, for ages."""

    type: ClassVar[str] = "jobs_ended"
    now: int = attrs.field(validator=f.timestamp)
    address: str | None = attrs.field(default=None, validator=f.optional(f.address))
    jobs: tuple[JobInfo, ...] = attrs.field(default=(), validator=_job_infos)
    info: JobInfo | None = attrs.field(default=None, validator=f.optional(_no_answer))
    result: LocalEnded | None = attrs.field(default=None)
    code: str | None = attrs.field(default=None, validator=f.optional(f.matches(REFUSAL_CODE_RE)))
    message: str | None = attrs.field(
        default=None,
        validator=[f.optional(f.text(MAX_LOCAL_TEXT_CHARS, min_chars=1)), _jobs_end_shape],
    )

    @result.validator
    def _answer_or_failure(self, _attribute: Any, value: LocalEnded | None) -> None:
        if value is not None and (
            not isinstance(value, LocalEnded) or value.kind not in (EndKind.ANSWER, EndKind.FAILED)
        ):
            raise ValueError("result: an answer or a failure")

    @classmethod
    def trouble(
        cls, now: float, code: str, message: str, address: str | None = None
    ) -> LocalJobsEnded:
        return cls(int(now), address, code=code, message=clip(message))


ToService = LocalCall | LocalJobs
FromService = LocalStatus | LocalNote | LocalEnded | LocalProgress | LocalJobsEnded

# type tag -> class, for the one decoder (agentcall.wire.codec.decode_local).
LOCAL_TYPES: Final[dict[str, type[Any]]] = {
    cls.type: cls
    for cls in (
        LocalCall,
        LocalStatus,
        LocalNote,
        LocalEnded,
        LocalJobs,
        LocalProgress,
        LocalJobsEnded,
    )
}
FROM_SERVICE: Final = (LocalStatus, LocalNote, LocalEnded)
TO_SERVICE: Final = (LocalCall, LocalJobs)
# What the service answers a jobs request with (a malformed one gets an ``ended`` refusal).
FROM_SERVICE_JOBS: Final = (LocalProgress, LocalJobsEnded, LocalEnded)
