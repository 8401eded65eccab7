"""The owner's controls in the listener pipeline: tasks, the ceiling, conversations, the guard.

Every call goes through the in-memory pipeline of ``test_listener_core.py``; outcomes are opened
with the caller's key, so each test checks what the caller actually gets. The service tests at
the end build a real installation under ``tmp_path``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.testing import MemoryReactorClock

from agentcall import limits
from agentcall.errors import CallErrorCode
from agentcall.guard.main import DENY_OUTPUT
from agentcall.listener import guardwire, stages
from agentcall.listener import service as service_module
from agentcall.listener.admission import Admitted
from agentcall.listener.calllog import CallStatus
from agentcall.listener.ceiling import TEST_OVERRIDE_ENV
from agentcall.listener.contexts import Binding
from agentcall.listener.policy import CallerRule, Policy
from agentcall.listener.service import ListenerStartError, make_listener_service
from agentcall.listener.tasks import load_tasks
from agentcall.local.home import Home
from agentcall.wire.frames import CallAccepted, CallOutcome, CallStarted
from agentcall.wire.payloads import CallFailure, Reply
from tests.unit.crypto_helpers import NOW
from tests.unit.test_listener_core import GUARD_ARGV, Harness, fired, install
from tests.unit.test_listener_stages import (
    CALL_ID,
    CLAUDE,
    CODEX,
    MESSAGE,
    OTHER_CALL_ID,
    a_binding,
    after,
    claude_stdout,
    make_config,
    run_result,
)

CONTEXT = "ctx_" + "a" * 22
SHARED = os.path.realpath("/srv/shared")
INSTRUCTIONS = "Read the failing job's log and name the first error."


def write_skill(tasks_dir: Path, task_id: str, front: str, body: str = INSTRUCTIONS) -> None:
    directory = tasks_dir / task_id
    directory.mkdir(parents=True)
    (directory / "SKILL.md").write_text(f"---\n{front}---\n{body}\n")


def answer(h: Harness, index: int = -1) -> Reply:
    outcome = h.outcome(index)
    assert isinstance(outcome, Reply), outcome
    return outcome


def refusal(h: Harness) -> CallFailure:
    outcome = h.outcome()
    assert isinstance(outcome, CallFailure), outcome
    return outcome


# --- admission goes through resolve: tasks, grants, the menu ------------------------------------


@pytest.fixture
def ci_harness(tmp_path: Path) -> Callable[..., Harness]:
    """A Claude harness whose tasks are loaded from a real ci/SKILL.md (tools read+exec)."""

    def make(*, timeout_s: int = 45, policy: Policy | None = None) -> Harness:
        root = tmp_path.resolve() / "code"
        workdir = root / "repo"
        workdir.mkdir(parents=True)
        tasks_dir = tmp_path / "tasks"
        write_skill(
            tasks_dir,
            "ci",
            'description: "Why did CI fail?"\n'
            'name: "CI triage"\n'
            "tools: [read, exec]\n"
            f'workdir: "{workdir}"\n'
            f"timeout_s: {timeout_s}\n",
        )
        config = make_config(agent_kind="claude", agent_command=None, read_roots=[str(root)])
        tasks = load_tasks(tasks_dir, config.read_roots)
        assert tasks.problems == [] and set(tasks.tasks) == {"ask", "ci"}
        return Harness(
            config=config,
            policy=policy or Policy(),
            tasks=tasks,
            existing={str(root), str(workdir)},
        )

    return make


def test_a_task_on_disk_that_is_not_offered_is_refused_with_the_menu(
    ci_harness: Callable[..., Harness],
) -> None:
    h = ci_harness()
    h.place(task="ci")
    outcome = refusal(h)
    assert outcome.code is CallErrorCode.TASK_NOT_OFFERED
    assert outcome.offered == ("ask",)
    assert (h.prompts, h.runs) == ([], [])
    assert h.types() == [CallOutcome]
    [record] = h.records
    assert (record.status, record.task) == (CallStatus.TASK_NOT_OFFERED, "ci")


@pytest.mark.parametrize(("task_timeout", "expected"), [(45, 45.0), (300, 120.0)])
def test_an_offered_skill_task_runs_with_its_instructions_tools_workdir_and_timeout(
    ci_harness: Callable[..., Harness], task_timeout: int, expected: float
) -> None:
    """Granted to ann: its SKILL.md body, its tools, its workdir, min(config, task) timeout."""
    h = ci_harness(
        timeout_s=task_timeout, policy=Policy(callers=[CallerRule("ann", grants=("ci",))])
    )
    h.place(task="ci")
    assert h.types() == [CallAccepted, CallStarted]
    [(parts, message)] = h.prompts
    assert message == MESSAGE
    assert (parts.task_id, parts.task_name, parts.task_instructions) == (
        "ci",
        "CI triage",
        INSTRUCTIONS,
    )
    [run] = h.runs
    workdir = str(Path(h.config.read_roots[0]) / "repo")
    assert run.run.cwd == workdir
    assert INSTRUCTIONS in run.run.stdin.decode()
    assert after(run.run.argv, "--tools") == "Read,Grep,Glob,Bash"
    assert after(run.run.argv, "--allowedTools") == "Bash"
    assert run.run.env["AGENTCALL_GUARD_CAPS"] == "exec,read"
    assert run.run.timeout_s == expected
    run.finish(run_result(stdout=claude_stdout("the linter failed", tools=())))
    # exec makes the task not threadable: no conversation is offered.
    assert answer(h) == Reply(text="the linter failed", task="ci")
    assert "--no-session-persistence" in run.run.argv
    assert (h.records[-1].status, h.records[-1].task) == (CallStatus.OK, "ci")
    assert h.contexts.bindings == {}


# --- conversations -----------------------------------------------------------------------------


REFUSED_CONTEXTS: list[tuple[str, Binding | None]] = [
    ("unknown", None),
    (
        "expired",
        a_binding(created_at=NOW - limits.CONTEXT_TTL_S, last_used_at=NOW - limits.CONTEXT_TTL_S),
    ),
    ("another caller's", a_binding(caller="@acme/mallory")),
    ("another task's", a_binding(task="ci")),
    ("another workdir's", a_binding(workdir="/srv/other")),
    ("another agent's", a_binding(agent_kind="codex")),
    ("out of turns", a_binding(turns=limits.MAX_CONTEXT_TURNS)),
]


@pytest.mark.parametrize(
    ("case", "stored"), REFUSED_CONTEXTS, ids=[case for case, _ in REFUSED_CONTEXTS]
)
def test_a_conversation_that_does_not_fit_is_context_unknown_and_spawns_nothing(
    case: str, stored: Binding | None
) -> None:
    h = Harness(config=CLAUDE)
    if stored is not None:
        h.contexts.put(stored)
    h.place(context_id=CONTEXT)
    outcome = refusal(h)
    assert outcome.code is CallErrorCode.CONTEXT_UNKNOWN
    assert outcome.detail == stages.CONTEXT_UNKNOWN_DETAIL
    assert h.types() == [CallOutcome]
    assert (h.prompts, h.runs) == ([], [])
    assert h.records[-1].status is CallStatus.CONTEXT_UNKNOWN


def test_a_fitting_conversation_is_not_refused() -> None:
    """(Guard for the table above) the same binding unchanged is resumed."""
    h = Harness(config=CLAUDE)
    h.contexts.put(a_binding())
    h.place(context_id=CONTEXT)
    assert len(h.runs) == 1


def test_a_threadable_claude_call_opens_a_conversation_the_next_call_resumes() -> None:
    h = Harness(config=CLAUDE)
    h.place()
    [first] = h.runs
    assert "--no-session-persistence" not in first.run.argv
    assert "--resume" not in first.run.argv
    first.finish(run_result(stdout=claude_stdout("first answer", session="sess-new-1")))
    reply = answer(h)
    assert reply.text == "first answer" and reply.context_id is not None
    stored = h.contexts.bindings[reply.context_id]
    assert (stored.caller, stored.task, stored.agent_kind, stored.workdir) == (
        "@acme/ann",
        "ask",
        "claude",
        SHARED,
    )
    assert (stored.agent_session, stored.turns) == ("sess-new-1", 1)

    h.clock.advance(60)
    h.place(call_id=OTHER_CALL_ID, context_id=reply.context_id, message="and after that?")
    second = h.runs[1]
    assert after(second.run.argv, "--resume") == "sess-new-1"
    assert h.prompts[-1][0].threaded is True
    second.finish(run_result(stdout=claude_stdout("second answer", session="sess-new-1")))
    follow_up = answer(h)
    assert (follow_up.text, follow_up.context_id) == ("second answer", reply.context_id)
    rolled = h.contexts.bindings[reply.context_id]
    assert (rolled.turns, rolled.last_used_at) == (2, NOW + 60)
    # The agent's session id never leaves the machine, nor reaches the owner's log.
    assert "sess-new-1" not in repr(h.records)


def test_a_command_agent_offers_no_conversation() -> None:
    h = Harness()
    h.place()
    h.runs[0].finish(run_result(stdout=b"plain"))
    assert answer(h).context_id is None
    assert h.contexts.bindings == {}


def test_a_session_the_agent_cannot_resume_is_context_unknown_and_forgotten() -> None:
    h = Harness(config=CLAUDE)
    h.contexts.put(a_binding())
    h.place(context_id=CONTEXT)
    [run] = h.runs
    assert after(run.run.argv, "--resume") == "sess-earlier-1"
    stderr = b"Error: No conversation found with session ID: sess-earlier-1\n"
    run.finish(run_result(exit_code=1, stderr=stderr))
    outcome = refusal(h)
    assert outcome == CallFailure(
        code=CallErrorCode.CONTEXT_UNKNOWN, detail=stages.CONTEXT_UNKNOWN_DETAIL
    )
    assert h.records[-1].status is CallStatus.CONTEXT_UNKNOWN
    assert h.contexts.bindings == {}
    # The next try with the same id is refused before anything runs.
    h.place(call_id=OTHER_CALL_ID, context_id=CONTEXT)
    assert refusal(h).code is CallErrorCode.CONTEXT_UNKNOWN
    assert len(h.runs) == 1


# --- the tool guard ------------------------------------------------------------------------------


def test_the_spawned_claude_run_is_wired_to_the_guard() -> None:
    h = Harness(config=CLAUDE)
    h.place()
    [run] = h.runs
    assert after(run.run.argv, "--settings") == guardwire.claude_guard_settings(list(GUARD_ARGV))
    assert after(run.run.argv, "--setting-sources") == ""
    env = run.run.env
    assert env["AGENTCALL_GUARD_CAPS"] == "read"
    assert env["AGENTCALL_GUARD_LOG"] == h.tools_log
    assert env["AGENTCALL_CALL_ID"] == CALL_ID
    assert "AGENTCALL_HOME" not in env  # the listener's own environment has one


def test_the_spawned_codex_run_is_wired_to_the_guard_with_exec() -> None:
    h = Harness(config=CODEX)
    h.place()
    h.runs[0].finish(PREFLIGHT_DENIED)
    _preflight, run = h.runs
    hook = "hooks.PreToolUse=" + guardwire.codex_hook_value(list(GUARD_ARGV))
    assert "--dangerously-bypass-hook-trust" in run.run.argv
    assert run.run.argv[run.run.argv.index(hook) - 1] == "-c"
    assert run.run.env["AGENTCALL_GUARD_CAPS"] == "exec,read"
    assert "AGENTCALL_HOME" not in run.run.env


# What a working guard answers the preflight run that precedes every Codex run.
PREFLIGHT_DENIED = run_result(stdout=DENY_OUTPUT.encode() + b"\n")


def write_tools_log(path: Path, *entries: tuple[str, str]) -> None:
    lines = [json.dumps({"call_id": call, "tool_use_id": tool}) for call, tool in entries]
    path.write_text("".join(line + "\n" for line in lines))


def test_a_tool_call_missing_from_the_guard_log_withholds_the_answer(tmp_path: Path) -> None:
    """toolu_2 was logged for another call only: this call's run was not fully guarded."""
    log = tmp_path / "tools.log"
    write_tools_log(log, (CALL_ID, "toolu_1"), (OTHER_CALL_ID, "toolu_2"))
    h = Harness(config=CLAUDE, tools_log=str(log))
    h.place()
    stdout = claude_stdout("UNCHECKED-SECRET", tools=("toolu_1", "toolu_2"))
    h.runs[0].finish(run_result(stdout=stdout))
    assert refusal(h) == CallFailure(
        code=CallErrorCode.AGENT_ERROR, detail=stages.GUARD_UNWIRED_DETAIL
    )
    [record] = h.records
    assert (record.status, record.flags) == (CallStatus.AGENT_ERROR, ("guard_unwired",))
    assert "UNCHECKED-SECRET" not in repr(record)
    assert h.contexts.bindings == {}


