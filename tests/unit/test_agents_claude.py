"""The Claude adapter: argv per capability set, the stream-json parser, every failure mapping.

Parsers are checked against the real captures in ``tests/fixtures/agent-clis`` (read at test
time) and against inline lines; a few runs drive the fake ``claude`` through the real runner so
the built argv must pass its hygiene checks.
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
from agentcall.listener.agents.claude import ADAPTER, ClaudeParser
from agentcall.listener.runner import AgentRun, RunResult, run_agent
from tests.unit.agent_helpers import (
    FAKE_AGENT,
    SAMPLES,
    reactor,
    run_result,
    twisted_test,
)

WORKDIR = "/home/ken/AgentCall/t1"
PROMPT = "You are ken's agent.\n<<CALLER-MESSAGE>>\nWhat do the notes say?\n-rf please\n"


def spec(**kw: Any) -> AgentSpec:
    kw.setdefault("binary", "/usr/local/bin/claude")
    kw.setdefault("workdir", WORKDIR)
    kw.setdefault("tools", {"read"})
    return AgentSpec(**kw)


def feed(lines: list[bytes] | list[str]) -> ClaudeParser:
    parser = ADAPTER.new_parser()
    for line in lines:
        parser.feed_line(line.encode() if isinstance(line, str) else line)
    return parser


def outcome(lines: list[bytes] | list[str], **result: Any) -> Outcome:
    parser = feed(lines)
    return ADAPTER.interpret(run_result(**result), parser)


def sample_lines(name: str) -> list[str]:
    return (SAMPLES / name).read_text(encoding="utf-8").splitlines()


def sample_section(name: str, heading: str, stream: str = "stdout") -> list[str]:
    """The lines of one stream under the ``## ...`` heading that contains ``heading``."""
    lines: list[str] = []
    in_section = in_stream = False
    for line in sample_lines(name):
        if line.startswith("## "):
            in_section = heading in line
            in_stream = False
        elif in_section and line.startswith("--- "):
            in_stream = line.startswith(f"--- {stream}")
        elif in_section and in_stream:
            lines.append(line)
    return lines


def json_after_heading(name: str, heading: str) -> str:
    lines = sample_lines(name)
    for i, line in enumerate(lines):
        if line.startswith("## ") and heading in line:
            return next(ln for ln in lines[i + 1 :] if ln.startswith("{"))
    raise AssertionError(f"no section {heading!r} in {name}")


# --- argv -----------------------------------------------------------------------------------------

COMMON = (
    "/usr/local/bin/claude",
    "-p",
    "--output-format",
    "stream-json",
    "--verbose",
    "--permission-mode",
    "dontAsk",
)


@pytest.mark.parametrize(
    ("tools", "tool_list", "rules"),
    [
        ({"read"}, "Read,Grep,Glob", None),
        ({"read", "write"}, "Read,Grep,Glob,Write,Edit,NotebookEdit", f"Edit(/{WORKDIR}/**)"),
        ({"read", "exec"}, "Read,Grep,Glob,Bash", "Bash"),
        ({"read", "fetch"}, "Read,Grep,Glob,WebFetch,WebSearch", "WebFetch,WebSearch"),
        (
            {"read", "write", "exec", "fetch"},
            "Read,Grep,Glob,Write,Edit,NotebookEdit,Bash,WebFetch,WebSearch",
            f"Edit(/{WORKDIR}/**),Bash,WebFetch,WebSearch",
        ),
        (set(), "", None),
    ],
)
def test_argv_per_capability_set(tools: set[str], tool_list: str, rules: str | None) -> None:
    """--tools names exactly the capability's tools; --allowedTools only scoped rules."""
    inv = ADAPTER.build(spec(tools=tools), PROMPT)
    allowed = ("--allowedTools", rules) if rules else ()
    assert inv.argv == (
        *COMMON,
        "--tools",
        tool_list,
        *allowed,
        "--strict-mcp-config",
        "--max-turns",
        "30",
        "--no-session-persistence",
    )


