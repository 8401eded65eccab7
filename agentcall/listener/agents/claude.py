"""Claude Code (``claude -p``): argv, the stream-json parser, and what a finished run means.

The argv is the one verified in ``reference/agent-clis/ANALYSIS.md`` §4: the prompt goes to
stdin and never into argv (several flags are variadic and would swallow it), tools are named
explicitly with ``--tools`` (pre-approval alone does not remove any), and write access is
approved only under the workdir. ``--bare``, ``--safe-mode``, ``--dangerously-skip-permissions``
and bare ``Read``/``Write``/``Edit`` allow rules are never produced: each would switch the
guard off or widen a tool to the whole disk.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentcall.listener.agents.base import (
    AgentAnswer,
    AgentFailure,
    AgentParser,
    AgentSpec,
    FailureKind,
    Invocation,
    Outcome,
    clean_text,
    decode_json_line,
    detail_with_tail,
    encode_prompt,
    sanitize_detail,
)
from agentcall.listener.connectors import tool_name_part
from agentcall.listener.runner import RunResult

# Capability -> built-in tool names for --tools, in a fixed order so argv is deterministic.
TOOLS_BY_CAPABILITY: dict[str, tuple[str, ...]] = {
    "read": ("Read", "Grep", "Glob"),
    "write": ("Write", "Edit", "NotebookEdit"),
    "exec": ("Bash",),
    "fetch": ("WebFetch", "WebSearch"),
}
_CAPABILITY_ORDER = ("read", "write", "exec", "fetch")
# Fails in seconds on a 401/429 instead of retrying silently past the kill timer.
BASE_ENV = {"CLAUDE_CODE_MAX_RETRIES": "2", "DISABLE_AUTOUPDATER": "1"}
# Characters whose effect inside an Edit(...) rule was never verified; refusing them keeps a
# rule from silently meaning something wider.
_UNSAFE_RULE_CHARS = frozenset(" ,()\t\n\"'\\")

_UNAUTHENTICATED = re.compile(r"Not logged in|Invalid API key", re.IGNORECASE)
_RESUME_FAILED = re.compile(
    r"is already in use|No conversation found with session ID", re.IGNORECASE
)
_USAGE_ERROR = re.compile(
    r"^.*(?:option '[^'\n]*' argument '[^'\n]*' is invalid|error: unknown option '[^'\n]*').*$",
    re.MULTILINE,
)


def allowed_rules(spec: AgentSpec) -> tuple[str, ...]:
    """The scoped ``--allowedTools`` rules for the capabilities (never a bare Read or Write)."""
    rules: list[str] = []
    if "write" in spec.tools:
        workdir = spec.workdir.rstrip("/")
        if _UNSAFE_RULE_CHARS & set(workdir):
            raise ValueError("the workdir path has characters an Edit() rule cannot carry")
        # "//" marks an absolute path in Claude's rule syntax.
        rules.append(f"Edit(/{workdir}/**)")
    if "exec" in spec.tools:
        rules.append("Bash")
    if "fetch" in spec.tools:
        rules.extend(("WebFetch", "WebSearch"))
    # MCP tools cannot be wildcarded otherwise; each granted server is approved as a whole.
    rules.extend(f"mcp__{tool_name_part(name)}__*" for name in spec.mcp_servers)
    return tuple(rules)


def mcp_config(spec: AgentSpec) -> str | None:
    """The ``--mcp-config`` JSON for the spec's servers, or None when there are none."""
    if not spec.mcp_servers:
        return None
    servers = {name: dict(config) for name, config in spec.mcp_servers.items()}
    return json.dumps({"mcpServers": servers}, separators=(",", ":"), ensure_ascii=False)


def tool_names(spec: AgentSpec) -> tuple[str, ...]:
    """The built-in tools the run may have at all (``--tools``)."""
    names: list[str] = []
    for capability in _CAPABILITY_ORDER:
        if capability in spec.tools:
            names.extend(TOOLS_BY_CAPABILITY[capability])
    return tuple(names)


class ClaudeParser:
    """Reads ``--output-format stream-json`` lines; the first ``result`` line wins."""

    def __init__(self) -> None:
        self.result: dict[str, Any] | None = None
        self.results_seen = 0
        self.ignored_lines = 0
        self.auth_failed = False
        self.cli_version: str | None = None
        self.init_tools: tuple[str, ...] | None = None
        self._session_id: str | None = None
        self._tool_use_ids: list[str] = []
        self._seen: set[str] = set()

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def session_id(self) -> str | None:
        return self._session_id

    @property
    def tool_use_ids(self) -> tuple[str, ...]:
        return tuple(self._tool_use_ids)

    def feed_line(self, line: bytes) -> None:
        frame = decode_json_line(line)
        if not isinstance(frame, dict):
            if line.strip():
                self.ignored_lines += 1
            return
        kind = frame.get("type")
        if kind == "system" and frame.get("subtype") == "init":
            self._take_session(frame)
            version = frame.get("claude_code_version")
            if isinstance(version, str):
                self.cli_version = version
            tools = frame.get("tools")
            if isinstance(tools, list):
                self.init_tools = tuple(t for t in tools if isinstance(t, str))
        elif kind == "assistant":
            if frame.get("error") == "authentication_failed":
                self.auth_failed = True
            self._take_tool_uses(frame.get("message"))
        elif kind == "result":
            self.results_seen += 1
            if self.result is None:
                self.result = frame
                self._take_session(frame)

    def _take_session(self, frame: dict[str, Any]) -> None:
        session = frame.get("session_id")
        if isinstance(session, str) and self._session_id is None:
            self._session_id = session

    def _take_tool_uses(self, message: object) -> None:
        if not isinstance(message, dict):
            return
        content = message.get("content")
        if not isinstance(content, list):
            return
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                ident = block.get("id")
                if isinstance(ident, str) and ident not in self._seen:
                    self._seen.add(ident)
                    self._tool_use_ids.append(ident)


