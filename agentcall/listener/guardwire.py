"""How the tool guard is wired into an agent run, and how to tell afterwards that it was.

Pure builders for what the listener passes to the agent CLI:

- :func:`claude_guard_settings`: the ``--settings`` JSON. Claude drops the *whole* settings
  object, hooks included and without a word, when any field in it fails validation, so the
  shape is produced here and nowhere else, and a test pins it byte for byte.
- :func:`codex_hook_value` / :func:`codex_guard_config`: the TOML value of
  ``hooks.PreToolUse`` for ``codex exec -c``. Codex skips inline hooks silently unless
  ``--dangerously-bypass-hook-trust`` is passed too (the Codex adapter adds both).
- :func:`guard_env`: the environment the guard reads its configuration from.
- :func:`codex_hook_shell`, :func:`preflight_payload`, :func:`preflight_problem`: the check
  run before Codex starts (Codex runs the tool when its hook crashes, so a hook that does not
  refuse a must-deny call ends the call first).

And two checks: :func:`owner_settings_disable_hooks` (settings of the owner's that switch every
hook off) and :func:`cross_check` (tool calls the guard never logged: ``guard_unwired``).
Facts from ``reference/agent-clis/ANALYSIS.md`` §1.5 and §2.4.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agentcall.listener.connectors import SERVER_NAME_RE, tool_name_part

if TYPE_CHECKING:
    from agentcall.listener.runner import RunResult

GUARD_MODULE = "agentcall.guard"
GUARD_TIMEOUT_SECONDS = 30
GUARD_CAPABILITIES = frozenset({"read", "write", "fetch", "exec"})
# Where managed (administrator) settings live; they apply even with --setting-sources "".
MANAGED_SETTINGS_PATHS: tuple[str, ...] = (
    ("/Library/Application Support/ClaudeCode/managed-settings.json",)
    if sys.platform == "darwin"
    else ("/etc/claude-code/managed-settings.json",)
)
_HOOK_KILLERS = ("disableAllHooks", "allowManagedHooksOnly")
# The guard starts in about 30 ms; a hook that needs 10 s for one call is not working.
PREFLIGHT_TIMEOUT_S = 10.0
PREFLIGHT_KILL_GRACE_S = 1.0
PREFLIGHT_TOOL = "agentcall_preflight"


class GuardWireError(ValueError):
    """A value that cannot be wired into the guard's command line or environment safely."""


def guard_argv() -> list[str]:
    """How to run the guard: this interpreter, isolated, on the guard module.

    ``-I`` keeps the hook's cwd (the task workdir, which the agent may write to) and
    ``PYTHON*`` variables out of the module search path: a planted ``agentcall/`` package in
    the workdir must not replace the guard. The interpreter path is made absolute but not
    resolved, so a virtualenv's interpreter keeps its site-packages.
    """
    return [os.path.abspath(sys.executable), "-I", "-m", GUARD_MODULE]


def _check_argv(argv: list[str]) -> None:
    if not argv or not all(isinstance(a, str) and a for a in argv):
        raise GuardWireError("the guard command is empty")
    if not os.path.isabs(argv[0]):
        raise GuardWireError("the guard program must be an absolute path")
    for arg in argv:
        # A newline would end the shell command early; NUL cannot be passed at all.
        if any(ch in arg for ch in "\0\n\r"):
            raise GuardWireError("the guard command holds a control character")


def claude_guard_settings(argv: list[str]) -> str:
    """The ``--settings`` JSON that runs ``argv`` (through ``/bin/sh -c``) before every tool.

    ``onFailure: "block"`` makes Claude 2.1.332 refuse a tool whose hook crashed, is missing
    or timed out; older versions ignore the key (they fail open), and the guard itself
    fails closed by exiting 2.
    """
    _check_argv(argv)
    hook = {
        "type": "command",
        "command": shlex.join(argv),
        "timeout": GUARD_TIMEOUT_SECONDS,
        "onFailure": "block",
    }
    settings = {"hooks": {"PreToolUse": [{"matcher": "*", "hooks": [hook]}]}}
    text = json.dumps(settings, separators=(",", ":"), ensure_ascii=False)
    if json.loads(text) != settings:
        raise GuardWireError("the guard settings do not survive a JSON round trip")
    return text


def _toml_string(value: str) -> str:
    escaped = []
    for ch in value:
        if ch in ('"', "\\"):
            escaped.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            escaped.append(f"\\u{ord(ch):04X}")
        elif 0xD800 <= ord(ch) <= 0xDFFF:
            raise GuardWireError("the guard command holds a lone surrogate")
        else:
            escaped.append(ch)
    return '"' + "".join(escaped) + '"'


def codex_hook_command(argv: list[str]) -> str:
    """The hook's command line as Codex receives it (and as the preflight runs it)."""
    _check_argv(argv)
    return shlex.join(argv)