def test_prompt_goes_to_stdin_never_argv() -> None:
    """The prompt is stdin (UTF-8); no argument contains any of it."""
    inv = ADAPTER.build(spec(tools={"read", "write", "exec", "fetch"}), PROMPT)
    assert inv.stdin_bytes == PROMPT.encode()
    assert not any("notes" in arg or "-rf" in arg for arg in inv.argv)
    assert inv.cwd == WORKDIR


def test_dangerous_flags_and_bare_rules_never_appear() -> None:
    """No capability set yields --bare, --safe-mode, skip-permissions or bare file rules."""
    for tools in ({"read"}, {"read", "write"}, {"write", "exec", "fetch"}):
        argv = ADAPTER.build(spec(tools=tools, read_roots=("/srv",)), PROMPT).argv
        assert not {"--bare", "--safe-mode", "--dangerously-skip-permissions"} & set(argv)
        rules = (
            argv[argv.index("--allowedTools") + 1].split(",") if "--allowedTools" in argv else []
        )
        assert not {"Read", "Write", "Edit", "NotebookEdit"} & set(rules)


def test_extra_dirs_settings_turns_and_env() -> None:
    """--add-dir lists read roots; --settings comes with --setting-sources ""; env retries 2."""
    settings = json.dumps({"hooks": {"PreToolUse": []}})
    inv = ADAPTER.build(
        spec(
            read_roots=("/home/ken", "/srv/docs"),
            settings_json=settings,
            max_turns=7,
            extra_env={"CLAUDE_CONFIG_DIR": "/home/ken/.claude"},
        ),
        PROMPT,
    )
    argv = inv.argv
    i = argv.index("--add-dir")
    assert argv[i + 1 : i + 3] == ("/home/ken", "/srv/docs")
    assert argv[i + 3 : i + 7] == ("--settings", settings, "--setting-sources", "")
    assert argv[argv.index("--max-turns") + 1] == "7"
    assert inv.env_additions["CLAUDE_CODE_MAX_RETRIES"] == "2"
    assert inv.env_additions["CLAUDE_CONFIG_DIR"] == "/home/ken/.claude"


def test_session_flags() -> None:
    """One-shot: --no-session-persistence; kept: Claude mints the id; resume: --resume <id>."""
    assert ADAPTER.build(spec(), PROMPT).argv[-1] == "--no-session-persistence"
    kept = ADAPTER.build(spec(keep_session=True), PROMPT).argv
    assert "--no-session-persistence" not in kept and "--resume" not in kept
    sid = "a5b1ff81-8731-4e5a-9d3b-8b0c301a5fb4"
    resumed = ADAPTER.build(spec(resume_session=sid), PROMPT).argv
    assert resumed[-2:] == ("--resume", sid)
    assert "--no-session-persistence" not in resumed


@pytest.mark.parametrize(
    "bad",
    [
        {"binary": "claude"},
        {"workdir": "relative/dir"},
        {"tools": {"read", "admin"}},
        {"tools": "read"},
        {"read_roots": ("relative",)},
        {"max_turns": 0},
        {"settings_json": "/etc/settings.json"},
        {"settings_json": "[1]"},
        {"resume_session": "--dangerously-skip-permissions"},
        {"extra_env": {"A=B": "x"}},
    ],
)
def test_spec_refuses_unsafe_values(bad: dict[str, Any]) -> None:
    """A spec that would build a dangerous or meaningless argv is refused with ValueError."""
    with pytest.raises(ValueError):
        spec(**bad)


def test_write_rule_refuses_unverified_path_characters() -> None:
    """A workdir with a comma, blank or parenthesis cannot become an Edit() rule."""
    for workdir in ("/home/ken/a,b", "/home/ken/my dir", "/home/ken/x(1)"):
        with pytest.raises(ValueError):
            ADAPTER.build(spec(workdir=workdir, tools={"read", "write"}), PROMPT)
    ADAPTER.build(spec(workdir="/home/ken/my dir", tools={"read"}), PROMPT)


# --- connectors: the task's MCP servers ------------------------------------------------------

