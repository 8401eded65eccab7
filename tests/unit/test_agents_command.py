"""The ``command`` adapter, and the text helpers every adapter shares (cut, sanitise, tail)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall import limits
from agentcall.listener.agents import adapter_for, cut_utf8
from agentcall.listener.agents.base import (
    MAX_DETAIL_CHARS,
    AgentAnswer,
    AgentFailure,
    AgentSpec,
    FailureKind,
    sanitize_detail,
    tail_detail,
)
from agentcall.listener.agents.command import ADAPTER, CommandParser
from agentcall.listener.runner import AgentRun, run_agent
from tests.unit.agent_helpers import reactor, run_result, twisted_test

PROMPT = "preamble\n<<CALLER-MESSAGE>>\nhello ünïcode\n"


def spec(**kw: Any) -> AgentSpec:
    kw.setdefault("binary", "/opt/bin/answerer")
    kw.setdefault("workdir", "/srv/work")
    kw.setdefault("tools", set())
    return AgentSpec(**kw)


# --- the command adapter --------------------------------------------------------------------------


def test_build_runs_the_binary_alone_with_the_prompt_on_stdin() -> None:
    """argv is just the binary; the prompt is stdin; extra_env passes through."""
    inv = ADAPTER.build(spec(extra_env={"LANG": "C.UTF-8"}), PROMPT)
    assert inv.argv == ("/opt/bin/answerer",)
    assert inv.stdin_bytes == PROMPT.encode()
    assert dict(inv.env_additions) == {"LANG": "C.UTF-8"}
    assert inv.cwd == "/srv/work"
    assert adapter_for("command") is ADAPTER


def test_a_command_cannot_resume() -> None:
    """There are no sessions to resume with a plain command."""
    with pytest.raises(ValueError):
        ADAPTER.build(spec(resume_session="abc"), PROMPT)


def test_exit_zero_answers_with_all_of_stdout() -> None:
    """Exit 0: the whole stdout, decoded as UTF-8 with bad bytes replaced."""
    got = ADAPTER.interpret(run_result(stdout=b"line 1\nline \xff2\n"), CommandParser())
    assert got == AgentAnswer("line 1\nline \ufffd2\n", None, ())


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (
            {"exit_code": 3, "stderr": b"warming up\nno model configured\n"},
            AgentFailure(
                FailureKind.AGENT_ERROR,
                "command exited with code 3: warming up | no model configured",
            ),
        ),
        (
            {"exit_code": None, "signal": 9},
            AgentFailure(FailureKind.AGENT_ERROR, "command exited with signal 9"),
        ),
        (
            {"timed_out": True, "exit_code": None, "signal": 15},
            AgentFailure(FailureKind.TIMEOUT, "no answer before the kill timer"),
        ),
        (
            {"cancelled": True, "exit_code": None, "signal": 15},
            AgentFailure(FailureKind.CANCELLED, "the run was cancelled"),
        ),
        (
            {"stdout_truncated": True},
            AgentFailure(FailureKind.OUTPUT_TOO_LARGE, "the command printed too much"),
        ),
    ],
)
def test_failures(result: dict[str, Any], expected: AgentFailure) -> None:
    """Anything but a clean exit with all of stdout is a failure of one kind."""
    assert ADAPTER.interpret(run_result(**result), CommandParser()) == expected


def test_parser_never_finishes_early() -> None:
    """The command parser is never done, so the runner never ends the command early."""
    parser = ADAPTER.new_parser()
    parser.feed_line(b'{"type":"result"}')
    assert not parser.done
    assert (parser.session_id, parser.tool_use_ids) == (None, ())


@pytest.mark.slow
@twisted_test
async def test_a_script_as_command_agent(tmp_path: Path) -> None:
    """A small script reading stdin answers through the runner and the adapter."""
    script = tmp_path / "answerer"
    script.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "msg = sys.stdin.read().split('<<CALLER-MESSAGE>>\\n', 1)[1]\n"
        "print('echo: ' + msg.strip())\n"
    )
    script.chmod(0o755)
    inv = ADAPTER.build(spec(binary=str(script), workdir=str(tmp_path)), PROMPT)
    run = AgentRun(
        argv=inv.argv,
        cwd=inv.cwd,
        env={**os.environ, **inv.env_additions, "PYTHONIOENCODING": "utf-8"},
        stdin=inv.stdin_bytes,
        timeout_s=10,
    )
    parser = ADAPTER.new_parser()
    result = await run_agent(reactor, run, parser)[0]
    assert ADAPTER.interpret(result, parser) == AgentAnswer("echo: hello ünïcode\n", None, ())


# --- shared helpers -------------------------------------------------------------------------------


def test_cut_utf8_examples() -> None:
    """Short text is untouched; a cut never splits a code point."""
    assert cut_utf8("héllo", 100) == ("héllo", False)
    assert cut_utf8("héllo", 6) == ("héllo", False)
    assert cut_utf8("héllo", 2) == ("h", True)
    assert cut_utf8("€€", 5) == ("€", True)
    assert cut_utf8("a😀", 4) == ("a", True)
    assert cut_utf8("abc", 0) == ("", True)
    with pytest.raises(ValueError):
        cut_utf8("x", -1)


def test_cut_utf8_at_the_reply_cap() -> None:
    """A 1.5 MB two-byte answer is cut to the reply cap, on a character boundary."""
    text, cut = cut_utf8("é" * 750_001, limits.MAX_REPLY_BYTES)
    assert cut
    assert len(text.encode()) == limits.MAX_REPLY_BYTES
    odd, _ = cut_utf8("é" * 750_001, limits.MAX_REPLY_BYTES - 1)
    assert len(odd.encode()) == limits.MAX_REPLY_BYTES - 2


@given(st.text(), st.integers(min_value=0, max_value=64))
def test_cut_utf8_properties(text: str, max_bytes: int) -> None:
    """The cut is the longest prefix of whole code points that fits in max_bytes."""
    out, cut = cut_utf8(text, max_bytes)
    size = len(out.encode("utf-8", "surrogatepass"))
    assert text.startswith(out)
    assert size <= max_bytes
    assert cut == (out != text)
    if cut:
        next_char = text[len(out)]
        assert size + len(next_char.encode("utf-8", "surrogatepass")) > max_bytes


def test_sanitize_detail_removes_controls_and_bounds_length() -> None:
    """Controls (C0, C1, bidi overrides, line breaks) become single spaces; long text is cut."""
    # Whole escape sequences go (agentcall.safetext), not just their ESC.
    assert sanitize_detail("a\x1b[31mb\x9b\u202ec\r\nd\x00e") == "ab c d e"
    long = sanitize_detail("x" * 1000)
    assert len(long) == MAX_DETAIL_CHARS and long.endswith("…")


def test_tail_detail_keeps_the_end() -> None:
    """The tail keeps the last lines that fit; one over-long last line keeps its end."""
    assert tail_detail(b"one\n\ntwo\nthree\n", 12) == "two | three"
    assert tail_detail(b"x" * 500 + b"END", 10) == "…xxxxxxEND"
    assert tail_detail(b"", 10) == ""
