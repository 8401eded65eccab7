"""Neutralise, in a caller's message, anything that could pose as our own prompt structure.

The caller's message is placed last in the agent's prompt, after every fence has been closed,
so a forged marker has nothing left to close. Defanging is the second wall: it removes the
strings a model could read as structure — our task-instruction fences, our message divider,
and the control tokens of common chat templates — so that the message cannot even look like
owner text or a new conversation turn.

Each forged marker is replaced by ``[filtered]`` in one pass and nothing else is changed. The
replacement is never empty, so removing a marker can never join its neighbours into a new
one, and ``[filtered]`` itself matches no pattern: the output is a fixed point.
"""

from __future__ import annotations

import re
from typing import Final

FILTERED: Final = "[filtered]"

# The prompt's own structure. prompt.py renders exactly these strings; they live here so the
# filter and the prompt can never disagree about what must not be forged.
TASK_FENCE_OPEN: Final = "<<TASK-INSTRUCTIONS>>"
TASK_FENCE_CLOSE: Final = "<<END-TASK-INSTRUCTIONS>>"
MESSAGE_DIVIDER: Final = "<<CALLER-MESSAGE>>"

# Between the words of a marker a forger may put spaces, hyphens, underscores or characters a
# reader cannot see (soft hyphen, zero-width space/joiners, word joiner, byte-order mark).
_GAP = r"[\s_\-\u00ad\u200b-\u200f\u2060-\u2064\ufeff]*"
_END = rf"(?:END{_GAP})?"


def _words(*words: str) -> str:
    return _GAP.join(words)


_OUR_MARKERS = (
    rf"<<{_GAP}{_END}{_words('TASK', 'INSTRUCTIONS')}{_GAP}>>"
    rf"|<<{_GAP}{_END}{_words('CALLER', 'MESSAGE')}{_GAP}>>"
)

_CONTROL_TOKENS = (
    # ChatML, Llama 3, Phi, GPT: <|im_start|>, <|endoftext|>, <|eot_id|> ... and the
    # full-width-bar spelling DeepSeek uses. The inside excludes brackets so that a token
    # wrapped around another token (<|<s>|>) cannot turn into <|[filtered]|> after one pass.
    r"<[|\uff5c][^|\uff5c<>\[\]\n]{0,64}[|\uff5c]>"
    # Llama 2 / Mistral instruction and system turns, Mistral tool turns.
    r"|\[\s*/?\s*(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS)\s*\]"
    r"|<<\s*/?\s*SYS\s*>>"
    # Sentence and turn markers: <s>, </s>, <bos>, <eos>, Gemma's <start_of_turn>.
    r"|</?(?:s|bos|eos)>"
    r"|<(?:start|end)_of_turn>"
    # Claude Code wraps harness notes in these tags; a caller must not be able to fake one.
    r"|</?\s*system-reminder\s*>"
)

RESERVED_RE: Final = re.compile(f"{_OUR_MARKERS}|{_CONTROL_TOKENS}", re.IGNORECASE)


def defang(message: str) -> str:
    """Replace every forged prompt marker or model control token with ``[filtered]``."""
    return RESERVED_RE.sub(FILTERED, message)
