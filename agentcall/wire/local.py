"""The local protocol between a thin ``agentcall call`` and the running listener service.

The service listens on a private UNIX socket in the state directory
(:mod:`agentcall.listener.localsocket`). A connection carries exactly one request. A call: the
CLI writes one :class:`LocalCall` line, then the service writes :class:`LocalStatus` and
:class:`LocalNote` lines as the call goes on and one :class:`LocalEnded` line, and closes. An
``agentcall jobs`` command: one :class:`LocalJobs` line, then :class:`LocalProgress` lines and
one :class:`LocalJobsEnded` line.
Each line is one compact JSON object tagged with ``type``, decoded strictly through
:func:`decode_line` (unknown keys, wrong types, oversize lines: all
:class:`~agentcall.errors.MalformedFrame`). The CLI closing the connection early hangs up: the
service cancels the call.

:class:`LocalEnded` carries everything ``agentcall call`` prints (and :class:`LocalJobsEnded`
everything ``agentcall jobs`` prints), so both paths (through the service, or dialling the
relay directly) render from the same value. Rendering stays in the CLI.

This module imports neither Twisted nor any crypto, nor attrs or cattrs: the thin CLI imports
it, and each of those costs it more than a bare interpreter start. The lines are therefore
:class:`~agentcall.frozen.Frozen` values checked by the same field validators as every wire
shape (:mod:`agentcall.wire.fields`), each field read and written by its own small spec
(:class:`_Spec`); only the jobs lines, which carry :class:`~agentcall.wire.http.JobInfo`,
import the codec, and only when they are built or read.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Collection, Sequence

from agentcall import limits, strictjson
from agentcall.errors import CallErrorCode, MalformedFrame
from agentcall.frozen import Frozen
from agentcall.wire import fields as f

# typing is imported for the type checker only: the thin `agentcall call` imports this module,
# and typing costs that process milliseconds (tests/unit/test_cli_call_thin.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, Final

    from agentcall.wire.http import JobInfo

    Check = Callable[[Any, Any, Any], None]

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


class EndKind(enum.StrEnum):
    ANSWER = "answer"  # an answer came back: text, task, maybe a conversation
    QUEUED = "queued"  # the relay kept the call as a mailbox job
    FAILED = "failed"  # the call ended without an answer: a CallErrorCode
    REFUSED = "refused"  # not placed, or the answer not believed: a local reason to fix


def clip(text: str, max_chars: int = MAX_LOCAL_TEXT_CHARS) -> str:
    """``text`` cut to ``max_chars`` (local wording can be long; the CLI shows less anyway)."""
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


# --- how a line is checked, written and read -------------------------------------------------


def _same(value: Any) -> Any:
    return value


def _list_to_tuple(value: Any) -> tuple[Any, ...]:
    # A JSON list only: a string or an object would otherwise quietly become a tuple.
    if type(value) is not list:
        raise TypeError("expected a list")
    return tuple(value)


class _Spec:
    """One field of a line: its name (in Python and on the wire), whether a line must carry it,
    its checks (the validators of agentcall.wire.fields, run whenever a line is made), and how
    its value is read from and written to JSON."""

    __slots__ = ("checks", "dump", "load", "name", "required", "wire")

    def __init__(
        self,
        name: str,
        *checks: Check,
        required: bool = False,
        wire: str | None = None,
        load: Callable[[Any], Any] = _same,
        dump: Callable[[Any], Any] = _same,
    ) -> None:
        self.name = name  # what the validators report (they read .name, as of an attrs field)
        self.wire = wire or name
        self.required = required
        self.checks = checks
        self.load = load
        self.dump = dump


class _Line(Frozen):
    """A line of the local socket: a JSON object tagged with ``type``."""

    __slots__ = ()
    type: ClassVar[str]
    _specs: ClassVar[tuple[_Spec, ...]]

    def _check(self) -> None:
        """Every field's checks, in field order, once all fields are set (as attrs does)."""
        for spec in self._specs:
            value = getattr(self, spec.name)
            for check in spec.checks:
                check(self, spec, value)

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": self.type}
        for spec in self._specs:
            body[spec.wire] = spec.dump(getattr(self, spec.name))
        return body

    @classmethod
    def from_wire(cls, raw: object) -> Any:
        """The line ``raw`` (parsed JSON, its ``type`` already taken off or still its own)
        describes; anything else (unknown or missing keys, a wrong type, a failed check) is
        :class:`MalformedFrame`."""
        try:
            if type(raw) is not dict:
                raise TypeError("expected an object")
            body = dict(raw)
            if "type" in body and body.pop("type") != cls.type:
                raise ValueError(f"expected a {cls.type}")
            values: dict[str, Any] = {}
            for spec in cls._specs:
                if spec.wire in body:
                    values[spec.name] = spec.load(body.pop(spec.wire))
                elif spec.required:
                    raise KeyError(spec.wire)
            if body:
                raise KeyError("unknown keys")
            return cls(**values)
        except MalformedFrame:
            raise
        except (TypeError, ValueError, KeyError) as exc:
            raise MalformedFrame(f"not a valid {cls.__name__}") from exc


