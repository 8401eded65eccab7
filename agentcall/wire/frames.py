"""WebSocket frames of the synchronous call path, and the sealed envelope they carry.

Every frame is a JSON object with a ``type``; the classes below are the only definition of what
each frame holds. Who sends what:

- caller → relay: ``call_request``, ``cancel_call``
- relay → caller: ``ready``, ``call_status``, ``call_error``, ``call_outcome``, ``call_queued``
- relay → listener: ``ready``, ``incoming_call``, ``cancel_call``; and for a listener that
  dialled with ``mailbox=1``: ``job_delivery``, ``cancel_job``, ``job_ack``. A relay attaches
  the caller's published key records to ``incoming_call`` and ``job_delivery``
  (``caller_keys``), which the listener verifies like records it fetched
- listener → relay: ``call_accepted``, ``call_started``, ``call_rejected``, ``call_cancelled``,
  ``call_not_cancelled``, ``call_outcome``; and ``job_accepted``, ``job_declined``,
  ``job_renew``, ``job_result``, and ``jobs_held`` (first, to a relay whose ``ready`` asks)

The offline mailbox (docs/mailbox.md): a ``call_request`` with ``queue: true`` to a callee who
has opted in and is offline or busy is kept by the relay as a job, and the caller is told
``call_queued`` only once the job is durably stored. The callee's listener later receives it as
``job_delivery``, takes it (``job_accepted``, after its execution journal committed) or leaves it
(``job_declined``), renews its lease while the agent runs, and sends one ``job_result``: the
sealed answer, or an error it reports in clear. The relay confirms a stored result with
``job_ack``; until then the listener sends the result again on every new connection.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import ClassVar, TypeVar

import attrs

from agentcall import limits
from agentcall.errors import RELAY_CALL_ERRORS, CallErrorCode
from agentcall.wire import fields as f
from agentcall.wire.keyrecords import KeysResponse

T = TypeVar("T")

# Written only when set (see agentcall.wire.codec.OMIT_IF_DEFAULT): a frame that does not use a
# later field reads exactly as it did before the field existed.
_LATER = {"agentcall.omit_if_default": True}

# A hand-written encoder (codec.HAND_WRITTEN): the frame, and the codec's generic encoder for a
# sub-document it does not write itself (passed in: the codec imports this module, not the
# reverse). It must give the very bytes the generic encoder gives (tests compare).
NestedText = Callable[[object], str]
HandWritten = Callable[[T, NestedText], bytes]


class Direction(enum.StrEnum):
    REQUEST = "request"
    RESPONSE = "response"


@attrs.frozen
class SealedEnvelope:
    """An HPKE-sealed, signed payload with its routing header in clear.

    The relay reads the header to route; the header is bound into the ciphertext through HPKE
    ``info``, so changing any of it makes the envelope unopenable.
    """

    v: int = attrs.field(validator=f.exactly(1))
    direction: Direction = attrs.field(converter=Direction)
    relay_origin: str = attrs.field(validator=f.relay_origin)
    from_: str = attrs.field(validator=f.address)
    to: str = attrs.field(validator=f.address)
    key_id: str = attrs.field(validator=f.hex32)  # the recipient's encryption key id
    epoch: int = attrs.field(validator=f.epoch_number)  # the recipient's key epoch
    ct: str = attrs.field(  # base64url of HPKE enc || ciphertext
        validator=f.b64url((limits.MAX_RESPONSE_CIPHERTEXT_BYTES * 4 + 2) // 3 + 64, min_chars=44),
        # base64url only: JSON never escapes it, so the encoder copies it (codec.UNESCAPED).
        metadata={"agentcall.unescaped": True},
    )


class CallState(enum.StrEnum):
    RINGING = "ringing"
    ANSWERED = "answered"
    WORKING = "working"


class Terminal(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"


class Role(enum.StrEnum):
    LISTEN = "listen"
    CALL = "call"


class CancelPhase(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"


class NotCancelledReason(enum.StrEnum):
    ALREADY_TERMINAL = "already_terminal"
    UNKNOWN = "unknown"
    TOO_LATE = "too_late"


def _relay_error(_inst: object, attribute: attrs.Attribute[CallErrorCode], value: object) -> None:
    if value not in _RELAY_ERRORS:
        raise ValueError(f"{attribute.name}: not a relay error code")


# The one list of codes a relay may send in clear lives beside the codes themselves.
_RELAY_ERRORS = RELAY_CALL_ERRORS


class JobError(enum.StrEnum):
    """What a listener reports in clear instead of a sealed answer to a mailbox job."""

    INDETERMINATE_EXECUTION = "indeterminate_execution"  # the journal says it may have run
    REJECTED = "rejected"  # the sealed request did not open or verify, or was replayed
    CANCELED = "canceled"  # stopped because the relay sent cancel_job


@attrs.frozen
class Ready:
    """The relay's first frame on a socket: the connection is authenticated and usable."""

    type: ClassVar[str] = "ready"
    role: Role = attrs.field(converter=Role)
    address: str = attrs.field(validator=f.address)
    relay_origin: str = attrs.field(validator=f.relay_origin)
    # On a listener socket: the relay takes this installation's own outgoing calls on it. A
    # relay from before the persistent socket does not say so, and its listeners' calls then
    # take a socket of their own instead of waiting for answers that would never come.
    calls: bool = attrs.field(default=False, validator=f.boolean, metadata=_LATER)
    # On a mailbox listener's socket: the relay takes ``jobs_held``. A relay that predates it
    # does not say so, and is sent none (it would only log the frame as malformed).
    jobs_held: bool = attrs.field(default=False, validator=f.boolean, metadata=_LATER)


