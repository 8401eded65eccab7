"""The real Claude Code and Codex answering through the real listener.

A real relay, a caller (ann) and a callee (ken) installed as people have them, each with their
own HOME, and ``twistd agentcall-listen`` for ken whose PATH has the cached *real* CLI first
(instead of the suite's fake) and whose environment points it at a loopback mock model. Calls
are placed with ``agentcall call`` as a subprocess, so everything the listener wires into a run
is what the real binary gets: Claude's ``--settings`` hook with ``--setting-sources ""``,
Codex's ``-c hooks.PreToolUse`` with ``--dangerously-bypass-hook-trust``, the guard's
``AGENTCALL_GUARD_*`` environment, ``~/.agentcall/tools.log``, the ``guard_unwired``
cross-check, ``--resume`` of a kept session.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentcall.listener.guardwire import PREFLIGHT_TOOL
from tests.e2e.installs import Install
from tests.e2e.processes import RelayProcess, start_relay
from tests.realagents.harness import (
    DUMMY_ANTHROPIC_KEY,
    MOCK_KEY_ENV,
    json_records,
    write_codex_config,
)
from tests.realagents.install import InstalledAgent
from tests.realagents.mock_anthropic import Final, MockAnthropic, ToolUse
from tests.realagents.mock_openai import Final as CodexFinal
from tests.realagents.mock_openai import MockResponses, add_file_patch, patch, shell
from tests.realagents.test_claude_guard import refused_by_hook
from tests.realagents.test_codex_guard import HOOK_BLOCKED

pytestmark = [pytest.mark.realagent, pytest.mark.slow]

ANSWER_WAIT_S = 120.0
MOCK_LIFETIME_S = 600.0
# The outer environment's agent settings must not reach the callee's CLI (a real API key, a
# config dir elsewhere): only what the test sets does.
_AGENT_PREFIXES = ("ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_", "FAKE_AGENT_")
SCRIBE_TASK = "scribe"


@attrs.define
class RealAgentInstall(Install):
    """An installation whose listener runs the real CLI: the cached install's ``.bin`` first on
    PATH in place of the fake agent's directory, plus the variables aiming it at the mock."""

    agent_bin: Path | None = None
    agent_env: dict[str, str] = attrs.field(factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        inherited = super().env()
        fake = str(self.root / "bin")
        path = [p for p in inherited["PATH"].split(os.pathsep) if p and p != fake]
        if self.agent_bin is not None:
            path.insert(0, str(self.agent_bin))
        env = {k: v for k, v in inherited.items() if not k.startswith(_AGENT_PREFIXES)}
        env["PATH"] = os.pathsep.join(path)
        env.update(self.agent_env)
        env.update(extra)
        return env

    def listener_tail(self, chars: int = 4000) -> str:
        """The end of the listener's log, for an assertion message."""
        return "" if self.listener is None else self.listener.log.text()[-chars:]

    def secret_files(self, tag: str) -> tuple[str, Path]:
        """A private SSH key (its text holds a unique marker) and a notes file in the HOME."""
        ssh = self.home / ".ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        key_marker = f"AGENTCALL-{tag}-KEY-{secrets.token_hex(8)}"
        key = ssh / "id_ed25519"
        key.write_text(
            "-----BEGIN OPENSSH PRIVATE KEY-----\n"
            f"{key_marker}\n"
            "-----END OPENSSH PRIVATE KEY-----\n"
        )
        key.chmod(0o600)
        notes = self.home / "notes.txt"
        notes.write_text(f"public notes: AGENTCALL-{tag}-NOTES-{secrets.token_hex(8)}\n")
        return key_marker, notes


@attrs.frozen
class Answered:
    """One successful ``agentcall call --json``: the JSON body and what the CLI printed."""

    body: dict[str, Any]
    done: subprocess.CompletedProcess[str]

    @property
    def call_id(self) -> str:
        return str(self.body["call_id"])

    @property
    def text(self) -> str:
        return str(self.body["text"])


@attrs.frozen
class World:
    relay: RelayProcess
    root: Path
    ann: Install
    ken: RealAgentInstall
    mock: MockAnthropic
    key_marker: str
    notes: Path
    scratch: Path


def invite(admin: Install) -> str:
    made = admin.cli("invite", "create")
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def _skill(workdir: Path) -> str:
    return (
        "---\n"
        "description: Write a note into the scratch directory\n"
        "name: Scribe\n"
        "tools: [read, write]\n"
        f"workdir: {json.dumps(str(workdir))}\n"
        "timeout_s: 120\n"
        "---\n"
        "Write what the caller asks for into the scratch directory, and nowhere else.\n"
    )


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, claude_install: InstalledAgent
) -> Iterator[World]:
    root = tmp_path_factory.mktemp("listener-real").resolve()
    mock = MockAnthropic(lifetime_s=MOCK_LIFETIME_S).start()
    relay, invites = start_relay(root / "relay")
    ann = Install("ann", root / "ann", relay.ca_file)
    ken = RealAgentInstall(
        "ken",
        root / "ken",
        relay.ca_file,
        agent_bin=claude_install.binary.parent,
        agent_env={
            "ANTHROPIC_BASE_URL": mock.base_url,
            "ANTHROPIC_API_KEY": DUMMY_ANTHROPIC_KEY,
            "CLAUDE_CODE_MAX_RETRIES": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
    )
    try:
        ann.setup(invites["acme"], "ann", "--caller-only")
        ken.setup(invite(ann), "ken", "--agent", "claude")
        key_marker, notes = ken.secret_files("KEN")
        scratch = ken.home / "scratch"
        scratch.mkdir()
        task_dir = ken.home / "AgentCall" / "tasks" / SCRIBE_TASK
        task_dir.mkdir(parents=True)
        (task_dir / "SKILL.md").write_text(_skill(scratch))
        granted = ken.cli("allow", "ann", SCRIBE_TASK)
        assert granted.returncode == 0, granted.stdout + granted.stderr
        ken.start_listener()
        yield World(relay, root, ann, ken, mock, key_marker, notes, scratch)
    finally:
        ken.stop()
        relay.stop()
        mock.stop()


def place(caller: Install, callee: Install, target: str, *args: str) -> Answered:
    """``agentcall call TARGET ... --json`` that must succeed; returns once the callee's listener
    has logged the answer (its calls.log line is written by then)."""
    done = caller.cli("call", target, *args, "--json")
    listener = callee.listener
    assert listener is not None
    debug = (
        f"stdout={done.stdout!r}\nstderr={done.stderr!r}\nlistener:\n{listener.log.text()[-4000:]}"
    )
    assert done.returncode == 0, debug
    body = json.loads(done.stdout)
    assert body.get("ok") is True, debug
    call_id = str(body["call_id"])
    listener.log.wait_for(rf"call_ended call_id={re.escape(repr(call_id))}", ANSWER_WAIT_S)
    return Answered(body, done)


def guard_decisions(install: Install, call_id: str) -> list[tuple[str, str, str]]:
    """(tool_use_id, tool, decision) of every tools.log record of one call, in order."""
    return [
        (str(r.get("tool_use_id")), str(r.get("tool")), str(r.get("decision")))
        for r in json_records(install.state_dir / "tools.log")
        if r.get("call_id") == call_id
    ]


def call_record(install: Install, call_id: str) -> Mapping[str, Any]:
    records = [
        r for r in json_records(install.state_dir / "calls.log") if r.get("call_id") == call_id
    ]
    assert len(records) == 1, records
    return records[0]


def assert_guarded_ok(install: Install, call_id: str, task: str) -> None:
    """calls.log says ok for the task, and nothing in it says a tool call went unseen."""
    record = call_record(install, call_id)
    assert (record["status"], record["task"]) == ("ok", task), record
    assert "guard_unwired" not in (install.state_dir / "calls.log").read_text()


# --- Claude -----------------------------------------------------------------------------------


def test_an_ask_call_reads_notes_but_never_the_ssh_key(
    world: World, claude_install: InstalledAgent
) -> None:
    key = world.ken.home / ".ssh" / "id_ed25519"
    notes_marker = world.notes.read_text().split()[-1]
    key_id, notes_id = world.mock.script(
        [
            ToolUse("Read", {"file_path": str(key)}),
            ToolUse("Read", {"file_path": str(world.notes)}),
            Final("the notes say the build is fine"),
        ]
    )

    answered = place(world.ann, world.ken, "ken", "what do my notes and my ssh key say?")

    assert answered.text == "the notes say the build is fine"
    results = world.mock.tool_results()
    assert refused_by_hook(results[key_id]), results.get(key_id)
    assert not results[notes_id].is_error and notes_marker in results[notes_id].text
    assert not world.mock.server.saw_bytes(world.key_marker.encode())
    assert world.key_marker not in answered.done.stdout + answered.done.stderr
    assert guard_decisions(world.ken, answered.call_id) == [
        (key_id, "Read", "deny"),
        (notes_id, "Read", "allow"),
    ]
    assert_guarded_ok(world.ken, answered.call_id, "ask")
    assert world.mock.server.errors == []
    # Answered by the pinned CLI, not the suite's fake.
    agents = {r.headers.get("user-agent", "") for r in world.mock.main_requests()}
    version = claude_install.package.version
    assert agents and all(a.startswith(f"claude-cli/{version} ") for a in agents), agents


def test_a_write_task_writes_only_inside_its_workdir(world: World) -> None:
    escaped = world.ken.home / "escaped.txt"
    inside = world.scratch / "answer.txt"
    outside_id, inside_id = world.mock.script(
        [
            ToolUse("Write", {"file_path": str(escaped), "content": "should not exist\n"}),
            ToolUse("Write", {"file_path": str(inside), "content": "written by the agent\n"}),
            Final("wrote the note"),
        ]
    )

    answered = place(world.ann, world.ken, "ken", "--task", SCRIBE_TASK, "write a note")

    assert answered.text == "wrote the note"
    results = world.mock.tool_results()
    # Inside ken's read root, outside the task's workdir: the guard refuses it first.
    assert refused_by_hook(results[outside_id]), results.get(outside_id)
    assert not escaped.exists()
    assert not results[inside_id].is_error, results[inside_id]
    assert inside.read_text() == "written by the agent\n"
    assert guard_decisions(world.ken, answered.call_id) == [
        (outside_id, "Write", "deny"),
        (inside_id, "Write", "allow"),
    ]
    assert_guarded_ok(world.ken, answered.call_id, SCRIBE_TASK)


def test_continue_resumes_the_same_claude_session(world: World) -> None:
    key = world.ken.home / ".ssh" / "id_ed25519"
    notes_marker = world.notes.read_text().split()[-1]
    first_message = f"first question {uuid.uuid4()}"
    (notes_id,) = world.mock.script(
        [ToolUse("Read", {"file_path": str(world.notes)}), Final("first answer")]
    )
    first = place(world.ann, world.ken, "ken", first_message)
    assert first.text == "first answer"
    assert first.body.get("context_id"), first.body
    turn_one_requests = len(world.mock.main_requests())

    second_message = f"second question {uuid.uuid4()}"
    (key_id,) = world.mock.script(
        [ToolUse("Read", {"file_path": str(key)}), Final("second answer")]
    )
    second = place(world.ann, world.ken, "ken", "--continue", second_message)

    assert second.text == "second answer"
    turn_two = [
        r.body
        for r in world.mock.main_requests()[turn_one_requests:]
        if second_message.encode() in r.body
    ]
    assert turn_two, world.ken.listener_tail()
    # Turn 2's first request carries turn 1: the caller's message, the tool call, its
    # result and the answer; so the listener resumed the session Claude kept.
    for earlier in (first_message, notes_id, notes_marker, "first answer"):
        assert earlier.encode() in turn_two[0], (earlier, world.ken.listener_tail())
    # The resumed run has the guard too.
    assert refused_by_hook(world.mock.tool_results()[key_id])
    assert not world.mock.server.saw_bytes(world.key_marker.encode())
    assert guard_decisions(world.ken, second.call_id) == [(key_id, "Read", "deny")]
    assert_guarded_ok(world.ken, second.call_id, "ask")


# --- Codex ------------------------------------------------------------------------------------


@attrs.frozen
class CodexCallee:
    install: RealAgentInstall
    mock: MockResponses
    key_marker: str
    notes: Path


@pytest.fixture(scope="module")
def cody(world: World, codex_install: InstalledAgent) -> Iterator[CodexCallee]:
    mock = MockResponses(lifetime_s=MOCK_LIFETIME_S).start()
    install = RealAgentInstall(
        "cody",
        world.root / "cody",
        world.relay.ca_file,
        agent_bin=codex_install.binary.parent,
        agent_env={MOCK_KEY_ENV: "dummy-key"},
    )
    try:
        install.setup(invite(world.ann), "cody", "--agent", "codex")
        write_codex_config(install.home, mock.base_url)
        key_marker, notes = install.secret_files("CODY")
        install.start_listener()
        yield CodexCallee(install, mock, key_marker, notes)
    finally:
        install.stop()
        mock.stop()


def test_an_ask_call_to_codex_runs_under_the_guard(
    world: World, cody: CodexCallee, codex_install: InstalledAgent
) -> None:
    key = cody.install.home / ".ssh" / "id_ed25519"
    planted = cody.install.home / "planted.txt"
    notes_marker = cody.notes.read_text().split()[-1]
    key_text = key.read_text()
    read_id, patch_id, key_id = cody.mock.script(
        [
            shell(f"cat {cody.notes.name}"),
            patch(add_file_patch(planted.name, "planted")),
            shell(f"cat {key}"),
            # The model quotes the key: redaction is the only thing between it and the caller.
            CodexFinal(f"the notes are fine; the key is\n{key_text}"),
        ]
    )

    answered = place(world.ann, cody.install, "cody", "what do my notes and my ssh key say?")

    outputs = cody.mock.tool_outputs()
    assert notes_marker in outputs[read_id].text, outputs.get(read_id)
    # `ask` has no write: the guard refuses the patch (the read-only sandbox would too).
    assert HOOK_BLOCKED in outputs[patch_id].text, outputs.get(patch_id)
    assert not planted.exists()
    assert key_id in outputs
    # Codex reads through its shell, which the guard records and flags but cannot bound
    # (docs/permissions.md); what does stop the key is the redaction of the reply.
    decisions = [
        (tool, decision) for _, tool, decision in guard_decisions(cody.install, answered.call_id)
    ]
    # First the listener's preflight: the exact hook command must refuse a test call.
    assert decisions == [
        (PREFLIGHT_TOOL, "deny"),
        ("Bash", "allow"),
        ("apply_patch", "deny"),
        ("Bash", "flag"),
    ]
    assert answered.text.startswith("the notes are fine; the key is")
    assert "[redacted]" in answered.text
    assert cody.key_marker not in answered.done.stdout + answered.done.stderr
    record = call_record(cody.install, answered.call_id)
    assert (record["status"], record["task"]) == ("ok", "ask"), record
    assert cody.key_marker not in (cody.install.state_dir / "calls.log").read_text()
    assert cody.mock.server.errors == []
    agents = {r.headers.get("user-agent", "") for r in cody.mock.requests}
    version = codex_install.package.version
    assert agents and all(a.startswith(f"codex_exec/{version} ") for a in agents), agents