def _is_str(_instance: object, spec: Any, value: object) -> None:
    if type(value) is not str:
        raise ValueError(f"{spec.name}: expected a string")


def _is_int(_instance: object, spec: Any, value: object) -> None:
    if type(value) is not int:
        raise ValueError(f"{spec.name}: expected an integer")


def _is_optional_int(_instance: object, spec: Any, value: object) -> None:
    if value is not None and type(value) is not int:
        raise ValueError(f"{spec.name}: expected an integer")


def encode_line(line: _Line) -> bytes:
    """``line`` as one compact line of UTF-8 JSON (without the newline)."""
    return json.dumps(line.to_wire(), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _parse(data: bytes | str, max_bytes: int) -> Any:
    """Strict JSON: size first, UTF-8, no duplicate keys, no NaN/Infinity (as the codec)."""
    if len(data) > max_bytes:
        raise MalformedFrame(f"larger than {max_bytes} bytes")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        if len(text.encode("utf-8")) > max_bytes:
            raise MalformedFrame(f"larger than {max_bytes} bytes")
        return strictjson.loads(text)
    except MalformedFrame:
        raise
    except (ValueError, UnicodeError, RecursionError) as exc:
        raise MalformedFrame("not valid JSON") from exc


# --- the key line: first on every connection ---------------------------------------------------
# ``key HEX`` ahead of the request: the service key (:mod:`agentcall.local.servicekey`), which
# only the owner's own processes can read. Its own plain form, not a JSON line, so the service
# can check it before it parses anything the client wrote.
KEY_LINE_PREFIX: Final = b"key "
KEY_LINE_BYTES: Final = len(KEY_LINE_PREFIX) + 64


def encode_key_line(key: str) -> bytes:
    """The line that opens a connection to the service (ended by its newline)."""
    return KEY_LINE_PREFIX + key.encode("ascii") + b"\n"


def key_from_line(line: bytes) -> bytes:
    """The key a client's first line shows (without its newline); :class:`MalformedFrame`
    when the line is not of that form."""
    if len(line) != KEY_LINE_BYTES or not line.startswith(KEY_LINE_PREFIX):
        raise MalformedFrame("the connection did not open with the service key")
    key = line[len(KEY_LINE_PREFIX) :]
    if not all(c in b"0123456789abcdef" for c in key):
        raise MalformedFrame("the connection did not open with the service key")
    return key


def decode_line(data: bytes | str, accept: Collection[type[Any]], *, max_bytes: int) -> Any:
    """Decode one line of the local socket of an accepted type; :class:`MalformedFrame` else."""
    raw = _parse(data, max_bytes)
    if type(raw) is not dict:
        raise MalformedFrame("a frame is a JSON object")
    line_type = raw.pop("type", None)
    if type(line_type) is not str or line_type not in LOCAL_TYPES:
        raise MalformedFrame("unknown frame type")
    cls = LOCAL_TYPES[line_type]
    if cls not in accept:
        raise MalformedFrame(f"{line_type} is not expected here")
    return cls.from_wire(raw)


# --- a call: `agentcall call` ------------------------------------------------------------------


def _one_thread(instance: LocalCall, _spec: Any, value: bool) -> None:
    if value and instance.context_id is not None:
        raise ValueError("continue and context_id exclude each other")


class LocalCall(_Line):
    """The CLI's request: the call as the person typed it (the service resolves TARGET)."""

    type: ClassVar[str] = "call"
    _fields = ("target", "message", "task", "continue_", "context_id", "queue", "timeout_ms")
    __slots__ = _fields
    _specs = (
        _Spec("target", _is_str, f.text(MAX_TARGET_CHARS, min_chars=1), required=True),
        _Spec(
            "message", _is_str, f.utf8_bytes(limits.MAX_MESSAGE_BYTES, min_bytes=1), required=True
        ),
        _Spec("task", f.optional(f.task_id)),
        _Spec("continue_", f.boolean, _one_thread, wire="continue"),
        _Spec("context_id", f.optional(f.context_id)),
        _Spec("queue", f.boolean),
        _Spec("timeout_ms", _is_int, f.integer(MIN_TIMEOUT_MS, MAX_TIMEOUT_MS)),
    )
    target: str
    message: str
    task: str | None
    continue_: bool
    context_id: str | None
    queue: bool
    timeout_ms: int

    def __init__(
        self,
        target: str,
        message: str,
        task: str | None = None,
        continue_: bool = False,
        context_id: str | None = None,
        queue: bool = True,
        timeout_ms: int = MAX_TIMEOUT_MS,
    ) -> None:
        self._set(
            target=target,
            message=message,
            task=task,
            continue_=continue_,
            context_id=context_id,
            queue=queue,
            timeout_ms=timeout_ms,
        )
        self._check()

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000


def _call_state(_instance: object, _spec: Any, value: str) -> None:
    if type(value) is not str or value not in CALL_STATES:
        raise ValueError("state: not a call state")


class LocalStatus(_Line):
    """The call's lifecycle as the relay reports it: ringing, answered, working."""

    type: ClassVar[str] = "status"
    _fields = ("state", "call_id")
    __slots__ = _fields
    _specs = (
        _Spec("state", _call_state, required=True),
        _Spec("call_id", f.call_id, required=True),
    )
    state: str
    call_id: str

    def __init__(self, state: str, call_id: str) -> None:
        self._set(state=state, call_id=call_id)
        self._check()


class LocalNote(_Line):
    """A warning that does not stop the call (printed as ``agentcall: warning: …``)."""

    type: ClassVar[str] = "note"
    _fields = ("text",)
    __slots__ = _fields
    _specs = (_Spec("text", _is_str, f.text(MAX_NOTE_CHARS, min_chars=1), required=True),)
    text: str

    def __init__(self, text: str) -> None:
        self._set(text=text)
        self._check()


def _code_fits(instance: LocalEnded, _spec: Any, value: str | None) -> None:
    if instance.kind is EndKind.FAILED:
        if value is None or value not in CallErrorCode._value2member_map_:
            raise ValueError("a failed call carries a known call error code")
    elif instance.kind is EndKind.REFUSED:
        if type(value) is not str or REFUSAL_CODE_RE.match(value) is None:
            raise ValueError("a refusal carries a code")
    elif value is not None:
        raise ValueError("only a failure or a refusal carries a code")


def _shape(instance: LocalEnded, _spec: Any, _value: object) -> None:
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


def _end_kind(value: Any) -> EndKind:
    if type(value) is not str:
        raise TypeError("kind: expected a string")
    return EndKind(value)


def _dump_str(value: Any) -> Any:
    return str(value)


def _dump_tuple(value: tuple[Any, ...]) -> list[Any]:
    return list(value)


class LocalEnded(_Line):
    """How the call ended, with everything ``agentcall call`` prints about it."""

    type: ClassVar[str] = "ended"
    _fields = (
        "kind",
        "address",
        "call_id",
        "text",
        "task",
        "context_id",
        "job_id",
        "expires_at",
        "code",
        "detail",
        "offered",
        "message",
        "ended",
        "conversation_note",
    )
    __slots__ = _fields
    _specs = (
        _Spec("kind", required=True, load=_end_kind, dump=_dump_str),
        # The resolved address; None only when the target could not be resolved.
        _Spec("address", f.optional(f.address)),
        _Spec("call_id", f.optional(f.call_id)),
        # answer
        _Spec("text", f.optional(f.utf8_bytes(limits.MAX_REPLY_BYTES))),
        _Spec("task", f.optional(f.task_id)),
        _Spec("context_id", f.optional(f.context_id)),
        # queued
        _Spec("job_id", f.optional(f.job_id)),
        _Spec("expires_at", _is_optional_int, f.optional(f.timestamp)),
        # failed (a CallErrorCode) or refused (a local reason: identity_changed, bad_target, …)
        _Spec("code", _code_fits),
        _Spec("detail", f.optional(f.text(MAX_LOCAL_TEXT_CHARS))),
        _Spec(
            "offered",
            f.each(f.task_id, max_items=limits.MAX_OFFERED_TASKS),
            load=_list_to_tuple,
            dump=_dump_tuple,
        ),
        _Spec("message", f.optional(f.text(MAX_LOCAL_TEXT_CHARS, min_chars=1))),
        # The conversation this call continued has ended (the callee said context_unknown).
        _Spec("ended", f.boolean),
        # The line about the open conversations, printed as `agentcall: …` before the result.
        _Spec("conversation_note", f.optional(f.text(MAX_NOTE_CHARS, min_chars=1)), _shape),
    )
    kind: EndKind
    address: str | None
    call_id: str | None
    text: str | None
    task: str | None
    context_id: str | None
    job_id: str | None
    expires_at: int | None
    code: str | None
    detail: str | None
    offered: tuple[str, ...]
    message: str | None
    ended: bool
    conversation_note: str | None

    def __init__(
        self,
        kind: EndKind | str,
        address: str | None = None,
        call_id: str | None = None,
        text: str | None = None,
        task: str | None = None,
        context_id: str | None = None,
        job_id: str | None = None,
        expires_at: int | None = None,
        code: str | None = None,
        detail: str | None = None,
        offered: tuple[str, ...] = (),
        message: str | None = None,
        ended: bool = False,
        conversation_note: str | None = None,
    ) -> None:
        self._set(
            kind=EndKind(kind),
            address=address,
            call_id=call_id,
            text=text,
            task=task,
            context_id=context_id,
            job_id=job_id,
            expires_at=expires_at,
            code=code,
            detail=detail,
            offered=offered,
            message=message,
            ended=ended,
            conversation_note=conversation_note,
        )
        self._check()

    @classmethod
    def refused(cls, code: str, message: str, address: str | None = None) -> LocalEnded:
        return cls(EndKind.REFUSED, address, code=code, message=clip(message))


# --- jobs: `agentcall jobs list|get|cancel` ----------------------------------------------------

JOBS_COMMANDS: Final = ("list", "get", "cancel")
MAX_JOBS_WAIT_S: Final = int(limits.MAILBOX_TTL_S)


def _jobs_command(_instance: object, _spec: Any, value: str) -> None:
    if type(value) is not str or value not in JOBS_COMMANDS:
        raise ValueError("command: list, get or cancel")


def _jobs_request_shape(instance: LocalJobs, _spec: Any, _value: object) -> None:
    if instance.command == "list":
        if instance.job_id is not None or instance.wait_s:
            raise ValueError("a list names no job and does not wait")
    elif instance.target is None or instance.job_id is None:
        raise ValueError("get and cancel name the other party and the job")


class LocalJobs(_Line):
    """The CLI's ``agentcall jobs`` request: the subcommand and its arguments as typed
    (TARGET resolved by the service; the job id already checked and lowercased)."""

    type: ClassVar[str] = "jobs"
    _fields = ("command", "target", "job_id", "wait_s")
    __slots__ = _fields
    _specs = (
        _Spec("command", _jobs_command, required=True),
        _Spec("target", f.optional(f.text(MAX_TARGET_CHARS, min_chars=1))),
        _Spec("job_id", f.optional(f.job_id)),
        _Spec("wait_s", _is_int, f.integer(0, MAX_JOBS_WAIT_S), _jobs_request_shape),
    )
    command: str
    target: str | None
    job_id: str | None
    wait_s: int

    def __init__(
        self,
        command: str,
        target: str | None = None,
        job_id: str | None = None,
        wait_s: int = 0,
    ) -> None:
        self._set(command=command, target=target, job_id=job_id, wait_s=wait_s)
        self._check()


class LocalProgress(_Line):
    """A line for stderr while a job is followed (``waiting up to 60 s for job …``)."""

    type: ClassVar[str] = "progress"
    _fields = ("text",)
    __slots__ = _fields
    _specs = (_Spec("text", _is_str, f.text(MAX_NOTE_CHARS, min_chars=1), required=True),)
    text: str

    def __init__(self, text: str) -> None:
        self._set(text=text)
        self._check()


def _job_infos(_instance: object, spec: Any, value: object) -> None:
    if not isinstance(value, tuple) or len(value) > limits.MAX_JOBS_LISTED:
        raise ValueError(f"{spec.name}: at most {limits.MAX_JOBS_LISTED} jobs")
    for item in value:
        _no_answer(_instance, spec, item)


def _no_answer(_instance: object, spec: Any, value: object) -> None:
    from agentcall.wire.http import JobInfo

    # The sealed answer stays in the service: what the CLI prints of it is ``result``.
    if not isinstance(value, JobInfo) or value.answer is not None:
        raise ValueError(f"{spec.name}: a job, without its sealed answer")


def _jobs_end_shape(instance: LocalJobsEnded, _spec: Any, _value: object) -> None:
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


def _answer_or_failure(_instance: object, _spec: Any, value: LocalEnded | None) -> None:
    if value is not None and (
        not isinstance(value, LocalEnded) or value.kind not in (EndKind.ANSWER, EndKind.FAILED)
    ):
        raise ValueError("result: an answer or a failure")


# JobInfo is an attrs shape of agentcall.wire.http: read and written by the codec, which only
# the jobs lines need (imported when one is read or written, never by a thin call).
def _load_job(value: Any) -> JobInfo:
    from agentcall.wire import codec
    from agentcall.wire.http import JobInfo

    return codec.structure(value, JobInfo)


def _load_jobs(value: Any) -> tuple[JobInfo, ...]:
    return tuple(_load_job(item) for item in _list_to_tuple(value))


def _load_optional_job(value: Any) -> JobInfo | None:
    return None if value is None else _load_job(value)


def _dump_job(value: JobInfo) -> Any:
    from agentcall.wire import codec

    return codec.converter.unstructure(value)


def _dump_jobs(value: Sequence[JobInfo]) -> list[Any]:
    return [_dump_job(item) for item in value]


def _dump_optional_job(value: JobInfo | None) -> Any:
    return None if value is None else _dump_job(value)


def _load_result(value: Any) -> LocalEnded | None:
    # Encoded with its own tag (``"type": "ended"``); only that tag is accepted there.
    if value is None:
        return None
    result: LocalEnded = LocalEnded.from_wire(value)
    return result


def _dump_result(value: LocalEnded | None) -> Any:
    return None if value is None else value.to_wire()


class LocalJobsEnded(_Line):
    """Everything ``agentcall jobs`` prints, from either path (the service, or the relay dialled
    directly): the jobs listed, or the one job (with ``result``: how a ``get`` ended for the
    caller), or trouble (``code``, ``message``: a JobUnavailable or a refusal such as
    bad_target). ``now`` is when it was looked at, for ages."""

    type: ClassVar[str] = "jobs_ended"
    _fields = ("now", "address", "jobs", "info", "result", "code", "message")
    __slots__ = _fields
    _specs = (
        _Spec("now", _is_int, f.timestamp, required=True),
        _Spec("address", f.optional(f.address)),
        _Spec("jobs", _job_infos, load=_load_jobs, dump=_dump_jobs),
        _Spec("info", f.optional(_no_answer), load=_load_optional_job, dump=_dump_optional_job),
        _Spec("result", _answer_or_failure, load=_load_result, dump=_dump_result),
        _Spec("code", f.optional(f.matches(REFUSAL_CODE_RE))),
        _Spec(
            "message",
            f.optional(f.text(MAX_LOCAL_TEXT_CHARS, min_chars=1)),
            _jobs_end_shape,
        ),
    )
    now: int
    address: str | None
    jobs: tuple[JobInfo, ...]
    info: JobInfo | None
    result: LocalEnded | None
    code: str | None
    message: str | None

    def __init__(
        self,
        now: int,
        address: str | None = None,
        jobs: tuple[JobInfo, ...] = (),
        info: JobInfo | None = None,
        result: LocalEnded | None = None,
        code: str | None = None,
        message: str | None = None,
    ) -> None:
        self._set(
            now=now,
            address=address,
            jobs=jobs,
            info=info,
            result=result,
            code=code,
            message=message,
        )
        self._check()

    @classmethod
    def trouble(
        cls, now: float, code: str, message: str, address: str | None = None
    ) -> LocalJobsEnded:
        return cls(int(now), address, code=code, message=clip(message))


ToService = LocalCall | LocalJobs
FromService = LocalStatus | LocalNote | LocalEnded | LocalProgress | LocalJobsEnded

# type tag -> class, for the one decoder (decode_line).
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
