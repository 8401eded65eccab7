#!/usr/bin/env python3
"""A fake ``claude`` and ``codex`` for tests: one file, installed under both names.

Tests put a directory first on PATH holding this file as ``claude`` and/or ``codex`` (a
symlink or a copy); the name it is run under picks the CLI it imitates (``FAKE_AGENT_KIND``
overrides). It parses the same argv as the real CLI and fails loudly (exit 2, a message on
stderr) on anything the listener must never do: the prompt in argv, a variadic flag followed
by something that is not its value, ``--bare``/``--safe-mode``/
``--dangerously-skip-permissions``, a bare ``Read``/``Write``/``Edit`` allow rule.

It reads the prompt from stdin, appends one JSON line to ``$FAKE_AGENT_LOG`` (argv, cwd,
selected env, the prompt, its pids) when that is set, and then behaves as the scenario says.
The scenario is read from the file ``$FAKE_AGENT_SCENARIO_FILE`` when it exists (so a test
can change it between calls), else from ``$FAKE_AGENT_SCENARIO``. Either holds a bare name
(``happy``) or a JSON object (``{"name": "slow", "seconds": 3, "marker": "M"}``).

Options every scenario understands: ``marker`` (default ``FAKE-AGENT-ANSWER``), ``echo``
(default true: the answer is ``<marker>: <first line of the caller's message>``), ``answer``
(the literal answer), ``divider`` (what separates the caller's message from the preamble),
``version``, ``leave_children`` (true: first leave detached children behind, as a Bash tool's
``setsid … &`` would, then behave as the named scenario), ``hold`` (``{"started": FILE,
"release": FIFO}``: once running, create FILE, then wait until a test writes to the FIFO, then
behave as the named scenario, so a test can act while the agent is surely running without
guessing how long that takes). The scenario names are the keys of ``CLAUDE_SCENARIOS`` /
``CODEX_SCENARIOS``.

Tool calls and the guard (``happy``): ``tools`` is a list of ``{"tool_name", "tool_input"}``
(optionally ``tool_use_id``). Each becomes a tool call that first goes through the PreToolUse
hooks the argv wires up: Claude's ``--settings`` JSON, Codex's ``-c hooks.PreToolUse=…`` with
``--dangerously-bypass-hook-trust``. The hook command runs under ``/bin/sh -c`` with a realistic
payload on stdin; a deny JSON or exit 2 refuses the call (Claude lists it in the result's
``permission_denials``; Codex emits no item for it), a crash or timeout lets it run unless
Claude 2.1.332 has ``onFailure: "block"``. Settings that fail validation run no hook at all,
silently, as the real CLI does. ``hook_timeout`` overrides the hooks' timeout; ``perform``
makes allowed Read/Write calls touch the file and Bash calls run their command under
``/bin/sh -c`` (a real child process); ``report`` makes the answer the tools' outputs. What
happened to each call is logged as one ``{"tool_calls": [...]}`` line.

The facts imitated come from ``reference/agent-clis/ANALYSIS.md`` §1-§5. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, NoReturn

CLAUDE_VERSION = "2.1.332"
CLAUDE_OLD_VERSION = "2.1.197"
CODEX_VERSION = "0.171.0"
DEFAULT_MARKER = "FAKE-AGENT-ANSWER"
DEFAULT_DIVIDERS = ("<<CALLER-MESSAGE>>", "---")
LOGGED_ENV_PREFIXES = ("AGENTCALL_", "CLAUDE_CODE_", "DISABLE_", "CODEX_", "FAKE_AGENT_")
ESCAPES = (
    "\x1b[31mred\x1b[0m \x1b]0;evil-title\x07 "
    "\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\ \x1b]52;c;ZXZpbA==\x07 "
    "over\rwrite back\x08space c1:\x9b31m"
)
SECRETS = (
    "key sk-ant-api03-FAKEfakeFAKEfakeFAKEfake0123 "
    "token ghp_FAKEfakeFAKEfakeFAKEfakeFAKEfake0123 "
    "aws AKIAFAKEFAKEFAKE0123 "
    "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJmYWtlIn0.ZmFrZXNpZ25hdHVyZQ "
    "auth Bearer FAKEfakeFAKEfake0123456789"
)
INVALID_UTF8 = b"\xff\xfe bad \xc3("

Scenario = dict[str, Any]


class Refused(Exception):
    """The argv is one the listener must never produce: exit 2 with a message."""


class CliError(Exception):
    """An error the real CLI would print (to stderr) with its own exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# --- plumbing ------------------------------------------------------------------------------


def out(data: str | bytes) -> None:
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    sys.stdout.buffer.write(raw)
    sys.stdout.buffer.flush()