@attrs.frozen
class CallRequest:
    type: ClassVar[str] = "call_request"
    envelope: SealedEnvelope
    correlation_id: str = attrs.field(validator=f.correlation_id)
    # The caller accepts a queued job when the callee is offline or busy and has opted in.
    queue: bool = attrs.field(default=False, validator=f.boolean)
    # The target handle, on an installation's persistent socket only (``role=listen``): there
    # the frame itself names whom it calls. A per-call socket names it in its URL instead.
    to: str | None = attrs.field(default=None, validator=f.optional(f.handle), metadata=_LATER)


@attrs.frozen
class CallQueued:
    """The request is stored as a job (committed); the caller fetches the answer later."""

    type: ClassVar[str] = "call_queued"
    job_id: str = attrs.field(validator=f.job_id)
    expires_at: int = attrs.field(validator=f.timestamp)
    # The request's correlation_id, on a socket that carries several calls.
    correlation_id: str | None = attrs.field(
        default=None, validator=f.optional(f.correlation_id), metadata=_LATER
    )


@attrs.frozen
class CallStatus:
    type: ClassVar[str] = "call_status"
    hand_written_json: ClassVar[HandWritten[CallStatus]]
    call_id: str = attrs.field(validator=f.call_id)
    state: CallState = attrs.field(converter=CallState)
    # The request's correlation_id, on a socket that carries several calls.
    correlation_id: str | None = attrs.field(
        default=None, validator=f.optional(f.correlation_id), metadata=_LATER
    )


def _call_status_json(status: CallStatus, _nested: NestedText) -> bytes:
    # The relay writes three a call. Every field is held by its validator to characters JSON
    # never escapes (a call id, a state name, a hex correlation id): no escaping to do.
    head = f'{{"type":"call_status","call_id":"{status.call_id}","state":"{status.state.value}"'
    if status.correlation_id is None:
        return f"{head}}}".encode("ascii")
    return f'{head},"correlation_id":"{status.correlation_id}"}}'.encode("ascii")


# Written by agentcall.wire.codec.encode (codec.HAND_WRITTEN).
CallStatus.hand_written_json = staticmethod(_call_status_json)


@attrs.frozen
class CallError:
    """A relay-originated failure. Not authenticated; the relay closes the socket after it."""

    type: ClassVar[str] = "call_error"
    code: CallErrorCode = attrs.field(converter=CallErrorCode, validator=_relay_error)
    call_id: str | None = attrs.field(default=None, validator=f.optional(f.call_id))
    detail: str | None = attrs.field(
        default=None, validator=f.optional(f.text(limits.MAX_DETAIL_CHARS))
    )
    # The request's correlation_id, on a socket that carries several calls.
    correlation_id: str | None = attrs.field(
        default=None, validator=f.optional(f.correlation_id), metadata=_LATER
    )


@attrs.frozen
class CallOutcome:
    """The listener's sealed answer, forwarded verbatim by the relay to the caller."""

    type: ClassVar[str] = "call_outcome"
    call_id: str = attrs.field(validator=f.call_id)
    terminal: Terminal = attrs.field(converter=Terminal)
    envelope: SealedEnvelope


@attrs.frozen
class IncomingCall:
    type: ClassVar[str] = "incoming_call"
    hand_written_json: ClassVar[HandWritten[IncomingCall]]
    call_id: str = attrs.field(validator=f.call_id)
    from_: str = attrs.field(validator=f.handle)  # relay-verified caller handle (same org)
    envelope: SealedEnvelope
    correlation_id: str = attrs.field(validator=f.correlation_id)
    # Roster ids the relay attests both sides share (filled by the organisation features).
    groups: tuple[str, ...] = attrs.field(default=(), validator=f.each(f.roster_id, max_items=50))
    # The caller's current published records (identity and newest encryption epoch), as
    # ``GET /v1/keys/<caller>`` would serve them, so the listener need not fetch them. Not
    # trusted: the listener verifies them against its pin and their signatures like fetched ones.
    caller_keys: KeysResponse | None = attrs.field(default=None, metadata=_LATER)


