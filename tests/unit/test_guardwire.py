"""Wiring the guard into the agent CLIs: the exact settings JSON, the Codex TOML value, the
guard's environment, the owner's hook-killing settings, and the after-run cross-check."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import agentcall
from agentcall.guard.main import config_from_environ
from agentcall.listener.agents.base import AgentSpec
from agentcall.listener.guardwire import (
    GuardWireError,
    claude_guard_settings,
    codex_guard_config,
    codex_hook_value,
    cross_check,
    default_extra_denied,
    guard_argv,
    guard_env,
    logged_tool_use_ids,
    owner_settings_disable_hooks,
)

ARGV = ["/opt/venv/bin/python3", "-I", "-m", "agentcall.guard"]
AWKWARD = ["/opt/my venv/bin/python3", "it's", 'say "hi"', "back\\slash", "ünï", "$HOME", "`x`"]


def test_claude_settings_exact_shape() -> None:
    """Byte for byte: one invalid field would silently disable every hook in Claude."""
    assert claude_guard_settings(ARGV) == (
        '{"hooks":{"PreToolUse":[{"matcher":"*","hooks":[{"type":"command",'
        '"command":"/opt/venv/bin/python3 -I -m agentcall.guard","timeout":30,'
        '"onFailure":"block"}]}]}}'
    )


def test_claude_settings_round_trip_and_pass_the_spec_check() -> None:
    """The JSON parses back to the one expected structure and AgentSpec accepts it."""
    text = claude_guard_settings(AWKWARD)
    assert json.loads(text) == {
        "hooks": {
            "PreToolUse": [
                {
                    "matcher": "*",
                    "hooks": [
                        {
                            "type": "command",
                            "command": shlex.join(AWKWARD),
                            "timeout": 30,
                            "onFailure": "block",
                        }
                    ],
                }
            ]
        }
    }
    spec = AgentSpec(binary="/bin/claude", workdir="/w", tools={"read"}, settings_json=text)
    assert spec.settings_json == text


@pytest.mark.slow
def test_command_survives_the_shell(tmp_path: Path) -> None:
    """Claude runs the command through /bin/sh -c; every argument arrives unchanged."""
    argv = [sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))"]
    argv += AWKWARD[1:]
    command = json.loads(claude_guard_settings(argv))["hooks"]["PreToolUse"][0]["hooks"][0]
    done = subprocess.run(
        ["/bin/sh", "-c", command["command"]],
        capture_output=True,
        check=True,
        env={"HOME": "/nope", "PATH": os.environ.get("PATH", "")},
    )
    assert json.loads(done.stdout) == AWKWARD[1:]


@pytest.mark.parametrize(
    "bad", [[], ["python3", "-m", "agentcall.guard"], ["/bin/py", "a\nb"], ["/bin/py", ""]]
)
def test_unsafe_commands_are_refused(bad: list[str]) -> None:
    """A relative program, an empty word or a newline never reaches a settings string."""
    with pytest.raises(GuardWireError):
        claude_guard_settings(bad)
    with pytest.raises(GuardWireError):
        codex_hook_value(bad)


@pytest.mark.parametrize("argv", [ARGV, AWKWARD, ["/bin/py", "tab\there", "bell\x07", "del\x7f"]])
def test_codex_value_is_the_toml_codex_reads(argv: list[str]) -> None:
    """The ``hooks.PreToolUse`` value parses as TOML to the hook list, command intact."""
    value = codex_hook_value(argv)
    assert tomllib.loads(f"v = {value}")["v"] == [
        {
            "matcher": "*",
            "hooks": [{"type": "command", "command": shlex.join(argv), "timeout": 30}],
        }
    ]
    assert codex_guard_config(argv) == ["-c", f"hooks.PreToolUse={value}"]
    # Exactly what the dotted key means inside a config file, too.
    assert tomllib.loads(codex_guard_config(argv)[1])["hooks"]["PreToolUse"][0]["matcher"] == "*"


def test_guard_argv_is_absolute_and_isolated() -> None:
    """This interpreter (not resolved: a venv keeps its packages), isolated, the module."""
    argv = guard_argv()
    assert os.path.isabs(argv[0])
    assert argv[1:] == ["-I", "-m", "agentcall.guard"]


@pytest.mark.slow
def test_a_planted_package_in_the_workdir_does_not_replace_the_guard(tmp_path: Path) -> None:
    """The hook runs in the task workdir; an ``agentcall`` package the agent wrote there is
    ignored by the isolated interpreter, where a plain ``-m`` would run it."""
    planted = tmp_path / "agentcall" / "guard"
    planted.mkdir(parents=True)
    (tmp_path / "agentcall" / "__init__.py").write_text("")
    (planted / "__init__.py").write_text("")
    (planted / "__main__.py").write_text("print('PLANTED')\n")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}

    def run(argv: list[str]) -> bytes:
        done = subprocess.run(
            argv, input=b"{}", cwd=tmp_path, capture_output=True, env=env, check=False
        )
        return done.stdout + done.stderr

    assert b"PLANTED" in run([sys.executable, "-m", "agentcall.guard"])
    guarded = run(guard_argv())
    assert b"PLANTED" not in guarded
    assert b"could not be checked" in guarded


def test_guard_env_is_what_the_guard_reads(tmp_path: Path) -> None:
    """What the listener writes, the guard parses back to the same configuration."""
    env = guard_env(
        ["/home/ken/AgentCall/t1", "/home/ken/docs"],
        "/home/ken/AgentCall/t1",
        ["write", "read"],
        "call-42",
        tmp_path / "tools.log",
        Path("/home/ken"),
        ["/home/ken/AgentCall/tasks"],
    )
    assert env == {
        "AGENTCALL_GUARD_ROOTS": os.pathsep.join(["/home/ken/AgentCall/t1", "/home/ken/docs"]),
        "AGENTCALL_GUARD_WRITE_ROOT": "/home/ken/AgentCall/t1",
        "AGENTCALL_GUARD_CAPS": "read,write",
        "AGENTCALL_CALL_ID": "call-42",
        "AGENTCALL_GUARD_LOG": str(tmp_path / "tools.log"),
        "AGENTCALL_GUARD_HOME": "/home/ken",
        "AGENTCALL_GUARD_DENY_EXTRA": "/home/ken/AgentCall/tasks",
        "AGENTCALL_GUARD_MCP": "",
    }
    config = config_from_environ(env)
    assert config.roots == ("/home/ken/AgentCall/t1", "/home/ken/docs")
    assert config.write_root == "/home/ken/AgentCall/t1"
    assert config.caps == {"read", "write"}
    assert (config.call_id, config.home) == ("call-42", "/home/ken")
    # The guard adds its own code and its log's directory to the denied roots.
    package = os.path.dirname(os.path.abspath(agentcall.__file__))
    assert config.extra_denied == ("/home/ken/AgentCall/tasks", package, str(tmp_path))
    no_write = guard_env([], None, ["read"], "c", "/l/tools.log", "/h", [])
    assert no_write["AGENTCALL_GUARD_WRITE_ROOT"] == ""
    assert config_from_environ(no_write).roots == ()


@pytest.mark.parametrize(
    "change",
    [
        {"roots": ["relative"]},
        {"roots": [f"/a{os.pathsep}b"]},
        {"roots": "/home/ken"},
        {"write_root": "rel"},
        {"caps": ["read", "sudo"]},
        {"caps": "read"},
        {"call_id": ""},
        {"log_path": "tools.log"},
        {"home": "~"},
        {"extra_denied": ["x"]},
        {"mcp_servers": "github"},
        {"mcp_servers": ["git hub"]},
        {"mcp_servers": ["a,b"]},
        {"mcp_servers": ["-x"]},
        {"mcp_servers": [""]},
    ],
)
def test_guard_env_refuses_what_it_cannot_encode(change: dict[str, object]) -> None:
    """A value the guard would misread is refused here, at the listener."""
    args: dict[str, object] = {
        "roots": ["/w"],
        "write_root": None,
        "caps": ["read"],
        "call_id": "c",
        "log_path": "/s/tools.log",
        "home": "/h",
        "extra_denied": [],
    }
    with pytest.raises(GuardWireError):
        guard_env(**{**args, **change})  # type: ignore[arg-type]


def test_guard_env_names_the_connectors_as_tool_names_carry_them() -> None:
    """The task's servers reach the guard as in mcp__<server>__ (a dot becomes "_"), sorted."""
    env = guard_env(
        ["/w"], None, ["read"], "c", "/s/tools.log", "/h", [], mcp_servers=["sentry", "docs.io"]
    )
    assert env["AGENTCALL_GUARD_MCP"] == "docs_io,sentry"
    assert config_from_environ(env).mcp_servers == {"docs_io", "sentry"}
    assert config_from_environ(
        guard_env(["/w"], None, ["read"], "c", "/l", "/h", [])
    ).mcp_servers == (frozenset())


