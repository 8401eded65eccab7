"""The Codex guard preflight: the hook runs once, as Codex would, before Codex is spawned.

Codex 0.171.0 runs a tool when its hook crashes, is missing or times out, so the listener runs
the exact hook command first on a call the guard must refuse. Pure parts first, then the
pipeline on a Clock with fake runs, then real processes (the real guard and broken hooks).
"""

from __future__ import annotations

import json
import shlex
import tomllib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
import pytest_twisted  # type: ignore[import-untyped,unused-ignore]
from twisted.internet import defer
from twisted.internet import reactor as _reactor

from agentcall.errors import CallErrorCode
from agentcall.guard.decide import DENY, Policy, decide, parse_payload
from agentcall.guard.main import DENY_OUTPUT, FAILURE_MESSAGE
from agentcall.guard.scope import Scope
from agentcall.listener import core, guardwire
from agentcall.listener.calllog import CallStatus
from agentcall.listener.runner import AgentRun, OutputParser, RunHandle, RunResult, run_agent
from agentcall.wire.frames import CallCancelled, CancelCall, CancelPhase
from agentcall.wire.payloads import CallFailure, Reply
from tests.unit.test_listener_core import Harness
from tests.unit.test_listener_stages import (
    CALL_ID,
    CLAUDE,
    CODEX,
    ENVIRON,
    GUARD,
    make_config,
    planned,
    run_result,
)

reactor: Any = _reactor
F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, None]])
DENIED = run_result(stdout=DENY_OUTPUT.encode() + b"\n")


def twisted_test(f: F) -> F:
    """Run an async test on the reactor (pytest-twisted is untyped)."""
    result: F = pytest_twisted.ensureDeferred(f)
    return result


# --- what counts as a refusal --------------------------------------------------------------


@pytest.mark.parametrize(
    "result",
    [
        DENIED,
        run_result(stdout=b"  " + DENY_OUTPUT.encode() + b"\r\n"),
        run_result(exit_code=2, stderr=FAILURE_MESSAGE.encode()),
    ],
    ids=["deny JSON", "deny JSON with blanks", "exit 2 with a reason"],
)
def test_the_refusals_codex_honours_pass(result: RunResult) -> None:
    assert guardwire.preflight_problem(result) is None


def _deny(**changes: object) -> bytes:
    output: dict[str, object] = {
        "hookEventName": "PreToolUse",
        "permissionDecision": "deny",
        "permissionDecisionReason": "no",
    }
    output.update(changes)
    return json.dumps({"hookSpecificOutput": output}).encode()


@pytest.mark.parametrize(
    ("result", "words"),
    [
        (run_result(), "did not refuse"),
        (run_result(stdout=_deny(permissionDecision="allow")), "did not refuse"),
        (run_result(stdout=_deny(permissionDecisionReason=" ")), "did not refuse"),
        (run_result(stdout=_deny(hookEventName="PostToolUse")), "did not refuse"),
        (run_result(stdout=b"Welcome back!\n" + DENY_OUTPUT.encode()), "did not refuse"),
        (run_result(stdout=b"\xff" + DENY_OUTPUT.encode()), "did not refuse"),
        (run_result(exit_code=2, stderr=b" \n"), "code 2 but gave no reason"),
        (run_result(exit_code=1, stdout=DENY_OUTPUT.encode()), "exit code 1"),
        (run_result(exit_code=127), "not found (exit code 127)"),
        (run_result(exit_code=126), "could not be executed (exit code 126)"),
        (run_result(exit_code=None, signal=9), "killed by signal 9"),
        (run_result(exit_code=None, signal=15, timed_out=True), "within 10 s"),
        (run_result(exit_code=None, signal=15, cancelled=True), "was stopped"),
    ],
)
def test_anything_else_is_a_problem_with_a_reason(result: RunResult, words: str) -> None:
    problem = guardwire.preflight_problem(result)
    assert problem is not None and words in problem


@pytest.mark.parametrize("caps", [set(), {"read", "write", "fetch", "exec"}])
def test_the_real_guard_refuses_the_preflight_call_whatever_the_call_may_do(
    caps: set[str],
) -> None:
    call = parse_payload(json.loads(guardwire.preflight_payload("/srv/work")), "/")
    policy = Policy(Scope(("/",), (), "/home/ken"), caps, "/", ("agentcall", "sentry"))
    assert decide(call, policy).action == DENY
    assert call.tool_name == call.tool_use_id == guardwire.PREFLIGHT_TOOL