def _incoming_call_json(call: IncomingCall, nested: NestedText) -> bytes:
    # One a call, the relay's largest frame on the request's path. Every field but the caller's
    # key records is held by its validator to text JSON never escapes (ids, addresses, an
    # origin, base64url, digits); the records are the codec's (encoded once per object).
    env = call.envelope
    text = "".join(
        (
            '{"type":"incoming_call","call_id":"',
            call.call_id,
            '","from":"',
            call.from_,
            '","envelope":{"v":',
            str(env.v),
            ',"direction":"',
            env.direction.value,
            '","relay_origin":"',
            env.relay_origin,
            '","from":"',
            env.from_,
            '","to":"',
            env.to,
            '","key_id":"',
            env.key_id,
            '","epoch":',
            str(env.epoch),
            ',"ct":"',
            env.ct,
            '"},"correlation_id":"',
            call.correlation_id,
            '","groups":[',
            ",".join(f'"{group}"' for group in call.groups),
            "]",
            "" if call.caller_keys is None else ',"caller_keys":' + nested(call.caller_keys),
            "}",
        )
    )
    return text.encode("utf-8")


# Written by agentcall.wire.codec.encode (codec.HAND_WRITTEN).
IncomingCall.hand_written_json = staticmethod(_incoming_call_json)


@attrs.frozen
class CancelCall:
    type: ClassVar[str] = "cancel_call"
    call_id: str = attrs.field(validator=f.call_id)


@attrs.frozen
class CallAccepted:
    type: ClassVar[str] = "call_accepted"
    call_id: str = attrs.field(validator=f.call_id)


@attrs.frozen
class CallStarted:
    type: ClassVar[str] = "call_started"
    call_id: str = attrs.field(validator=f.call_id)


@attrs.frozen
class CallRejected:
    """The listener could not open or verify the envelope (or it was replayed)."""

    type: ClassVar[str] = "call_rejected"
    call_id: str = attrs.field(validator=f.call_id)
    code: CallErrorCode = attrs.field(
        default=CallErrorCode.PROTOCOL_ERROR,
        converter=CallErrorCode,
        validator=attrs.validators.in_({CallErrorCode.PROTOCOL_ERROR}),
    )


@attrs.frozen
class CallCancelled:
    type: ClassVar[str] = "call_cancelled"
    call_id: str = attrs.field(validator=f.call_id)
    phase: CancelPhase = attrs.field(converter=CancelPhase)


@attrs.frozen
class CallNotCancelled:
    type: ClassVar[str] = "call_not_cancelled"
    call_id: str = attrs.field(validator=f.call_id)
    reason: NotCancelledReason = attrs.field(converter=NotCancelledReason)


# --- the offline mailbox ------------------------------------------------------------------------


@attrs.frozen
class JobDelivery:
    """A queued job handed to its callee's listener under a lease (one at a time)."""

    type: ClassVar[str] = "job_delivery"
    job_id: str = attrs.field(validator=f.job_id)
    from_: str = attrs.field(validator=f.handle)  # relay-verified caller handle (same org)
    envelope: SealedEnvelope
    expires_at: int = attrs.field(validator=f.timestamp)  # the job's, by the relay's clock
    attempt: int = attrs.field(validator=f.integer(1, 100))
    # The caller's current published records at delivery, as on ``incoming_call``.
    caller_keys: KeysResponse | None = attrs.field(default=None, metadata=_LATER)


@attrs.frozen
class CancelJob:
    """The caller cancelled (or the relay ended) a job this listener holds: drop or kill it."""

    type: ClassVar[str] = "cancel_job"
    job_id: str = attrs.field(validator=f.job_id)


@attrs.frozen
class JobAck:
    """The relay has durably stored the listener's ``job_result`` (or no longer needs it)."""

    type: ClassVar[str] = "job_ack"
    job_id: str = attrs.field(validator=f.job_id)


def _storage_error(_inst: object, attribute: attrs.Attribute[CallErrorCode], value: object) -> None:
    if value not in (CallErrorCode.STORAGE_FULL, CallErrorCode.UNAVAILABLE):
        raise ValueError(f"{attribute.name}: not a storage error code")


@attrs.frozen
class JobNack:
    """The relay could not store the listener's ``job_result`` (its storage is failing): the
    listener keeps renewing the job's lease and sends the result again later, on the same
    connection, until a ``job_ack``. A listener that predates it ignores it and sends the
    result again on its next connection."""

    type: ClassVar[str] = "job_nack"
    job_id: str = attrs.field(validator=f.job_id)
    code: CallErrorCode = attrs.field(converter=CallErrorCode, validator=_storage_error)