def codex_hook_value(argv: list[str]) -> str:
    """The TOML value of ``hooks.PreToolUse`` (what ``AgentSpec.codex_hook_config`` holds).

    It only takes effect together with ``--dangerously-bypass-hook-trust``: without that
    flag Codex skips inline hooks silently.
    """
    command = _toml_string(codex_hook_command(argv))
    return (
        f'[{{matcher="*", hooks=[{{type="command", command={command}, '
        f"timeout={GUARD_TIMEOUT_SECONDS}}}]}}]"
    )


def codex_guard_config(argv: list[str]) -> list[str]:
    """``-c hooks.PreToolUse=[…]`` as argv words; ``--dangerously-bypass-hook-trust`` must
    accompany it on the same command line."""
    return ["-c", f"hooks.PreToolUse={codex_hook_value(argv)}"]


# --- the Codex preflight ------------------------------------------------------------------
#
# Codex 0.171.0 runs the tool when its hook exits with any code but 0 or 2, cannot be started,
# or times out. So before Codex is spawned, the listener runs the hook command once itself, the
# way Codex would, on a call the guard must refuse; anything but a refusal Codex honours ends
# the call before the agent starts.


def codex_hook_shell(command: str, env: Mapping[str, str]) -> tuple[str, ...]:
    """The argv Codex's hook runner uses for ``command`` on Unix: the user's shell as a login
    shell (``$SHELL -lc``), ``/bin/sh`` when ``SHELL`` is unset. A login profile that prints
    to stdout would spoil the hook's answer for Codex too, so the preflight goes the same way."""
    return (env.get("SHELL") or "/bin/sh", "-lc", command)