def err(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def jline(obj: object) -> None:
    out(json.dumps(obj, ensure_ascii=False) + "\n")


def load_scenario() -> Scenario:
    raw = ""
    path = os.environ.get("FAKE_AGENT_SCENARIO_FILE")
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            raw = fh.read().strip()
    if not raw:
        raw = os.environ.get("FAKE_AGENT_SCENARIO", "").strip()
    if raw.startswith("{"):
        scenario: Scenario = json.loads(raw)
        scenario.setdefault("name", "happy")
        return scenario
    return {"name": raw or "happy"}


def read_prompt(scenario: Scenario) -> str:
    if scenario["name"] == "ignore_stdin":
        return ""
    return sys.stdin.buffer.read().decode("utf-8", "replace")


def record(kind: str, argv: list[str], prompt: str, scenario: Scenario, **extra: Any) -> None:
    path = os.environ.get("FAKE_AGENT_LOG")
    if not path:
        return
    entry = {
        "kind": kind,
        "argv": argv,
        "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(LOGGED_ENV_PREFIXES)},
        "env_names": sorted(os.environ),
        "prompt": prompt,
        "scenario": scenario.get("name"),
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        **extra,
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def caller_line(prompt: str, scenario: Scenario) -> str:
    dividers = [scenario["divider"]] if "divider" in scenario else list(DEFAULT_DIVIDERS)
    message = prompt
    for divider in dividers:
        token = f"\n{divider}\n"
        if token in prompt:
            message = prompt.split(token, 1)[1]
            break
        if prompt.startswith(f"{divider}\n"):
            message = prompt[len(divider) + 1 :]
            break
    lines = [ln for ln in message.strip().splitlines() if ln.strip()]
    return lines[0].strip() if lines else ""


def answer_text(prompt: str, scenario: Scenario) -> str:
    if "answer" in scenario:
        return str(scenario["answer"])
    marker = str(scenario.get("marker", DEFAULT_MARKER))
    if not scenario.get("echo", True):
        return marker
    return f"{marker}: {caller_line(prompt, scenario)}"


def exit_143_on_term() -> None:
    # Like claude: SIGTERM ends the process with 143 and no result line.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))


def spawn_orphans(scenario: Scenario) -> list[int]:
    """Detached children that keep stdout open, like a `setsid sleep 600 &` from a Bash tool."""
    env = dict(os.environ)
    if scenario.get("scrub_env"):
        env = {k: v for k, v in env.items() if k != "AGENTCALL_RUN_ID"}
    seconds = str(scenario.get("seconds", 600))
    detached = subprocess.Popen(
        ["sleep", seconds], stdin=subprocess.DEVNULL, start_new_session=True, env=env
    )
    pids = [detached.pid]
    if not scenario.get("scrub_env"):
        nohup = subprocess.Popen(
            ["nohup", "sleep", seconds], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        pids.append(nohup.pid)
    return pids


def hold_until_released(scenario: Scenario) -> None:
    """Say "started" through a file, then block until the test writes to the release FIFO."""
    gate = scenario.get("hold")
    if not gate:
        return
    # Opened read-write, the FIFO never blocks the open and never reads as end-of-file, so the
    # read waits for the test's byte; and it is open before `started` exists, so the test's
    # non-blocking open for writing always finds a reader.
    fd = os.open(gate["release"], os.O_RDWR)
    try:
        with open(gate["started"], "w", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()}\n")
        os.read(fd, 1)
    finally:
        os.close(fd)


def refuse(message: str) -> NoReturn:
    raise Refused(message)


def refuse_prompt_in_argv(argv: list[str], prompt: str) -> None:
    """The whole prompt, or the caller's first line, must not be in any argument."""
    needles = [prompt.strip(), caller_line(prompt, {})]
    for needle in needles:
        if len(needle) >= 12 and any(needle in arg for arg in argv):
            refuse("the prompt text appears in argv")


# --- claude: argv ----------------------------------------------------------------------------

CLAUDE_FLAGS = {
    "-p",
    "--print",
    "--verbose",
    "--strict-mcp-config",
    "--no-session-persistence",
    "-c",
    "--continue",
    "--fork-session",
    "--include-hook-events",
    "--include-partial-messages",
}
CLAUDE_VALUED = {
    "--output-format",
    "--input-format",
    "--permission-mode",
    "--permission-prompts",
    "--settings",
    "--setting-sources",
    "--max-turns",
    "--max-budget-usd",
    "--session-id",
    "-r",
    "--resume",
    "--model",
    "--fallback-model",
    "--append-system-prompt",
    "--system-prompt",
    "--append-system-prompt-file",
    "--system-prompt-file",
}
CLAUDE_VARIADIC = {
    "--tools",
    "--allowedTools",
    "--allowed-tools",
    "--disallowedTools",
    "--disallowed-tools",
    "--add-dir",
    "--mcp-config",
    "--betas",
    "--file",
}
NEVER_FLAGS = {
    "--bare",
    "--safe-mode",
    "--dangerously-skip-permissions",
    "--allow-dangerously-skip-permissions",
    "--dangerously-bypass-approvals-and-sandbox",
}
KNOWN_TOOLS = {
    "Task",
    "Bash",
    "Edit",
    "Glob",
    "Grep",
    "NotebookEdit",
    "Read",
    "WebFetch",
    "WebSearch",
    "Write",
    "Skill",
    "TaskStop",
    "ToolSearch",
    "Monitor",
}
BARE_FILE_RULES = {"Read", "Write", "Edit", "NotebookEdit", "Grep", "Glob"}
PERMISSION_MODES = {
    CLAUDE_VERSION: ("acceptEdits", "auto", "bypassPermissions", "manual", "dontAsk", "plan"),
    CLAUDE_OLD_VERSION: ("acceptEdits", "bypassPermissions", "default", "dontAsk", "plan"),
}
_TOOL_NAME = re.compile(r"^(?:[A-Za-z][A-Za-z0-9_]*|mcp__[A-Za-z0-9_-]+(?:__[A-Za-z0-9_*-]+)?)$")
_RULE = re.compile(r"^(?:[A-Za-z][A-Za-z0-9_]*|mcp__[A-Za-z0-9_*-]+)(?:\(.*\))?$")


def split_rules(value: str) -> list[str]:
    """Split on commas and blanks outside parentheses, the way rule lists are written."""
    parts: list[str] = []
    depth = 0
    current = ""
    for ch in value:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        if ch in ", " and depth == 0:
            if current:
                parts.append(current)
            current = ""
        else:
            current += ch
    if current:
        parts.append(current)
    return parts


def check_variadic_value(flag: str, value: str) -> None:
    """A value that is not what the flag takes is a swallowed prompt: refuse it loudly.

    Stricter than the real CLI, which drops unknown tool names silently and splits on blanks:
    the listener never writes blanks between names, so a blank means prose.
    """
    if flag == "--add-dir":
        ok = value.startswith("/")
    elif flag in ("--mcp-config", "--file", "--betas"):
        ok = bool(value.strip())
    else:
        names = split_rules(value) if value else []
        shape = _TOOL_NAME if flag == "--tools" else _RULE
        ok = " " not in _outside_parens(value) and all(
            shape.match(n) and (n.split("(")[0] in KNOWN_TOOLS or n.startswith("mcp__"))
            for n in names
        )
        ok = ok and (bool(names) or flag == "--tools")
    if not ok:
        refuse(f'"{value[:60]}" was read as a value of {flag}, not as a prompt')


def _outside_parens(value: str) -> str:
    return re.sub(r"\([^)]*\)", "", value)


def parse_claude(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"positionals": [], "variadic": {}}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in NEVER_FLAGS:
            refuse(f"{name} must never be passed: it switches the tool guard or permissions off")
        if name in CLAUDE_FLAGS:
            opts[name] = True
        elif name in CLAUDE_VALUED:
            if eq:
                opts[name] = inline
            else:
                if i + 1 >= len(argv):
                    raise CliError(f"error: option '{name} <value>' argument missing")
                i += 1
                opts[name] = argv[i]
        elif name in CLAUDE_VARIADIC:
            values = [inline] if eq else []
            while i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                i += 1
                values.append(argv[i])
            if not values:
                raise CliError(f"error: option '{name} <values...>' argument missing")
            for value in values:
                check_variadic_value(name, value)
            opts["variadic"].setdefault(name, []).extend(values)
        elif arg.startswith("-") and arg != "-":
            raise CliError(f"error: unknown option '{arg}'")
        else:
            opts["positionals"].append(arg)
        i += 1
    return opts


def claude_rules(opts: dict[str, Any], flag: str) -> list[str]:
    return [r for v in opts["variadic"].get(flag, []) for r in split_rules(v)]


def validate_claude(opts: dict[str, Any], version: str, prompt: str, scenario_name: str) -> None:
    if opts["positionals"]:
        refuse("a positional prompt was passed in argv; the prompt must come on stdin")
    for rule in claude_rules(opts, "--allowedTools") + claude_rules(opts, "--allowed-tools"):
        if rule in BARE_FILE_RULES:
            refuse(f"bare allow rule {rule!r} approves that tool on any path")
    refuse_prompt_in_argv(sys.argv[1:], prompt)
    mode = opts.get("--permission-mode")
    choices = PERMISSION_MODES.get(version, PERMISSION_MODES[CLAUDE_VERSION])
    if mode is not None and mode not in choices:
        raise CliError(
            f"error: option '--permission-mode <mode>' argument '{mode}' is invalid. "
            f"Allowed choices are {', '.join(choices)}."
        )
    fmt = opts.get("--output-format", "text")
    if fmt not in ("text", "json", "stream-json"):
        raise CliError(f"error: option '--output-format <format>' argument '{fmt}' is invalid.")
    if fmt == "stream-json" and not opts.get("--verbose"):
        raise CliError("Error: When using --print, --output-format=stream-json requires --verbose")
    settings = opts.get("--settings")
    if settings is not None and not os.path.exists(settings):
        try:
            json.loads(settings)
        except ValueError:
            raise CliError(
                f"Error: Settings file not found: {os.path.join(os.getcwd(), settings)}"
            ) from None
    if not (opts.get("-p") or opts.get("--print")):
        refuse("the fake only imitates print mode (-p)")
    if not prompt.strip() and scenario_name != "ignore_stdin":
        raise CliError(
            "Error: Input must be provided either through stdin or as a prompt argument "
            "when using --print"
        )


# --- claude: output --------------------------------------------------------------------------


class ClaudeOut:
    """Writes frames in the output format argv asked for."""

    def __init__(self, opts: dict[str, Any], scenario: Scenario, version: str) -> None:
        self.format = opts.get("--output-format", "text")
        self.version = version
        self.session_id = (
            opts.get("--resume") or opts.get("-r") or opts.get("--session-id") or str(uuid.uuid4())
        )
        self.tools = [t for v in opts["variadic"].get("--tools", []) for t in split_rules(v)]
        self.mode = opts.get("--permission-mode", "default")
        self.max_turns = int(opts.get("--max-turns", 30))
        self.scenario = scenario
        self.results = 0
        self.hooks = claude_hooks(opts)
        self.permission_denials: list[dict[str, Any]] = []
        self.tool_outputs: list[str] = []

    def frame(self, obj: dict[str, Any]) -> None:
        if self.format == "stream-json":
            obj.setdefault("session_id", self.session_id)
            jline(obj)

    def init(self) -> None:
        self.frame(
            {
                "type": "system",
                "subtype": "init",
                "cwd": os.getcwd(),
                "session_id": self.session_id,
                "tools": self.tools,
                "mcp_servers": [],
                "model": "claude-fake-1",
                "permissionMode": self.mode,
                "apiKeySource": "none",
                "claude_code_version": self.version,
                "uuid": str(uuid.uuid4()),
            }
        )

    def assistant(self, content: list[dict[str, Any]], **extra: Any) -> None:
        message = {"id": "msg_fake", "type": "message", "role": "assistant", "content": content}
        self.frame({"type": "assistant", "message": message, "parent_tool_use_id": None, **extra})

    def text(self, text: str) -> None:
        self.assistant([{"type": "text", "text": text}])

    def tool_round(self, ident: str, name: str, tool_input: dict[str, Any], output: str) -> None:
        self.assistant([{"type": "tool_use", "id": ident, "name": name, "input": tool_input}])
        content = [{"type": "tool_result", "tool_use_id": ident, "content": output}]
        self.frame({"type": "user", "message": {"role": "user", "content": content}})

    def result_obj(self, text: Any = None, **fields: Any) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "api_error_status": None,
            "duration_ms": 120,
            "duration_api_ms": 60,
            "num_turns": 2,
            "result": text,
            "stop_reason": "end_turn",
            "session_id": self.session_id,
            "total_cost_usd": 0.0004,
            "usage": {"input_tokens": 10, "output_tokens": 5},
            "modelUsage": {},
            "permission_denials": list(self.permission_denials),
            "terminal_reason": "completed",
            "uuid": str(uuid.uuid4()),
        }
        if self.version != CLAUDE_OLD_VERSION:
            obj.update(
                result_index=self.results,
                queued_turn_count=0,
                safety_stops=0,
                fast_mode_state="off",
                subagent_stats={"spawned": 0},
            )
        obj.update(fields)
        return obj

    def result(self, text: Any = None, **fields: Any) -> None:
        obj = self.result_obj(text, **fields)
        self.results += 1
        if self.format == "text":
            out(f"{obj.get('result', '')}\n")
        else:
            jline(obj)


# --- hooks: tool calls through the PreToolUse guard ----------------------------------------

HOOK_EVENTS = {
    "PreToolUse",
    "PostToolUse",
    "Notification",
    "UserPromptSubmit",
    "Stop",
    "SubagentStop",
    "PreCompact",
    "SessionStart",
    "SessionEnd",
}
HOOK_TYPES = {"command", "prompt", "agent", "http"}
CLAUDE_HOOK_KEYS = {"type", "command", "timeout", "onFailure", "args"}
DEFAULT_HOOK_TIMEOUT = 60.0


def _valid_matcher_entries(entries: object, hook_keys: set[str]) -> bool:
    if not isinstance(entries, list):
        return False
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) - {"matcher", "hooks"}:
            return False
        if not isinstance(entry.get("matcher", ""), str):
            return False
        hooks = entry.get("hooks")
        if not isinstance(hooks, list):
            return False
        for hook in hooks:
            if not isinstance(hook, dict) or set(hook) - hook_keys:
                return False
            if hook.get("type") not in HOOK_TYPES:
                return False
            if hook["type"] == "command" and not (
                isinstance(hook.get("command"), str) and hook["command"]
            ):
                return False
            timeout = hook.get("timeout", 1)
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
                return False
            if not isinstance(hook.get("onFailure", "block"), str):
                return False
    return True


def valid_claude_settings(settings: object) -> bool:
    """The fields the fake knows, checked the way the real CLI drops a whole bad settings."""
    if not isinstance(settings, dict):
        return False
    hooks = settings.get("hooks", {})
    if not isinstance(hooks, dict) or set(hooks) - HOOK_EVENTS:
        return False
    if not all(_valid_matcher_entries(v, CLAUDE_HOOK_KEYS) for v in hooks.values()):
        return False
    permissions = settings.get("permissions", {})
    if not isinstance(permissions, dict):
        return False
    return all(
        isinstance(v, list) and all(isinstance(r, str) for r in v)
        for k, v in permissions.items()
        if k in ("allow", "deny", "ask")
    )


def claude_hooks(opts: dict[str, Any]) -> list[dict[str, Any]]:
    """The PreToolUse matcher entries of --settings; none when the settings are invalid."""
    raw = opts.get("--settings")
    if raw is None:
        return []
    try:
        if os.path.exists(raw):
            with open(raw, encoding="utf-8") as fh:
                raw = fh.read()
        settings = json.loads(raw)
    except (OSError, ValueError):
        return []
    if not valid_claude_settings(settings):
        return []
    entries: list[dict[str, Any]] = settings.get("hooks", {}).get("PreToolUse", [])
    return entries


def codex_hooks(opts: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``hooks.PreToolUse`` entries of the -c overrides; none unless they parse."""
    import tomllib

    entries: list[dict[str, Any]] = []
    for item in opts["config"]:
        key, eq, value = item.partition("=")
        if key.strip() != "hooks.PreToolUse" or not eq:
            continue
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            return []
        if not _valid_matcher_entries(parsed, {"type", "command", "timeout"}):
            return []
        entries.extend(parsed)
    return entries


def matching_hooks(entries: list[dict[str, Any]], tool_name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for entry in entries:
        matcher = entry.get("matcher", "")
        if matcher in ("", "*") or re.fullmatch(matcher, tool_name):
            found.extend(h for h in entry["hooks"] if h.get("type") == "command")
    return found


def run_hook(
    hook: dict[str, Any], payload: dict[str, Any], env: dict[str, str], sc: Scenario
) -> dict[str, Any]:
    """Run one command hook the way the CLIs do; what it said, as a dict."""
    timeout = float(sc.get("hook_timeout", hook.get("timeout", DEFAULT_HOOK_TIMEOUT)))
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", hook["command"]],
            input=json.dumps(payload).encode(),
            capture_output=True,
            timeout=timeout,
            env=env,
            cwd=os.getcwd(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"exit": None, "stdout": "", "stderr": "", "timed_out": True}
    return {
        "exit": done.returncode,
        "stdout": done.stdout.decode("utf-8", "replace"),
        "stderr": done.stderr.decode("utf-8", "replace"),
        "timed_out": False,
    }


def hook_decision(said: dict[str, Any]) -> tuple[str | None, str]:
    """``("deny"|"allow"|None, reason)`` from a hook's stdout JSON."""
    try:
        value = json.loads(said["stdout"])
    except ValueError:
        return None, ""
    output = value.get("hookSpecificOutput") if isinstance(value, dict) else None
    if not isinstance(output, dict):
        return None, ""
    decision = output.get("permissionDecision")
    reason = output.get("permissionDecisionReason")
    return (decision if isinstance(decision, str) else None), (
        reason if isinstance(reason, str) else ""
    )


def judge_claude(hook: dict[str, Any], said: dict[str, Any], version: str) -> dict[str, Any]:
    """Claude's reading of one hook run: refused or not, and the text the model would see."""
    decision, reason = hook_decision(said) if said["exit"] == 0 else (None, "")
    verdict: dict[str, Any] = {"allow_emitted": decision == "allow"}
    if said["exit"] == 0 and decision == "deny":
        return {**verdict, "outcome": "denied", "reason": reason}
    if said["exit"] == 2:
        return {**verdict, "outcome": "denied", "reason": f"[{hook['command']}]: {said['stderr']}"}
    if said["exit"] == 0:
        return {**verdict, "outcome": "ran"}
    if hook.get("onFailure") == "block" and version != CLAUDE_OLD_VERSION:
        return {
            **verdict,
            "outcome": "blocked",
            "reason": 'failed; blocking because onFailure is "block"',
        }
    return {**verdict, "outcome": "ran", "no_verdict": True}


def judge_codex(said: dict[str, Any]) -> dict[str, Any]:
    """Codex's reading (inferred where ANALYSIS.md §2.4 says it was not exercised)."""
    decision, reason = hook_decision(said) if said["exit"] == 0 else (None, "")
    verdict: dict[str, Any] = {"allow_emitted": decision == "allow"}
    if said["exit"] == 0 and decision == "deny" and reason:
        return {**verdict, "outcome": "denied", "reason": reason}
    if said["exit"] == 2 and said["stderr"].strip():
        return {**verdict, "outcome": "denied", "reason": said["stderr"].strip()}
    return {**verdict, "outcome": "ran"}


def perform_tool(name: str, tool_input: dict[str, Any], sc: Scenario) -> tuple[bool, str]:
    """What an allowed tool returns: synthetic, or the real file for Read/Write with perform."""
    if not sc.get("perform"):
        return False, f"{name} ran"
    if name == "Bash":
        # A real child process, as the real CLI's Bash tool starts one.
        done = subprocess.run(
            ["/bin/sh", "-c", str(tool_input.get("command", ""))],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=60,
            check=False,
        )
        return done.returncode != 0, (done.stdout + done.stderr)[:4000]
    path = str(tool_input.get("file_path", ""))
    try:
        if name == "Read":
            with open(path, encoding="utf-8", errors="replace") as fh:
                return False, fh.read(4000)
        if name == "Write":
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(str(tool_input.get("content", "")))
            return False, f"File created successfully at: {path}"
    except OSError as exc:
        return True, f"<tool_use_error>{exc.strerror}</tool_use_error>"
    return False, f"{name} ran"


def claude_tool_calls(o: ClaudeOut, sc: Scenario) -> None:
    cwd = os.getcwd()
    slug = re.sub(r"[^A-Za-z0-9]", "-", cwd)
    env = {
        **os.environ,
        "CLAUDE_PROJECT_DIR": cwd,
        "CLAUDECODE": "1",
        "CLAUDE_CODE_SESSION_ID": o.session_id,
        "CLAUDE_PID": str(os.getpid()),
        "CLAUDE_CODE_ENTRYPOINT": "sdk-cli",
    }
    prompt_id = str(uuid.uuid4())
    calls = []
    for n, tool in enumerate(sc["tools"]):
        name = tool["tool_name"]
        tool_input = tool.get("tool_input", {})
        ident = tool.get("tool_use_id", f"toolu_fake_g{n:02d}")
        o.assistant([{"type": "tool_use", "id": ident, "name": name, "input": tool_input}])
        payload: dict[str, Any] = {
            "session_id": o.session_id,
            "transcript_path": os.path.expanduser(
                f"~/.claude/projects/{slug}/{o.session_id}.jsonl"
            ),
            "cwd": cwd,
            "prompt_id": prompt_id,
            "permission_mode": o.mode,
            "hook_event_name": "PreToolUse",
            "tool_name": name,
            "tool_input": tool_input,
            "tool_use_id": ident,
        }
        if o.version != CLAUDE_OLD_VERSION:
            payload["effort"] = {"level": "medium"}
        call: dict[str, Any] = {"tool_use_id": ident, "tool_name": name, "outcome": "ran"}
        hooks = matching_hooks(o.hooks, name)
        call["hooks_run"] = len(hooks)
        for hook in hooks:
            said = run_hook(hook, payload, env, sc)
            verdict = judge_claude(hook, said, o.version)
            call.update(hook_exit=said["exit"], hook_stdout=said["stdout"], **verdict)
            call["allow_emitted"] = call.get("allow_emitted", False) or verdict["allow_emitted"]
            if verdict.get("no_verdict") and o.version != CLAUDE_OLD_VERSION:
                o.frame(
                    {
                        "type": "system",
                        "subtype": "informational",
                        "tag": "hook_no_verdict",
                        "text": "A hook didn't answer in time, so it didn't check this action.",
                    }
                )
            if verdict["outcome"] != "ran":
                break
        if call["outcome"] == "ran":
            is_error, output = perform_tool(name, tool_input, sc)
        else:
            is_error = True
            reason = call.get("reason", "")
            output = (
                reason
                if o.version == CLAUDE_OLD_VERSION
                else (f"PreToolUse:{name} hook error: {reason}")
            )
            o.permission_denials.append(
                {"tool_name": name, "tool_use_id": ident, "tool_input": tool_input}
            )
        content = [
            {"type": "tool_result", "tool_use_id": ident, "content": output, "is_error": is_error}
        ]
        o.frame({"type": "user", "message": {"role": "user", "content": content}})
        o.tool_outputs.append(output)
        calls.append(call)
    record_tool_calls(calls, hooks_active=bool(o.hooks))


def codex_tool_calls(o: CodexOut, sc: Scenario) -> None:
    hooks_on = o.trust_bypassed and bool(o.hooks)
    calls = []
    for tool in sc["tools"]:
        name = tool["tool_name"]
        tool_input = tool.get("tool_input", {})
        ident = tool.get("tool_use_id", f"exec-{uuid.uuid4()}")
        payload = {
            "session_id": o.thread_id,
            "turn_id": o.turn_id,
            "transcript_path": os.path.expanduser(f"~/.codex/sessions/rollout-{o.thread_id}.jsonl"),
            "cwd": os.getcwd(),
            "hook_event_name": "PreToolUse",
            "model": "gpt-fake-1",
            "permission_mode": "bypassPermissions",
            "tool_name": name,
            "tool_input": tool_input,
            "tool_use_id": ident,
        }
        call: dict[str, Any] = {"tool_use_id": ident, "tool_name": name, "outcome": "ran"}
        hooks = matching_hooks(o.hooks, name) if hooks_on else []
        call["hooks_run"] = len(hooks)
        for hook in hooks:
            said = run_hook(hook, payload, dict(os.environ), sc)
            verdict = judge_codex(said)
            call.update(hook_exit=said["exit"], hook_stdout=said["stdout"], **verdict)
            if verdict["outcome"] != "ran":
                break
        if call["outcome"] == "ran":
            # A denied call leaves no item at all in the real stream.
            if name == "apply_patch":
                patch = str(tool_input.get("command", ""))
                changes = [
                    {"path": m.group(2), "kind": m.group(1).split()[0].lower()}
                    for m in re.finditer(
                        r"^\*\*\* (Add File|Update File|Delete File): (.+)$", patch, re.MULTILINE
                    )
                ]
                o.item({"type": "file_change", "changes": changes, "status": "completed"})
            else:
                # ``perform``: the command runs as a real child process, as Codex's shell runs it.
                failed, output = perform_tool("Bash", tool_input, sc)
                output = output if sc.get("perform") else ""
                o.tool_outputs.append(output)
                o.item(
                    {
                        "type": "command_execution",
                        "command": f"/bin/bash -lc {json.dumps(str(tool_input.get('command')))}",
                        "aggregated_output": output,
                        "exit_code": 1 if failed else 0,
                        "status": "completed",
                    },
                    started=True,
                )
        calls.append(call)
    record_tool_calls(calls, hooks_active=hooks_on)


def record_tool_calls(calls: list[dict[str, Any]], *, hooks_active: bool) -> None:
    path = os.environ.get("FAKE_AGENT_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            entry = {"tool_calls": calls, "hooks_active": hooks_active, "pid": os.getpid()}
            fh.write(json.dumps(entry) + "\n")


# --- claude: scenarios ------------------------------------------------------------------------


def claude_happy(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    o.init()
    if "tools" in sc:
        claude_tool_calls(o, sc)
    elif o.hooks:
        # Like the real CLI, every tool call goes through the configured hooks first.
        default_tools = [
            {
                "tool_name": "Read",
                "tool_input": {"file_path": os.path.join(os.getcwd(), "notes.txt")},
                "tool_use_id": "toolu_fake_01",
            },
            {
                "tool_name": "Glob",
                "tool_input": {"pattern": "*.txt"},
                "tool_use_id": "toolu_fake_02",
            },
        ]
        claude_tool_calls(o, {**sc, "tools": default_tools})
    else:
        o.tool_round(
            "toolu_fake_01",
            "Read",
            {"file_path": os.path.join(os.getcwd(), "notes.txt")},
            "1\tnotes",
        )
        o.tool_round("toolu_fake_02", "Glob", {"pattern": "**/*.txt"}, "notes.txt")
    # ``report``: the answer is what the tools returned, as a model quoting them would say it.
    answer = "\n".join(o.tool_outputs) if sc.get("report") else answer_text(prompt, sc)
    o.text(answer)
    o.result(answer)
    return 0


def claude_unauthenticated(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    text = "Not logged in · Please run /login"
    o.init()
    o.assistant([{"type": "text", "text": text}], error="authentication_failed")
    reason = "completed" if o.version == CLAUDE_OLD_VERSION else "api_error"
    o.result(text, is_error=True, num_turns=1, terminal_reason=reason, total_cost_usd=0)
    return 1


def claude_invalid_key(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    o.init()
    text = "Invalid API key · Fix external API key"
    o.result(text, is_error=True, api_error_status=401, terminal_reason="api_error")
    return 1


def claude_hang(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    time.sleep(float(sc.get("seconds", 3600)))
    return 0


def claude_slow(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    o.init()
    time.sleep(float(sc.get("seconds", 2)))
    return claude_happy_tail(o, prompt, sc)


def claude_happy_tail(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    answer = answer_text(prompt, sc)
    o.text(answer)
    o.result(answer)
    return 0


def claude_linger(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    # A background Bash task outlives the answer: a second result comes when it ends.
    o.init()
    answer = answer_text(prompt, sc)
    o.tool_round("toolu_fake_bg", "Bash", {"command": "sleep 25", "run_in_background": True}, "ok")
    o.text(answer)
    o.result(answer)
    time.sleep(float(sc.get("seconds", 20)))
    o.text("SECOND " + answer)
    o.result("SECOND " + answer, result_index=1)
    return 0


def claude_max_turns(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    o.init()
    obj = o.result_obj(
        subtype="error_max_turns",
        is_error=True,
        terminal_reason="max_turns",
        stop_reason="tool_use",
        errors=[f"Reached maximum number of turns ({o.max_turns})"],
    )
    del obj["result"]
    jline(obj)
    return 1


def claude_api_error(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    o.init()
    text = "API Error: Repeated 529 Overloaded errors. The API is at capacity."
    o.result(text, is_error=True, api_error_status=529, terminal_reason="api_error")
    return 1


def claude_session_in_use(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    err(f"Error: Session ID {o.session_id} is already in use.\n")
    return 1


def claude_no_conversation(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    err(f"No conversation found with session ID: {o.session_id}\n")
    return 1


def claude_usage_error(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    # What a 2.1.197 says to a flag value only 2.1.332 knows.
    err(
        "error: option '--permission-mode <mode>' argument 'manual' is invalid. Allowed "
        "choices are acceptEdits, bypassPermissions, default, dontAsk, plan.\n"
    )
    return 1


def claude_truncated_json(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    o.init()
    line = json.dumps(o.result_obj(answer_text(prompt, sc)))
    out(line[: len(line) // 2])
    os.kill(os.getpid(), signal.SIGKILL)
    return 137


def claude_json_array(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    jline([o.result_obj(answer_text(prompt, sc))])
    return 0


def claude_result_number(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    o.init()
    o.result(42)
    return 0


def claude_warning_first(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    out("WARNING: proceeding without a keychain\n")
    return claude_happy(o, prompt, sc)


def claude_crlf(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    o.init()
    out(json.dumps(o.result_obj(answer_text(prompt, sc))) + "\r\n")
    return 0


def claude_huge_result(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    size = int(sc.get("bytes", 1_500_000))
    answer = answer_text(prompt, sc) + " " + ("é" * (size // 2))
    o.init()
    o.result(answer)
    return 0


def claude_flood_stdout(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    total = int(sc.get("bytes", 11 * 1024 * 1024))
    o.init()
    chunk = json.dumps({"type": "system", "subtype": "informational", "pad": "x" * 900}) + "\n"
    for _ in range(total // len(chunk) + 1):
        out(chunk)
    return claude_happy_tail(o, prompt, sc)


def claude_endless_stderr(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    line = "2026-11-29T08:05:48Z ERROR api: failed to connect, retrying " + "." * 60 + "\n"
    limit = sc.get("bytes")
    written = 0
    while limit is None or written < int(limit):
        err(line)
        written += len(line)
    return claude_happy_tail(o, prompt, sc) if sc.get("then_answer", True) else 1


def claude_escapes(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    o.init()
    answer = f"{answer_text(prompt, sc)} {ESCAPES}"
    line = json.dumps(o.result_obj(answer), ensure_ascii=False).encode("utf-8")
    # Raw invalid bytes inside the JSON string, just before the closing quote of "result".
    marker = json.dumps(answer, ensure_ascii=False).encode("utf-8")
    line = line.replace(marker, marker[:-1] + INVALID_UTF8 + b'"', 1)
    out(line + b"\n")
    return 0


def claude_secrets(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    o.init()
    o.result(f"{answer_text(prompt, sc)} {SECRETS}")
    return 0


def claude_ignore_term(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    o.init()
    while True:
        o.frame({"type": "system", "subtype": "informational", "text": "still thinking"})
        time.sleep(0.05)


def claude_orphans(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    pids = spawn_orphans(sc)
    record_children(pids)
    return claude_happy(o, prompt, sc)


def claude_wrapper(o: ClaudeOut, prompt: str, sc: Scenario) -> int:
    return run_wrapper(sc)


CLAUDE_SCENARIOS: dict[str, Callable[[ClaudeOut, str, Scenario], int]] = {
    "happy": claude_happy,
    "happy_old": claude_happy,
    "ignore_stdin": claude_happy,
    "unauthenticated": claude_unauthenticated,
    "invalid_key": claude_invalid_key,
    "hang": claude_hang,
    "slow": claude_slow,
    "linger": claude_linger,
    "max_turns": claude_max_turns,
    "api_error": claude_api_error,
    "session_in_use": claude_session_in_use,
    "no_conversation": claude_no_conversation,
    "usage_error": claude_usage_error,
    "truncated_json": claude_truncated_json,
    "json_array": claude_json_array,
    "result_number": claude_result_number,
    "warning_first": claude_warning_first,
    "crlf": claude_crlf,
    "huge_result": claude_huge_result,
    "flood_stdout": claude_flood_stdout,
    "endless_stderr": claude_endless_stderr,
    "escapes": claude_escapes,
    "secrets": claude_secrets,
    "ignore_term": claude_ignore_term,
    "orphans": claude_orphans,
    "wrapper": claude_wrapper,
}


def claude_main(argv: list[str], scenario: Scenario) -> int:
    old = (
        scenario["name"] in ("happy_old", "old_cli")
        or scenario.get("version") == CLAUDE_OLD_VERSION
    )
    version = str(scenario.get("version", CLAUDE_OLD_VERSION if old else CLAUDE_VERSION))
    if argv[:1] in (["--version"], ["-v"]):
        out(f"{version} (Claude Code)\n")
        return 0
    if argv[:2] == ["auth", "status"]:
        return claude_auth_status(scenario, version)
    opts = parse_claude(argv)
    prompt = read_prompt(scenario)
    record("claude", argv, prompt, scenario)
    validate_claude(opts, version, prompt, scenario["name"])
    exit_143_on_term()
    behaviour = CLAUDE_SCENARIOS.get(scenario["name"])
    if behaviour is None:
        refuse(f"unknown scenario {scenario['name']!r}")
    if scenario.get("leave_children"):
        record_children(spawn_orphans(scenario))
    hold_until_released(scenario)
    return behaviour(ClaudeOut(opts, scenario, version), prompt, scenario)


def claude_auth_status(scenario: Scenario, version: str) -> int:
    logged_in = scenario["name"] not in ("unauthenticated", "invalid_key")
    status: dict[str, Any] = {
        "loggedIn": logged_in,
        "authMethod": "api_key" if logged_in else "none",
        "apiProvider": "firstParty",
    }
    if version != CLAUDE_OLD_VERSION:
        status["configDirectory"] = os.path.expanduser("~/.claude")
    out(json.dumps(status, indent=2) + "\n")
    if not logged_in and version != CLAUDE_OLD_VERSION:
        out("Not logged in. Run claude auth login to authenticate.\n")
    return 0 if logged_in else 1


# --- codex -----------------------------------------------------------------------------------

CODEX_FLAGS = {
    "--json",
    "--skip-git-repo-check",
    "--ephemeral",
    "--ignore-user-config",
    "--ignore-rules",
    "--strict-config",
    "--dangerously-bypass-hook-trust",
}
CODEX_VALUED = {
    "-C",
    "--cd",
    "-s",
    "--sandbox",
    "-c",
    "--config",
    "--add-dir",
    "-o",
    "--output-last-message",
    "-m",
    "--model",
    "--enable",
    "--disable",
    "-p",
    "--profile",
}
SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")


def parse_codex(argv: list[str]) -> dict[str, Any]:
    if argv[:1] != ["exec"]:
        raise CliError(f"error: unrecognized subcommand '{argv[0] if argv else ''}'", 2)
    rest = argv[1:]
    opts: dict[str, Any] = {"config": [], "positionals": [], "resume": None}
    if rest[:1] == ["resume"]:
        if len(rest) < 2 or rest[1].startswith("-"):
            raise CliError("error: the following required arguments were not provided: <ID>", 2)
        opts["resume"] = rest[1]
        rest = rest[2:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in NEVER_FLAGS:
            refuse(f"{arg} must never be passed")
        if opts["resume"] is not None and arg in ("-s", "--sandbox", "-C", "--cd", "--ephemeral"):
            raise CliError(f"error: unexpected argument '{arg}' found", 2)
        if arg in CODEX_FLAGS:
            opts[arg] = True
        elif arg in CODEX_VALUED:
            if i + 1 >= len(rest):
                raise CliError(f"error: a value is required for '{arg} <VALUE>'", 2)
            i += 1
            value = rest[i]
            if arg in ("-c", "--config"):
                opts["config"].append(value)
            else:
                opts[arg] = value
        elif arg.startswith("-") and arg != "-":
            raise CliError(f"error: unexpected argument '{arg}' found", 2)
        else:
            opts["positionals"].append(arg)
        i += 1
    mode = opts.get("-s") or opts.get("--sandbox")
    if mode is not None and mode not in SANDBOX_MODES:
        raise CliError(f"error: invalid value '{mode}' for '--sandbox <SANDBOX_MODE>'", 2)
    if opts["positionals"] != ["-"]:
        refuse("the prompt must come on stdin through a single '-' argument")
    return opts


class CodexOut:
    def __init__(self, opts: dict[str, Any]) -> None:
        self.thread_id = opts["resume"] or str(uuid.uuid4())
        self.turn_id = str(uuid.uuid4())
        self.trust_bypassed = bool(opts.get("--dangerously-bypass-hook-trust"))
        self.hooks = codex_hooks(opts)
        self.items = 0
        self.tool_outputs: list[str] = []
        self.output_file = opts.get("-o") or opts.get("--output-last-message")

    def event(self, obj: dict[str, Any]) -> None:
        jline(obj)

    def item(self, item: dict[str, Any], started: bool = False) -> None:
        item = {"id": f"item_{self.items}", **item}
        self.items += 1
        if started:
            self.event({"type": "item.started", "item": {**item, "status": "in_progress"}})
        self.event({"type": "item.completed", "item": item})

    def start(self) -> None:
        self.event({"type": "thread.started", "thread_id": self.thread_id})
        if self.trust_bypassed:
            notice = (
                "`--dangerously-bypass-hook-trust` is enabled. Enabled hooks may run without "
                "review for this invocation."
            )
            # The real CLI prints the notice twice, as two items.
            self.item({"type": "error", "message": notice})
            self.item({"type": "error", "message": notice})
        self.event({"type": "turn.started"})

    def finish(self, answer: str) -> None:
        self.item({"type": "agent_message", "text": answer})
        usage = {"input_tokens": 20, "cached_input_tokens": 0, "output_tokens": 10}
        self.event({"type": "turn.completed", "usage": usage})
        self.write_last(answer)

    def fail(self, message: str) -> None:
        self.event({"type": "turn.failed", "error": {"message": message}})
        self.write_last("")

    def write_last(self, text: str) -> None:
        # On failure the real CLI leaves the -o file empty.
        if self.output_file:
            with open(self.output_file, "w", encoding="utf-8") as fh:
                fh.write(text)


def codex_happy(o: CodexOut, prompt: str, sc: Scenario) -> int:
    o.start()
    if "tools" in sc:
        codex_tool_calls(o, sc)
        # ``report``: the answer is what the commands printed, as a model quoting them would.
        o.finish("\n".join(o.tool_outputs) if sc.get("report") else answer_text(prompt, sc))
        return 0
    command = "/bin/bash -lc 'cat notes.txt'"
    o.item(
        {
            "type": "command_execution",
            "command": command,
            "aggregated_output": "notes\n",
            "exit_code": 0,
            "status": "completed",
        },
        started=True,
    )
    o.finish(answer_text(prompt, sc))
    return 0


def codex_unauthenticated(o: CodexOut, prompt: str, sc: Scenario) -> int:
    o.start()
    why = "unexpected status 401 Unauthorized: Incorrect API key provided"
    for n in range(1, 6):
        o.event({"type": "error", "message": f"Reconnecting... {n}/5 ({why})"})
    o.event({"type": "error", "message": why})
    o.fail(why)
    return 1


def codex_hang(o: CodexOut, prompt: str, sc: Scenario) -> int:
    time.sleep(float(sc.get("seconds", 3600)))
    return 0


def codex_slow(o: CodexOut, prompt: str, sc: Scenario) -> int:
    o.start()
    deadline = time.monotonic() + float(sc.get("seconds", 2))
    while time.monotonic() < deadline:
        msg = "Reconnecting... waiting for network (Connection failed: error sending request)"
        o.event({"type": "error", "message": msg})
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))
    o.finish(answer_text(prompt, sc))
    return 0


def codex_linger(o: CodexOut, prompt: str, sc: Scenario) -> int:
    o.start()
    o.finish(answer_text(prompt, sc))
    time.sleep(float(sc.get("seconds", 20)))
    return 0


def codex_api_error(o: CodexOut, prompt: str, sc: Scenario) -> int:
    o.start()
    why = "unexpected status 500 Internal Server Error: mock failure"
    o.event({"type": "error", "message": why})
    o.fail(why)
    return 1


def codex_usage_error(o: CodexOut, prompt: str, sc: Scenario) -> int:
    err("error: unexpected argument '--dangerously-bypass-hook-trust' found\n")
    return 2


def codex_no_thread(o: CodexOut, prompt: str, sc: Scenario) -> int:
    err(f"Error: no saved session found for thread {o.thread_id}\n")
    return 1


def codex_warning_first(o: CodexOut, prompt: str, sc: Scenario) -> int:
    out("WARNING: proceeding, even though we could not update PATH\n")
    return codex_happy(o, prompt, sc)


def codex_crlf(o: CodexOut, prompt: str, sc: Scenario) -> int:
    for obj in (
        {"type": "thread.started", "thread_id": o.thread_id},
        {
            "type": "item.completed",
            "item": {"id": "item_0", "type": "agent_message", "text": answer_text(prompt, sc)},
        },
        {"type": "turn.completed", "usage": {}},
    ):
        out(json.dumps(obj) + "\r\n")
    return 0


def codex_truncated_json(o: CodexOut, prompt: str, sc: Scenario) -> int:
    o.start()
    line = json.dumps({"type": "item.completed", "item": {"type": "agent_message", "text": "x"}})
    out(line[: len(line) // 2])
    os.kill(os.getpid(), signal.SIGKILL)
    return 137


def codex_huge_result(o: CodexOut, prompt: str, sc: Scenario) -> int:
    o.start()
    o.finish(answer_text(prompt, sc) + " " + "é" * (int(sc.get("bytes", 1_500_000)) // 2))
    return 0


def codex_flood_stdout(o: CodexOut, prompt: str, sc: Scenario) -> int:
    o.start()
    chunk = json.dumps({"type": "error", "message": "Reconnecting... " + "x" * 900}) + "\n"
    for _ in range(int(sc.get("bytes", 11 * 1024 * 1024)) // len(chunk) + 1):
        out(chunk)
    o.finish(answer_text(prompt, sc))
    return 0


def codex_endless_stderr(o: CodexOut, prompt: str, sc: Scenario) -> int:
    line = "2026-11-29T08:05:48Z ERROR codex_api::endpoint::responses_websocket: failed\n"
    limit = sc.get("bytes")
    written = 0
    while limit is None or written < int(limit):
        err(line)
        written += len(line)
    return codex_happy(o, prompt, sc)


def codex_escapes(o: CodexOut, prompt: str, sc: Scenario) -> int:
    o.start()
    answer = f"{answer_text(prompt, sc)} {ESCAPES}"
    item = {"id": "item_0", "type": "agent_message", "text": answer}
    line = json.dumps({"type": "item.completed", "item": item}, ensure_ascii=False).encode()
    text = json.dumps(answer, ensure_ascii=False).encode()
    out(line.replace(text, text[:-1] + INVALID_UTF8 + b'"', 1) + b"\n")
    o.event({"type": "turn.completed", "usage": {}})
    return 0


def codex_secrets(o: CodexOut, prompt: str, sc: Scenario) -> int:
    o.start()
    o.finish(f"{answer_text(prompt, sc)} {SECRETS}")
    return 0


def codex_ignore_term(o: CodexOut, prompt: str, sc: Scenario) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    o.start()
    while True:
        o.event({"type": "error", "message": "Reconnecting... waiting for network"})
        time.sleep(0.05)


def codex_orphans(o: CodexOut, prompt: str, sc: Scenario) -> int:
    record_children(spawn_orphans(sc))
    return codex_happy(o, prompt, sc)


def codex_wrapper(o: CodexOut, prompt: str, sc: Scenario) -> int:
    return run_wrapper(sc)


CODEX_SCENARIOS: dict[str, Callable[[CodexOut, str, Scenario], int]] = {
    "happy": codex_happy,
    "ignore_stdin": codex_happy,
    "unauthenticated": codex_unauthenticated,
    "hang": codex_hang,
    "slow": codex_slow,
    "linger": codex_linger,
    "api_error": codex_api_error,
    "usage_error": codex_usage_error,
    "no_thread": codex_no_thread,
    "warning_first": codex_warning_first,
    "crlf": codex_crlf,
    "truncated_json": codex_truncated_json,
    "huge_result": codex_huge_result,
    "flood_stdout": codex_flood_stdout,
    "endless_stderr": codex_endless_stderr,
    "escapes": codex_escapes,
    "secrets": codex_secrets,
    "ignore_term": codex_ignore_term,
    "orphans": codex_orphans,
    "wrapper": codex_wrapper,
}


def codex_main(argv: list[str], scenario: Scenario) -> int:
    if argv[:1] in (["--version"], ["-V"]):
        out(f"codex-cli {scenario.get('version', CODEX_VERSION)}\n")
        return 0
    if argv[:2] == ["login", "status"]:
        if scenario["name"] == "unauthenticated":
            err("Not logged in\n")
            return 1
        out("Logged in using an API key\n")
        return 0
    opts = parse_codex(argv)
    if not opts.get("--skip-git-repo-check"):
        raise CliError(
            "Not inside a trusted directory and --skip-git-repo-check was not specified."
        )
    err("Reading prompt from stdin...\n")
    prompt = read_prompt(scenario)
    record("codex", argv, prompt, scenario)
    refuse_prompt_in_argv(argv, prompt)
    if not prompt.strip() and scenario["name"] != "ignore_stdin":
        raise CliError("No prompt provided via stdin.")
    behaviour = CODEX_SCENARIOS.get(scenario["name"])
    if behaviour is None:
        refuse(f"unknown scenario {scenario['name']!r}")
    if scenario.get("leave_children"):
        record_children(spawn_orphans(scenario))
    hold_until_released(scenario)
    return behaviour(CodexOut(opts), prompt, scenario)


# --- shared lifecycle behaviours ---------------------------------------------------------------


def record_children(pids: list[int]) -> None:
    path = os.environ.get("FAKE_AGENT_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"children": pids, "pid": os.getpid()}) + "\n")


def run_wrapper(sc: Scenario) -> int:
    """Like Node spawning the native codex: the worker does the work; the wrapper only waits.

    ``detach`` puts the worker in its own session and lets the wrapper exit at once, so only
    the sweep can end the worker.
    """
    env = dict(os.environ, FAKE_AGENT_WORKER="1")
    worker = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__)],
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=bool(sc.get("detach")),
    )
    record_children([worker.pid])
    if sc.get("detach"):
        return 0
    return worker.wait()


def worker_main() -> int:
    # Keeps writing to the stdout it inherited until killed.
    while True:
        out('{"type":"system","subtype":"informational","text":"worker busy"}\n')
        time.sleep(0.05)


def main() -> int:
    if os.environ.get("FAKE_AGENT_WORKER"):
        return worker_main()
    kind = os.environ.get("FAKE_AGENT_KIND") or os.path.basename(sys.argv[0])
    scenario = load_scenario()
    try:
        if kind == "claude":
            return claude_main(sys.argv[1:], scenario)
        if kind == "codex":
            return codex_main(sys.argv[1:], scenario)
        refuse(f"run me as 'claude' or 'codex', not {kind!r}")
    except Refused as exc:
        err(f"fake-agent: refused: {exc}\n")
        return 2
    except CliError as exc:
        err(f"{exc}\n")
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
