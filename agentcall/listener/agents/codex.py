"""Codex CLI (``codex exec --json``): argv, the JSONL event parser, and run interpretation.

The prompt goes to stdin through the ``-`` argument (Codex waits for stdin's EOF, which the
runner always gives). The sandbox mode follows ANALYSIS.md §4: read-only unless the task may
write or fetch; ``workspace-write`` always excludes ``/tmp`` and ``$TMPDIR``. Codex reads are
never confined by its sandbox, so ``read_roots`` has no flag here. A run inside the kernel
boundary (``spec.confined``) is ``danger-full-access`` instead: Codex's sandbox (bubblewrap)
cannot start inside a Landlock domain, and the domain bounds reads, writes and, without
``fetch``, the network of Codex and every command it runs. The answer is the last
``agent_message`` of a turn that completed with exit 0.
"""

from __future__ import annotations

import re

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
from agentcall.listener.runner import RunResult

_EXCLUDE_TMP = (
    "-c",
    "sandbox_workspace_write.exclude_slash_tmp=true",
    "-c",
    "sandbox_workspace_write.exclude_tmpdir_env_var=true",
)
_NETWORK = ("-c", "sandbox_workspace_write.network_access=true")
# Items that are the agent acting (for counting and logs; Codex hook ids differ from these).
_ACTION_ITEMS = frozenset(
    {"command_execution", "file_change", "mcp_tool_call", "web_search", "collab_tool_call"}
)

_UNAUTHENTICATED = re.compile(r"\b401\b|unauthorized|not logged in", re.IGNORECASE)
_USAGE_ERROR = re.compile(
    r"^.*(?:error: unexpected argument|error: unrecognized subcommand|error: invalid value).*$",
    re.MULTILINE,
)
# Inferred, not observed: how a resume of an unknown thread is likely to be worded.
_RESUME_FAILED = re.compile(
    r"no (?:saved )?(?:session|thread|rollout|conversation)[^\n]*found"
    r"|(?:session|thread|rollout|conversation)[^\n]* not found",
    re.IGNORECASE,
)


def sandbox_mode(spec: AgentSpec) -> str:
    """The ``-s`` mode: none of Codex's own inside the kernel boundary; otherwise read-only,
    or workspace-write (Codex has no read-only mode with network, so fetch implies write)."""
    if spec.confined:
        return "danger-full-access"
    return "workspace-write" if spec.tools & {"write", "fetch"} else "read-only"


def sandbox_config(spec: AgentSpec) -> tuple[str, ...]:
    """The ``-c`` keys that go with the mode (the same on a fresh run and on resume)."""
    if sandbox_mode(spec) != "workspace-write":
        return ()
    return _EXCLUDE_TMP + (_NETWORK if "fetch" in spec.tools else ())


class CodexParser:
    """Reads ``codex exec --json`` events."""

    def __init__(self) -> None:
        self.thread_id: str | None = None
        self.last_message: str | None = None
        self.turn_completed = False
        self.turn_failed: str | None = None
        self.error_events = 0
        self.ignored_lines = 0
        self._tool_use_ids: list[str] = []
        self._seen: set[str] = set()

    @property
    def done(self) -> bool:
        return self.turn_completed or self.turn_failed is not None

    @property
    def session_id(self) -> str | None:
        return self.thread_id

    @property
    def tool_use_ids(self) -> tuple[str, ...]:
        return tuple(self._tool_use_ids)

    def feed_line(self, line: bytes) -> None:
        event = decode_json_line(line)
        if not isinstance(event, dict):
            if line.strip():
                self.ignored_lines += 1
            return
        kind = event.get("type")
        if kind == "thread.started":
            thread = event.get("thread_id")
            if isinstance(thread, str) and self.thread_id is None:
                self.thread_id = thread
        elif kind == "turn.completed":
            self.turn_completed = True
        elif kind == "turn.failed":
            err = event.get("error")
            message = err.get("message") if isinstance(err, dict) else None
            self.turn_failed = message if isinstance(message, str) else "turn failed"
        elif kind == "error":
            # Reconnect notices and warnings: progress, not a failure.
            self.error_events += 1
        elif kind in ("item.started", "item.completed"):
            self._take_item(event.get("item"), completed=kind == "item.completed")

    def _take_item(self, item: object, *, completed: bool) -> None:
        if not isinstance(item, dict):
            return
        item_type = item.get("type")
        if item_type == "agent_message" and completed:
            text = item.get("text")
            if isinstance(text, str):
                self.last_message = text
        elif item_type in _ACTION_ITEMS:
            ident = item.get("id")
            if isinstance(ident, str) and ident not in self._seen:
                self._seen.add(ident)
                self._tool_use_ids.append(ident)


