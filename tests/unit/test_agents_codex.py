"""The Codex adapter: argv per capability set, the ``--json`` event parser, failure mappings.

Parsers run against the real captures in ``tests/fixtures/agent-clis`` (read at test time)
and inline events; a few runs drive the fake ``codex`` through the real runner.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentcall.listener.agents import adapter_for
from agentcall.listener.agents.base import (
    AgentAnswer,
    AgentFailure,
    AgentSpec,
    FailureKind,
    Outcome,
)
from agentcall.listener.agents.codex import ADAPTER, CodexParser
from agentcall.listener.runner import AgentRun, RunResult, run_agent
from tests.unit.agent_helpers import (
    FAKE_AGENT,
    SAMPLES,
    reactor,
    run_result,
    twisted_test,
)

WORKDIR = "/home/ken/AgentCall/t1"
PROMPT = "You are ken's agent.\n<<CALLER-MESSAGE>>\nWhat do the notes say?\n"
EXCLUDES = (
    "-c",
    "sandbox_workspace_write.exclude_slash_tmp=true",
    "-c",
    "sandbox_workspace_write.exclude_tmpdir_env_var=true",
)
NETWORK = ("-c", "sandbox_workspace_write.network_access=true")


def spec(**kw: Any) -> AgentSpec:
    kw.setdefault("binary", "/usr/local/bin/codex")
    kw.setdefault("workdir", WORKDIR)
    kw.setdefault("tools", {"read"})
    return AgentSpec(**kw)


def feed(lines: list[str] | list[bytes] | list[str | bytes]) -> CodexParser:
    parser = ADAPTER.new_parser()
    for line in lines:
        parser.feed_line(line.encode() if isinstance(line, str) else line)
    return parser


def outcome(lines: list[str] | list[bytes], **result: Any) -> Outcome:
    return ADAPTER.interpret(run_result(**result), feed(lines))


def sample_lines(name: str) -> list[str]:
    return (SAMPLES / name).read_text(encoding="utf-8").splitlines()


# --- argv -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "mode", "extra"),
    [
        ({"read"}, "read-only", ()),
        ({"read", "exec"}, "read-only", ()),
        ({"read", "write"}, "workspace-write", EXCLUDES),
        ({"read", "fetch"}, "workspace-write", EXCLUDES + NETWORK),
        ({"read", "write", "exec", "fetch"}, "workspace-write", EXCLUDES + NETWORK),
    ],
)
def test_argv_per_capability_set(tools: set[str], mode: str, extra: tuple[str, ...]) -> None:
    """Sandbox mode and -c keys per capability; the prompt comes through '-'."""
    inv = ADAPTER.build(spec(tools=tools), PROMPT)
    assert inv.argv == (
        "/usr/local/bin/codex",
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--ephemeral",
        "-C",
        WORKDIR,
        "-s",
        mode,
        *extra,
        "-",
    )
    assert inv.stdin_bytes == PROMPT.encode()
    assert inv.cwd == WORKDIR


def test_resume_form_has_no_sandbox_flag_or_cd() -> None:
    """exec resume takes neither -s nor -C: the mode goes in as sandbox_mode config."""
    inv = ADAPTER.build(spec(tools={"read", "write"}, resume_session="01a2265a-c5d8"), PROMPT)
    assert inv.argv == (
        "/usr/local/bin/codex",
        "exec",
        "resume",
        "01a2265a-c5d8",
        "--json",
        "--skip-git-repo-check",
        "-c",
        'sandbox_mode="workspace-write"',
        *EXCLUDES,
        "-",
    )
    assert inv.cwd == WORKDIR


@pytest.mark.parametrize("tools", [{"read"}, {"read", "exec"}, {"read", "write", "fetch"}])
def test_inside_the_kernel_boundary_codex_has_no_sandbox_of_its_own(tools: set[str]) -> None:
    """Its bubblewrap cannot start inside Landlock: full access, bounded by the ruleset."""
    argv = ADAPTER.build(spec(tools=tools, confined=True), PROMPT).argv
    assert argv[argv.index("-s") + 1] == "danger-full-access"
    assert not any(a.startswith("sandbox_workspace_write") for a in argv)
    resumed = ADAPTER.build(spec(tools=tools, confined=True, resume_session="01a2"), PROMPT)
    assert 'sandbox_mode="danger-full-access"' in resumed.argv
    assert not any(a.startswith("sandbox_workspace_write") for a in resumed.argv)


def test_kept_session_and_hook_config() -> None:
    """keep_session drops --ephemeral; a hook config comes with the hook-trust bypass."""
    hook = '[{matcher="*", hooks=[{type="command", command="guard", timeout=30}]}]'
    argv = ADAPTER.build(spec(keep_session=True, codex_hook_config=hook), PROMPT).argv
    assert "--ephemeral" not in argv
    i = argv.index("--dangerously-bypass-hook-trust")
    assert argv[i + 1 : i + 3] == ("-c", f"hooks.PreToolUse={hook}")
    assert argv[-1] == "-"


def test_prompt_never_in_argv_and_env_passes_through() -> None:
    """Nothing of the prompt is an argument; extra_env is the only env addition."""
    inv = ADAPTER.build(spec(extra_env={"CODEX_HOME": "/home/ken/.codex"}), PROMPT)
    assert not any("notes" in arg for arg in inv.argv)
    assert dict(inv.env_additions) == {"CODEX_HOME": "/home/ken/.codex"}


# --- parser on the real captures ------------------------------------------------------------------


def test_sample_read_only_answer() -> None:
    """The read-only run: the last agent_message, escapes intact, thread id and item ids."""
    parser = feed(sample_lines("codex-exec-json-read-only.jsonl"))
    got = ADAPTER.interpret(run_result(), parser)
    assert got == AgentAnswer(
        "FINAL CODEX ANSWER \x1b]0;evil-title\x07 done",
        "01a22659-86b0-72e2-8681-8b961cc2166c",
        ("item_0",),
    )


def test_sample_hook_trust_error_items_are_not_failures() -> None:
    """item.completed of type error (the hook-trust notice) does not fail the run."""
    parser = feed(sample_lines("codex-exec-json-hook-trust-bypass.jsonl"))
    got = ADAPTER.interpret(run_result(), parser)
    assert isinstance(got, AgentAnswer)
    assert got.text == "FINAL HOOK"
    assert got.tool_use_ids == ("item_2", "item_3")


def test_sample_401_is_unauthenticated() -> None:
    """Five reconnect errors then turn.failed with 401: unauthenticated, errors counted."""
    parser = feed(sample_lines("codex-exec-json-error-401.jsonl"))
    assert parser.error_events == 6
    got = ADAPTER.interpret(run_result(exit_code=1), parser)
    assert isinstance(got, AgentFailure)
    assert got.kind is FailureKind.UNAUTHENTICATED
    assert got.detail.startswith("unexpected status 401 Unauthorized")


def test_sample_400_is_agent_error() -> None:
    """A 400 turn.failed is an agent_error whose detail is the failure message."""
    got = outcome(sample_lines("codex-exec-json-error-400.jsonl"), exit_code=1)
    assert isinstance(got, AgentFailure)
    assert got.kind is FailureKind.AGENT_ERROR
    assert "bad request from mock" in got.detail


def test_sample_no_network_run_is_a_timeout() -> None:
    """The no-DNS capture never completes a turn: killed by the timer, it is a timeout."""
    lines = sample_lines("codex-unauthenticated.txt")
    events = [ln for ln in lines if ln.startswith("{")]
    parser = feed(events)
    assert parser.thread_id == "01a22656-bf17-7d53-8a99-cce768380a5f"
    assert not parser.done
    got = ADAPTER.interpret(run_result(timed_out=True, exit_code=None, signal=15), parser)
    assert got == AgentFailure(FailureKind.TIMEOUT, "no answer before the kill timer")


def test_sample_not_logged_in_stderr() -> None:
    """`Not logged in` on stderr with no events is unauthenticated."""
    lines = sample_lines("codex-unauthenticated.txt")
    stderr = "\n".join(lines[lines.index("## $ codex login status") + 2 :][:1]).encode()
    assert stderr == b"Not logged in"
    got = outcome([], exit_code=1, stderr=stderr)
    assert isinstance(got, AgentFailure) and got.kind is FailureKind.UNAUTHENTICATED


# --- parser and interpretation, inline ------------------------------------------------------------

STARTED = '{"type":"thread.started","thread_id":"t-1"}'
MESSAGE = '{"type":"item.completed","item":{"id":"i1","type":"agent_message","text":"%s"}}'
COMPLETED = '{"type":"turn.completed","usage":{}}'


def test_last_agent_message_wins() -> None:
    """Two agent messages: the answer is the last one."""
    got = outcome([STARTED, MESSAGE % "first", MESSAGE % "last", COMPLETED])
    assert got == AgentAnswer("last", "t-1", ())


def test_turn_completed_and_exit_zero_are_both_needed() -> None:
    """No turn.completed, or a non-zero exit, is not an answer."""
    no_turn = outcome([STARTED, MESSAGE % "x"], exit_code=1)
    assert isinstance(no_turn, AgentFailure) and no_turn.kind is FailureKind.AGENT_ERROR
    bad_exit = outcome([STARTED, MESSAGE % "x", COMPLETED], exit_code=1)
    assert isinstance(bad_exit, AgentFailure)
    assert "after the turn completed" in bad_exit.detail
    lingered = outcome([STARTED, MESSAGE % "x", COMPLETED], exit_code=None, early_finish=True)
    assert lingered == AgentAnswer("x", "t-1", ())


def test_completed_turn_without_a_message() -> None:
    """A turn that completes with no agent_message is an agent_error."""
    got = outcome([STARTED, COMPLETED])
    assert got == AgentFailure(
        FailureKind.AGENT_ERROR, "the turn completed without an agent message"
    )


def test_turn_failed_mentions_decide_the_kind() -> None:
    """turn.failed is agent_error, or unauthenticated when it names 401/Unauthorized/login."""
    failed = '{"type":"turn.failed","error":{"message":"%s"}}'
    for message, kind in [
        ("stream error: 500", FailureKind.AGENT_ERROR),
        ("401", FailureKind.UNAUTHENTICATED),
        ("request Unauthorized", FailureKind.UNAUTHENTICATED),
        ("Not logged in", FailureKind.UNAUTHENTICATED),
    ]:
        got = outcome([STARTED, failed % message], exit_code=1)
        assert isinstance(got, AgentFailure) and got.kind is kind, message
    assert isinstance(outcome(['{"type":"turn.failed"}'], exit_code=1), AgentFailure)


def test_done_follows_the_turn_outcome() -> None:
    """The parser is done at turn.completed or turn.failed, not before."""
    parser = feed([STARTED, '{"type":"error","message":"Reconnecting... 1/5"}'])
    assert not parser.done
    parser.feed_line(COMPLETED.encode())
    assert parser.done


def test_malformed_lines_are_ignored_and_counted() -> None:
    """Warnings, arrays, cut lines and CRLF are tolerated; bad bytes are replaced."""
    lines: list[str | bytes] = [
        "WARNING: could not update PATH",
        "[1, 2]",
        STARTED[:20],
        STARTED + "\r\n",
        b'{"type":"item.completed","item":{"type":"agent_message","text":"a\xffb"}}\r\n',
        COMPLETED + "\r\n",
    ]
    parser = feed(lines)
    assert parser.ignored_lines == 3
    assert ADAPTER.interpret(run_result(), parser) == AgentAnswer("a\ufffdb", "t-1", ())


@pytest.mark.parametrize(
    ("result", "kind"),
    [
        ({"cancelled": True, "exit_code": None, "signal": 15}, FailureKind.CANCELLED),
        ({"stdout_truncated": True}, FailureKind.OUTPUT_TOO_LARGE),
        (
            {"exit_code": 2, "stderr": b"error: unexpected argument '--ephemeral' found\n"},
            FailureKind.CLI_TOO_OLD,
        ),
        (
            {"exit_code": 1, "stderr": b"Error: no saved session found for thread 01a2\n"},
            FailureKind.RESUME_FAILED,
        ),
        (
            {"exit_code": 1, "stderr": b"Not inside a trusted directory and --skip-git..."},
            FailureKind.AGENT_ERROR,
        ),
    ],
)
def test_failures_without_a_turn(result: dict[str, Any], kind: FailureKind) -> None:
    """Each exit without a turn outcome maps to one failure kind."""
    got = ADAPTER.interpret(run_result(**result), CodexParser())
    assert isinstance(got, AgentFailure)
    assert got.kind is kind
    assert len(got.detail) <= 300


def test_interpret_refuses_another_adapters_parser() -> None:
    """Handing the Codex interpreter a foreign parser is a programming error."""
    with pytest.raises(TypeError):
        ADAPTER.interpret(run_result(), adapter_for("claude").new_parser())


# --- the fake codex through the real runner -------------------------------------------------------


@pytest.fixture
def fake_codex(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "codex").symlink_to(FAKE_AGENT)
    return bin_dir / "codex"


async def run_fake(
    binary: Path, tmp_path: Path, scenario: dict[str, Any], **kw: Any
) -> tuple[Outcome, RunResult, list[dict[str, Any]]]:
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    log = tmp_path / "fake.log"
    tools = kw.pop("tools", {"read"})
    inv = ADAPTER.build(spec(binary=str(binary), workdir=str(workdir), tools=tools), PROMPT)
    env = {
        **os.environ,
        **inv.env_additions,
        "FAKE_AGENT_SCENARIO": json.dumps(scenario),
        "FAKE_AGENT_LOG": str(log),
    }
    kw.setdefault("timeout_s", 10.0)
    run = AgentRun(argv=inv.argv, cwd=inv.cwd, env=env, stdin=inv.stdin_bytes, **kw)
    parser = ADAPTER.new_parser()
    result = await run_agent(reactor, run, parser)[0]
    entries = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
    return ADAPTER.interpret(result, parser), result, entries


@pytest.mark.slow
@twisted_test
async def test_fake_happy_run_end_to_end(fake_codex: Path, tmp_path: Path) -> None:
    """The built argv passes the fake's checks and the caller's line comes back."""
    got, _, entries = await run_fake(
        fake_codex, tmp_path, {"name": "happy"}, tools={"read", "fetch"}
    )
    assert isinstance(got, AgentAnswer)
    assert got.text == "FAKE-AGENT-ANSWER: What do the notes say?"
    assert got.session_id is not None
    (entry,) = entries
    assert entry["prompt"] == PROMPT
    assert entry["argv"][-1] == "-"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "kind"),
    [
        ({"name": "unauthenticated"}, FailureKind.UNAUTHENTICATED),
        ({"name": "api_error"}, FailureKind.AGENT_ERROR),
        ({"name": "usage_error"}, FailureKind.CLI_TOO_OLD),
        ({"name": "no_thread"}, FailureKind.RESUME_FAILED),
        ({"name": "truncated_json"}, FailureKind.AGENT_ERROR),
        ({"name": "flood_stdout"}, FailureKind.OUTPUT_TOO_LARGE),
    ],
)
@twisted_test
async def test_fake_failures_end_to_end(
    fake_codex: Path, tmp_path: Path, scenario: dict[str, Any], kind: FailureKind
) -> None:
    """Each failing fake behaviour reaches the listener as its failure kind."""
    got, _, _ = await run_fake(fake_codex, tmp_path, scenario)
    assert isinstance(got, AgentFailure)
    assert got.kind is kind


@pytest.mark.slow
@pytest.mark.parametrize("name", ["warning_first", "crlf", "escapes", "secrets", "huge_result"])
@twisted_test
async def test_fake_answers_end_to_end(fake_codex: Path, tmp_path: Path, name: str) -> None:
    """Odd but valid output still answers with the marker first."""
    got, _, _ = await run_fake(fake_codex, tmp_path, {"name": name, "marker": "MK"})
    assert isinstance(got, AgentAnswer)
    assert got.text.startswith("MK: What do the notes say?")


@pytest.mark.slow
@twisted_test
async def test_fake_slow_answer_inside_the_timer(fake_codex: Path, tmp_path: Path) -> None:
    """Reconnect notices while slow are progress: the late answer still counts."""
    got, result, _ = await run_fake(fake_codex, tmp_path, {"name": "slow", "seconds": 0.6})
    assert isinstance(got, AgentAnswer)
    assert b"Reconnecting" in result.stdout


@pytest.mark.slow
@twisted_test
async def test_fake_slow_answer_past_the_timer(fake_codex: Path, tmp_path: Path) -> None:
    """The same agent with a shorter kill timer is a timeout."""
    got, _, _ = await run_fake(fake_codex, tmp_path, {"name": "slow", "seconds": 5}, timeout_s=0.5)
    assert isinstance(got, AgentFailure) and got.kind is FailureKind.TIMEOUT


@pytest.mark.slow
@twisted_test
async def test_fake_ignoring_stdin_still_finishes(fake_codex: Path, tmp_path: Path) -> None:
    """An agent that never reads stdin is not blocked by the prompt the runner wrote."""
    got, _, _ = await run_fake(fake_codex, tmp_path, {"name": "ignore_stdin", "echo": False})
    assert isinstance(got, AgentAnswer)
    assert (got.text, got.tool_use_ids) == ("FAKE-AGENT-ANSWER", ("item_0",))


@pytest.mark.slow
def test_fake_probes(fake_codex: Path) -> None:
    """--version names the CLI version; login status says Not logged in and exits 1."""

    def probe(*args: str, scenario: str = "happy") -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "FAKE_AGENT_SCENARIO": scenario}
        return subprocess.run(
            [str(fake_codex), *args], env=env, capture_output=True, text=True, timeout=10
        )

    assert probe("--version").stdout == "codex-cli 0.171.0\n"
    logged_out = probe("login", "status", scenario="unauthenticated")
    assert (logged_out.returncode, logged_out.stderr) == (1, "Not logged in\n")
    assert probe("login", "status").returncode == 0


@pytest.mark.slow
@twisted_test
async def test_fake_linger_after_turn_completed_ends_early(
    fake_codex: Path, tmp_path: Path
) -> None:
    """A codex that stays alive after turn.completed is ended and still answers."""
    got, result, _ = await run_fake(
        fake_codex,
        tmp_path,
        {"name": "linger", "seconds": 600},
        finish_grace_s=0.2,
        timeout_s=300,
    )
    # Ended by the finish grace, not by the kill timer (300 s) or the agent itself (600 s).
    assert result.early_finish and result.duration_s < 120
    assert isinstance(got, AgentAnswer)


@pytest.mark.slow
@twisted_test
async def test_fake_rejects_a_prompt_in_argv(fake_codex: Path, tmp_path: Path) -> None:
    """The fake itself fails loudly when handed a positional prompt (the hygiene check works)."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    run = AgentRun(
        argv=(str(fake_codex), "exec", "--json", "--skip-git-repo-check", "What do the notes say"),
        cwd=str(workdir),
        env=dict(os.environ),
        stdin=PROMPT.encode(),
        timeout_s=10,
    )
    result = await run_agent(reactor, run)[0]
    assert result.exit_code == 2
    assert b"refused" in result.stderr
