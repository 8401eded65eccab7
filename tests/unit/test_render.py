"""Terminal-safe rendering of remote text, and the wording of every error code."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall.cli.render import describe_error, safe_cell, safe_json, safe_text
from agentcall.errors import CallErrorCode

ESCAPES = {
    "csi colour": ("\x1b[31mred\x1b[0m", " [31mred [0m"),
    "osc title bel": ("\x1b]0;evil\x07ok", " ]0;evil ok"),
    "osc title st": ("\x1b]2;evil\x1b\\ok", " ]2;evil \\ok"),
    "osc 8 link": (
        "\x1b]8;;https://evil.example\x1b\\docs\x1b]8;;\x1b\\",
        " ]8;;https://evil.example \\docs ]8;; \\",
    ),
    "osc 52 clipboard": ("\x1b]52;c;cm0gLXJmIH4=\x07", " ]52;c;cm0gLXJmIH4= "),
    "bare cr": ("safe\rEVIL", "safeEVIL"),
    "crlf": ("line\r\nnext", "line\nnext"),
    "backspace": ("rm\x08\x08ls", "rm  ls"),
    "c1 csi": ("\x9b31mred", " 31mred"),
    "c1 osc and st": ("\x9d0;t\x9cx", " 0;t x"),
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
def test_safe_text_neutralises_escape_families(name: str) -> None:
    """Each escape family from the agent-CLI analysis comes out inert and as expected."""
    raw, expected = ESCAPES[name]
    out = safe_text(raw)
    assert out == expected
    assert "\x1b" not in out
    assert "\x9b" not in out


def test_safe_text_keeps_tab_newline_and_ordinary_unicode() -> None:
    """Tabs, newlines, accents, CJK, emoji with ZWJ and ZWNJ survive unchanged."""
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # a word that needs ZWNJ
    text = f"a\tb\nc é 漢字 👩\u200d💻 {persian}"
    assert safe_text(text) == text


def test_safe_cell_flattens_to_one_line() -> None:
    """A cell turns TAB and LF into spaces and still neutralises escapes."""
    assert safe_cell("a\tb\nc\r\x1b[2Jd") == "a b c [2Jd"


def test_safe_json_escapes_what_json_leaves_literal() -> None:
    """C1, DEL, bidi, invisibles and lone surrogates are \\u-escaped; the value is unchanged."""
    value = {"reply": "x\x9b31m\u202e\x7f\u200b\U000e0041\udcff é", "n": [1, None]}
    out = safe_json(value)
    for bad in ["\x9b", "\u202e", "\x7f", "\u200b", "\U000e0041", "\udcff"]:
        assert bad not in out
    assert "\\u009b" in out
    assert "\\udb40\\udc41" in out
    assert " é" in out
    assert json.loads(out) == value


def test_safe_json_escapes_c0_through_json_itself() -> None:
    """ESC and CR inside strings come out as JSON escapes, never raw."""
    out = safe_json("\x1b]0;t\x07\r")
    assert out == '"\\u001b]0;t\\u0007\\r"'


def test_safe_json_indent() -> None:
    """Indentation is passed through for human-readable output."""
    assert safe_json({"a": 1}, indent=2) == '{\n  "a": 1\n}'


@pytest.mark.parametrize("code", list(CallErrorCode))
def test_every_error_code_has_a_sentence(code: CallErrorCode) -> None:
    """Each error code has its own one-line human sentence."""
    sentence = describe_error(code)
    assert sentence.endswith(".")
    assert "\n" not in sentence
    assert sentence[0].isupper()


def test_error_sentences_are_distinct() -> None:
    """No two codes share a sentence, so the message alone tells them apart."""
    sentences = [describe_error(code) for code in CallErrorCode]
    assert len(set(sentences)) == len(sentences)


# Every code point, lone surrogates included (they are what undecodable bytes turn into).
ANY_CHAR = st.characters(exclude_categories=())


def _is_control(char: str) -> bool:
    return unicodedata.category(char) == "Cc" and char not in "\t\n"


@given(st.text(alphabet=ANY_CHAR))
def test_safe_text_output_has_no_controls(text: str) -> None:
    """Whatever comes in, safe_text emits no control character but TAB and LF."""
    out = safe_text(text)
    assert not any(_is_control(char) for char in out)
    assert not any(0xD800 <= ord(char) <= 0xDFFF for char in out)


@given(st.text())
def test_safe_cell_output_is_one_line(text: str) -> None:
    """safe_cell emits no control character at all, so a cell stays on one line."""
    out = safe_cell(text)
    assert not any(unicodedata.category(char) == "Cc" for char in out)


@given(
    st.recursive(
        st.none() | st.text(alphabet=ANY_CHAR),
        lambda kids: st.lists(kids, max_size=3),
        max_leaves=6,
    )
)
def test_safe_json_round_trips_and_has_no_raw_controls(value: object) -> None:
    """safe_json output decodes to the same value and contains no raw control character."""
    out = safe_json(value)
    assert json.loads(out) == value
    assert not any(unicodedata.category(char) == "Cc" for char in out)
