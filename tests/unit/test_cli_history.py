"""`agentcall history`: recent calls and tool attempts from the logs, flagged or all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentcall.cli.main import EXIT_OUTPUT_CLOSED, main
from agentcall.guard.decide import Decision, HookCall
from agentcall.guard.main import GuardConfig, append_log, log_entry
from agentcall.listener.calllog import CallLog, CallRecord, CallStatus
from agentcall.local.home import Home
from tests.unit.cli_helpers import NOW, isolate


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Home:
    state = Home.from_environ({"HOME": str(isolate(monkeypatch, tmp_path))})
    state.ensure()
    return state


def call(home: Home, n: int, status: CallStatus = CallStatus.OK, **extra: Any) -> None:
    """One calls.log line, written by the listener's own writer."""
    record = CallRecord(
        at=NOW + n,
        call_id=f"call-{n}",
        caller="@acme/bob",
        task="ask",
        status=status,
        duration_ms=1500,
        outcome_text=extra.pop("text", f"answer {n}"),
        **extra,
    )
    assert CallLog(home.calls_log_path).append(record)


def tool(
    home: Home, n: int, action: str, rule: str, target: str = "/w/file", name: str = "Read"
) -> None:
    """One tools.log line, written by the guard's own writer."""
    config = GuardConfig(
        roots=("/w",),
        write_root=None,
        caps=frozenset({"read"}),
        call_id=f"call-{n}",
        log_path=str(home.tools_log_path),
        home="/home/x",
        extra_denied=(),
    )
    hook = HookCall(name, {"file_path": target}, "/w", f"toolu_{n}")
    append_log(config.log_path, log_entry(config, hook, Decision(action, rule), NOW + n))


def history(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["history", *argv])
    return code, capsys.readouterr().out