TOKEN = "ghp_" + "T" * 36
SERVERS = {
    "github": {
        "type": "http",
        "url": "https://api.example/mcp",
        "headers": {"Authorization": TOKEN},
    },
    "docs.io": {"command": "/usr/bin/docs-mcp", "args": ["--ro"], "env": {"DOCS_TOKEN": TOKEN}},
}


def test_mcp_servers_go_into_mcp_config_and_allowed_rules() -> None:
    """--mcp-config right after --strict-mcp-config holds exactly the servers; each one is
    approved as mcp__<name>__* (a dot as Claude writes it in tool names)."""
    argv = ADAPTER.build(spec(tools={"read", "exec"}, mcp_servers=SERVERS), PROMPT).argv
    i = argv.index("--strict-mcp-config")
    assert argv[i + 1] == "--mcp-config"
    assert json.loads(argv[i + 2]) == {"mcpServers": SERVERS}
    assert argv[i + 3 : i + 5] == ("--max-turns", "30")
    rules = argv[argv.index("--allowedTools") + 1]
    assert rules == "Bash,mcp__github__*,mcp__docs_io__*"
    # --tools stays the built-in set: servers add no built-in tool.
    assert argv[argv.index("--tools") + 1] == "Read,Grep,Glob,Bash"


def test_a_read_only_task_with_a_connector_gets_only_its_rule() -> None:
    argv = ADAPTER.build(spec(mcp_servers={"github": SERVERS["github"]}), PROMPT).argv
    assert argv[argv.index("--allowedTools") + 1] == "mcp__github__*"
    assert argv.count("--mcp-config") == 1


def test_no_servers_no_mcp_config() -> None:
    argv = ADAPTER.build(spec(tools={"read", "exec"}), PROMPT).argv
    assert "--mcp-config" not in argv
    assert "--strict-mcp-config" in argv
    assert not any("mcp__" in arg for arg in argv)


def test_server_configs_stay_out_of_the_spec_repr_and_are_copied() -> None:
    """The configurations may hold tokens: not in repr; later changes to the input do not leak
    into the argv."""
    given = {"github": {"headers": {"Authorization": TOKEN}}}
    the_spec = spec(mcp_servers=given)
    given["github"]["headers"]["Authorization"] = "changed"
    assert TOKEN not in repr(the_spec)
    argv = ADAPTER.build(the_spec, PROMPT).argv
    assert json.loads(argv[argv.index("--mcp-config") + 1])["mcpServers"]["github"] == {
        "headers": {"Authorization": TOKEN}
    }


@pytest.mark.parametrize(
    "bad",
    [
        {"git hub": {}},
        {"a,b": {}},
        {"-x": {}},
        {"": {}},
        {"github": ["not", "an", "object"]},
        {"github": {"command": object()}},
        ["github"],
    ],
)
def test_spec_refuses_unsafe_servers(bad: Any) -> None:
    """A name that could widen a rule, or a config that is not a JSON object, is refused."""
    with pytest.raises(ValueError):
        spec(mcp_servers=bad)


def test_registry_knows_the_adapter() -> None:
    """adapter_for('claude') is this adapter; an unknown kind is a ValueError."""
    assert adapter_for("claude") is ADAPTER
    with pytest.raises(ValueError):
        adapter_for("gemini")


# --- parser on the real captures ------------------------------------------------------------------


def test_sample_read_task_with_guard() -> None:
    """The guarded read task: the answer (escapes intact), session id and every tool_use id."""
    parser = feed(sample_lines("claude-stream-json-read-task-with-guard.jsonl"))
    result = ADAPTER.interpret(run_result(), parser)
    assert result == AgentAnswer(
        "FINAL ANSWER: the notes say hello\n\x1b[31mred\x1b[0m done",
        "a5b1ff81-8731-4e5a-9d3b-8b0c301a5fb4",
        tuple(f"toolu_mock_0{i}" for i in range(7)),
    )
    assert parser.cli_version == "2.1.332"
    assert parser.init_tools == ("Glob", "Grep", "Read")


