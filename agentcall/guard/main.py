"""``agentcall guard``: the PreToolUse hook program run before every tool call of an answer.

The agent CLI runs it once per tool call with the hook JSON on stdin and the listener's
environment for this run (:func:`agentcall.listener.guardwire.guard_env` writes it):

- ``AGENTCALL_GUARD_ROOTS``: read roots, ``os.pathsep``-separated (empty: nothing readable);
- ``AGENTCALL_GUARD_WRITE_ROOT``: the write root, or empty;
- ``AGENTCALL_GUARD_CAPS``: granted capabilities, comma-separated (``read,write``);
- ``AGENTCALL_CALL_ID``, ``AGENTCALL_GUARD_LOG`` (the tools.log to append to),
  ``AGENTCALL_GUARD_HOME`` (the owner's home), ``AGENTCALL_GUARD_DENY_EXTRA`` (more denied
  roots, ``os.pathsep``-separated);
- ``AGENTCALL_GUARD_MCP``: the MCP servers whose ``mcp__<server>__*`` tools are allowed (the
  task's connectors, as named in tool names), comma-separated; empty or unset: none.

Answers, as both Claude Code and Codex read them:

- let the call through: no output at all, exit 0 (never a ``permissionDecision`` of
  ``allow``: Claude would take that as approval beyond its own working-directory scope);
- refuse it: the deny JSON on stdout, exit 0, with a fixed reason that names no path or rule;
- cannot decide (bad input, bad configuration, any exception, the log cannot be written):
  a reason on stderr and exit 2, which both CLIs treat as a refusal.

Every attempt is appended to tools.log first, so a call the log does not know never ran. The
start-up path imports only the standard library and this package (no Twisted, no crypto): it
runs for every tool call.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time

import agentcall
from agentcall.guard.decide import (
    CAPABILITIES,
    DENY,
    Decision,
    HookCall,
    PayloadError,
    Policy,
    decide,
    mcp_server_of,
    parse_payload,
)
from agentcall.guard.scope import Scope

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import BinaryIO, TextIO

DENY_REASON = "The owner's policy for this call refuses this tool use."
DENY_OUTPUT = json.dumps(
    {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": DENY_REASON,
        }
    },
    separators=(",", ":"),
)
# Codex only treats exit 2 as a refusal when stderr says something.
FAILURE_MESSAGE = "agentcall guard: this tool use could not be checked, so it is refused"
FAILURE_EXIT = 2
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
MAX_LOGGED_CHARS = 500
LOG_MODE = 0o600

ENV_ROOTS = "AGENTCALL_GUARD_ROOTS"
ENV_WRITE_ROOT = "AGENTCALL_GUARD_WRITE_ROOT"
ENV_CAPS = "AGENTCALL_GUARD_CAPS"
ENV_CALL_ID = "AGENTCALL_CALL_ID"
ENV_LOG = "AGENTCALL_GUARD_LOG"
ENV_HOME = "AGENTCALL_GUARD_HOME"
ENV_DENY_EXTRA = "AGENTCALL_GUARD_DENY_EXTRA"
ENV_MCP = "AGENTCALL_GUARD_MCP"
# A server name as Claude puts it into tool names: no comma, no blank, nothing to widen.
_MCP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")


class GuardConfigError(Exception):
    """The environment does not configure the guard completely."""


class GuardConfig:
    """The run's configuration, read from the environment."""

    __slots__ = (
        "call_id",
        "caps",
        "extra_denied",
        "home",
        "log_path",
        "mcp_servers",
        "roots",
        "write_root",
    )

    def __init__(
        self,
        *,
        roots: tuple[str, ...],
        write_root: str | None,
        caps: frozenset[str],
        call_id: str,
        log_path: str,
        home: str,
        extra_denied: tuple[str, ...],
        mcp_servers: frozenset[str] = frozenset(),
    ) -> None:
        self.roots = roots
        self.write_root = write_root
        self.caps = caps
        self.call_id = call_id
        self.log_path = log_path
        self.home = home
        self.extra_denied = extra_denied
        self.mcp_servers = mcp_servers


def _paths(environ: Mapping[str, str], name: str, *, required: bool) -> tuple[str, ...]:
    if name not in environ:
        if required:
            raise GuardConfigError(f"{name} is not set")
        return ()
    paths = tuple(p for p in environ[name].split(os.pathsep) if p)
    if not all(os.path.isabs(p) and "\0" not in p for p in paths):
        raise GuardConfigError(f"{name} holds a path that is not absolute")
    return paths


def _one_path(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "")
    if not os.path.isabs(value):
        raise GuardConfigError(f"{name} must be an absolute path")
    return value


def _mcp_servers(environ: Mapping[str, str]) -> frozenset[str]:
    names = [n.strip() for n in environ.get(ENV_MCP, "").split(",") if n.strip()]
    if not all(_MCP_NAME.match(n) for n in names):
        raise GuardConfigError(f"{ENV_MCP} holds an invalid server name")
    return frozenset(names)


