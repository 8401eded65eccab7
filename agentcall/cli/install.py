"""``agentcall install [--remove] claude|codex``: let a coding agent call coworkers' agents.

Install registers ``agentcall mcp`` (:mod:`agentcall.mcp.server`) as a user-scope MCP server of
the agent and adds a short block of instructions to the agent's own instruction file; what
each file gets is :mod:`agentcall.install.edits`. What was done is recorded in
``installs.json`` in the state directory (0600), so ``--remove`` undoes exactly that: the entry
it added (or the one it replaced, put back), the block it added, the file it created. Both are
idempotent and say what they changed; ``--json`` prints one object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from agentcall.install import edits

AGENTS: Final = ("claude", "codex")
RECORD_NAME: Final = "installs.json"
CLAUDE_TIMEOUT_S: Final = 60.0
# Passed on to the server when set here: Codex starts MCP servers with a filtered
# environment, so a relocated state directory or a private CA would otherwise be lost.
FORWARDED_ENV: Final = ("AGENTCALL_HOME", "SSL_CERT_FILE")

DESCRIPTION = """\
Let Claude Code or Codex call your coworkers' agents with AgentCall's MCP tools.

`agentcall install claude` registers `agentcall mcp` as a user-scope MCP server of Claude
Code (with `claude mcp add-json --scope user` when `claude` is on PATH, else in
~/.claude.json, or $CLAUDE_CONFIG_DIR/.claude.json) and adds a short block to
~/.claude/CLAUDE.md saying when and how to call a coworker's agent.

`agentcall install codex` adds [mcp_servers.agentcall] to ~/.codex/config.toml ($CODEX_HOME
if set), keeping every other line and comment of the file, with a tool timeout long enough
for a call, and adds the same block to AGENTS.md beside it.

