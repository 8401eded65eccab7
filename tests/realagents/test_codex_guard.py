"""The sandbox and the tool guard under the real ``codex exec`` (pinned, from npm).

Each test runs exactly the argv of :mod:`agentcall.listener.agents.codex` through
``run_agent``, against the loopback Responses API mock, which the owner's
``~/.codex/config.toml`` names as the model provider (so argv stays the adapter's own). The
scripted model reaches the shell and patches the way Codex 0.171 offers them: nested calls in
the JavaScript ``exec`` tool.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_twisted  # type: ignore[import-untyped,unused-ignore]

from agentcall.guard.main import DENY_REASON, FAILURE_MESSAGE
from agentcall.listener.agents.base import AgentAnswer, AgentSpec
from agentcall.listener.agents.codex import ADAPTER
from tests.realagents.harness import (
    MOCK_KEY_ENV,
    GuardWiring,
    Layout,
    RealRun,
    base_environ,
    confinement,
    run_real,
)
from tests.realagents.install import InstalledAgent
from tests.realagents.mock_openai import (
    Final,
    MockResponses,
    ToolOutput,
    add_file_patch,
    patch,
    shell,
)

pytestmark = [pytest.mark.realagent, pytest.mark.slow]

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, None]])
# What the model sees when a PreToolUse hook refused a nested call (ANALYSIS.md §2.4).
HOOK_BLOCKED = "blocked by PreToolUse hook"


def twisted_test(f: F) -> F:
    """Run an async test on the reactor (pytest-twisted is untyped)."""
    result: F = pytest_twisted.ensureDeferred(f)
    return result


async def run_codex(
    install: InstalledAgent,
    layout: Layout,
    mock: MockResponses,
    guard: GuardWiring,
    *,
    caps: set[str],
    prompt: str = "Please look at the notes.",
    hook_argv: Sequence[str] | None = None,
    guard_env: dict[str, str] | None = None,
    keep_session: bool = False,
    resume_session: str | None = None,
) -> RealRun:
    layout.codex_config(mock.base_url)
    read_roots: Sequence[Path] = (layout.home,)
    environ = base_environ(layout)
    # Confined exactly as the listener plans it where the kernel has Landlock: then Codex
    # runs without its own sandbox (danger-full-access) and the ruleset is the boundary.
    confine = confinement(layout, "codex", caps, read_roots, environ)
    spec = AgentSpec(
        binary=str(install.binary),
        workdir=str(layout.workdir),
        tools=frozenset(caps),
        read_roots=tuple(str(r) for r in read_roots),
        extra_env={MOCK_KEY_ENV: "dummy-key"},
        codex_hook_config=guard.codex_hook(hook_argv),
        keep_session=keep_session,
        resume_session=resume_session,
        confined=confine is not None,
    )
    call_id = f"call-{secrets.token_hex(6)}"
    return await run_real(
        ADAPTER,
        spec,
        prompt,
        environ=environ,
        guard_env=guard.env(layout, caps, read_roots, call_id) if guard_env is None else guard_env,
        call_id=call_id,
        confine=confine,
    )


def confined(run: RealRun) -> bool:
    """Whether the run was inside the kernel boundary (Codex then has no sandbox of its own)."""
    argv = list(run.invocation.argv)
    if "-s" in argv:
        return argv[argv.index("-s") + 1] == "danger-full-access"
    return 'sandbox_mode="danger-full-access"' in argv


def answer_of(run: RealRun) -> AgentAnswer:
    assert isinstance(run.outcome, AgentAnswer), run.describe()
    return run.outcome


def outputs(mock: MockResponses, ids: Sequence[str], run: RealRun) -> list[ToolOutput]:
    found = mock.tool_outputs()
    missing = [i for i in ids if i not in found]
    assert not missing, f"no output for {missing}\n{run.describe()}"
    return [found[i] for i in ids]


def guard_calls(layout: Layout, run: RealRun) -> list[tuple[str, str]]:
    """(tool, decision) per tools.log record of this run; each has its own tool_use id."""
    records = [r for r in layout.guard_records() if r.get("call_id") == run.call_id]
    ids = [r.get("tool_use_id") for r in records]
    assert all(isinstance(i, str) and i for i in ids), records
    assert len(set(ids)) == len(ids), records
    return [(str(r.get("tool")), str(r.get("decision"))) for r in records]


@twisted_test
async def test_read_only_sandbox_blocks_writes_the_guard_lets_through(
    codex_install: InstalledAgent,
    layout: Layout,
    openai_mock: MockResponses,
    guard: GuardWiring,
) -> None:
    blocked = layout.workdir / "blocked.txt"
    ids = openai_mock.script(
        [
            shell("cat notes.txt"),
            shell("printf planted > blocked.txt"),
            shell(f"cat {layout.ssh_key} > /dev/null"),
            Final("looked around"),
        ]
    )

    run = await run_codex(codex_install, layout, openai_mock, guard, caps={"read", "exec"})

    assert answer_of(run).text == "looked around"
    argv = list(run.invocation.argv)
    assert argv[argv.index("-s") + 1] == ("danger-full-access" if confined(run) else "read-only")
    read, write, _key = outputs(openai_mock, ids, run)
    assert layout.markers["notes"] in read.text
    # The guard records Bash and lets it run ({exec}); the kernel boundary (or, without
    # Landlock, Codex's read-only sandbox) stops the write.
    refusal = "Permission denied" if confined(run) else "Read-only file system"
    assert refusal in write.text, write
    assert not blocked.exists()
    # Bash is not bounded by the guard (ANALYSIS.md §4): a command naming a denied path is
    # only flagged for the owner.
    assert guard_calls(layout, run) == [("Bash", "allow"), ("Bash", "allow"), ("Bash", "flag")]


@twisted_test
async def test_guard_denies_shell_and_patches_the_sandbox_would_allow(
    codex_install: InstalledAgent,
    layout: Layout,
    openai_mock: MockResponses,
    guard: GuardWiring,
) -> None:
    by_shell = layout.workdir / "made-by-shell.txt"
    inside = layout.workdir / "inside.txt"
    outside = layout.outside / "escaped.txt"
    planted_env = layout.workdir / ".env"
    ids = openai_mock.script(
        [
            shell(f"printf planted > {by_shell.name}"),
            patch(add_file_patch("inside.txt", "patched in")),
            patch(add_file_patch(str(outside), "should not exist")),
            patch(add_file_patch(".env", "TOKEN=planted")),
            Final("tried everything"),
        ]
    )

    run = await run_codex(codex_install, layout, openai_mock, guard, caps={"read", "write"})

    assert answer_of(run).text == "tried everything"
    argv = list(run.invocation.argv)
    mode = "danger-full-access" if confined(run) else "workspace-write"
    assert argv[argv.index("-s") + 1] == mode
    assert "--dangerously-bypass-hook-trust" in argv
    shell_out, inside_out, outside_out, env_out = outputs(openai_mock, ids, run)
    # Both sandboxes would allow these in the workdir: only the guard stops them
    # ({read,write} has no exec; .env is a denied name anywhere).
    for refused in (shell_out, env_out):
        assert HOOK_BLOCKED in refused.text and DENY_REASON in refused.text, refused
    assert not by_shell.exists()
    assert not planted_env.exists()
    assert HOOK_BLOCKED in outside_out.text, outside_out
    assert not outside.exists()
    assert HOOK_BLOCKED not in inside_out.text, inside_out
    assert inside.read_text() == "patched in\n"
    assert guard_calls(layout, run) == [
        ("Bash", "deny"),
        ("apply_patch", "allow"),
        ("apply_patch", "deny"),
        ("apply_patch", "deny"),
    ]


@twisted_test
async def test_a_guard_that_cannot_decide_refuses_through_codex(
    codex_install: InstalledAgent,
    layout: Layout,
    openai_mock: MockResponses,
    guard: GuardWiring,
) -> None:
    # The guard's log directory does not exist: it cannot record the call, so it refuses
    # (exit 2 with a reason on stderr, the only failure Codex treats as a refusal).
    env = guard.env(layout, {"read", "write", "exec"}, (layout.home,), "call-unloggable")
    env["AGENTCALL_GUARD_LOG"] = str(layout.root / "no-such-dir" / "tools.log")
    created = layout.workdir / "created.txt"
    ids = openai_mock.script(
        [
            shell(f"printf x > {created.name}"),
            patch(add_file_patch("patched.txt", "x")),
            Final("nothing ran"),
        ]
    )

    run = await run_codex(
        codex_install, layout, openai_mock, guard, caps={"read", "write", "exec"}, guard_env=env
    )

    assert answer_of(run).text == "nothing ran"
    for refused in outputs(openai_mock, ids, run):
        assert HOOK_BLOCKED in refused.text and FAILURE_MESSAGE in refused.text, refused
    assert not created.exists()
    assert not (layout.workdir / "patched.txt").exists()


@pytest.mark.xfail(
    strict=True,
    reason="Codex 0.171.0 runs the tool when the hook exits 1 or cannot be started "
    "(verified here); only exit 2 with stderr, or the deny JSON, refuses. If this starts "
    "passing, Codex fails closed now: drop the xfail.",
)
@pytest.mark.parametrize("failure", ["exits-1", "missing"])
@twisted_test
async def test_a_crashing_hook_blocks_codex_tools(
    failure: str,
    codex_install: InstalledAgent,
    layout: Layout,
    openai_mock: MockResponses,
    guard: GuardWiring,
) -> None:
    broken = (
        ["/bin/sh", "-c", "exit 1"]
        if failure == "exits-1"
        else [str(layout.root / "no-such-dir" / "agentcall-guard")]
    )
    created = layout.workdir / "created.txt"
    openai_mock.script([patch(add_file_patch(created.name, "x")), Final("done")])

    run = await run_codex(
        codex_install, layout, openai_mock, guard, caps={"read", "write"}, hook_argv=broken
    )

    assert isinstance(run.outcome, AgentAnswer), run.describe()
    assert not created.exists()


@twisted_test
async def test_follow_up_resumes_the_codex_thread_with_the_guard(
    codex_install: InstalledAgent,
    layout: Layout,
    openai_mock: MockResponses,
    guard: GuardWiring,
) -> None:
    first_prompt = f"First question {uuid.uuid4()}"
    (read_id,) = openai_mock.script([shell("cat notes.txt"), Final("first answer")])
    first = await run_codex(
        codex_install,
        layout,
        openai_mock,
        guard,
        caps={"read", "exec"},
        prompt=first_prompt,
        keep_session=True,
    )
    thread = answer_of(first).session_id
    assert thread is not None
    assert "--ephemeral" not in first.invocation.argv
    seen_before = len(openai_mock.requests)

    second_prompt = f"Second question {uuid.uuid4()}"
    (patch_id,) = openai_mock.script(
        [patch(add_file_patch("follow-up.txt", "x")), Final("second answer")]
    )
    second = await run_codex(
        codex_install,
        layout,
        openai_mock,
        guard,
        caps={"read", "exec"},
        prompt=second_prompt,
        resume_session=thread,
    )

    assert answer_of(second).text == "second answer"
    assert second.invocation.argv[1:4] == ("exec", "resume", thread)
    resumed = openai_mock.requests[seen_before].body
    for earlier in (first_prompt, read_id, layout.markers["notes"], "first answer"):
        assert earlier.encode() in resumed, earlier
    assert second_prompt.encode() in resumed
    # The resumed run still has the guard and its first run's boundary: no write capability.
    assert confined(second) == confined(first)
    (refused,) = outputs(openai_mock, [patch_id], second)
    assert HOOK_BLOCKED in refused.text, refused
    assert not (layout.workdir / "follow-up.txt").exists()
    assert guard_calls(layout, first) == [("Bash", "allow")]
    assert guard_calls(layout, second) == [("apply_patch", "deny")]
