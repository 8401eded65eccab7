"""The tool guard under the real ``claude -p`` (pinned, from npm), driven by a scripted model.

Each test runs exactly the argv of :mod:`agentcall.listener.agents.claude` through
``run_agent``, with the guard wired in by its ``--settings``, against the loopback Messages
API mock. What the model "asked for" is scripted; what the CLI sent back (tool results,
denials, file contents) is read from the mock's request record.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_twisted  # type: ignore[import-untyped,unused-ignore]

from agentcall.guard.main import DENY_REASON
from agentcall.listener import guardwire
from agentcall.listener.agents.base import AgentAnswer, AgentSpec
from agentcall.listener.agents.claude import ADAPTER, ClaudeParser
from tests.realagents.harness import (
    CLAUDE_QUIET_ENV,
    DUMMY_ANTHROPIC_KEY,
    GuardWiring,
    Layout,
    RealRun,
    base_environ,
    confinement,
    run_real,
)
from tests.realagents.install import InstalledAgent
from tests.realagents.mock_anthropic import Final, MockAnthropic, ToolResult, ToolUse

pytestmark = [pytest.mark.realagent, pytest.mark.slow]

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, None]])
# How a hook's refusal reaches the model: 2.1.332 says "PreToolUse:<Tool> hook error: <reason>",
# 2.1.197 passes the guard's reason alone.
HOOK_REFUSAL = "PreToolUse:"


def twisted_test(f: F) -> F:
    """Run an async test on the reactor (pytest-twisted is untyped)."""
    result: F = pytest_twisted.ensureDeferred(f)
    return result


async def run_claude(
    install: InstalledAgent,
    layout: Layout,
    mock: MockAnthropic,
    guard: GuardWiring,
    *,
    caps: set[str],
    prompt: str = "Please look at the notes.",
    settings: str | None = None,
    keep_session: bool = False,
    resume_session: str | None = None,
) -> RealRun:
    read_roots: Sequence[Path] = (layout.home,)
    spec = AgentSpec(
        binary=str(install.binary),
        workdir=str(layout.workdir),
        tools=frozenset(caps),
        read_roots=tuple(str(r) for r in read_roots),
        max_turns=8,
        extra_env=CLAUDE_QUIET_ENV,
        settings_json=guard.claude_settings() if settings is None else settings,
        keep_session=keep_session,
        resume_session=resume_session,
    )
    call_id = f"call-{secrets.token_hex(6)}"
    environ = base_environ(
        layout, ANTHROPIC_BASE_URL=mock.base_url, ANTHROPIC_API_KEY=DUMMY_ANTHROPIC_KEY
    )
    return await run_real(
        ADAPTER,
        spec,
        prompt,
        environ=environ,
        guard_env=guard.env(layout, caps, read_roots, call_id),
        call_id=call_id,
        confine=confinement(layout, "claude", caps, read_roots, environ),
    )


def answer_of(run: RealRun) -> AgentAnswer:
    assert isinstance(run.outcome, AgentAnswer), run.describe()
    return run.outcome


def result_for(mock: MockAnthropic, tool_use_id: str, run: RealRun) -> ToolResult:
    results = mock.tool_results()
    assert tool_use_id in results, f"no tool_result for {tool_use_id}\n{run.describe()}"
    return results[tool_use_id]


def assert_no_secret_left(layout: Layout, mock: MockAnthropic, run: RealRun) -> None:
    """No secret file's content reached the model, nor the CLI's own output."""
    for marker in layout.secret_markers:
        assert not mock.server.saw_bytes(marker.encode()), f"{marker} was sent to the model"
        assert marker.encode() not in run.result.stdout, f"{marker} is in the CLI's output"


def assert_every_attempt_logged(layout: Layout, run: RealRun, expected_ids: Sequence[str]) -> None:
    """Every tool_use in stream-json is a tools.log record with the same id, and vice versa."""
    streamed = list(run.parser.tool_use_ids)
    assert streamed == list(expected_ids), run.describe()
    logged = [r.get("tool_use_id") for r in layout.guard_records()]
    for ident in streamed:
        assert ident in logged, f"{ident} is missing from tools.log: {layout.guard_records()}"
    # The listener's own check agrees: no call ran unseen (no guard_unwired).
    assert guardwire.cross_check(streamed, layout.guard_log, run.call_id) == []


def refused_by_hook(result: ToolResult) -> bool:
    return result.is_error and (HOOK_REFUSAL in result.text or DENY_REASON in result.text)


def guard_decisions(layout: Layout) -> dict[str, str]:
    return {
        str(r.get("tool_use_id")): str(r.get("decision"))
        for r in layout.guard_records()
        if r.get("tool_use_id")
    }


@twisted_test
async def test_read_task_guard_denies_credentials_and_outside_reads(
    claude_install: InstalledAgent,
    layout: Layout,
    anthropic_mock: MockAnthropic,
    guard: GuardWiring,
) -> None:
    key_id, env_id, outside_id, notes_id = anthropic_mock.script(
        [
            ToolUse("Read", {"file_path": str(layout.ssh_key)}),
            ToolUse("Read", {"file_path": str(layout.home_env)}),
            ToolUse("Read", {"file_path": str(layout.outside_file)}),
            ToolUse("Read", {"file_path": str(layout.notes)}),
            Final("read what I was allowed to"),
        ]
    )

    run = await run_claude(claude_install, layout, anthropic_mock, guard, caps={"read"})

    assert answer_of(run).text == "read what I was allowed to"
    assert isinstance(run.parser, ClaudeParser)
    assert set(run.parser.init_tools or ()) == {"Read", "Grep", "Glob"}, run.describe()
    # Inside --add-dir $HOME, Claude itself would let these through: the refusal is the hook's.
    for denied in (key_id, env_id):
        refused = result_for(anthropic_mock, denied, run)
        assert refused_by_hook(refused), refused
    assert result_for(anthropic_mock, outside_id, run).is_error
    notes = result_for(anthropic_mock, notes_id, run)
    assert not notes.is_error, notes
    assert layout.markers["notes"] in notes.text
    assert_no_secret_left(layout, anthropic_mock, run)
    assert_every_attempt_logged(layout, run, [key_id, env_id, outside_id, notes_id])
    decisions = guard_decisions(layout)
    assert [decisions[i] for i in (key_id, env_id, outside_id, notes_id)] == [
        "deny",
        "deny",
        "deny",
        "allow",
    ]
    assert anthropic_mock.server.errors == []


@twisted_test
async def test_write_task_guard_confines_writes_to_the_workdir(
    claude_install: InstalledAgent,
    layout: Layout,
    anthropic_mock: MockAnthropic,
    guard: GuardWiring,
) -> None:
    escaped = layout.outside / "escaped.txt"
    env_file = layout.workdir / ".env"
    written = layout.workdir / "answer.txt"
    outside_id, env_id, inside_id = anthropic_mock.script(
        [
            ToolUse("Write", {"file_path": str(escaped), "content": "should not exist\n"}),
            ToolUse("Write", {"file_path": str(env_file), "content": "TOKEN=planted\n"}),
            ToolUse("Write", {"file_path": str(written), "content": "written by the agent\n"}),
            Final("wrote what I was allowed to"),
        ]
    )

    run = await run_claude(claude_install, layout, anthropic_mock, guard, caps={"read", "write"})

    assert answer_of(run).text == "wrote what I was allowed to"
    assert not escaped.exists()
    assert result_for(anthropic_mock, outside_id, run).is_error
    # The Edit(//workdir/**) rule approves this one; only the guard's denylist refuses it.
    planted = result_for(anthropic_mock, env_id, run)
    assert refused_by_hook(planted), planted
    assert not env_file.exists()
    assert not result_for(anthropic_mock, inside_id, run).is_error
    assert written.read_text() == "written by the agent\n"
    assert_every_attempt_logged(layout, run, [outside_id, env_id, inside_id])
    decisions = guard_decisions(layout)
    assert [decisions[i] for i in (outside_id, env_id, inside_id)] == ["deny", "deny", "allow"]


@pytest.mark.parametrize("failure", ["exits-1", "missing"])
@twisted_test
async def test_a_guard_that_cannot_answer_blocks_the_tool(
    failure: str,
    claude_install: InstalledAgent,
    layout: Layout,
    anthropic_mock: MockAnthropic,
    guard: GuardWiring,
) -> None:
    broken = (
        ["/bin/sh", "-c", "exit 1"]
        if failure == "exits-1"
        else [str(layout.root / "no-such-dir" / "agentcall-guard")]
    )
    created = layout.workdir / "created.txt"
    read_id, write_id = anthropic_mock.script(
        [
            ToolUse("Read", {"file_path": str(layout.notes)}),
            ToolUse("Write", {"file_path": str(created), "content": "should not exist\n"}),
            Final("the tools were blocked"),
        ]
    )

    run = await run_claude(
        claude_install,
        layout,
        anthropic_mock,
        guard,
        caps={"read", "write"},
        settings=guard.claude_settings(broken),
    )

    assert answer_of(run).text == "the tools were blocked"
    for ident in (read_id, write_id):
        blocked = result_for(anthropic_mock, ident, run)
        assert blocked.is_error, blocked
    # Both calls are ones Claude itself allows (inside the cwd, Edit rule): only
    # onFailure "block" stops them.
    assert not anthropic_mock.server.saw_bytes(layout.markers["notes"].encode())
    assert not created.exists()
    assert layout.guard_records() == []
    # What the listener's cross-check reports for such a run: both calls unseen by the guard.
    unseen = guardwire.cross_check(run.parser.tool_use_ids, layout.guard_log, run.call_id)
    assert unseen == [read_id, write_id]


@twisted_test
async def test_follow_up_resumes_the_same_session_with_the_guard(
    claude_install: InstalledAgent,
    layout: Layout,
    anthropic_mock: MockAnthropic,
    guard: GuardWiring,
) -> None:
    first_prompt = f"First question {uuid.uuid4()}"
    (notes_id,) = anthropic_mock.script(
        [ToolUse("Read", {"file_path": str(layout.notes)}), Final("first answer")]
    )
    first = await run_claude(
        claude_install,
        layout,
        anthropic_mock,
        guard,
        caps={"read"},
        prompt=first_prompt,
        keep_session=True,
    )
    assert answer_of(first).text == "first answer"
    session = answer_of(first).session_id
    assert session is not None
    assert "--no-session-persistence" not in first.invocation.argv
    turn_one_requests = len(anthropic_mock.main_requests())

    second_prompt = f"Second question {uuid.uuid4()}"
    (key_id,) = anthropic_mock.script(
        [ToolUse("Read", {"file_path": str(layout.ssh_key)}), Final("second answer")]
    )
    second = await run_claude(
        claude_install,
        layout,
        anthropic_mock,
        guard,
        caps={"read"},
        prompt=second_prompt,
        resume_session=session,
    )

    assert answer_of(second).text == "second answer"
    assert answer_of(second).session_id == session
    resumed = anthropic_mock.main_requests()[turn_one_requests].body
    # The first request of turn 2 carries turn 1: its prompt, its tool call and its answer.
    for earlier in (first_prompt, notes_id, layout.markers["notes"], "first answer"):
        assert earlier.encode() in resumed, earlier
    assert second_prompt.encode() in resumed
    refused = result_for(anthropic_mock, key_id, second)
    assert refused_by_hook(refused), refused
    assert_no_secret_left(layout, anthropic_mock, second)
    logged = [r.get("tool_use_id") for r in layout.guard_records()]
    assert logged == [notes_id, key_id]