Both can be run again (nothing changes the second time) and say what they changed. What
was done is recorded in installs.json in the state directory; `--remove` undoes exactly
that: it takes out the entry and the block it added, puts back an entry it replaced, and
deletes a file only if install created it. The tools themselves: `agentcall mcp --help`."""

EPILOG = """\
examples:
  agentcall install claude
  agentcall install codex --json
  agentcall install --remove claude"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("agent", choices=AGENTS, metavar="AGENT", help="claude or codex")
    parser.add_argument(
        "--remove", action="store_true", help="undo what `agentcall install AGENT` did"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


class InstallError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen
class Places:
    """Where one agent keeps its MCP servers and its instructions."""

    config: Path
    instructions: Path

    @classmethod
    def of(cls, agent: str, user_home: Path, environ: Mapping[str, str]) -> Places:
        if agent == "claude":
            configured = environ.get("CLAUDE_CONFIG_DIR")
            base = Path(configured) if configured else None
            config_dir = base or user_home / ".claude"
            return cls((base or user_home) / ".claude.json", config_dir / "CLAUDE.md")
        codex_home = Path(environ.get("CODEX_HOME") or user_home / ".codex")
        return cls(codex_home / "config.toml", codex_home / "AGENTS.md")


@attrs.frozen
class InstallDeps:
    """What install reaches outside the process with; tests pass their own."""

    environ: Mapping[str, str] = attrs.field(factory=lambda: os.environ)
    which: Callable[[str], str | None] = shutil.which
    program: tuple[str, ...] = (sys.executable, "-m", "agentcall")
    run: Callable[[Sequence[str]], subprocess.CompletedProcess[str]] = attrs.field(
        factory=lambda: _run
    )


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    # Not doctor_checks.run_command: doctor imports this module for its check.
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        errors="replace",
        timeout=CLAUDE_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


# --- files ----------------------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise InstallError("local_error", f"cannot read {path}: {exc}") from None


def _write(path: Path, text: str | None) -> None:
    """Replace ``path`` in one step keeping its mode (new files 0600); None deletes it."""
    from agentcall.atomicfile import replace_file

    try:
        if text is None:
            path.unlink(missing_ok=True)
            return
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o600
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_file(path, text.encode("utf-8"), mode=mode)
    except OSError as exc:
        raise InstallError("local_error", f"cannot write {path}: {exc}") from None


def _record_path(deps: InstallDeps) -> Path:
    from agentcall.local.home import Home, LocalStateError

    try:
        return Home.from_environ(deps.environ).state_dir / RECORD_NAME
    except LocalStateError as exc:
        raise InstallError("local_error", str(exc)) from None


def load_record(path: Path) -> dict[str, Any]:
    from agentcall import strictjson

    text = _read(path)
    if text is None:
        return {}
    try:
        record = strictjson.loads(text)
    except ValueError as exc:
        raise InstallError("local_error", f"{path} is not valid JSON ({exc})") from None
    if not isinstance(record, dict) or not all(isinstance(v, dict) for v in record.values()):
        raise InstallError("local_error", f"{path} is not what agentcall install writes")
    return record


def _save_record(path: Path, record: Mapping[str, Any]) -> None:
    if not record:
        _write(path, None)
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write(path, json.dumps(record, indent=2, sort_keys=True) + "\n")


# --- the server entry -----------------------------------------------------------------------------


def _entry(agent: str, deps: InstallDeps) -> dict[str, Any]:
    env = {key: deps.environ[key] for key in FORWARDED_ENV if deps.environ.get(key)}
    if agent == "claude":
        return edits.claude_entry(deps.program, env)
    return edits.codex_entry(deps.program, env)


def _current(agent: str, places: Places) -> dict[str, Any] | None:
    text = _read(places.config)
    try:
        return edits.claude_server(text) if agent == "claude" else edits.codex_server(text)
    except edits.EditError as exc:
        raise InstallError("config_unreadable", f"{places.config}: {exc}") from None


def _set_in_file(agent: str, places: Places, entry: Mapping[str, Any] | None) -> None:
    text = _read(places.config)
    try:
        if agent == "claude":
            new = edits.set_claude_server(text, entry)
        else:
            new = edits.set_codex_server(text, entry)
    except edits.EditError as exc:
        raise InstallError("config_unreadable", f"{places.config}: {exc}") from None
    if new != text:
        _write(places.config, new)


def _claude_cli(argv: Sequence[str], deps: InstallDeps) -> None:
    try:
        done = deps.run(argv)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError("agent_cli_failed", f"{argv[0]} did not run: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise InstallError(
            "agent_cli_failed",
            f"`claude mcp {argv[2]}` exited {done.returncode}: {said[-1] if said else ''}",
        )


def _set_server(
    agent: str, places: Places, entry: Mapping[str, Any] | None, deps: InstallDeps
) -> str:
    """Make the agent's entry ``entry`` (None: none); how it was done ("claude-cli", "file")."""
    claude = deps.which("claude") if agent == "claude" else None
    if claude is None:
        _set_in_file(agent, places, entry)
        return "file"
    # `claude mcp add-json` is `claude mcp add` taking the entry as JSON: the same entry, its
    # env values needing no quoting. It refuses a name that exists, so that goes first.
    if _current(agent, places) is not None:
        _claude_cli(edits.claude_remove_argv(claude), deps)
    if entry is not None:
        _claude_cli(edits.claude_add_argv(claude, entry), deps)
    if _current(agent, places) != (None if entry is None else dict(entry)):
        raise InstallError(
            "agent_cli_failed",
            f"`claude mcp` did not leave the expected entry in {places.config} "
            "(is CLAUDE_CONFIG_DIR the same for both?)",
        )
    return "claude-cli"


# --- install and remove ---------------------------------------------------------------------------


@attrs.frozen
class Report:
    agent: str
    action: str
    changes: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "agent": self.agent,
            "action": self.action,
            "changed": bool(self.changes),
            "changes": list(self.changes),
            "notes": list(self.notes),
        }


def _where(agent: str, places: Places) -> str:
    return f"{places.config} (user scope)" if agent == "claude" else str(places.config)


def install(agent: str, deps: InstallDeps) -> Report:
    from agentcall.local.home import Home

    places = Places.of(agent, Home.from_environ(deps.environ).user_home, deps.environ)
    record_path = _record_path(deps)
    record = load_record(record_path)
    done = record.get(agent, {})
    changes: list[str] = []
    # Directories this install makes (~/.claude, ~/.codex on a fresh machine) go with --remove.
    made_dirs = list(done.get("created_dirs") or [])
    for directory in {places.config.parent, places.instructions.parent}:
        if not directory.exists() and str(directory) not in made_dirs:
            made_dirs.append(str(directory))
    wanted = _entry(agent, deps)
    current = _current(agent, places)
    server = done.get("server") or {}
    previous = server.get("previous") if server.get("entry") == current else current
    if current != wanted:
        via = _set_server(agent, places, wanted, deps)
        verb = "replaced the" if current is not None else "added the"
        changes.append(f"{verb} agentcall MCP server in {_where(agent, places)}")
    else:
        via = server.get("via", "file")
    instructions_text = _read(places.instructions)
    try:
        new_text = edits.add_block(instructions_text)
    except edits.EditError as exc:
        raise InstallError("config_unreadable", f"{places.instructions}: {exc}") from None
    earlier = done.get("instructions") or {}
    created = bool(earlier.get("created")) or instructions_text is None
    separator = earlier.get("separator")
    if not edits.has_block(instructions_text):
        separator = edits.separator_for(instructions_text)
    if new_text != instructions_text:
        _write(places.instructions, new_text)
        changes.append(f"added the AgentCall instructions to {places.instructions}")
    record[agent] = {
        "server": {
            "path": str(places.config),
            "entry": wanted,
            "previous": previous,
            "via": via,
        },
        "instructions": {
            "path": str(places.instructions),
            "created": created,
            "separator": separator,
        },
        "created_dirs": sorted(made_dirs),
    }
    if record.get(agent) != done or changes:
        _save_record(record_path, record)
    notes = () if changes else ("already installed: nothing changed",)
    return Report(agent, "install", tuple(changes), notes)