def test_sample_hook_events_are_ignored() -> None:
    """hook_started/hook_response frames do not disturb the answer."""
    parser = feed(sample_lines("claude-stream-json-include-hook-events.jsonl"))
    result = ADAPTER.interpret(run_result(), parser)
    assert isinstance(result, AgentAnswer)
    assert result.text == "FINAL B"
    assert result.tool_use_ids == ("toolu_mock_00",)


def test_sample_two_results_first_wins() -> None:
    """A background task makes two results: the first is the answer; the comment is ignored."""
    lines = sample_lines("claude-stream-json-background-task-two-results.jsonl.txt")
    parser = ClaudeParser()
    for line in lines:
        parser.feed_line(line.encode())
        if parser.done:
            break
    assert parser.results_seen == 1
    assert parser.ignored_lines == 1  # the "# ..." caption line
    for line in lines:
        parser.feed_line(line.encode())
    assert parser.results_seen == 3  # the first result, then both again
    result = ADAPTER.interpret(run_result(exit_code=143, early_finish=True), parser)
    assert isinstance(result, AgentAnswer)
    assert result.text == "FINAL J"


def test_sample_unauthenticated_stream() -> None:
    """Not logged in: subtype "success" with is_error true is unauthenticated, not an answer."""
    lines = sample_section("claude-unauthenticated.txt", "--output-format stream-json")
    assert any('"subtype":"success"' in ln for ln in lines)
    parser = feed(lines)
    assert parser.auth_failed
    result = ADAPTER.interpret(run_result(exit_code=1), parser)
    assert isinstance(result, AgentFailure)
    assert result.kind is FailureKind.UNAUTHENTICATED
    assert "Not logged in" in result.detail


@pytest.mark.parametrize("heading", ['$ claude -p "hi" --output-format json', "claude 2.1.197"])
def test_sample_unauthenticated_json(heading: str) -> None:
    """Both versions' json-mode "Not logged in" result map to unauthenticated."""
    lines = sample_section("claude-unauthenticated.txt", heading)
    assert lines and lines[0].startswith("{")
    result = outcome(lines, exit_code=1)
    assert isinstance(result, AgentFailure)
    assert result.kind is FailureKind.UNAUTHENTICATED


def test_sample_unauthenticated_text_mode_output() -> None:
    """Text-mode output (no JSON at all) saying Not logged in is unauthenticated."""
    lines = sample_section("claude-unauthenticated.txt", "--output-format text")
    parser = feed(lines)
    assert parser.ignored_lines == 1
    stdout = "\n".join(lines).encode()
    result = ADAPTER.interpret(run_result(exit_code=1, stdout=stdout), parser)
    assert isinstance(result, AgentFailure)
    assert result.kind is FailureKind.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("## success", AgentAnswer("FINAL J2", "f5899066-b7a9-4b1a-8e29-9aa07a12038c", ())),
        (
            "--max-turns 2",
            AgentFailure(
                FailureKind.AGENT_ERROR,
                "Reached maximum number of turns (2) (subtype=error_max_turns, "
                "terminal_reason=max_turns)",
            ),
        ),
        ("API 529", FailureKind.AGENT_ERROR),
        ("API 400", FailureKind.AGENT_ERROR),
        ("API 401", FailureKind.UNAUTHENTICATED),
        ("2.1.197 success", AgentAnswer("FINAL B", None, ())),
    ],
)
def test_sample_json_results(heading: str, expected: Outcome | FailureKind) -> None:
    """Each captured result shape maps to its answer or failure kind."""
    line = json_after_heading("claude-json-results.txt", heading.removeprefix("## "))
    result = outcome([line], exit_code=0 if isinstance(expected, AgentAnswer) else 1)
    if isinstance(expected, FailureKind):
        assert isinstance(result, AgentFailure)
        assert result.kind is expected
        assert len(result.detail) <= 300
    elif isinstance(expected, AgentAnswer) and expected.session_id is None:
        assert isinstance(result, AgentAnswer)
        assert result.text == expected.text
    else:
        assert result == expected