class ClaudeAdapter:
    """``claude -p`` with stream-json output."""

    kind = "claude"

    def build(self, spec: AgentSpec, prompt: str) -> Invocation:
        argv: list[str] = [
            spec.binary,
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--permission-mode",
            "dontAsk",
            "--tools",
            ",".join(tool_names(spec)),
        ]
        rules = allowed_rules(spec)
        if rules:
            argv += ["--allowedTools", ",".join(rules)]
        if spec.read_roots:
            argv += ["--add-dir", *spec.read_roots]
        if spec.settings_json is not None:
            # "" drops user/project/local settings: their disableAllHooks or allow rules
            # would otherwise switch the guard off or widen the task.
            argv += ["--settings", spec.settings_json, "--setting-sources", ""]
        # Strict: none of the owner's MCP servers but those the task names (in --mcp-config).
        argv.append("--strict-mcp-config")
        servers = mcp_config(spec)
        if servers is not None:
            # By path when the caller wrote the private file (the listener always does).
            argv += ["--mcp-config", spec.mcp_config_file or servers]
        argv += ["--max-turns", str(spec.max_turns)]
        if spec.resume_session is not None:
            argv += ["--resume", spec.resume_session]
        elif not spec.keep_session:
            argv.append("--no-session-persistence")
        env = {**BASE_ENV, **spec.extra_env}
        return Invocation(
            argv=tuple(argv), env_additions=env, stdin_bytes=encode_prompt(prompt), cwd=spec.workdir
        )

    def new_parser(self) -> ClaudeParser:
        return ClaudeParser()

    def interpret(self, result: RunResult, parser: AgentParser) -> Outcome:
        if not isinstance(parser, ClaudeParser):
            raise TypeError("the Claude adapter needs its own parser")
        if parser.result is not None:
            return _from_result(parser.result, parser)
        if result.cancelled:
            return AgentFailure(FailureKind.CANCELLED, "the run was cancelled")
        if result.timed_out:
            return AgentFailure(FailureKind.TIMEOUT, "no answer before the kill timer")
        if result.stdout_truncated:
            return AgentFailure(
                FailureKind.OUTPUT_TOO_LARGE, "the agent printed too much before answering"
            )
        stderr = result.stderr.decode("utf-8", "replace")
        if _RESUME_FAILED.search(stderr):
            return AgentFailure(
                FailureKind.RESUME_FAILED, "the agent CLI could not resume the conversation"
            )
        usage = _USAGE_ERROR.search(stderr)
        if usage:
            return AgentFailure(
                FailureKind.CLI_TOO_OLD, sanitize_detail("agent CLI too old: " + usage.group(0))
            )
        stdout = result.stdout[-4096:].decode("utf-8", "replace")
        if parser.auth_failed or _UNAUTHENTICATED.search(stderr) or _UNAUTHENTICATED.search(stdout):
            return AgentFailure(FailureKind.UNAUTHENTICATED, "the agent CLI is not logged in")
        how = f"signal {result.signal}" if result.signal is not None else f"code {result.exit_code}"
        detail = detail_with_tail(f"agent exited with {how} without a result", result.stderr)
        return AgentFailure(FailureKind.AGENT_ERROR, detail)


def _from_result(frame: dict[str, Any], parser: ClaudeParser) -> Outcome:
    is_error = frame.get("is_error")
    text = frame.get("result")
    # is_error is trusted over subtype: "Not logged in" arrives as subtype "success".
    failed = is_error is True or (
        not isinstance(is_error, bool) and frame.get("subtype") != "success"
    )
    if failed:
        status = frame.get("api_error_status")
        if (
            parser.auth_failed
            or status == 401
            or (isinstance(text, str) and _UNAUTHENTICATED.search(text))
        ):
            return AgentFailure(
                FailureKind.UNAUTHENTICATED,
                sanitize_detail(text if isinstance(text, str) else "not logged in"),
            )
        return AgentFailure(FailureKind.AGENT_ERROR, _error_detail(frame))
    if not isinstance(text, str):
        return AgentFailure(FailureKind.AGENT_ERROR, "the result line carries no answer text")
    return AgentAnswer(clean_text(text), parser.session_id, parser.tool_use_ids)


def _error_detail(frame: dict[str, Any]) -> str:
    parts: list[str] = []
    text = frame.get("result")
    if isinstance(text, str) and text.strip():
        parts.append(text)
    errors = frame.get("errors")
    if isinstance(errors, list):
        parts.extend(e for e in errors if isinstance(e, str) and e.strip())
    extra = [
        f"{key}={frame[key]}"
        for key in ("subtype", "terminal_reason", "api_error_status")
        if isinstance(frame.get(key), str | int) and not isinstance(frame.get(key), bool)
    ]
    if not parts:
        parts.append("the agent reported an error")
    return sanitize_detail("; ".join(parts) + (f" ({', '.join(extra)})" if extra else ""))


ADAPTER = ClaudeAdapter()