@attrs.frozen
class JobAccepted:
    """The listener's journal holds the job; it runs now (the lease starts again)."""

    type: ClassVar[str] = "job_accepted"
    job_id: str = attrs.field(validator=f.job_id)


@attrs.frozen
class JobDeclined:
    """The listener cannot take the delivery now (busy or stopping); nothing was run."""

    type: ClassVar[str] = "job_declined"
    job_id: str = attrs.field(validator=f.job_id)


@attrs.frozen
class JobRenew:
    """The job's agent is still running: extend its lease."""

    type: ClassVar[str] = "job_renew"
    job_id: str = attrs.field(validator=f.job_id)


@attrs.frozen
class JobsHeld:
    """The listener's first frame on a connection whose ``ready`` said ``jobs_held``: every job
    it holds (running there, or its result not yet acknowledged), complete, possibly empty.
    The relay ends every other lease of this callee's that no open session of theirs was
    handed (a delivered job is queued again, a running one fails indeterminate_execution)."""

    type: ClassVar[str] = "jobs_held"
    job_ids: tuple[str, ...] = attrs.field(
        validator=f.each(f.job_id, max_items=limits.MAILBOX_MAX_JOBS_HELD)
    )


@attrs.frozen
class JobResult:
    """How a job ended at the listener: a sealed answer (with its terminal), or an error."""

    type: ClassVar[str] = "job_result"
    job_id: str = attrs.field(validator=f.job_id)
    terminal: Terminal | None = attrs.field(
        default=None, converter=attrs.converters.optional(Terminal)
    )
    envelope: SealedEnvelope | None = None
    error: JobError | None = attrs.field(
        default=None, converter=attrs.converters.optional(JobError)
    )

    def __attrs_post_init__(self) -> None:
        sealed = self.envelope is not None
        if sealed == (self.error is not None) or sealed != (self.terminal is not None):
            raise ValueError("a job result is a sealed answer with its terminal, or an error")


Frame = (
    Ready
    | CallRequest
    | CallStatus
    | CallError
    | CallOutcome
    | IncomingCall
    | CancelCall
    | CallAccepted
    | CallStarted
    | CallRejected
    | CallCancelled
    | CallNotCancelled
    | CallQueued
    | JobDelivery
    | CancelJob
    | JobAck
    | JobNack
    | JobAccepted
    | JobDeclined
    | JobRenew
    | JobsHeld
    | JobResult
)

FRAME_TYPES: dict[str, type[Frame]] = {
    cls.type: cls
    for cls in (
        Ready,
        CallRequest,
        CallStatus,
        CallError,
        CallOutcome,
        IncomingCall,
        CancelCall,
        CallAccepted,
        CallStarted,
        CallRejected,
        CallCancelled,
        CallNotCancelled,
        CallQueued,
        JobDelivery,
        CancelJob,
        JobAck,
        JobNack,
        JobAccepted,
        JobDeclined,
        JobRenew,
        JobsHeld,
        JobResult,
    )
}

# What each side may receive; anything else is a protocol error at that receiver.
FROM_CALLER: tuple[type[Frame], ...] = (CallRequest, CancelCall)
TO_CALLER: tuple[type[Frame], ...] = (Ready, CallStatus, CallError, CallOutcome, CallQueued)
# A listener socket is an installation's persistent socket: besides answering its own calls it
# carries the installation's outgoing calls, several at once (the caller frames above; the
# relay's answers carry the request's correlation_id until the call id is known).
FROM_LISTENER: tuple[type[Frame], ...] = (
    CallAccepted,
    CallStarted,
    CallRejected,
    CallCancelled,
    CallNotCancelled,
    CallOutcome,
    JobAccepted,
    JobDeclined,
    JobRenew,
    JobsHeld,
    JobResult,
    CallRequest,
    CancelCall,
)
TO_LISTENER: tuple[type[Frame], ...] = (
    Ready,
    IncomingCall,
    CancelCall,
    JobDelivery,
    CancelJob,
    JobAck,
    JobNack,
    CallStatus,
    CallError,
    CallOutcome,
    CallQueued,
)
# The frames about the installation's own outgoing calls on its persistent socket.
OUTGOING_FROM_LISTENER: tuple[type[Frame], ...] = (CallRequest, CancelCall)
OUTGOING_TO_LISTENER: tuple[type[Frame], ...] = (CallStatus, CallError, CallOutcome, CallQueued)
# The listener frames about mailbox jobs (the rest of FROM_LISTENER is about live calls).
JOB_FRAMES_FROM_LISTENER: tuple[type[Frame], ...] = (
    JobAccepted,
    JobDeclined,
    JobRenew,
    JobsHeld,
    JobResult,
)
