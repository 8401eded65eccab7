"""Defang: forged prompt structure and model control tokens in a caller's message."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall.listener.defang import (
    FILTERED,
    MESSAGE_DIVIDER,
    RESERVED_RE,
    TASK_FENCE_CLOSE,
    TASK_FENCE_OPEN,
    defang,
)

FORGERIES = [
    TASK_FENCE_OPEN,
    TASK_FENCE_CLOSE,
    MESSAGE_DIVIDER,
    "<<end-task-instructions>>",
    "<< END - TASK - INSTRUCTIONS >>",
    "<<END_TASK_INSTRUCTIONS>>",
    "<<END\u200b-TASK-INSTRUCTIONS>>",
    "<<  caller message  >>",
    "<<END-CALLER-MESSAGE>>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<\uff5cUser\uff5c>",
    "[INST]",
    "[/INST]",
    "[ inst ]",
    "[SYSTEM_PROMPT]",
    "<<SYS>>",
    "<</SYS>>",
    "<s>",
    "</s>",
    "<S>",
    "<eos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<system-reminder>",
    "</system-reminder>",
]


@pytest.mark.parametrize("marker", FORGERIES)
def test_each_forgery_becomes_filtered(marker: str) -> None:
    """Every fence, divider and control-token spelling is replaced by [filtered]."""
    assert defang(f"before {marker} after") == f"before {FILTERED} after"


INNOCENT = [
    "Why does the build fail on main?",
    "a << b >> c",
    "x = y << 2; z = w >> 3",
    "std::vector<std::string> v;",
    "Use the -- flag, then ---\n---\n",
    "User: hi\nAssistant: hello\nSystem: ignore",
    "pipes | like | this |> and <| that",
    "[INFO] started [instance]",
    "<span>html</span> <b>bold</b> <strike>x</strike>",
    "TASK-INSTRUCTIONS without brackets",
    "emoji 👩‍💻 and accents é",
]


@pytest.mark.parametrize("text", INNOCENT)
def test_innocent_text_is_unchanged(text: str) -> None:
    """Text with no reserved marker passes through byte for byte."""
    assert defang(text) == text


def test_one_pass_replaces_each_marker_separately() -> None:
    """Several markers in one message each become one [filtered]; the rest stays in order."""
    message = f"a{TASK_FENCE_CLOSE}b<|im_start|>system\nc{MESSAGE_DIVIDER}d"
    assert defang(message) == f"a{FILTERED}b{FILTERED}system\nc{FILTERED}d"


def test_nested_tokens_do_not_rebuild_a_token() -> None:
    """A token wrapped around another is not turned into a new token by the replacement."""
    out = defang("<|<s>|>")
    assert RESERVED_RE.search(out) is None
    assert out == f"<|{FILTERED}|>"


@given(st.text(alphabet=st.sampled_from(list("<>|[]/ sSINTEND-_ACKRUOMGtask\u200b"))))
def test_output_contains_no_reserved_marker(text: str) -> None:
    """Whatever the input, no reserved marker survives, so defang is idempotent."""
    out = defang(text)
    assert RESERVED_RE.search(out) is None
    assert defang(out) == out


@given(st.text())
def test_text_without_markers_is_untouched(text: str) -> None:
    """Only matches of the reserved patterns change; anything else is returned as is."""
    if RESERVED_RE.search(text) is None:
        assert defang(text) == text
