"""Connectors: the owner's user-scope MCP servers, read strictly, and the ones a task names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentcall.listener import connectors
from agentcall.listener.connectors import (
    ConnectorError,
    discover_servers,
    select,
    task_servers,
    tool_name_part,
)

TOKEN = "ghp_" + "S" * 36
GITHUB: dict[str, Any] = {
    "type": "http",
    "url": "https://api.example/mcp",
    "headers": {"Authorization": TOKEN},
}
DOCS: dict[str, Any] = {"command": "/usr/bin/docs-mcp", "args": [], "env": {"DOCS_TOKEN": TOKEN}}


def write_json(path: Path, value: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


def test_no_config_file_means_no_servers(home: Path) -> None:
    assert discover_servers(str(home), {}) == {}


def test_user_scope_servers_are_read_and_other_keys_ignored(home: Path) -> None:
    write_json(
        home / ".claude.json",
        {
            "numStartups": 3,
            "mcpServers": {"github": GITHUB, "docs": DOCS},
            # Project-scope servers are not the owner's user scope: not offered.
            "projects": {"/srv/x": {"mcpServers": {"local": {"command": "/bin/x"}}}},
        },
    )
    assert discover_servers(str(home), {}) == {"github": GITHUB, "docs": DOCS}
    write_json(home / ".claude.json", {"numStartups": 3})
    assert discover_servers(str(home), {}) == {}


def test_the_config_dir_file_is_read_too_and_wins(home: Path, tmp_path: Path) -> None:
    write_json(home / ".claude.json", {"mcpServers": {"github": GITHUB, "docs": DOCS}})
    config_dir = tmp_path / "cfg"
    newer = {"type": "http", "url": "https://other.example/mcp"}
    write_json(config_dir / ".claude.json", {"mcpServers": {"github": newer, "sentry": DOCS}})
    found = discover_servers(str(home), {"CLAUDE_CONFIG_DIR": str(config_dir)})
    assert found == {"github": newer, "docs": DOCS, "sentry": DOCS}
    # Set but without a file there: the home file alone.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert discover_servers(str(home), {"CLAUDE_CONFIG_DIR": str(empty)})["github"] == GITHUB
    # An empty value is not set.
    assert discover_servers(str(home), {"CLAUDE_CONFIG_DIR": ""})["github"] == GITHUB


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "is not valid JSON"),
        (b"", "is not valid JSON"),
        (b"[1, 2]", "is not a JSON object"),
        (json.dumps({"mcpServers": [GITHUB]}).encode(), "mcpServers is not a JSON object"),
        (json.dumps({"mcpServers": {"github": TOKEN}}).encode(), "MCP server github is not"),
        (json.dumps({"mcpServers": {TOKEN + " x": TOKEN}}).encode(), "MCP server an entry is"),
        (b"\xff\xfe{}", "is not valid JSON"),
    ],
)
def test_a_malformed_file_fails_closed_naming_the_file(
    home: Path, content: bytes, problem: str
) -> None:
    """The message names the file (home shown as ~) and never what the file holds."""
    (home / ".claude.json").write_bytes(content)
    with pytest.raises(ConnectorError) as caught:
        discover_servers(str(home), {})
    message = str(caught.value)
    assert message.startswith("~/.claude.json")
    assert problem in message
    assert TOKEN not in message and str(home) not in message


def test_a_malformed_config_dir_file_fails_even_when_home_is_fine(
    home: Path, tmp_path: Path
) -> None:
    write_json(home / ".claude.json", {"mcpServers": {"github": GITHUB}})
    config_dir = tmp_path / "cfg"
    config_dir.mkdir()
    (config_dir / ".claude.json").write_text("{")
    with pytest.raises(ConnectorError, match=r"cfg/\.claude\.json is not valid JSON"):
        discover_servers(str(home), {"CLAUDE_CONFIG_DIR": str(config_dir)})


def test_an_unreadable_or_oversized_file_fails_closed(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / ".claude.json").mkdir()
    with pytest.raises(ConnectorError, match=r"^~/.claude.json cannot be read"):
        discover_servers(str(home), {})
    (home / ".claude.json").rmdir()
    write_json(home / ".claude.json", {"mcpServers": {"github": GITHUB}})
    monkeypatch.setattr(connectors, "MAX_CONFIG_BYTES", 10)
    with pytest.raises(ConnectorError, match="too large"):
        discover_servers(str(home), {})


def test_relative_locations_are_refused(home: Path) -> None:
    with pytest.raises(ConnectorError, match="CLAUDE_CONFIG_DIR"):
        discover_servers(str(home), {"CLAUDE_CONFIG_DIR": "cfg"})
    with pytest.raises(ConnectorError, match="home"):
        discover_servers("home", {})


def test_select_keeps_the_tasks_order_and_only_what_it_names() -> None:
    servers: dict[str, dict[str, Any]] = {
        "github": GITHUB,
        "docs": DOCS,
        "slack": {"command": "/bin/slack"},
    }
    chosen = select(servers, ["docs", "github"], "ci")
    assert list(chosen) == ["docs", "github"]
    assert chosen == {"docs": DOCS, "github": GITHUB}
    assert select(servers, [], "ci") == {}


def test_a_name_the_owner_does_not_have_is_refused() -> None:
    with pytest.raises(ConnectorError) as caught:
        select({"github": GITHUB}, ["github", "sentry"], "ci")
    assert str(caught.value) == "task ci names connector sentry, which is not configured"
    with pytest.raises(ConnectorError, match="invalid connector"):
        select({"a b": GITHUB}, ["a b"], "ci")


def test_task_servers_reads_nothing_for_a_task_without_connectors(home: Path) -> None:
    """A broken .claude.json does not touch tasks that name no connector."""
    (home / ".claude.json").write_text("{broken")
    assert task_servers("ask", (), str(home), {}) == {}
    with pytest.raises(ConnectorError):
        task_servers("ci", ("github",), str(home), {})
    write_json(home / ".claude.json", {"mcpServers": {"github": GITHUB, "docs": DOCS}})
    assert task_servers("ci", ("github",), str(home), {}) == {"github": GITHUB}


@pytest.mark.parametrize(
    ("name", "part"),
    [("github", "github"), ("docs.io", "docs_io"), ("my-server_2", "my-server_2")],
)
def test_tool_name_part(name: str, part: str) -> None:
    assert tool_name_part(name) == part