def test_a_fully_logged_claude_run_is_answered(tmp_path: Path) -> None:
    log = tmp_path / "tools.log"
    write_tools_log(log, (CALL_ID, "toolu_1"), (CALL_ID, "toolu_2"))
    h = Harness(config=CLAUDE, tools_log=str(log))
    h.place()
    h.runs[0].finish(run_result(stdout=claude_stdout("checked", tools=("toolu_1", "toolu_2"))))
    assert answer(h).text == "checked"
    [record] = h.records
    assert (record.status, record.flags) == (CallStatus.OK, ())


def test_codex_item_ids_are_not_cross_checked() -> None:
    """Codex's stream ids are not the hook's, so a Codex answer is not withheld for them."""
    h = Harness(config=CODEX)
    h.place()
    events: list[dict[str, Any]] = [
        {"type": "thread.started", "thread_id": "thread-1"},
        {"type": "item.completed", "item": {"type": "command_execution", "id": "item_1"}},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "from codex"}},
        {"type": "turn.completed"},
    ]
    stdout = b"".join(json.dumps(event).encode() + b"\n" for event in events)
    h.runs[0].finish(PREFLIGHT_DENIED)
    h.runs[1].finish(run_result(stdout=stdout))
    assert answer(h).text == "from codex"


# --- starting the service ------------------------------------------------------------------------