def test_hooks_run_in_the_users_login_shell_or_sh() -> None:
    assert guardwire.codex_hook_shell("x y", {"SHELL": "/bin/zsh"}) == ("/bin/zsh", "-lc", "x y")
    assert guardwire.codex_hook_shell("x", {"SHELL": ""}) == ("/bin/sh", "-lc", "x")
    assert guardwire.codex_hook_shell("x", {}) == ("/bin/sh", "-lc", "x")


# --- the plan ------------------------------------------------------------------------------


def test_a_codex_plan_runs_the_hook_command_codex_is_given() -> None:
    """The same command string as in ``-c hooks.PreToolUse=…``, shell, cwd and environment."""
    plan = planned(CODEX)
    preflight = plan.preflight
    assert preflight is not None
    value = plan.run.argv[plan.run.argv.index("--dangerously-bypass-hook-trust") + 2]
    hooks = tomllib.loads(value.replace("hooks.PreToolUse=", "v=", 1))["v"]
    command = hooks[0]["hooks"][0]["command"]
    assert command == shlex.join(GUARD.argv)
    shell = ENVIRON.get("SHELL") or "/bin/sh"
    assert preflight.argv == (shell, "-lc", command)
    assert preflight.env == plan.run.env
    assert preflight.cwd == plan.run.cwd == plan.workdir
    assert json.loads(preflight.stdin)["cwd"] == plan.workdir
    assert preflight.timeout_s == guardwire.PREFLIGHT_TIMEOUT_S == 10.0
    assert preflight.kill_grace_s == guardwire.PREFLIGHT_KILL_GRACE_S


@pytest.mark.parametrize("config", [CLAUDE, make_config()], ids=["claude", "command"])
def test_other_agents_get_no_preflight(config: Any) -> None:
    # Claude 2.1.332 blocks a tool whose hook failed (onFailure: "block"); a command agent
    # has no hook at all.
    assert planned(config).preflight is None


# --- the pipeline, on a Clock --------------------------------------------------------------


def codex_harness(**kw: Any) -> Harness:
    return Harness(config=make_config(agent_kind="codex", agent_command=None), **kw)


def failure_of(h: Harness) -> CallFailure:
    outcome = h.outcome()
    assert isinstance(outcome, CallFailure), outcome
    return outcome


def test_codex_starts_only_after_its_hook_refused_the_preflight_call() -> None:
    h = codex_harness()
    done = h.place()
    [check] = h.runs
    assert check.run.argv[1:] == ("-lc", shlex.join(h.guard_argv))
    assert json.loads(check.run.stdin)["tool_name"] == guardwire.PREFLIGHT_TOOL
    check.finish(DENIED)
    _check, agent = h.runs
    assert agent.run.argv[0] == "/usr/local/bin/codex"
    events = [
        {"type": "item.completed", "item": {"type": "agent_message", "text": "hello"}},
        {"type": "turn.completed"},
    ]
    agent.finish(run_result(stdout=b"\n".join(json.dumps(e).encode() for e in events)))
    assert done.called
    outcome = h.outcome()
    assert isinstance(outcome, Reply) and outcome.text == "hello"


def test_a_hook_that_does_not_refuse_ends_the_call_before_codex_starts() -> None:
    h = codex_harness()
    done = h.place()
    h.runs[0].finish(run_result(exit_code=1, stderr=b"Traceback: ImportError\n"))
    assert done.called
    assert len(h.runs) == 1
    failure = failure_of(h)
    assert failure.code is CallErrorCode.AGENT_ERROR
    assert failure.detail == f"{core.GUARD_PREFLIGHT_DETAIL}: the tool guard failed (exit code 1)"
    assert "Traceback" not in failure.detail  # the hook's own words stay on the owner's side
    [record] = h.records
    assert record.status is CallStatus.AGENT_ERROR
    assert record.error is not None and "ImportError" in record.error


