"""Connectors: the owner's own MCP servers that a task may name (``connectors:`` in SKILL.md).

Claude runs with ``--strict-mcp-config``, so by default an answer has no MCP server at all. A
task that names connectors gets exactly those servers, taken from the owner's user-scope
configuration (``mcpServers`` in ``~/.claude.json``, and in ``$CLAUDE_CONFIG_DIR/.claude.json``
when that is set, whose entries win), passed with ``--mcp-config`` and approved with
``--allowedTools mcp__<name>__*``; the guard lets ``mcp__<name>__*`` tools of those servers
through and no other MCP tool.

Reading is strict and fails closed: a file that exists but cannot be read, parsed or has the
wrong shape is a :class:`ConnectorError` and the call is refused before anything is spawned. A
server's configuration can hold tokens (``env``, ``headers``): it is never logged, and error
messages name only files and server names. Project-scope servers (``.mcp.json``, the
``projects`` entries) are not read.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

CLAUDE_JSON: Final = ".claude.json"
# .claude.json also keeps per-project history, so it can be large; beyond this it is refused.
MAX_CONFIG_BYTES: Final = 64 * 1024 * 1024
# What a task may name (the same shape as ``tasks.CONNECTOR_RE``).
SERVER_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
# Claude builds tool names as mcp__<server>__<tool> with every character outside this set in
# the server name replaced by "_".
_NOT_IN_TOOL_NAME: Final = re.compile(r"[^A-Za-z0-9_-]")

ServerConfig = dict[str, Any]


class ConnectorError(Exception):
    """The owner's MCP configuration cannot be used for this call (safe to show: no config)."""


def tool_name_part(name: str) -> str:
    """The server name as it appears in ``mcp__<server>__<tool>`` tool names."""
    return _NOT_IN_TOOL_NAME.sub("_", name)


def config_files(home: str, environ: Mapping[str, str]) -> list[str]:
    """The files read, in order (later ones win): ``~/.claude.json``, then the config dir's."""
    if not os.path.isabs(home):
        raise ConnectorError("the owner's home directory is not an absolute path")
    files = [os.path.join(home, CLAUDE_JSON)]
    config_dir = environ.get("CLAUDE_CONFIG_DIR", "")
    if config_dir:
        if not os.path.isabs(config_dir):
            raise ConnectorError("CLAUDE_CONFIG_DIR is not an absolute path")
        other = os.path.join(config_dir, CLAUDE_JSON)
        if os.path.normpath(other) != os.path.normpath(files[0]):
            files.append(other)
    return files


def _shown(path: str, home: str) -> str:
    """A path for a message that may reach the caller: the owner's home is shown as ``~``."""
    prefix = home.rstrip("/") + "/"
    return "~/" + path[len(prefix) :] if path.startswith(prefix) else path


def _read_servers(path: str, home: str) -> dict[str, ServerConfig]:
    shown = _shown(path, home)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConnectorError(f"{shown} cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConnectorError(f"{shown} is too large to read")
    try:
        document: object = json.loads(raw)
    except (ValueError, RecursionError):
        raise ConnectorError(f"{shown} is not valid JSON") from None
    if not isinstance(document, dict):
        raise ConnectorError(f"{shown} is not a JSON object")
    servers = document.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise ConnectorError(f"{shown}: mcpServers is not a JSON object")
    found: dict[str, ServerConfig] = {}
    for name, config in servers.items():
        if not isinstance(config, dict):
            # The name is the owner's own label; the value is what may hold a token.
            label = name if SERVER_NAME_RE.match(name) else "an entry"
            raise ConnectorError(f"{shown}: MCP server {label} is not a JSON object")
        found[name] = config
    return found


def discover_servers(home: str, environ: Mapping[str, str]) -> dict[str, ServerConfig]:
    """The owner's user-scope MCP servers by name; no file at all means none.

    Raises :class:`ConnectorError` for a file that exists but is unreadable or malformed.
    """
    servers: dict[str, ServerConfig] = {}
    for path in config_files(home, environ):
        servers.update(_read_servers(path, home))
    return servers


def select(
    servers: Mapping[str, ServerConfig], names: Iterable[str], task_id: str = "this task"
) -> dict[str, ServerConfig]:
    """The servers a task names, in its order; a name the owner does not have raises."""
    chosen: dict[str, ServerConfig] = {}
    for name in names:
        if not SERVER_NAME_RE.match(name):
            raise ConnectorError(f"task {task_id} names an invalid connector")
        if name not in servers:
            raise ConnectorError(f"task {task_id} names connector {name}, which is not configured")
        chosen[name] = servers[name]
    return chosen


def task_servers(
    task_id: str, names: Iterable[str], home: str, environ: Mapping[str, str]
) -> dict[str, ServerConfig]:
    """What a task's connectors resolve to; nothing is read when it names none."""
    wanted = tuple(names)
    if not wanted:
        return {}
    return select(discover_servers(home, environ), wanted, task_id)
