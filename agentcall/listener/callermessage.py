"""The caller's verified request, closed to every stage but the one that builds the prompt.

Admission must never read what a caller wrote (``docs/security.md``, the admission invariant).
So the opened request travels through the pipeline as a :class:`CallerMessage` with no typed
attribute at all: ``message.text`` or ``message._request`` is an error under ``mypy --strict``.
Two functions open it, each for one purpose:

- :func:`open_for_prompt` gives the text; only :mod:`agentcall.listener.planning` imports it
  (``tests/unit/test_listener_callermessage.py`` checks that, module by module);
- :func:`seal_answer` seals an outcome to the caller. The answer is bound to the hash of the
  whole signed request, message included, so it needs the request but returns no text.
"""

from __future__ import annotations

from typing import Final, final

from agentcall import limits
from agentcall.crypto.envelope import seal_response
from agentcall.crypto.keys import IdentityKey
from agentcall.wire.frames import SealedEnvelope
from agentcall.wire.http import EncryptionKeyRecord
from agentcall.wire.payloads import CallFailure, Reply, RequestPayload

# The slot's name lives only here; code elsewhere has no typed way to reach it.
_SLOT: Final = "_request"


@final
class CallerMessage:
    """What the caller wrote, inside the request it came in. Opaque: see the module doc."""

    __slots__ = (_SLOT,)

    def __init__(self, request: RequestPayload) -> None:
        # Set by name, so the type checker knows of no attribute to read (or to write: the
        # slots leave no other attribute either).
        setattr(self, _SLOT, request)

    def __repr__(self) -> str:
        # Never the text: an opened call may end up in a log or a traceback.
        return "<CallerMessage>"


def _request_of(message: CallerMessage) -> RequestPayload:
    request = getattr(message, _SLOT)
    if not isinstance(request, RequestPayload):
        raise TypeError("not a CallerMessage made by open_envelope")
    return request


def open_for_prompt(message: CallerMessage) -> str:
    """The caller's text, for the prompt of an admitted call (planning only)."""
    return _request_of(message).message


def seal_answer(
    message: CallerMessage,
    *,
    responder: IdentityKey,
    outcome: Reply | CallFailure,
    caller_encryption: EncryptionKeyRecord,
    now: float,
    validity_s: float = limits.CALL_DEADLINE_S,
) -> SealedEnvelope:
    """``outcome`` signed by us, bound to the request it answers, sealed to the caller."""
    return seal_response(
        responder=responder,
        request=_request_of(message),
        outcome=outcome,
        caller_encryption=caller_encryption,
        now=now,
        validity_s=validity_s,
    )