def start(environ: dict[str, str], *, test_ceiling: bool) -> str | None:
    """The start error, or None once the service was built (and stopped again)."""
    try:
        built = make_listener_service(MemoryReactorClock(), environ, test_ceiling=test_ceiling)
    except ListenerStartError as exc:
        return str(exc)
    assert fired(built.stopService())
    return None


def managed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, mode: int = 0o644
) -> tuple[dict[str, str], Path]:
    """An installation whose test-only ceiling override points at ``text``."""
    environ = install(tmp_path)
    ceiling = tmp_path / "ceiling.json"
    ceiling.write_text(text)
    ceiling.chmod(mode)
    monkeypatch.setenv(TEST_OVERRIDE_ENV, str(ceiling))
    environ[TEST_OVERRIDE_ENV] = str(ceiling)
    return environ, ceiling


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ('{"version": 1, "max_tools": "all"}', 0o644),
        ('{"version": 1,', 0o644),
        ('{"version": 1}', 0o666),
    ],
    ids=["bad field", "bad JSON", "writable by others"],
)
def test_the_service_refuses_to_start_on_a_ceiling_it_cannot_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, mode: int
) -> None:
    environ, ceiling = managed(tmp_path, monkeypatch, text, mode)
    message = start(environ, test_ceiling=True)
    assert message is not None
    assert "ceiling" in message and str(ceiling) in message
    # Without the test-only flag the override is ignored and this machine is unmanaged.
    assert start(environ, test_ceiling=False) is None