def config_from_environ(environ: Mapping[str, str]) -> GuardConfig:
    """The configuration, or :class:`GuardConfigError` for anything missing or malformed."""
    if ENV_CAPS not in environ:
        raise GuardConfigError(f"{ENV_CAPS} is not set")
    caps = frozenset(c.strip() for c in environ[ENV_CAPS].split(",") if c.strip())
    if not caps <= CAPABILITIES:
        raise GuardConfigError(f"{ENV_CAPS} names an unknown capability")
    call_id = environ.get(ENV_CALL_ID, "")
    if not call_id:
        raise GuardConfigError(f"{ENV_CALL_ID} is not set")
    write_root = environ.get(ENV_WRITE_ROOT, "")
    if write_root and not os.path.isabs(write_root):
        raise GuardConfigError(f"{ENV_WRITE_ROOT} must be an absolute path")
    log_path = _one_path(environ, ENV_LOG)
    # The guard's own code and the directory of its log are refused even if the listener
    # forgot to name them: a write there would disarm the next tool call's guard.
    own = (os.path.dirname(os.path.abspath(agentcall.__file__)), os.path.dirname(log_path))
    return GuardConfig(
        roots=_paths(environ, ENV_ROOTS, required=True),
        write_root=write_root or None,
        caps=caps,
        call_id=call_id,
        log_path=log_path,
        home=_one_path(environ, ENV_HOME),
        extra_denied=_paths(environ, ENV_DENY_EXTRA, required=False) + own,
        mcp_servers=_mcp_servers(environ),
    )


# --- the log -------------------------------------------------------------------------------


def _timestamp(now: float) -> str:
    seconds = int(now)
    millis = int((now - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _excerpt(text: str) -> str:
    # Imported here: only commands, URLs and queries need it, and file tools start faster.
    from agentcall.listener.redact import redacted_excerpt

    return redacted_excerpt(text, MAX_LOGGED_CHARS)


def log_entry(
    config: GuardConfig, call: HookCall | None, decision: Decision, now: float
) -> dict[str, object]:
    """The tools.log record for one attempt (``call`` is None for an unreadable payload)."""
    entry: dict[str, object] = {
        "ts": _timestamp(now),
        "call_id": config.call_id,
        "tool": call.tool_name if call is not None else None,
        "tool_use_id": call.tool_use_id if call is not None else None,
        "decision": decision.action,
        "rule": decision.rule,
    }
    if call is None:
        return entry
    server = mcp_server_of(call.tool_name, config.mcp_servers)
    if server is not None:
        # Which of the task's connectors was used; its input is the server's business.
        entry["connector"] = server
    tool_input = call.tool_input
    if call.tool_name == "Bash" and isinstance(tool_input.get("command"), str):
        entry["command"] = _excerpt(str(tool_input["command"]))
    for key in ("file_path", "notebook_path", "path", "pattern", "glob", "url", "query"):
        value = tool_input.get(key)
        if isinstance(value, str):
            # Paths are kept as given; search patterns, URLs and queries can carry a secret.
            path_like = key in ("file_path", "notebook_path", "path")
            entry["target"] = value[:MAX_LOGGED_CHARS] if path_like else _excerpt(value)
            break
    return entry


def append_log(path: str, entry: Mapping[str, object]) -> None:
    """Append one JSON line to a 0600 file of ours; anything else raises ``OSError``."""
    line = (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, LOG_MODE)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise OSError(f"{path} is not a private file of this user")
        # One write of the whole line: O_APPEND keeps lines from concurrent guards whole.
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(f"short write to {path}")
    finally:
        os.close(fd)


# --- the program ---------------------------------------------------------------------------


def _append_if_possible(path: str, entry: Mapping[str, object]) -> bool:
    try:
        append_log(path, entry)
    except OSError:
        return False
    return True


def _read_payload(stdin: BinaryIO) -> object:
    raw = stdin.read(MAX_PAYLOAD_BYTES + 1)
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise PayloadError("the hook input is too large")
    try:
        value: object = json.loads(raw)
    except (ValueError, RecursionError):
        raise PayloadError("the hook input is not JSON") from None
    return value


def evaluate(stdin: BinaryIO, environ: Mapping[str, str], now: float) -> Decision:
    """Read, decide and log one tool call; raises on anything that prevents a verdict."""
    config = config_from_environ(environ)
    try:
        call = parse_payload(_read_payload(stdin), os.getcwd())
    except PayloadError:
        # On the record even though nothing can be said about the call; the refusal stands
        # whether or not this line gets written.
        entry = log_entry(config, None, Decision(DENY, "unparseable-payload"), now)
        _append_if_possible(config.log_path, entry)
        raise
    scope = Scope(config.roots, config.extra_denied, config.home)
    policy = Policy(scope, config.caps, config.write_root, config.mcp_servers)
    decision = decide(call, policy)
    append_log(config.log_path, log_entry(config, call, decision, now))
    return decision


def main(
    argv: Sequence[str] | None = None,
    *,
    stdin: BinaryIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run the guard once; the exit code is what the agent CLI sees."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    try:
        args = list(sys.argv[1:] if argv is None else argv)
        if args:
            raise GuardConfigError("agentcall guard takes no arguments (hook JSON on stdin)")
        decision = evaluate(
            stdin if stdin is not None else sys.stdin.buffer,
            os.environ if environ is None else environ,
            time.time(),
        )
        if decision.action == DENY:
            out.write(DENY_OUTPUT + "\n")
            out.flush()
    except BaseException as exc:  # the guard fails closed, whatever happened
        try:
            # Our own messages name only what is wrong; any other exception's text could
            # carry a path or input, and stderr reaches the model, so only its type is shown.
            known = isinstance(exc, GuardConfigError | PayloadError)
            detail = str(exc) if known else type(exc).__name__
            err.write(f"{FAILURE_MESSAGE} ({detail})\n")
            err.flush()
        except BaseException:  # noqa: S110 - exit 2 still refuses the call
            pass
        return FAILURE_EXIT
    return 0
