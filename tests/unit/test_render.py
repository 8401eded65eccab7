"""Terminal-safe rendering of remote text, and the wording of every error code."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall import safetext
from agentcall.cli.render import describe_error, safe_cell, safe_json, safe_text
from agentcall.errors import CallErrorCode


def test_render_uses_the_one_shared_definition() -> None:
    """The CLI prints through agentcall.safetext, the code the listener cleans answers with;
    its cases are tested in test_safetext.py."""
    assert safe_text is safetext.safe_text
    assert safe_cell is safetext.safe_cell
    assert safe_text("\x1b]52;c;Zm9v\x07ok\r\n") == "ok\n"


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