def test_a_ceiling_that_holds_lets_the_service_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = json.dumps(
        {
            "version": 1,
            "blocked_callers": ["mallory"],
            "assertions": [{"caller": "mallory", "deny": ["*"]}],
        }
    )
    environ, _ = managed(tmp_path, monkeypatch, text)
    assert start(environ, test_ceiling=True) is None


def test_the_service_refuses_to_start_on_a_failing_ceiling_assertion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The administrator says ann gets nothing; the owner's default offer gives her ask."""
    text = json.dumps({"version": 1, "assertions": [{"caller": "ann", "deny": ["*"]}]})
    environ, _ = managed(tmp_path, monkeypatch, text)
    message = start(environ, test_ceiling=True)
    assert message is not None and "ceiling assertion 1" in message and "ann gets ask" in message


def test_the_service_refuses_to_start_on_a_failing_owner_assertion(tmp_path: Path) -> None:
    """ann is promised ci, which is granted but not on disk; writing its SKILL.md fixes it."""
    environ = install(tmp_path)
    home = Home.from_environ(environ)
    home.policy_path.write_text(
        json.dumps(
            {
                "version": 2,
                "callers": {"ann": {"grants": ["ci"]}},
                "assertions": [{"caller": "ann", "accept": ["ci"]}],
            }
        )
    )
    message = start(environ, test_ceiling=False)
    assert message is not None
    assert "policy assertion 1" in message and "ann does not get ci" in message
    write_skill(home.tasks_dir, "ci", 'description: "Why did CI fail?"\n')
    assert start(environ, test_ceiling=False) is None


