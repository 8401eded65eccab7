"""WebSocket frames of the synchronous call path, and the sealed envelope they carry.

Every frame is a JSON object with a ``type``; the classes below are the only definition of what
each frame holds. Who sends what:

- caller → relay: ``call_request``, ``cancel_call``
- relay → caller: ``ready``, ``call_status``, ``call_error``, ``call_outcome``
- relay → listener: ``ready``, ``incoming_call``, ``cancel_call``
- listener → relay: ``call_accepted``, ``call_started``, ``call_rejected``, ``call_cancelled``,
  ``call_not_cancelled``, ``call_outcome``
"""

from __future__ import annotations

import enum
from typing import ClassVar

import attrs

from agentcall import limits
from agentcall.errors import CallErrorCode
from agentcall.wire import fields as f


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
        validator=f.b64url((limits.MAX_RESPONSE_CIPHERTEXT_BYTES * 4 + 2) // 3 + 64, min_chars=44)
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


_RELAY_ERRORS = frozenset(
    {
        CallErrorCode.UNKNOWN_HANDLE,
        CallErrorCode.OFFLINE,
        CallErrorCode.TIMEOUT,
        CallErrorCode.CANCELED,
        CallErrorCode.UNAUTHORIZED,
        CallErrorCode.RATE_LIMITED,
        CallErrorCode.MESSAGE_TOO_LARGE,
        CallErrorCode.PROTOCOL_ERROR,
        CallErrorCode.BUSY,
    }
)


@attrs.frozen
class Ready:
    """The relay's first frame on a socket: the connection is authenticated and usable."""

    type: ClassVar[str] = "ready"
    role: Role = attrs.field(converter=Role)
    address: str = attrs.field(validator=f.address)
    relay_origin: str = attrs.field(validator=f.relay_origin)


@attrs.frozen
class CallRequest:
    type: ClassVar[str] = "call_request"
    envelope: SealedEnvelope
    correlation_id: str = attrs.field(validator=f.correlation_id)


@attrs.frozen
class CallStatus:
    type: ClassVar[str] = "call_status"
    call_id: str = attrs.field(validator=f.call_id)
    state: CallState = attrs.field(converter=CallState)


@attrs.frozen
class CallError:
    """A relay-originated failure. Not authenticated; the relay closes the socket after it."""

    type: ClassVar[str] = "call_error"
    code: CallErrorCode = attrs.field(converter=CallErrorCode, validator=_relay_error)
    call_id: str | None = attrs.field(default=None, validator=f.optional(f.call_id))
    detail: str | None = attrs.field(
        default=None, validator=f.optional(f.text(limits.MAX_DETAIL_CHARS))
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
    call_id: str = attrs.field(validator=f.call_id)
    from_: str = attrs.field(validator=f.handle)  # relay-verified caller handle (same org)
    envelope: SealedEnvelope
    correlation_id: str = attrs.field(validator=f.correlation_id)
    # Roster ids the relay attests both sides share (filled by the organisation features).
    groups: tuple[str, ...] = attrs.field(default=(), validator=f.each(f.roster_id, max_items=50))


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
    )
}

# What each side may receive; anything else is a protocol error at that receiver.
FROM_CALLER: tuple[type[Frame], ...] = (CallRequest, CancelCall)
FROM_LISTENER: tuple[type[Frame], ...] = (
    CallAccepted,
    CallStarted,
    CallRejected,
    CallCancelled,
    CallNotCancelled,
    CallOutcome,
)
TO_CALLER: tuple[type[Frame], ...] = (Ready, CallStatus, CallError, CallOutcome)
TO_LISTENER: tuple[type[Frame], ...] = (Ready, IncomingCall, CancelCall)