def test_sample_529_detail_names_the_status() -> None:
    """The overload failure says what happened and which API status it was."""
    result = outcome([json_after_heading("claude-json-results.txt", "API 529")], exit_code=1)
    assert isinstance(result, AgentFailure)
    assert result.detail.startswith("API Error: Repeated 529 Overloaded errors")
    assert "api_error_status=529" in result.detail


# --- parser on inline lines -----------------------------------------------------------------------

RESULT_OK = '{"type":"result","subtype":"success","is_error":false,"result":"hi","session_id":"s1"}'


def test_crlf_and_warning_lines_are_tolerated() -> None:
    """CRLF endings are fine; a non-JSON warning line is ignored but counted."""
    parser = feed(["WARNING: proceeding without a keychain\r\n", RESULT_OK + "\r\n", "\r\n"])
    assert parser.ignored_lines == 1
    assert ADAPTER.interpret(run_result(), parser) == AgentAnswer("hi", "s1", ())


def test_array_truncated_and_numeric_results() -> None:
    """A JSON array or a cut line is not a result; a numeric result is an agent_error."""
    parser = feed([f"[{RESULT_OK}]", RESULT_OK[:40]])
    assert not parser.done and parser.ignored_lines == 2
    number = outcome(['{"type":"result","subtype":"success","is_error":false,"result":42}'])
    assert isinstance(number, AgentFailure) and number.kind is FailureKind.AGENT_ERROR


def test_absurdly_nested_json_is_just_an_ignored_line() -> None:
    """A deeply nested line is ignored like any other garbage; parsing carries on."""
    parser = feed([b"[" * 100_000 + b"]" * 100_000, RESULT_OK.encode()])
    assert parser.ignored_lines == 1 and parser.done


def test_is_error_is_trusted_over_subtype() -> None:
    """is_error true fails even with subtype success; missing is_error falls back to subtype."""
    failed = outcome(['{"type":"result","subtype":"success","is_error":true,"result":"boom"}'])
    assert failed == AgentFailure(FailureKind.AGENT_ERROR, "boom (subtype=success)")
    fallback = outcome(['{"type":"result","subtype":"error_during_execution","result":"x"}'])
    assert isinstance(fallback, AgentFailure)
    ok = outcome(['{"type":"result","subtype":"weird","is_error":false,"result":"fine"}'])
    assert isinstance(ok, AgentAnswer)


def test_missing_result_detail_from_errors_or_terminal_reason() -> None:
    """Without result text the detail comes from errors, then terminal_reason."""
    errs = outcome(['{"type":"result","is_error":true,"errors":["ran out"]}'])
    assert errs == AgentFailure(FailureKind.AGENT_ERROR, "ran out")
    reason = outcome(['{"type":"result","is_error":true,"terminal_reason":"hook_stopped"}'])
    assert isinstance(reason, AgentFailure)
    assert reason.detail == "the agent reported an error (terminal_reason=hook_stopped)"


def test_invalid_utf8_and_lone_surrogates_become_replacement_chars() -> None:
    """Bad bytes and lone surrogates in the answer are replaced, never dropped or raised."""
    raw = b'{"type":"result","is_error":false,"result":"a\xff\\ud800b"}'
    result = outcome([raw])
    assert result == AgentAnswer("a\ufffd\ufffdb", None, ())


def test_first_result_wins_and_tool_ids_keep_order() -> None:
    """Only the first result counts; tool_use ids are collected once each, in order."""
    use = '{"type":"assistant","message":{"content":[{"type":"tool_use","id":"%s"}]}}'
    second = '{"type":"result","subtype":"success","is_error":false,"result":"second"}'
    parser = feed([use % "t1", use % "t2", use % "t1", RESULT_OK, second, use % "t3"])
    assert parser.tool_use_ids == ("t1", "t2", "t3")
    result = ADAPTER.interpret(run_result(), parser)
    assert isinstance(result, AgentAnswer) and result.text == "hi"