# --- files someone else could have written (issue 7 item 3) -------------------------------------

GRANT_EVE = json.dumps({"version": 2, "callers": {"eve": {"grants": ["ci"]}}})


def loose_policy(home: Home) -> None:
    home.policy_path.write_text(GRANT_EVE)
    home.policy_path.chmod(0o666)


def loose_skill(home: Home) -> None:
    write_skill(home.tasks_dir, "ci", 'description: "Why did CI fail?"\ntools: [read, exec]\n')
    (home.tasks_dir / "ci" / "SKILL.md").chmod(0o666)


def policy_linked_out(home: Home) -> None:
    outside = home.user_home / "shared-policy.json"
    outside.write_text(GRANT_EVE)
    outside.chmod(0o600)
    home.policy_path.symlink_to(outside)


@pytest.mark.parametrize(
    ("spoil", "expected"),
    [
        (loose_policy, "policy.json: can be changed by group or others"),
        (loose_skill, "SKILL.md: can be changed by group or others"),
        (policy_linked_out, "policy.json: is a symbolic link to "),
    ],
)
def test_a_file_others_could_have_written_stops_start_and_refuses_every_call(
    tmp_path: Path, spoil: Callable[[Home], None], expected: str
) -> None:
    """The listener refuses to start; one already running refuses each call as a policy error."""
    environ = install(tmp_path)
    home = Home.from_environ(environ)
    config = make_config(read_roots=[str(tmp_path)])
    load = service_module.admission_loader(home, config)
    assert isinstance(stages.admit_call(load, "eve", None), Admitted)
    spoil(home)
    message = start(environ, test_ceiling=False)
    assert message is not None and expected in message
    refused = stages.admit_call(load, "eve", None)
    assert isinstance(refused, stages.RefusalAnswer)
    assert refused.status is CallStatus.POLICY_ERROR


def test_a_loose_state_dir_stops_start(tmp_path: Path) -> None:
    """A state directory group or others can use is refused, naming the chmod."""
    environ = install(tmp_path)
    home = Home.from_environ(environ)
    home.state_dir.chmod(0o755)
    message = start(environ, test_ceiling=False)
    assert message is not None and f"chmod 700 {home.state_dir}" in message
