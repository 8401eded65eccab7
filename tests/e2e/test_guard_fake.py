"""The fake agent CLIs driving the real guard program, wired the way the listener wires it.

argv comes from the real adapters with :mod:`agentcall.listener.guardwire`'s settings; the
fake ``claude``/``codex`` runs the hook command under ``/bin/sh -c`` for every tool call with
a realistic payload, and the guard decides and logs. Afterwards :func:`cross_check` must find
every stream tool_use id in tools.log, or name the ones that ran unseen.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentcall.listener.agents.base import AgentSpec
from agentcall.listener.agents.claude import ADAPTER as CLAUDE
from agentcall.listener.agents.claude import ClaudeParser
from agentcall.listener.agents.codex import ADAPTER as CODEX
from agentcall.listener.guardwire import (
    claude_guard_settings,
    codex_hook_value,
    cross_check,
    default_extra_denied,
    guard_argv,
    guard_env,
)

pytestmark = pytest.mark.e2e

FAKE_AGENT = Path(__file__).resolve().parents[1] / "fakes" / "fake_agent.py"
PROMPT = "You are ken's agent.\n<<CALLER-MESSAGE>>\nWhat do the notes say?\n"
CALL_ID = "call-e2e-1"


class Machine:
    """The callee's machine: home with credentials, a task workdir, the state dir."""

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.workdir = self.home / "AgentCall" / "work" / "t1"
        self.state = self.home / ".agentcall"
        self.tasks = self.home / "AgentCall" / "tasks"
        self.bin = root / "bin"
        for d in (self.workdir, self.state, self.tasks, self.home / ".ssh", self.bin):
            d.mkdir(parents=True, exist_ok=True)
        (self.home / ".ssh" / "id_ed25519").write_text("PRIVATE")
        (self.workdir / "notes.txt").write_text("the notes")
        (self.workdir / ".env").write_text("TOKEN=secret")
        (self.workdir / "key_link").symlink_to(self.home / ".ssh" / "id_ed25519")
        for name in ("claude", "codex"):
            (self.bin / name).symlink_to(FAKE_AGENT)
        self.tools_log = self.state / "tools.log"
        self.fake_log = root / "fake.log"

    def guard_env(self, caps: set[str], **change: str) -> dict[str, str]:
        env = guard_env(
            [str(self.workdir)],
            str(self.workdir) if "write" in caps else None,
            caps,
            CALL_ID,
            self.tools_log,
            self.home,
            default_extra_denied(self.tasks),
        )
        return {**env, **change}

    def run(
        self, spec: AgentSpec, adapter: Any, scenario: dict[str, Any]
    ) -> tuple[subprocess.CompletedProcess[bytes], list[dict[str, Any]]]:
        invocation = adapter.build(spec, PROMPT)
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(self.home),
            **invocation.env_additions,
            "FAKE_AGENT_SCENARIO": json.dumps(scenario),
            "FAKE_AGENT_LOG": str(self.fake_log),
        }
        done = subprocess.run(
            list(invocation.argv),
            input=invocation.stdin_bytes,
            cwd=invocation.cwd,
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        entries = [json.loads(line) for line in self.fake_log.read_text().splitlines()]
        # The fake appends; this run's tool calls are the last such line.
        calls = [e for e in entries if "tool_calls" in e][-1]
        return done, calls["tool_calls"]

    def guard_lines(self) -> list[dict[str, Any]]:
        if not self.tools_log.exists():
            return []
        return [json.loads(line) for line in self.tools_log.read_text().splitlines()]


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def claude_spec(m: Machine, caps: set[str], settings: str, **env: str) -> AgentSpec:
    return AgentSpec(
        binary=str(m.bin / "claude"),
        workdir=str(m.workdir),
        tools=caps,
        settings_json=settings,
        extra_env=m.guard_env(caps, **env),
    )


def read_tools(m: Machine) -> list[dict[str, Any]]:
    return [
        {"tool_name": "Read", "tool_input": {"file_path": str(m.workdir / "notes.txt")}},
        {"tool_name": "Read", "tool_input": {"file_path": str(m.workdir / ".env")}},
        {"tool_name": "Read", "tool_input": {"file_path": str(m.workdir / "key_link")}},
        {"tool_name": "Glob", "tool_input": {"pattern": "**/*.txt"}},
        {"tool_name": "Read", "tool_input": {"file_path": str(m.home / ".ssh" / "id_ed25519")}},
    ]


def write(path: Path, content: str) -> dict[str, Any]:
    return {"tool_name": "Write", "tool_input": {"file_path": str(path), "content": content}}


def add_file_patch(path: str) -> dict[str, Any]:
    patch = f"*** Begin Patch\n*** Add File: {path}\n+text\n*** End Patch\n"
    return {"tool_name": "apply_patch", "tool_input": {"command": patch}}


def stream(done: subprocess.CompletedProcess[bytes]) -> tuple[ClaudeParser, dict[str, Any]]:
    parser = ClaudeParser()
    for line in done.stdout.splitlines():
        parser.feed_line(line)
    assert parser.result is not None, done.stderr
    return parser, parser.result


def test_claude_guard_denies_credentials_and_logs_every_call(machine: Machine) -> None:
    """Reads of .env, a symlink to a key and ~/.ssh are refused; every tool_use id is in
    tools.log, so the cross-check finds nothing unwired; the guard never says allow."""
    spec = claude_spec(machine, {"read"}, claude_guard_settings(guard_argv()))
    done, calls = machine.run(spec, CLAUDE, {"name": "happy", "tools": read_tools(machine)})
    assert done.returncode == 0, done.stderr
    parser, result = stream(done)
    assert [c["outcome"] for c in calls] == ["ran", "denied", "denied", "ran", "denied"]
    assert not any(c["allow_emitted"] for c in calls)
    denied = [c["tool_use_id"] for c in calls if c["outcome"] == "denied"]
    assert [d["tool_use_id"] for d in result["permission_denials"]] == denied
    assert [(g["decision"], g["rule"]) for g in machine.guard_lines()] == [
        ("allow", "inside-read-roots"),
        ("deny", "denied-name"),
        ("deny", "denied-home-path"),
        ("allow", "inside-read-roots"),
        ("deny", "denied-home-path"),
    ]
    assert len(parser.tool_use_ids) == 5
    assert cross_check(parser.tool_use_ids, machine.tools_log, CALL_ID) == []


def test_claude_write_task_confined_to_the_workdir(machine: Machine) -> None:
    """With write: inside the workdir it runs (for real); ~/.bashrc and a planted guard are
    refused; with perform on, the refused files are never touched."""
    tools = [
        write(machine.workdir / "a.md", "A"),
        write(machine.home / ".bashrc", "evil"),
        write(machine.tasks / "ask" / "SKILL.md", "x"),
    ]
    spec = claude_spec(machine, {"read", "write"}, claude_guard_settings(guard_argv()))
    done, calls = machine.run(spec, CLAUDE, {"name": "happy", "tools": tools, "perform": True})
    assert done.returncode == 0, done.stderr
    assert [c["outcome"] for c in calls] == ["ran", "denied", "denied"]
    assert (machine.workdir / "a.md").read_text() == "A"
    assert not (machine.home / ".bashrc").exists()
    assert not (machine.tasks / "ask").exists()


@pytest.mark.parametrize("breakage", ["hook-type", "permissions-shape", "misspelt-key"])
def test_invalid_settings_run_no_hook_and_the_cross_check_says_so(
    machine: Machine, breakage: str
) -> None:
    """One bad field anywhere (even outside the hook): Claude drops the settings silently,
    every tool runs unguarded, and only the cross-check notices (every id is guard_unwired)."""
    settings = json.loads(claude_guard_settings(guard_argv()))
    hook = settings["hooks"]["PreToolUse"][0]["hooks"][0]
    if breakage == "hook-type":
        hook["type"] = "commandx"
    elif breakage == "permissions-shape":
        settings["permissions"] = {"allow": "Read"}
    else:
        hook["timout"] = hook.pop("timeout")
    spec = claude_spec(machine, {"read"}, json.dumps(settings))
    done, calls = machine.run(spec, CLAUDE, {"name": "happy", "tools": read_tools(machine)})
    assert done.returncode == 0, done.stderr
    parser, result = stream(done)
    assert {c["outcome"] for c in calls} == {"ran"}
    assert result["permission_denials"] == []
    assert machine.guard_lines() == []
    assert cross_check(parser.tool_use_ids, machine.tools_log, CALL_ID) == list(parser.tool_use_ids)


def test_broken_guard_configuration_still_refuses(machine: Machine) -> None:
    """The guard cannot decide (no call id): exit 2 refuses on both Claude versions."""
    for version in ("2.1.332", "2.1.197"):
        spec = claude_spec(
            machine, {"read"}, claude_guard_settings(guard_argv()), AGENTCALL_CALL_ID=""
        )
        scenario = {"name": "happy", "tools": read_tools(machine)[:1], "version": version}
        done, calls = machine.run(spec, CLAUDE, scenario)
        assert done.returncode == 0, done.stderr
        assert [(c["outcome"], c["hook_exit"]) for c in calls] == [("denied", 2)]


def test_crashing_hook_blocks_only_with_on_failure(machine: Machine, tmp_path: Path) -> None:
    """A hook that dies (exit 1) is a tool that runs unchecked on 2.1.197; 2.1.332 blocks it
    because of onFailure; either way the guard log is empty and the cross-check flags it."""
    crash = tmp_path / "crash.py"
    crash.write_text("raise SystemExit(1)\n")
    settings = claude_guard_settings([guard_argv()[0], str(crash)])
    outcomes = {}
    for version in ("2.1.332", "2.1.197"):
        spec = claude_spec(machine, {"read"}, settings)
        scenario = {"name": "happy", "tools": read_tools(machine)[:1], "version": version}
        done, calls = machine.run(spec, CLAUDE, scenario)
        parser, _ = stream(done)
        outcomes[version] = calls[0]["outcome"]
        assert cross_check(parser.tool_use_ids, machine.tools_log, CALL_ID) == list(
            parser.tool_use_ids
        )
    assert outcomes == {"2.1.332": "blocked", "2.1.197": "ran"}


def test_hook_timeout_blocks_with_on_failure(machine: Machine, tmp_path: Path) -> None:
    """A guard that does not answer within the timeout is a block on 2.1.332."""
    settings = claude_guard_settings(["/bin/sh", "-c", "exec sleep 30"])
    spec = claude_spec(machine, {"read"}, settings)
    scenario = {"name": "happy", "tools": read_tools(machine)[:1], "hook_timeout": 0.3}
    done, calls = machine.run(spec, CLAUDE, scenario)
    assert done.returncode == 0, done.stderr
    assert [(c["outcome"], c["hook_exit"]) for c in calls] == [("blocked", None)]
    assert b"hook_no_verdict" not in done.stdout


def test_codex_guard_checks_shell_and_patches(machine: Machine) -> None:
    """Codex with the inline hook and the trust bypass: the shell is recorded, a patch
    outside the workdir is refused and leaves no item in the stream."""
    caps = {"read", "write", "exec"}
    spec = AgentSpec(
        binary=str(machine.bin / "codex"),
        workdir=str(machine.workdir),
        tools=caps,
        codex_hook_config=codex_hook_value(guard_argv()),
        extra_env=machine.guard_env(caps),
    )
    tools = [
        {"tool_name": "Bash", "tool_input": {"command": "cat notes.txt"}},
        {"tool_name": "Bash", "tool_input": {"command": "cat ~/.ssh/id_ed25519"}},
        add_file_patch("new.txt"),
        add_file_patch("../../../.zshrc"),
    ]
    done, calls = machine.run(spec, CODEX, {"name": "happy", "tools": tools})
    assert done.returncode == 0, done.stderr
    assert [c["outcome"] for c in calls] == ["ran", "ran", "ran", "denied"]
    assert [(g["tool"], g["decision"], g["rule"]) for g in machine.guard_lines()] == [
        ("Bash", "allow", "bash-recorded"),
        ("Bash", "flag", "bash-mentions-denied-path"),
        ("apply_patch", "allow", "inside-write-root"),
        ("apply_patch", "deny", "denied-home-path"),
    ]
    items = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = [e["item"]["type"] for e in items if e["type"] == "item.completed"]
    assert kinds.count("file_change") == 1
    assert kinds.count("command_execution") == 2
    assert [c["tool_use_id"] for c in calls] == [g["tool_use_id"] for g in machine.guard_lines()]


def test_codex_without_the_trust_bypass_runs_no_hook(machine: Machine) -> None:
    """The same hook config without --dangerously-bypass-hook-trust: skipped silently."""
    caps = {"read", "exec"}
    value = codex_hook_value(guard_argv())
    argv = [
        str(machine.bin / "codex"),
        *("exec", "--json", "--skip-git-repo-check", "-C", str(machine.workdir)),
        *("-s", "read-only", "-c", f"hooks.PreToolUse={value}", "-"),
    ]
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(machine.home),
        **machine.guard_env(caps),
        "FAKE_AGENT_SCENARIO": json.dumps(
            {"name": "happy", "tools": [{"tool_name": "Bash", "tool_input": {"command": "ls"}}]}
        ),
        "FAKE_AGENT_LOG": str(machine.fake_log),
    }
    done = subprocess.run(
        argv, input=PROMPT.encode(), cwd=machine.workdir, env=env, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr
    entries = [json.loads(line) for line in machine.fake_log.read_text().splitlines()]
    (calls,) = [e for e in entries if "tool_calls" in e]
    assert calls["hooks_active"] is False
    assert machine.guard_lines() == []
