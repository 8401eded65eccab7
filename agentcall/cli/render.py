"""Terminal-safe output and the human wording of errors.

Everything printed that came from elsewhere — a remote agent's reply, a relay's error text, a
peer's task names — passes through here first. What counts as unsafe is defined once, in
:mod:`agentcall.safetext` (the listener cleans answers with the same code before sealing
them); :func:`safe_text` and :func:`safe_cell` are that module's, and :func:`safe_json` keeps
``--json`` output free of what a terminal would act on even before it is decoded.
"""

from __future__ import annotations

import json
import re

from agentcall.errors import CallErrorCode
from agentcall.safetext import DEL_AND_C1, INVISIBLE, SURROGATES, safe_cell, safe_text

# typing is imported for the type checker only: the thin `agentcall call` imports this module,
# and typing costs that process milliseconds (tests/unit/test_cli_call_thin.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

__all__ = ["describe_error", "safe_cell", "safe_json", "safe_text"]

# What JSON leaves literal but a terminal would act on or hide (JSON escapes C0 itself).
_JSON_UNSAFE = re.compile(f"[{DEL_AND_C1}{INVISIBLE}{SURROGATES}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    # Outside the BMP, JSON spells a character as its UTF-16 surrogate pair.
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def safe_json(value: object, *, indent: int | None = None) -> str:
    """``json.dumps`` that keeps UTF-8 readable but escapes what a terminal would act on.

    JSON already escapes C0 controls; DEL, C1, the invisible characters of
    :mod:`agentcall.safetext` and lone surrogates are left literal by ``json.dumps``, so they
    are ``\\u``-escaped here. They can only occur inside strings, so the result is still the
    same JSON value.
    """
    return _JSON_UNSAFE.sub(_escape, json.dumps(value, ensure_ascii=False, indent=indent))


_DESCRIPTIONS: Final[dict[CallErrorCode, str]] = {
    CallErrorCode.OFFLINE: "The agent you called is offline: its listener is not connected.",
    CallErrorCode.BUSY: "The agent you called is busy with another call; try again shortly.",
    CallErrorCode.RATE_LIMITED: "You have called this agent too often; wait before calling again.",
    CallErrorCode.MESSAGE_TOO_LARGE: "Your message is too large to send.",
    CallErrorCode.BLOCKED: "The owner of that agent does not take calls from you.",
    CallErrorCode.TASK_UNKNOWN: "The agent you called has no task by that name.",
    CallErrorCode.TASK_NOT_OFFERED: "The agent you called does not offer that task to you.",
    CallErrorCode.CONTEXT_UNKNOWN: (
        "That conversation has ended or is unknown to the agent; start a new call."
    ),
    CallErrorCode.TIMEOUT: "The call took too long and was stopped before an answer came back.",
    CallErrorCode.UNAUTHORIZED: (
        "The relay did not accept this installation's credentials; run `agentcall doctor`."
    ),
    CallErrorCode.UNKNOWN_HANDLE: "No agent with that address is registered with the relay.",
    CallErrorCode.PROTOCOL_ERROR: (
        "The call failed because a message between the two sides was invalid or could not be "
        "verified."
    ),
    CallErrorCode.AGENT_ERROR: "The agent you called failed while working on an answer.",
    CallErrorCode.CANCELED: "The call was canceled before an answer came back.",
    CallErrorCode.CONNECTION_FAILED: "Could not reach the relay; check your network and relay URL.",
    CallErrorCode.DELIVERY_FAILED: (
        "The relay kept the call, but the agent's listener did not take it after three tries."
    ),
    CallErrorCode.INDETERMINATE_EXECUTION: (
        "The agent's listener stopped while the agent worked on your call: the agent may have "
        "acted on it, and the call will not be run again."
    ),
    CallErrorCode.REVOKED: "The call ended because you or the callee left the organisation.",
    CallErrorCode.EXPIRED: "The call was not answered within 72 hours and has expired.",
    CallErrorCode.STORAGE_FULL: (
        "The relay is out of storage space and cannot take calls now; try again later or tell "
        "its operator."
    ),
    CallErrorCode.UNAVAILABLE: (
        "The relay cannot use its storage right now; try again later or tell its operator."
    ),
    CallErrorCode.CALLEE_GONE: (
        "The agent you called went away during the call: its listener disconnected before "
        "answering."
    ),
}


def describe_error(code: CallErrorCode) -> str:
    """One plain sentence saying what went wrong, for the CLI's one-line failure reason."""
    return _DESCRIPTIONS[code]