def test_default_extra_denied_names_the_package_and_tasks(tmp_path: Path) -> None:
    """The guard's own code and the tasks directory."""
    package = os.path.dirname(os.path.abspath(agentcall.__file__))
    assert default_extra_denied(tmp_path / "tasks") == [package, str(tmp_path / "tasks")]


def test_a_state_directory_outside_the_home_default_is_denied_too(tmp_path: Path) -> None:
    """AGENTCALL_HOME may put the keys, the service key and the bridge token anywhere (inside
    a read root, say): the listener passes its state directory, which is denied like the rest."""
    state = tmp_path / "projects" / "agentcall-work"
    assert default_extra_denied(tmp_path / "tasks", state)[-1] == str(state)


# --- the owner's settings ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, None),
        ({"model": "opus"}, None),
        ({"disableAllHooks": False}, None),
        ({"disableAllHooks": True}, "disableAllHooks"),
        ({"allowManagedHooksOnly": True}, "allowManagedHooksOnly"),
        ("{not json", "not valid JSON"),
        ([1], "not a JSON object"),
    ],
)
def test_owner_settings(tmp_path: Path, content: object, reason: str | None) -> None:
    """Settings that switch hooks off (or cannot be read) are named; others are fine."""
    config = tmp_path / "claude"
    config.mkdir()
    if content is not None:
        text = content if isinstance(content, str) else json.dumps(content)
        (config / "settings.json").write_text(text)
    got = owner_settings_disable_hooks(config, managed_paths=())
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got and str(config) in got


