"""The one definition of safe text: escape sequences go whole, controls and bidi tricks go,
plain text in any script survives unchanged."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agentcall.safetext import safe_cell, safe_text

ESC = "\x1b"

ESCAPES = {
    "csi colour": ("\x1b[31mred\x1b[0m", "red"),
    "csi private mode": ("a\x1b[?1049hb\x1b[?25l", "ab"),
    "csi with intermediate": ("a\x1b[1 qb", "ab"),
    "osc title bel": ("\x1b]0;evil\x07ok", "ok"),
    "osc title st": ("\x1b]2;evil\x1b\\ok", "ok"),
    "osc 8 link": ("\x1b]8;;https://evil.example\x1b\\docs\x1b]8;;\x1b\\", "docs"),
    "osc 52 clipboard": ("\x1b]52;c;cm0gLXJmIH4=\x07done", "done"),
    "osc 52 in c1 form": ("\x9d52;c;cm0gLXJmIH4=\x9cdone", "done"),
    "dcs": ("a\x1bP1$r0m\x1b\\b", "ab"),
    "dcs c1": ("a\x901$r0m\x9cb", "ab"),
    "apc, pm, sos": ("a\x1b_x\x1b\\b\x1b^y\x07c\x1bXz\x9cd", "abcd"),
    "short escapes": ("a\x1bcb\x1b7c\x1b(Bd\x1b#8e", "abcde"),
    "c1 csi": ("\x9b31mred", "red"),
    "unterminated osc": ("a\x1b]52;c;Zm9v", "a52;c;Zm9v"),
    "unterminated csi": ("a\x1b[12", "a12"),
    "lone esc": ("a\x1b", "a "),
    "esc before non-ascii": ("a\x1bé", "a é"),
    "bare cr": ("safe\rEVIL", "safeEVIL"),
    "crlf": ("line\r\nnext", "line\nnext"),
    "backspace": ("rm\x08\x08ls", "rm  ls"),
    "c1 st alone": ("\x9cx", " x"),
    "nel": ("a\x85b", "a b"),
    "del": ("a\x7fb", "a b"),
    "nul and bell": ("a\x00b\x07c", "a b c"),
    "rlo override": ("file\u202etxt.exe", "file txt.exe"),
    "isolates": ("\u2066a\u2067b\u2068c\u2069", " a b c "),
    "marks": ("\u200ea\u200f\u061c", " a  "),
    "zero width space": ("pay\u200bpal", "pay pal"),
    "bom": ("\ufeffhi", " hi"),
    "tag smuggling": ("ok\U000e0049\U000e0047", "ok  "),
    "lone surrogate": ("bad\udcffbyte", "bad\ufffdbyte"),
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_each_escape_family_goes_whole(name: str) -> None:
    """Each family of terminal trick comes out as expected: sequences removed with their
    parameters and payloads, single controls as spaces, CR dropped."""
    raw, expected = ESCAPES[name]
    assert safe_text(raw) == expected


def test_a_sequence_glued_from_neighbours_is_still_inert() -> None:
    """Removing one sequence can bring an ESC next to "[": that ESC becomes a space."""
    assert safe_text("\x1b\x1b[31m[0m") == " [0m"


def test_plain_text_survives_unchanged() -> None:
    """Tabs, newlines, accents, CJK, RTL letters, emoji with ZWJ and ZWNJ are left alone."""
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # a word that needs ZWNJ
    text = f"a\tb\nc é 漢字 👩\u200d💻 {persian} [31m ]52;c; \\ ^_"
    assert safe_text(text) == text


def test_a_cell_is_one_line() -> None:
    """A cell turns TAB and LF into spaces and still removes sequences."""
    assert safe_cell("a\tb\nc\r\x1b[2Jd") == "a b cd"


def test_long_unterminated_strings_stay_linear() -> None:
    """Many introducers that never end do not make cleaning quadratic (this would take
    minutes if each introducer scanned to the end of the text)."""
    hostile = ("\x9d" + "a" * 50 + "\x1b]" + "b" * 50) * 4000
    out = safe_text(hostile)
    assert ESC not in out and "\x9d" not in out


# --- properties ------------------------------------------------------------------------------

# Every code point, lone surrogates included.
ANY_CHAR = st.characters(exclude_categories=())
# Text that is mostly escape material, so the sequence grammar is exercised hard.
# Each character of this string is one piece; "52" makes OSC 52 likely.
ESCAPE_PIECES = st.sampled_from([*"\x1b[]PX^_\\\x07\x9b\x9c\x9d\x90\r0;? mc\n\t\x85\u202eé", "52"])
HOSTILE = st.lists(ESCAPE_PIECES, max_size=40).map("".join) | st.text(alphabet=ANY_CHAR)

BIDI_CONTROLS = {"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"}


def forbidden(char: str) -> bool:
    """An oracle written from Unicode properties, independent of the module's own classes."""
    if char in "\t\n":
        return False
    code = ord(char)
    return (
        unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp")
        or unicodedata.bidirectional(char) in BIDI_CONTROLS
        or char in "\u061c\u200e\u200f\u200b\u2060\ufeff"
        or 0xE0000 <= code <= 0xE007F
    )


@given(HOSTILE)
@example("\x1b]52;c;Zm9v\x07")
@example("\x1b\x1b[31m[0m")
def test_output_never_holds_a_forbidden_character(text: str) -> None:
    """Whatever comes in, no control but TAB/LF, no bidi control, no surrogate comes out."""
    out = safe_text(text)
    assert not [char for char in out if forbidden(char)], repr(out)


@given(HOSTILE)
def test_cleaning_is_a_fixed_point(text: str) -> None:
    """Cleaning twice is cleaning once: the callee's pass and the caller's agree."""
    once = safe_text(text)
    assert safe_text(once) == once
    assert safe_cell(safe_cell(text)) == safe_cell(text)


@given(HOSTILE)
def test_a_cell_holds_no_control_at_all(text: str) -> None:
    """safe_cell emits no control character, so a cell stays on one line."""
    assert not any(unicodedata.category(char) == "Cc" for char in safe_cell(text))


SAFE_CHAR = st.characters(
    exclude_categories=("Cc", "Cs", "Cn", "Zl", "Zp", "Cf"), include_characters="\t\n\u200c\u200d"
)


@given(st.text(alphabet=SAFE_CHAR))
def test_text_without_controls_survives_unchanged(text: str) -> None:
    """Letters, digits, punctuation, symbols, emoji, newlines and tabs pass through as they are."""
    assert safe_text(text) == text