# --- failure mappings without a result ------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "kind"),
    [
        ({"timed_out": True, "signal": 15, "exit_code": None}, FailureKind.TIMEOUT),
        ({"cancelled": True, "signal": 15, "exit_code": None}, FailureKind.CANCELLED),
        ({"stdout_truncated": True}, FailureKind.OUTPUT_TOO_LARGE),
        (
            {"exit_code": 1, "stderr": b"Error: Session ID 0f3e is already in use.\n"},
            FailureKind.RESUME_FAILED,
        ),
        (
            {"exit_code": 1, "stderr": b"No conversation found with session ID: 0f3e\n"},
            FailureKind.RESUME_FAILED,
        ),
        (
            {
                "exit_code": 1,
                "stderr": b"error: option '--permission-mode <mode>' argument 'manual' is "
                b"invalid. Allowed choices are acceptEdits, default.\n",
            },
            FailureKind.CLI_TOO_OLD,
        ),
        ({"exit_code": 1, "stderr": b"error: unknown option '--tools'\n"}, FailureKind.CLI_TOO_OLD),
        (
            {"exit_code": 1, "stdout": b"Invalid API key \xc2\xb7 Fix it\n"},
            FailureKind.UNAUTHENTICATED,
        ),
        ({"exit_code": 1, "stderr": b"Segmentation fault\n"}, FailureKind.AGENT_ERROR),
    ],
)
def test_failures_without_a_result(result: dict[str, Any], kind: FailureKind) -> None:
    """Each exit without a result line maps to one failure kind."""
    got = ADAPTER.interpret(run_result(**result), ClaudeParser())
    assert isinstance(got, AgentFailure)
    assert got.kind is kind


def test_resume_failure_detail_does_not_leak_the_session_id() -> None:
    """The resume failure detail is fixed text: the session id stays on this machine."""
    got = outcome([], exit_code=1, stderr=b"Error: Session ID 0f3e-secret is already in use.\n")
    assert isinstance(got, AgentFailure)
    assert "0f3e" not in got.detail


def test_agent_error_detail_is_a_short_clean_tail() -> None:
    """The detail is the stderr tail: control characters gone, at most 300 characters."""
    stderr = b"early noise\n" * 1000 + b"\x1b[31mfatal:\x07 disk full\r\n"
    got = outcome([], exit_code=2, stderr=stderr)
    assert isinstance(got, AgentFailure)
    # The escape sequence goes whole (agentcall.safetext), not only its ESC byte.
    assert got.detail.endswith(" | fatal: disk full")
    assert "\x1b" not in got.detail and "\x07" not in got.detail
    assert len(got.detail) <= 300
    assert got.detail.startswith("agent exited with code 2 without a result")


def test_answer_survives_early_finish_exit_code() -> None:
    """After the runner ended a lingering agent (exit 143), the first result still answers."""
    got = outcome([RESULT_OK], exit_code=143, early_finish=True)
    assert got == AgentAnswer("hi", "s1", ())


def test_interpret_refuses_another_adapters_parser() -> None:
    """Handing the Claude interpreter a foreign parser is a programming error."""
    with pytest.raises(TypeError):
        ADAPTER.interpret(run_result(), adapter_for("codex").new_parser())


# --- the fake claude through the real runner ------------------------------------------------------


@pytest.fixture
def fake_claude(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "claude").symlink_to(FAKE_AGENT)
    return bin_dir / "claude"


async def run_fake(
    binary: Path,
    tmp_path: Path,
    scenario: dict[str, Any],
    tools: set[str] | None = None,
    servers: dict[str, Any] | None = None,
    **run: Any,
) -> tuple[Outcome, RunResult, list[dict[str, Any]]]:
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    log = tmp_path / "fake.log"
    the_spec = spec(
        binary=str(binary), workdir=str(workdir), tools=tools or {"read"}, mcp_servers=servers or {}
    )
    inv = ADAPTER.build(the_spec, PROMPT)
    env = {
        **os.environ,
        **inv.env_additions,
        "FAKE_AGENT_SCENARIO": json.dumps(scenario),
        "FAKE_AGENT_LOG": str(log),
    }
    run.setdefault("timeout_s", 10.0)
    agent_run = AgentRun(argv=inv.argv, cwd=inv.cwd, env=env, stdin=inv.stdin_bytes, **run)
    parser = ADAPTER.new_parser()
    result = await run_agent(reactor, agent_run, parser)[0]
    entries = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
    return ADAPTER.interpret(result, parser), result, entries