def test_owner_settings_location_from_environment(tmp_path: Path) -> None:
    """CLAUDE_CONFIG_DIR wins over ~/.claude; managed settings are checked as well."""
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "settings.json").write_text('{"disableAllHooks": true}')
    home_dir = tmp_path / "home" / ".claude"
    home_dir.mkdir(parents=True)
    environ = {"HOME": str(tmp_path / "home"), "CLAUDE_CONFIG_DIR": str(moved)}
    got = owner_settings_disable_hooks(environ=environ, managed_paths=())
    assert got is not None and str(moved) in got
    environ.pop("CLAUDE_CONFIG_DIR")
    assert owner_settings_disable_hooks(environ=environ, managed_paths=()) is None
    (home_dir / "settings.json").write_text('{"disableAllHooks": true}')
    assert owner_settings_disable_hooks(environ=environ, managed_paths=()) is not None
    (home_dir / "settings.json").write_text("{}")
    managed = tmp_path / "managed-settings.json"
    managed.write_text('{"allowManagedHooksOnly": true}')
    got = owner_settings_disable_hooks(environ=environ, managed_paths=[str(managed)])
    assert got is not None and "allowManagedHooksOnly" in got


# --- the cross-check -----------------------------------------------------------------------


def test_cross_check_returns_the_ids_the_guard_never_saw(tmp_path: Path) -> None:
    """Only lines of this call count; garbage lines are skipped; order kept, repeats once."""
    log = tmp_path / "tools.log"
    lines = [
        {"call_id": "A", "tool_use_id": "t1", "decision": "allow"},
        {"call_id": "A", "tool_use_id": "t2", "decision": "deny"},
        {"call_id": "B", "tool_use_id": "t3", "decision": "allow"},
        {"call_id": "A", "tool_use_id": None, "decision": "deny"},
        {"call_id": "AA", "tool_use_id": "t4", "decision": "allow"},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"call_id": "A", broken\n[]\n'
    log.write_text(text)
    assert logged_tool_use_ids(log, "A") == {"t1", "t2"}
    assert cross_check(["t1", "t3", "t2", "t4", "t3", "t5"], log, "A") == ["t3", "t4", "t5"]
    assert cross_check(["t1", "t2"], log, "A") == []
    assert cross_check(["t1"], tmp_path / "missing.log", "A") == ["t1"]