def preflight_payload(cwd: str) -> bytes:
    """A Codex-shaped PreToolUse payload for a tool no task has: every working guard denies it
    (``unclassified-tool``), whatever the call's capabilities and roots. Its tool name says
    what it was, in tools.log and in ``agentcall history``."""
    payload: dict[str, object] = {
        "session_id": PREFLIGHT_TOOL,
        "turn_id": PREFLIGHT_TOOL,
        "transcript_path": None,
        "cwd": cwd,
        "hook_event_name": "PreToolUse",
        "model": "",
        "permission_mode": "bypassPermissions",
        "tool_name": PREFLIGHT_TOOL,
        "tool_input": {},
        "tool_use_id": PREFLIGHT_TOOL,
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def _is_deny_json(stdout: bytes) -> bool:
    try:
        value = json.loads(stdout.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    output = value.get("hookSpecificOutput") if isinstance(value, dict) else None
    if not isinstance(output, dict):
        return False
    reason = output.get("permissionDecisionReason")
    return (
        output.get("hookEventName") == "PreToolUse"
        and output.get("permissionDecision") == "deny"
        and isinstance(reason, str)
        and bool(reason.strip())
    )


def preflight_problem(result: RunResult) -> str | None:
    """None when the hook refused the preflight call in a way Codex honours, else why not.

    Codex honours two refusals: exit 0 with the deny JSON on stdout, and exit 2 with a reason
    on stderr. The text names only exit codes, signals and times, so it may go to the caller.
    """
    if result.timed_out:
        return f"the tool guard did not answer within {PREFLIGHT_TIMEOUT_S:g} s"
    if result.cancelled:
        return "the tool guard check was stopped"
    if result.signal is not None:
        return f"the tool guard was killed by signal {result.signal}"
    code = result.exit_code
    if code == 0:
        if _is_deny_json(result.stdout):
            return None
        return "the tool guard did not refuse a tool call it must refuse"
    if code == 2:
        if result.stderr.strip():
            return None
        return "the tool guard exited with code 2 but gave no reason, which Codex ignores"
    if code == 127:
        return "the tool guard's program was not found (exit code 127)"
    if code == 126:
        return "the tool guard's program could not be executed (exit code 126)"
    return f"the tool guard failed (exit code {code})"


def _joined_paths(name: str, paths: Iterable[str]) -> str:
    items = [str(p) for p in paths]
    for item in items:
        if not os.path.isabs(item) or os.pathsep in item or "\0" in item:
            raise GuardWireError(f"{name}: {item!r} is not an absolute path without {os.pathsep}")
    return os.pathsep.join(items)


def guard_env(
    roots: Iterable[str],
    write_root: str | None,
    caps: Iterable[str],
    call_id: str,
    log_path: str | Path,
    home: str | Path,
    extra_denied: Iterable[str],
    mcp_servers: Iterable[str] = (),
) -> dict[str, str]:
    """The variables the guard reads (see :mod:`agentcall.guard.main`) for one run.

    ``mcp_servers`` are the names of the task's connectors (as configured); the guard gets
    them as they appear in tool names, and allows ``mcp__<name>__*`` for those alone.
    """
    cap_set = frozenset(caps)
    if isinstance(caps, str) or not cap_set <= GUARD_CAPABILITIES:
        raise GuardWireError(f"unknown capabilities: {sorted(cap_set - GUARD_CAPABILITIES)}")
    if not call_id or "\0" in call_id:
        raise GuardWireError("the call id is empty")
    if isinstance(roots, str) or isinstance(extra_denied, str):
        raise GuardWireError("roots and extra_denied are collections of paths")
    if isinstance(mcp_servers, str):
        raise GuardWireError("mcp_servers is a collection of server names")
    servers = list(mcp_servers)
    if not all(isinstance(n, str) and SERVER_NAME_RE.match(n) for n in servers):
        raise GuardWireError("mcp_servers holds an invalid server name")
    return {
        "AGENTCALL_GUARD_ROOTS": _joined_paths("roots", roots),
        "AGENTCALL_GUARD_WRITE_ROOT": _joined_paths("write_root", [write_root])
        if write_root
        else "",
        "AGENTCALL_GUARD_CAPS": ",".join(sorted(cap_set)),
        "AGENTCALL_CALL_ID": call_id,
        "AGENTCALL_GUARD_LOG": _joined_paths("log_path", [str(log_path)]),
        "AGENTCALL_GUARD_HOME": _joined_paths("home", [str(home)]),
        "AGENTCALL_GUARD_DENY_EXTRA": _joined_paths("extra_denied", extra_denied),
        "AGENTCALL_GUARD_MCP": ",".join(sorted({tool_name_part(n) for n in servers})),
    }


def default_extra_denied(tasks_dir: str | Path, state_dir: str | Path | None = None) -> list[str]:
    """The roots the guard and the kernel boundary must always refuse besides the built-in
    list: the guard's own code (the installed ``agentcall`` package), the owner's tasks
    directory and the state directory. The built-in list names ``~/.agentcall``; a state
    directory moved elsewhere (``AGENTCALL_HOME``) holds the same keys, service key and bridge
    token, and a read root that contains it must not grant it."""
    import agentcall

    denied = [os.path.dirname(os.path.abspath(agentcall.__file__)), os.path.abspath(tasks_dir)]
    if state_dir is not None:
        denied.append(os.path.abspath(state_dir))
    return denied


def owner_settings_disable_hooks(
    claude_config_dir: str | Path | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    managed_paths: Iterable[str] = MANAGED_SETTINGS_PATHS,
) -> str | None:
    """Why Claude would not run the guard because of the owner's or managed settings, or None.

    Looks at ``<config dir>/settings.json`` (the given dir, else ``$CLAUDE_CONFIG_DIR``, else
    ``~/.claude``) and the managed settings for ``disableAllHooks: true`` or
    ``allowManagedHooksOnly: true``. A settings file that exists but cannot be read or parsed
    is reported too: whether it disables hooks cannot be told. (``--setting-sources ""``
    takes the user file out of play; managed settings apply regardless.)
    """
    if claude_config_dir is None:
        configured = environ.get("CLAUDE_CONFIG_DIR", "")
        home = environ.get("HOME", "") or os.path.expanduser("~")
        claude_config_dir = configured or os.path.join(home, ".claude")
    candidates = [os.path.join(str(claude_config_dir), "settings.json"), *managed_paths]
    for path in candidates:
        try:
            with open(path, "rb") as handle:
                raw = handle.read(4 * 1024 * 1024)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{path} cannot be read ({exc.strerror})"
        try:
            settings = json.loads(raw)
        except (ValueError, RecursionError):
            return f"{path} is not valid JSON"
        if not isinstance(settings, dict):
            return f"{path} is not a JSON object"
        for key in _HOOK_KILLERS:
            if settings.get(key) is True:
                return f"{path} sets {key}, which switches the tool guard off"
    return None


def logged_tool_use_ids(tools_log_path: str | Path, call_id: str) -> set[str]:
    """The tool_use ids the guard recorded for one call (unreadable lines are skipped)."""
    seen: set[str] = set()
    needle = json.dumps(call_id).encode()
    try:
        with open(tools_log_path, "rb") as handle:
            for line in handle:
                if needle not in line:
                    continue
                try:
                    entry = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(entry, dict) and entry.get("call_id") == call_id:
                    ident = entry.get("tool_use_id")
                    if isinstance(ident, str):
                        seen.add(ident)
    except FileNotFoundError:
        pass
    return seen


def cross_check(tool_use_ids: Iterable[str], tools_log_path: str | Path, call_id: str) -> list[str]:
    """The tool_use ids of a run that the guard never logged for ``call_id``, in order.

    Any id returned means a tool call ran without the guard seeing it (``guard_unwired``).
    Meaningful for Claude, whose stream-json ids equal the hook's ``tool_use_id``; Codex's
    stream item ids are not the hook's ids.
    """
    seen = logged_tool_use_ids(tools_log_path, call_id)
    missing: list[str] = []
    for ident in tool_use_ids:
        if ident not in seen and ident not in missing:
            missing.append(ident)
    return missing