@pytest.mark.slow
@twisted_test
async def test_fake_happy_run_end_to_end(fake_claude: Path, tmp_path: Path) -> None:
    """The built argv passes the fake's checks; the caller's line reaches the agent and back."""
    got, _, entries = await run_fake(
        fake_claude, tmp_path, {"name": "happy"}, {"read", "write", "exec", "fetch"}
    )
    assert isinstance(got, AgentAnswer)
    assert got.text == "FAKE-AGENT-ANSWER: What do the notes say?"
    assert got.tool_use_ids == ("toolu_fake_01", "toolu_fake_02")
    assert got.session_id is not None
    (entry,) = entries
    assert entry["prompt"] == PROMPT
    assert entry["env"]["CLAUDE_CODE_MAX_RETRIES"] == "2"
    assert entry["cwd"] == str(tmp_path / "work")
    assert entry["argv"][0] == "-p"


@pytest.mark.slow
@twisted_test
async def test_fake_run_with_connectors_passes_the_argv_checks(
    fake_claude: Path, tmp_path: Path
) -> None:
    """--mcp-config and the mcp__ rules are read as flag values, never as a swallowed prompt."""
    got, _, entries = await run_fake(
        fake_claude, tmp_path, {"name": "happy"}, {"read", "write"}, servers=SERVERS
    )
    assert isinstance(got, AgentAnswer)
    (entry,) = entries
    argv = entry["argv"]
    assert json.loads(argv[argv.index("--mcp-config") + 1]) == {"mcpServers": SERVERS}
    assert entry["prompt"] == PROMPT


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "kind"),
    [
        ({"name": "unauthenticated"}, FailureKind.UNAUTHENTICATED),
        ({"name": "unauthenticated", "version": "2.1.197"}, FailureKind.UNAUTHENTICATED),
        ({"name": "invalid_key"}, FailureKind.UNAUTHENTICATED),
        ({"name": "max_turns"}, FailureKind.AGENT_ERROR),
        ({"name": "api_error"}, FailureKind.AGENT_ERROR),
        ({"name": "session_in_use"}, FailureKind.RESUME_FAILED),
        ({"name": "no_conversation"}, FailureKind.RESUME_FAILED),
        ({"name": "usage_error"}, FailureKind.CLI_TOO_OLD),
        ({"name": "truncated_json"}, FailureKind.AGENT_ERROR),
        ({"name": "json_array"}, FailureKind.AGENT_ERROR),
        ({"name": "result_number"}, FailureKind.AGENT_ERROR),
        ({"name": "flood_stdout"}, FailureKind.OUTPUT_TOO_LARGE),
    ],
)
@twisted_test
async def test_fake_failures_end_to_end(
    fake_claude: Path, tmp_path: Path, scenario: dict[str, Any], kind: FailureKind
) -> None:
    """Each failing fake behaviour reaches the listener as its failure kind."""
    got, _, _ = await run_fake(fake_claude, tmp_path, scenario)
    assert isinstance(got, AgentFailure)
    assert got.kind is kind


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["happy_old", "warning_first", "crlf", "ignore_stdin", "escapes", "secrets"]
)
@twisted_test
async def test_fake_answers_end_to_end(fake_claude: Path, tmp_path: Path, name: str) -> None:
    """Odd but valid output still answers; escapes and secrets pass through untouched here."""
    got, _, _ = await run_fake(fake_claude, tmp_path, {"name": name, "marker": "MK"})
    assert isinstance(got, AgentAnswer)
    assert got.text.startswith("MK")
    if name == "escapes":
        assert "\x1b]0;evil-title\x07" in got.text and "\ufffd" in got.text
    if name == "secrets":
        assert "ghp_FAKE" in got.text