def test_shows_recent_calls_and_tool_attempts(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    """Newest last, with time, caller, task, status, duration and excerpt; tools with call id,
    tool, decision and rule."""
    call(home, 1)
    tool(home, 1, "allow", "inside-read-roots")
    code, out = history(capsys)
    lines = out.splitlines()
    assert code == 0
    assert lines[0] == "calls (newest last):"
    assert lines[1] == '  2025-06-15T15:06:41.000Z  @acme/bob  ask  ok  1.5s  "answer 1"'
    assert lines[2] == "tool attempts (newest last):"
    assert lines[3] == (
        "  2025-06-15T15:06:41.000Z  call-1  Read  allow  inside-read-roots  /w/file"
    )


def test_limit_keeps_the_newest(home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    for n in range(5):
        call(home, n)
        tool(home, n, "allow", "inside-read-roots")
    _code, out = history(capsys, "--limit", "2", "--json")
    report = json.loads(out)
    assert [c["call_id"] for c in report["calls"]] == ["call-3", "call-4"]
    assert [t["call_id"] for t in report["tools"]] == ["call-3", "call-4"]


def test_flagged_keeps_flags_failures_and_denials(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    """--flagged filters before the limit, so older flagged entries are not cut off by newer
    clean ones."""
    call(home, 1, CallStatus.BLOCKED, flags=("blocked_caller_attempt",))
    call(home, 2, CallStatus.AGENT_ERROR, error="boom")
    call(home, 3, CallStatus.OK, flags=("guard_unwired",))
    for n in range(4, 30):
        call(home, n)
    tool(home, 1, "deny", "denied-home-path", "/home/x/.ssh/id_ed25519")
    tool(home, 2, "flag", "bash-mentions-denied-path")
    for n in range(3, 30):
        tool(home, n, "allow", "inside-read-roots")
    _code, out = history(capsys, "--flagged", "--limit", "3", "--json")
    report = json.loads(out)
    assert [c["call_id"] for c in report["calls"]] == ["call-1", "call-2", "call-3"]
    assert report["calls"][0]["flags"] == ["blocked_caller_attempt"]
    assert report["calls"][1]["error"] == "boom"
    assert [t["decision"] for t in report["tools"]] == ["deny", "flag"]
    code, text = history(capsys, "--flagged")
    assert code == 0 and "flags: guard_unwired" in text and '"boom"' in text
    assert "flagged tool attempts (newest last):" in text


def test_broken_lines_are_skipped(home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    """A torn line, a hand edit, or a wrong type is skipped; the rest still shows."""
    call(home, 1)
    tool(home, 1, "deny", "denied-home-path")
    with open(home.calls_log_path, "ab") as log:
        log.write(b'{"ts": "x", "call_id": 5}\nnot json\n\xff\xfe\n{"ts":')
    with open(home.tools_log_path, "ab") as log:
        log.write(b'[1]\n{"ts":"t","call_id":"c","decision":"deny","rule":7}\n{"ts":"t"')
    tool(home, 2, "allow", "inside-read-roots")
    report = json.loads(history(capsys, "--json")[1])
    assert [c["call_id"] for c in report["calls"]] == ["call-1"]
    assert [t["call_id"] for t in report["tools"]] == ["call-1"]  # call-2 joined the torn line


def test_no_logs_yet(home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = history(capsys)
    assert code == 0 and out.splitlines() == [
        "calls (newest last):",
        "  none",
        "tool attempts (newest last):",
        "  none",
    ]


def test_hostile_text_is_made_terminal_safe(home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    """Excerpts and targets come from agents and callers: no escape sequence survives."""
    call(home, 1, text="\x1b]52;c;cHduZWQ=\x07 hi \u202e")
    tool(home, 1, "deny", "denied-home-path", "/w/\x1b[2Jx\ny")
    _code, out = history(capsys)
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "/w/x y" in out and len(out.splitlines()) == 4
    _code, out = history(capsys, "--json")
    assert "\x1b" not in out and "\\u202e" in out


@pytest.mark.parametrize("bad", ["0", "201", "x"])
def test_limit_range(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["history", "--limit", bad])
    assert exited.value.code == 2 and "limit" in capsys.readouterr().err


def test_help_explains_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["history", "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "agentcall history --flagged" in out.split("examples:")[1]


# --- a reader that goes away ---------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def run_into_closed_pipe(argv: list[str], home: Path) -> subprocess.CompletedProcess[bytes]:
    """Run the real CLI with stdout a pipe nobody reads: its read end is closed before the
    process starts, so every write fails at once, whatever the timing (`… | head -n1` once
    head has read its line)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", os.defpath),
        "PYTHONPATH": str(REPO),
    }
    try:
        return subprocess.run(
            [sys.executable, "-m", "agentcall", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["history", "--json"], ["history"]])
def test_history_into_a_closed_pipe_exits_quietly(home: Home, argv: list[str]) -> None:
    """`agentcall history --json | head -n1`: no BrokenPipeError traceback, status 141."""
    for n in range(200):
        call(home, n)
    done = run_into_closed_pipe(argv, home.user_home)
    assert done.stderr == b""
    assert done.returncode == EXIT_OUTPUT_CLOSED == 141


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["call", "--help"]])
def test_every_command_exits_quietly_into_a_closed_pipe(home: Home, argv: list[str]) -> None:
    """The fix sits at the entry point, so the fast path and argparse's own exit get it too."""
    done = run_into_closed_pipe(argv, home.user_home)
    assert (done.returncode, done.stderr) == (141, b"")


def test_the_guard_preflight_is_listed_but_not_flagged(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before each Codex run the listener has the guard refuse a test call: expected, not a sign."""
    from agentcall.listener.guardwire import PREFLIGHT_TOOL

    tool(home, 1, "deny", "unknown-tool", name=PREFLIGHT_TOOL)
    tool(home, 1, "deny", "denied-home-path", "/home/x/.ssh/id_ed25519")
    everything = json.loads(history(capsys, "--json")[1])
    assert [t["tool"] for t in everything["tools"]] == [PREFLIGHT_TOOL, "Read"]
    flagged = json.loads(history(capsys, "--flagged", "--json")[1])
    assert [t["tool"] for t in flagged["tools"]] == ["Read"]
