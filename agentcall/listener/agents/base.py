"""What every agent adapter shares: the spec, the invocation, the outcome, and text helpers.

An adapter is pure: it turns an :class:`AgentSpec` and a prompt into an :class:`Invocation`
(argv, env additions, stdin bytes), offers an incremental parser for the agent's stdout, and
interprets a finished :class:`~agentcall.listener.runner.RunResult` into an
:class:`AgentAnswer` or an :class:`AgentFailure`. Nothing here touches a process or a file.
"""

from __future__ import annotations

import enum
import json
import os
import re
import types
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import attrs

from agentcall.listener.connectors import SERVER_NAME_RE
from agentcall.listener.runner import RunResult
from agentcall.safetext import safe_cell, without_surrogates

CAPABILITIES = frozenset({"read", "write", "fetch", "exec"})
MAX_DETAIL_CHARS = 300

# Session and thread ids go into argv: a value starting with "-" would be read as a flag.
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class FailureKind(enum.StrEnum):
    """Why an agent run produced no answer."""

    UNAUTHENTICATED = "unauthenticated"
    AGENT_ERROR = "agent_error"
    TIMEOUT = "timeout"
    CLI_TOO_OLD = "cli_too_old"
    RESUME_FAILED = "resume_failed"
    OUTPUT_TOO_LARGE = "output_too_large"
    CANCELLED = "cancelled"


def _frozen_env(value: Mapping[str, str]) -> Mapping[str, str]:
    return types.MappingProxyType(dict(value))


def _to_tools(value: Iterable[str]) -> frozenset[str]:
    if isinstance(value, str):
        raise ValueError("tools must be a collection of capability names")
    return frozenset(value)