@pytest.mark.slow
@twisted_test
async def test_fake_huge_result_comes_back_whole(fake_claude: Path, tmp_path: Path) -> None:
    """A 1.5 MB answer on one line is parsed whole (the reply cap is applied later)."""
    got, result, _ = await run_fake(fake_claude, tmp_path, {"name": "huge_result"})
    assert isinstance(got, AgentAnswer)
    assert len(got.text.encode()) > 1_500_000
    assert not result.stdout_truncated


@pytest.mark.slow
@twisted_test
async def test_fake_hang_times_out(fake_claude: Path, tmp_path: Path) -> None:
    """A silent agent is ended by the kill timer and reported as timeout."""
    got, result, _ = await run_fake(fake_claude, tmp_path, {"name": "hang"}, timeout_s=0.5)
    assert result.timed_out
    assert got == AgentFailure(FailureKind.TIMEOUT, "no answer before the kill timer")


@pytest.mark.slow
@twisted_test
async def test_fake_linger_answers_after_the_first_result(
    fake_claude: Path, tmp_path: Path
) -> None:
    """Answer-then-linger: the answer comes from the first result, the run ends early."""
    got, result, _ = await run_fake(
        fake_claude,
        tmp_path,
        {"name": "linger", "seconds": 600},
        finish_grace_s=0.2,
        timeout_s=300,
    )
    # Ended by the finish grace, not by the kill timer (300 s) or the agent itself (600 s).
    assert result.early_finish and result.duration_s < 120
    assert isinstance(got, AgentAnswer)
    assert not got.text.startswith("SECOND")


def test_fake_agent_is_executable() -> None:
    """The fake is one executable python3 script."""
    assert os.access(FAKE_AGENT, os.X_OK)
    assert FAKE_AGENT.read_text().startswith("#!/usr/bin/env python3\n")


@pytest.mark.slow
def test_fake_probes(fake_claude: Path, tmp_path: Path) -> None:
    """--version prints the CLI version (old on request); auth status exits 1 when logged out."""

    def probe(*args: str, scenario: str = "happy") -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "FAKE_AGENT_SCENARIO": scenario}
        return subprocess.run(
            [str(fake_claude), *args], env=env, capture_output=True, text=True, timeout=10
        )

    assert probe("--version").stdout == "2.1.332 (Claude Code)\n"
    assert probe("--version", scenario="happy_old").stdout == "2.1.197 (Claude Code)\n"
    logged_out = probe("auth", "status", scenario="unauthenticated")
    assert logged_out.returncode == 1
    assert json.loads(logged_out.stdout.split("\n}")[0] + "}")["loggedIn"] is False
    assert probe("auth", "status").returncode == 0


@pytest.mark.slow
@twisted_test
async def test_fake_scenario_file_wins_and_can_change(
    fake_claude: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scenario file beats the env var, and a rewrite changes the next call."""
    scenario_file = tmp_path / "scenario"
    scenario_file.write_text("unauthenticated")
    monkeypatch.setenv("FAKE_AGENT_SCENARIO_FILE", str(scenario_file))
    first, _, _ = await run_fake(fake_claude, tmp_path, {"name": "happy"})
    scenario_file.write_text(json.dumps({"name": "happy", "answer": "changed"}))
    second, _, _ = await run_fake(fake_claude, tmp_path, {"name": "unauthenticated"})
    assert isinstance(first, AgentFailure) and first.kind is FailureKind.UNAUTHENTICATED
    assert isinstance(second, AgentAnswer) and second.text == "changed"


@pytest.mark.slow
@twisted_test
async def test_fake_slow_answer_just_inside_the_timer(fake_claude: Path, tmp_path: Path) -> None:
    """An answer that takes a while but lands before the kill timer is an answer."""
    got, result, _ = await run_fake(fake_claude, tmp_path, {"name": "slow", "seconds": 0.5})
    assert isinstance(got, AgentAnswer)
    assert result.duration_s >= 0.5