class CodexAdapter:
    """``codex exec --json`` with the prompt on stdin."""

    kind = "codex"

    def build(self, spec: AgentSpec, prompt: str) -> Invocation:
        hooks: tuple[str, ...] = ()
        if spec.codex_hook_config is not None:
            hooks = (
                "--dangerously-bypass-hook-trust",
                "-c",
                f"hooks.PreToolUse={spec.codex_hook_config}",
            )
        mode = sandbox_mode(spec)
        if spec.resume_session is not None:
            # `exec resume` takes neither -s nor -C: the mode goes in as config and the
            # runner's cwd is the workdir.
            argv = (
                spec.binary,
                "exec",
                "resume",
                spec.resume_session,
                "--json",
                "--skip-git-repo-check",
                "-c",
                f'sandbox_mode="{mode}"',
                *sandbox_config(spec),
                *hooks,
                "-",
            )
        else:
            argv = (
                spec.binary,
                "exec",
                "--json",
                "--skip-git-repo-check",
                *(() if spec.keep_session else ("--ephemeral",)),
                "-C",
                spec.workdir,
                "-s",
                mode,
                *sandbox_config(spec),
                *hooks,
                "-",
            )
        return Invocation(
            argv=argv,
            env_additions=dict(spec.extra_env),
            stdin_bytes=encode_prompt(prompt),
            cwd=spec.workdir,
        )

    def new_parser(self) -> CodexParser:
        return CodexParser()

    def interpret(self, result: RunResult, parser: AgentParser) -> Outcome:
        if not isinstance(parser, CodexParser):
            raise TypeError("the Codex adapter needs its own parser")
        if parser.turn_failed is not None:
            kind = (
                FailureKind.UNAUTHENTICATED
                if _UNAUTHENTICATED.search(parser.turn_failed)
                else FailureKind.AGENT_ERROR
            )
            return AgentFailure(kind, sanitize_detail(parser.turn_failed))
        if parser.turn_completed and (result.exit_code == 0 or result.early_finish):
            if parser.last_message is None:
                return AgentFailure(
                    FailureKind.AGENT_ERROR, "the turn completed without an agent message"
                )
            return AgentAnswer(
                clean_text(parser.last_message), parser.thread_id, parser.tool_use_ids
            )
        if result.cancelled:
            return AgentFailure(FailureKind.CANCELLED, "the run was cancelled")
        if result.timed_out:
            return AgentFailure(FailureKind.TIMEOUT, "no answer before the kill timer")
        if result.stdout_truncated:
            return AgentFailure(
                FailureKind.OUTPUT_TOO_LARGE, "the agent printed too much before answering"
            )
        stderr = result.stderr.decode("utf-8", "replace")
        usage = _USAGE_ERROR.search(stderr)
        if usage:
            return AgentFailure(
                FailureKind.CLI_TOO_OLD, sanitize_detail("agent CLI too old: " + usage.group(0))
            )
        if _RESUME_FAILED.search(stderr):
            return AgentFailure(
                FailureKind.RESUME_FAILED, "the agent CLI could not resume the conversation"
            )
        if re.search(r"not logged in", stderr, re.IGNORECASE):
            return AgentFailure(FailureKind.UNAUTHENTICATED, "the agent CLI is not logged in")
        how = f"signal {result.signal}" if result.signal is not None else f"code {result.exit_code}"
        state = "after the turn completed" if parser.turn_completed else "without finishing a turn"
        detail = detail_with_tail(f"agent exited with {how} {state}", result.stderr)
        return AgentFailure(FailureKind.AGENT_ERROR, detail)


ADAPTER = CodexAdapter()
