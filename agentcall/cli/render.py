"""Terminal-safe output and the human wording of errors.

Everything printed that came from elsewhere — a remote agent's reply, a relay's error text, a
peer's task names — passes through here first. Agent CLIs pass escape sequences through
verbatim, so a reply could otherwise recolour the terminal, retitle the window, plant an OSC 8
link whose text lies about its target, write the clipboard with OSC 52, or use a bare carriage
return, backspaces or bidi overrides to make one text display as another.

The rule is simple: every control character except TAB and LF, and every invisible formatting
character that can be used for spoofing, becomes a space; CR is dropped. ESC is a control
character, so no CSI, OSC or DCS sequence survives — what remains of one is printable text.
"""

from __future__ import annotations

import json
import re
from typing import Final

from agentcall.errors import CallErrorCode

# C0 except TAB and LF, DEL, and C1 (which holds 0x9b, the one-byte CSI, and 0x9d, OSC).
_CONTROLS = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
# Invisible characters that reorder or hide text: the Arabic letter mark, LRM/RLM, the bidi
# embeddings and overrides, the isolates, zero-width space, word joiner and invisible
# operators, line and paragraph separators, Mongolian vowel separator, byte-order mark,
# interlinear annotation marks, and the tag block (used to smuggle invisible ASCII).
# ZWJ/ZWNJ stay: emoji sequences and several scripts need them.
_INVISIBLE = (
    r"\u061c\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069"
    r"\u180e\ufeff\ufff9-\ufffb\U000e0000-\U000e007f"
)
# Lone surrogates: what undecodable bytes become under surrogateescape. They cannot be
# written to a UTF-8 terminal at all, so they turn into the replacement character.
_SURROGATES = r"\ud800-\udfff"

_TEXT_UNSAFE = re.compile(f"[{_CONTROLS}{_INVISIBLE}]")
_CELL_UNSAFE = re.compile(f"[\t\n{_CONTROLS}{_INVISIBLE}]")
_SURROGATE = re.compile(f"[{_SURROGATES}]")
# What JSON leaves literal but a terminal would act on or hide.
_JSON_UNSAFE = re.compile(f"[\x7f-\x9f{_INVISIBLE}{_SURROGATES}]")


def _clean(text: str, unsafe: re.Pattern[str]) -> str:
    text = text.replace("\r", "")
    text = _SURROGATE.sub("\ufffd", text)
    return unsafe.sub(" ", text)


def safe_text(text: str) -> str:
    """Multi-line text for the terminal: keeps TAB and LF, neutralises everything else."""
    return _clean(text, _TEXT_UNSAFE)


def safe_cell(text: str) -> str:
    """One-line text for a table cell or a status line: TAB and LF become spaces too."""
    return _clean(text, _CELL_UNSAFE)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    # Outside the BMP, JSON spells a character as its UTF-16 surrogate pair.
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def safe_json(value: object, *, indent: int | None = None) -> str:
    """``json.dumps`` that keeps UTF-8 readable but escapes what a terminal would act on.

    JSON already escapes C0 controls; DEL, C1, the invisible characters above and lone
    surrogates are left literal by ``json.dumps``, so they are ``\\u``-escaped here. They can
    only occur inside strings, so the result is still the same JSON value.
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
}


def describe_error(code: CallErrorCode) -> str:
    """One plain sentence saying what went wrong, for the CLI's one-line failure reason."""
    return _DESCRIPTIONS[code]
