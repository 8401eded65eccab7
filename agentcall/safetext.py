"""The one definition of text that is safe to show: what a terminal would act on or hide.

Agent CLIs pass escape sequences through verbatim, so an answer could recolour the terminal,
retitle the window, plant an OSC 8 link whose text lies about its target, write the clipboard
with OSC 52, or use a bare carriage return, backspaces or bidi overrides to make one text
display as another. Both sides use this module: the listener cleans an answer before it is
sealed, and the caller's CLI cleans whatever it prints again, because it cannot know that the
other side did.

The rule: whole escape sequences (CSI, OSC, DCS, SOS, PM, APC and the short ESC forms, in
their 7-bit and 8-bit spellings) are removed; CR is dropped; every other control character
except TAB and LF, and every invisible character that can reorder or hide text, becomes a
space; lone surrogates become U+FFFD. The output contains no ESC and no C1 character, so it
holds no escape sequence, and cleaning it again changes nothing.

Pure: no I/O, nothing but :mod:`re`.
"""

from __future__ import annotations

import re

# typing is imported for the type checker only: the thin `agentcall call` imports this module,
# and typing costs that process milliseconds (tests/unit/test_cli_call_thin.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

# Character-class bodies, shared with the CLI's JSON escaping (agentcall.cli.render).
# DEL and C1 (C1 holds 0x9b, the one-byte CSI, and 0x9d, OSC).
DEL_AND_C1: Final = r"\x7f-\x9f"
# C0 except TAB, LF and CR (CR is dropped rather than replaced), then DEL and C1.
CONTROLS: Final = r"\x00-\x08\x0b\x0c\x0e-\x1f" + DEL_AND_C1
# Invisible characters that reorder or hide text: the Arabic letter mark, LRM/RLM, the bidi
# embeddings and overrides, the isolates, zero-width space, word joiner and invisible
# operators, line and paragraph separators, Mongolian vowel separator, byte-order mark,
# interlinear annotation marks, and the tag block (used to smuggle invisible ASCII).
# ZWJ/ZWNJ stay: emoji sequences and several scripts need them.
INVISIBLE: Final = (
    r"\u061c\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069"
    r"\u180e\ufeff\ufff9-\ufffb\U000e0000-\U000e007f"
)
# Lone surrogates: what undecodable bytes become under surrogateescape, and what a JSON
# "\udcff" decodes to. No UTF-8 terminal can show them, and they do not encode as UTF-8.
SURROGATES: Final = r"\ud800-\udfff"

# ECMA-48 escape sequences, removed whole so no parameter or payload is left as litter.
_SEQUENCE = re.compile(
    # CSI: ESC [ or 0x9b, parameter bytes, intermediate bytes, one final byte.
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
    # Control strings (OSC, DCS, SOS, PM, APC) up to their terminator: BEL, ESC \ or ST.
    # The body stops at any ESC or C1, so a string that never ends costs one scan to the next
    # introducer, never a scan to the end of the text per introducer.
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x80-\x9f]*(?:\x07|\x1b\\|\x9c)"
    # Everything else that starts with ESC: intermediates then a final byte (ESC c, ESC ( B,
    # ESC 7). This also takes the introducer of a CSI or string that never ended; what
    # followed it stays as plain text, harmless once the introducer is gone.
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]"
)
_TEXT_UNSAFE = re.compile(f"[{CONTROLS}{INVISIBLE}]")
_CELL_UNSAFE = re.compile(f"[\t\n{CONTROLS}{INVISIBLE}]")
_SURROGATE = re.compile(f"[{SURROGATES}]")


def _clean(text: str, unsafe: re.Pattern[str]) -> str:
    # Surrogates first: they are not part of any sequence, and the rest must see real text.
    text = _SURROGATE.sub("\ufffd", text)
    # Sequences before single characters: replacing ESC first would leave "[31m" and
    # "]52;c;…" behind as text.
    text = _SEQUENCE.sub("", text)
    text = text.replace("\r", "")
    return unsafe.sub(" ", text)


def without_surrogates(text: str) -> str:
    """Only lone surrogates replaced (U+FFFD): the text encodes as UTF-8, nothing else changes."""
    return _SURROGATE.sub("\ufffd", text)


def safe_text(text: str) -> str:
    """Multi-line text: keeps TAB and LF, removes or neutralises everything else unsafe."""
    return _clean(text, _TEXT_UNSAFE)


def safe_cell(text: str) -> str:
    """One-line text for a table cell or a status line: TAB and LF become spaces too."""
    return _clean(text, _CELL_UNSAFE)