def remove(agent: str, deps: InstallDeps) -> Report:
    record_path = _record_path(deps)
    record = load_record(record_path)
    done = record.get(agent)
    if not done:
        return Report(
            agent,
            "remove",
            (),
            (f"nothing to remove: `agentcall install {agent}` has not been run here",),
        )
    changes: list[str] = []
    notes: list[str] = []
    server = done.get("server") or {}
    instructions = done.get("instructions") or {}
    config = Path(str(server.get("path")))
    places = Places(config, Path(str(instructions.get("path"))))
    current = _current(agent, places)
    if current is None:
        notes.append(f"the agentcall MCP server was already gone from {config}")
    elif current == server.get("entry"):
        previous = server.get("previous")
        _set_server(agent, places, previous, deps)
        if previous is None:
            changes.append(f"removed the agentcall MCP server from {_where(agent, places)}")
        else:
            changes.append(f"put back the earlier agentcall MCP server in {config}")
    else:
        notes.append(f"left the agentcall MCP server in {config} as it is: it changed since")
    text = _read(places.instructions)
    try:
        separator = instructions.get("separator")
        left = edits.remove_block(text, separator if isinstance(separator, str) else None)
    except edits.EditError as exc:
        raise InstallError("config_unreadable", f"{places.instructions}: {exc}") from None
    if edits.has_block(text):
        if left is None and not instructions.get("created"):
            left = ""
        _write(places.instructions, left)
        gone = " (and the file, which install had created)" if left is None else ""
        changes.append(f"removed the AgentCall instructions from {places.instructions}{gone}")
    for directory in sorted(done.get("created_dirs") or [], key=len, reverse=True):
        try:
            Path(directory).rmdir()
        except OSError:
            continue  # not empty (the agent keeps its own files there) or already gone
        changes.append(f"removed the directory {directory}, which install had created")
    del record[agent]
    _save_record(record_path, record)
    return Report(agent, "remove", tuple(changes), tuple(notes))


def installed(agent: str, environ: Mapping[str, str]) -> tuple[bool, str]:
    """Whether ``agentcall install agent`` is in place here, and a line saying so (for
    ``doctor`` and ``setup``); never raises."""
    try:
        deps = InstallDeps(environ=environ)
        record = load_record(_record_path(deps)).get(agent)
        if not record:
            return False, f"not installed (run `agentcall install {agent}`)"
        server = record.get("server") or {}
        places = Places(Path(str(server.get("path"))), Path(str(record["instructions"]["path"])))
        current = _current(agent, places)
    except (InstallError, KeyError, TypeError) as exc:
        return False, f"cannot tell: {exc}"
    if current is None:
        return False, f"the agentcall server is gone from {places.config}"
    command = [current.get("command"), *(current.get("args") or [])]
    program = command[:-1] if command[-1:] == ["mcp"] else None
    if program is None or not program[0] or not Path(str(program[0])).exists():
        return False, f"{places.config} starts {command[0]!r}, which is not there"
    return True, f"agentcall mcp registered in {places.config}"


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.main import CommandError
    from agentcall.cli.render import safe_json

    deps = DEPS or InstallDeps()
    try:
        report = remove(args.agent, deps) if args.remove else install(args.agent, deps)
    except InstallError as exc:
        if args.json:
            print(safe_json({"ok": False, "code": exc.code, "message": str(exc)}))
        raise CommandError(str(exc)) from None
    if args.json:
        print(safe_json(report.to_json()))
    else:
        for line in (*report.changes, *report.notes):
            print(line)
        if report.changes and not args.remove:
            name = "Claude Code" if args.agent == "claude" else "Codex"
            print(f"restart {name} to pick up the agentcall tools")
    return 0


# Tests set this to a InstallDeps of their own.
DEPS: InstallDeps | None = None