def _to_roots(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ValueError("read_roots must be a collection of paths")
    return tuple(value)


def _check_absolute(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not os.path.isabs(value):
        raise ValueError(f"{attribute.name} must be an absolute path")


def _check_absolute_or_none(_inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not os.path.isabs(value)):
        raise ValueError(f"{attribute.name} must be an absolute path")


def _check_tools(_inst: object, _attribute: object, value: frozenset[str]) -> None:
    unknown = value - CAPABILITIES
    if unknown:
        raise ValueError(f"unknown tool capabilities: {sorted(unknown)}")


def _check_roots(_inst: object, _attribute: object, value: tuple[str, ...]) -> None:
    for root in value:
        if not isinstance(root, str) or not os.path.isabs(root):
            raise ValueError("read_roots must be absolute paths")


def _check_turns(_inst: object, _attribute: object, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1000:
        raise ValueError("max_turns must be an integer from 1 to 1000")


def _check_env(_inst: object, _attribute: object, value: Mapping[str, str]) -> None:
    for key, val in value.items():
        if not key or "=" in key or "\0" in key or "\0" in val:
            raise ValueError("extra_env has an invalid variable")


def _check_settings(_inst: object, _attribute: object, value: str | None) -> None:
    # Claude takes a --settings value that does not parse as JSON for a file path and
    # silently runs without the guard, so anything but a JSON object is refused here.
    if value is None:
        return
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ValueError("settings_json is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise ValueError("settings_json must be a JSON object")


def _to_servers(value: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Mapping[str, Any]]:
    if not isinstance(value, Mapping):
        raise ValueError("mcp_servers must map server names to their configurations")
    try:
        # A deep, JSON-only copy: what is checked is what goes into --mcp-config.
        copied = json.loads(json.dumps(dict(value)))
    except (TypeError, ValueError, RecursionError):
        raise ValueError("mcp_servers is not JSON") from None
    return types.MappingProxyType(copied)


def _check_servers(
    _inst: object, _attribute: object, value: Mapping[str, Mapping[str, Any]]
) -> None:
    for name, config in value.items():
        # The name goes into an --allowedTools rule: a comma or blank would widen it.
        if not SERVER_NAME_RE.match(name):
            raise ValueError("mcp_servers has an invalid server name")
        if not isinstance(config, dict):
            raise ValueError("an MCP server configuration must be a JSON object")


def _check_session(
    _inst: object, attribute: attrs.Attribute[str | None], value: str | None
) -> None:
    if value is not None and not _SESSION_ID.match(value):
        raise ValueError(f"{attribute.name} is not a plausible session id")


@attrs.frozen
class AgentSpec:
    """How one call's agent is to be run: which binary, where, with which capabilities.

    ``keep_session`` makes the run resumable later (Claude without
    ``--no-session-persistence``, Codex without ``--ephemeral``); ``resume_session`` continues
    an earlier one. ``codex_hook_config`` is the TOML value of ``hooks.PreToolUse`` for Codex,
    the counterpart of ``settings_json`` for Claude. ``mcp_servers`` are the owner's MCP
    servers this run may use, by name (Claude only; their configurations may hold tokens, so
    they stay out of the repr).
    """

    binary: str = attrs.field(validator=_check_absolute)
    workdir: str = attrs.field(validator=_check_absolute)
    tools: frozenset[str] = attrs.field(converter=_to_tools, validator=_check_tools)
    read_roots: tuple[str, ...] = attrs.field(
        default=(), converter=_to_roots, validator=_check_roots
    )
    max_turns: int = attrs.field(default=30, validator=_check_turns)
    extra_env: Mapping[str, str] = attrs.field(
        factory=dict, converter=_frozen_env, validator=_check_env
    )
    settings_json: str | None = attrs.field(default=None, validator=_check_settings)
    resume_session: str | None = attrs.field(default=None, validator=_check_session)
    keep_session: bool = False
    codex_hook_config: str | None = None
    mcp_servers: Mapping[str, Mapping[str, Any]] = attrs.field(
        factory=dict, converter=_to_servers, validator=_check_servers, repr=False
    )
    # A private file holding ``mcp_servers`` as ``{"mcpServers": …}``: the listener always
    # passes one, because server configs can hold tokens that must not appear in argv (ps).
    mcp_config_file: str | None = attrs.field(default=None, validator=_check_absolute_or_none)
    # The run is inside the kernel boundary (agentcall.confine): an agent whose own sandbox
    # cannot run there (Codex) is started without it.
    confined: bool = False


@attrs.frozen
class Invocation:
    """What to spawn: argv (never holding the prompt), extra env, stdin and the cwd."""

    argv: tuple[str, ...]
    env_additions: Mapping[str, str] = attrs.field(converter=_frozen_env)
    stdin_bytes: bytes
    cwd: str


@attrs.frozen
class AgentAnswer:
    """The agent answered. ``text`` is whole: redaction and the reply cap come later."""

    text: str
    session_id: str | None
    tool_use_ids: tuple[str, ...]


@attrs.frozen
class AgentFailure:
    """The agent did not answer. ``detail`` is short, single-line and free of control chars,
    and is for the owner's calls.log only: it may quote the agent's stderr or error line. The
    caller is told words chosen from ``kind`` (:func:`agentcall.listener.stages.failure_reason`).
    """

    kind: FailureKind
    detail: str


Outcome = AgentAnswer | AgentFailure


class AgentParser(Protocol):
    """An incremental reader of one run's stdout, fed one line at a time by the runner."""

    def feed_line(self, line: bytes) -> None: ...

    @property
    def done(self) -> bool: ...

    @property
    def session_id(self) -> str | None: ...

    @property
    def tool_use_ids(self) -> tuple[str, ...]: ...


class AgentAdapter(Protocol):
    """One agent CLI: a pure argv builder plus an output parser and interpreter."""

    kind: str

    def build(self, spec: AgentSpec, prompt: str) -> Invocation: ...

    def new_parser(self) -> AgentParser: ...

    def interpret(self, result: RunResult, parser: AgentParser) -> Outcome: ...


def cut_utf8(text: str, max_bytes: int) -> tuple[str, bool]:
    """Cut ``text`` to at most ``max_bytes`` UTF-8 bytes at a code point boundary.

    Returns the text and whether anything was cut.
    """
    if max_bytes < 0:
        raise ValueError("max_bytes must not be negative")
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_bytes:
        return text, False
    end = max_bytes
    # A continuation byte (10xxxxxx) at the cut means a code point straddles it: back up to
    # its lead byte so the whole code point is left out.
    while end > 0 and encoded[end] & 0xC0 == 0x80:
        end -= 1
    return encoded[:end].decode("utf-8", "surrogatepass"), True


def clean_text(text: str) -> str:
    """Replace lone surrogates (JSON escapes can carry them) so the text encodes as UTF-8."""
    return without_surrogates(text)


def sanitize_detail(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """One short line for a failure detail, made safe by :func:`agentcall.safetext.safe_cell`."""
    line = " ".join(safe_cell(text).split())
    if len(line) > limit:
        line = line[: limit - 1] + "…"
    return line


def tail_detail(data: bytes, limit: int = MAX_DETAIL_CHARS) -> str:
    """The end of a stream (stderr) as a detail: the last non-empty lines that fit."""
    text = data[-8192:].decode("utf-8", "replace")
    lines = [ln for ln in (sanitize_detail(raw, 8192) for raw in text.splitlines()) if ln]
    picked: list[str] = []
    used = 0
    for line in reversed(lines):
        cost = len(line) + (3 if picked else 0)
        if used + cost > limit:
            if not picked and limit > 1:
                # One line longer than the budget: its end says more than its start.
                picked.append("…" + line[-(limit - 1) :])
            break
        picked.append(line)
        used += cost
    return " | ".join(reversed(picked))


def detail_with_tail(prefix: str, stream: bytes) -> str:
    """``prefix: <tail of stream>`` within the detail limit, the prefix kept whole."""
    prefix = sanitize_detail(prefix)
    tail = tail_detail(stream, MAX_DETAIL_CHARS - len(prefix) - 2)
    return f"{prefix}: {tail}" if tail else prefix


def decode_json_line(line: bytes) -> object | None:
    """One line of JSONL output as a value, or None when it is not JSON.

    CRLF and surrounding blanks are tolerated; invalid UTF-8 inside strings is replaced
    rather than losing the whole line.
    """
    stripped = line.strip()
    if not stripped:
        return None
    try:
        value: object = json.loads(stripped.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        # RecursionError: absurdly nested JSON is garbage too, not a reason to stop parsing.
        return None
    return value


def encode_prompt(prompt: str) -> bytes:
    """The prompt as stdin bytes (UTF-8; lone surrogates replaced)."""
    return clean_text(prompt).encode("utf-8")