def test_a_hook_that_cannot_be_spawned_ends_the_call() -> None:
    h = codex_harness(spawn_error=OSError(24, "Too many open files"))
    h.place()
    assert failure_of(h).detail == (
        f"{core.GUARD_PREFLIGHT_DETAIL}: the tool guard could not be started (Too many open files)"
    )
    assert h.runs == []


def test_a_cancel_during_the_preflight_stops_it_and_nothing_else_runs() -> None:
    h = codex_harness()
    h.place()
    h.pipeline.on_frame(CancelCall(call_id=CALL_ID))
    [check] = h.runs
    assert check.cancels == 1
    check.finish(run_result(exit_code=None, signal=15, cancelled=True))
    assert h.sent[-1] == CallCancelled(call_id=CALL_ID, phase=CancelPhase.RUNNING)
    assert len(h.runs) == 1


def test_a_listener_stopping_during_the_preflight_starts_nothing() -> None:
    h = codex_harness()
    h.place()
    stopped = h.pipeline.shutdown(5.0)
    [check] = h.runs
    assert check.cancels == 1
    check.finish(run_result(exit_code=None, signal=15, cancelled=True))
    assert stopped.called
    stopped_failure = failure_of(h)
    assert stopped_failure.detail == core.STOPPED_DETAIL
    # As a run cut later would be: the listener took the call and went away mid-way.
    assert stopped_failure.code is CallErrorCode.INDETERMINATE_EXECUTION
    assert h.records[-1].status is CallStatus.CANCELED
    assert len(h.runs) == 1


# --- real processes ------------------------------------------------------------------------


@attrs.define
class RealHarness(Harness):
    """The pipeline with real processes on the real reactor (time for logs stays a Clock)."""

    spawned: list[AgentRun] = attrs.field(factory=list)

    def spawn(  # type: ignore[override]
        self, run: AgentRun, parser: OutputParser
    ) -> tuple[defer.Deferred[RunResult], RunHandle]:
        self.spawned.append(run)
        return run_agent(reactor, run, parser)


def real_harness(tmp_path: Path, guard_argv: tuple[str, ...]) -> RealHarness:
    work = tmp_path / "work"
    work.mkdir()
    config = make_config(agent_kind="codex", agent_command=None, read_roots=[str(work)])
    return RealHarness(
        config=config,
        existing={str(work)},
        tools_log=str(tmp_path / "tools.log"),
        guard_argv=guard_argv,
    )


@pytest.mark.slow
@twisted_test
async def test_the_real_guard_passes_and_logs_the_preflight(tmp_path: Path) -> None:
    h = real_harness(tmp_path, tuple(guardwire.guard_argv()))
    await h.place()
    check, agent = h.spawned
    assert check.argv[1] == "-lc"
    # No codex is installed here, so the agent itself fails: it was started, which is the point.
    assert agent.argv[0] == "/usr/local/bin/codex"
    records = [json.loads(line) for line in (tmp_path / "tools.log").read_text().splitlines()]
    assert [(r["call_id"], r["tool"], r["decision"]) for r in records] == [
        (CALL_ID, guardwire.PREFLIGHT_TOOL, "deny")
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hook", "reason"),
    [
        ("missing", "the tool guard's program was not found (exit code 127)"),
        ("exits-1", "the tool guard failed (exit code 1)"),
        ("hangs", "the tool guard did not answer within 0.5 s"),
    ],
)
@twisted_test
async def test_a_broken_hook_ends_the_call_and_codex_never_starts(
    hook: str, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = {
        "missing": (str(tmp_path / "no-such-dir" / "python3"), "-I", "-m", "agentcall.guard"),
        "exits-1": ("/bin/sh", "-c", "exit 1"),
        "hangs": ("/bin/sleep", "60"),
    }[hook]
    # The 10 s limit itself is the runner's kill timer, tested on a Clock in test_runner.
    monkeypatch.setattr(guardwire, "PREFLIGHT_TIMEOUT_S", 0.5)
    h = real_harness(tmp_path, argv)
    await h.place()
    assert len(h.spawned) == 1
    failure = failure_of(h)
    assert failure.code is CallErrorCode.AGENT_ERROR
    assert failure.detail == f"{core.GUARD_PREFLIGHT_DETAIL}: {reason}"
    assert h.records[-1].status is CallStatus.AGENT_ERROR
