"""agentcall.install.edits: the text transforms of `agentcall install`, each undone exactly."""

from __future__ import annotations

import json

import pytest
import tomlkit

from agentcall.install import edits
from agentcall.install.edits import EditError

PROGRAM = ("/opt/py/bin/python", "-m", "agentcall")
CODEX = edits.codex_entry(PROGRAM, {"AGENTCALL_HOME": "/s"})
CLAUDE = edits.claude_entry(PROGRAM, {})

OWNER_TOML = """\
# my settings, hand-written
model = "gpt-5"   # the one I like

[mcp_servers.docs]   # docs server
command = "docs-mcp"
args = ["--quiet"]

[profiles.fast]
model = "small"
"""


def test_entries_start_agentcall_mcp_with_its_environment() -> None:
    assert CODEX == {
        "command": "/opt/py/bin/python",
        "args": ["-m", "agentcall", "mcp"],
        "env": {"AGENTCALL_HOME": "/s"},
        "startup_timeout_sec": 30,
        "tool_timeout_sec": 480,
    }
    assert CLAUDE == {
        "type": "stdio",
        "command": "/opt/py/bin/python",
        "args": ["-m", "agentcall", "mcp"],
    }
    with pytest.raises(ValueError):
        edits.server_entry((), {})


def test_codex_entry_is_added_keeping_every_other_line() -> None:
    added = edits.set_codex_server(OWNER_TOML, CODEX)
    assert added is not None
    # Beside the other server, a blank line after it, as the owner's tables have.
    start = OWNER_TOML.index("[profiles.fast]")
    assert added.startswith(OWNER_TOML[:start] + "[mcp_servers.agentcall]\n")
    assert added.endswith('AGENTCALL_HOME = "/s"\n\n' + OWNER_TOML[start:])
    assert edits.codex_server(added) == CODEX
    assert tomlkit.parse(added)["profiles"]["fast"]["model"] == "small"


def test_codex_entry_removed_gives_back_the_file_byte_for_byte() -> None:
    added = edits.set_codex_server(OWNER_TOML, CODEX)
    assert edits.set_codex_server(added, None) == OWNER_TOML


def test_codex_entry_into_no_file_and_out_again() -> None:
    added = edits.set_codex_server(None, CODEX)
    assert added is not None and "[mcp_servers.agentcall]" in added
    assert edits.set_codex_server(added, None) is None
    assert edits.codex_server(None) is None


def test_codex_entry_replaces_one_in_place() -> None:
    text = '[mcp_servers.agentcall]\ncommand = "old"\n\n[other]\nx = 1\n'
    replaced = edits.set_codex_server(text, CODEX)
    assert replaced is not None
    assert edits.codex_server(replaced) == CODEX
    assert replaced.index("[mcp_servers.agentcall]") < replaced.index("[other]")
    assert edits.set_codex_server(replaced, {"command": "old"}) is not None


def test_codex_inline_servers_table_is_edited_too() -> None:
    text = 'mcp_servers = { docs = { command = "d" } }\n'
    added = edits.set_codex_server(text, {"command": "c", "args": ["mcp"]})
    assert added is not None
    assert edits.codex_server(added) == {"command": "c", "args": ["mcp"]}
    assert tomlkit.parse(added)["mcp_servers"]["docs"]["command"] == "d"


def test_codex_removing_what_is_not_there_changes_nothing() -> None:
    assert edits.set_codex_server(OWNER_TOML, None) == OWNER_TOML
    assert edits.set_codex_server(None, None) is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("model = \n", "not valid TOML"),
        ('mcp_servers = "x"\n', "mcp_servers is not a table"),
        ('[mcp_servers]\nagentcall = "x"\n', "mcp_servers.agentcall is not a table"),
    ],
)
def test_codex_files_that_are_not_safe_to_edit_are_refused(text: str, problem: str) -> None:
    with pytest.raises(EditError, match=problem):
        edits.codex_server(text)
    if "agentcall is not" not in problem:
        with pytest.raises(EditError, match=problem):
            edits.set_codex_server(text, CODEX)


def test_claude_entry_is_added_and_removed_keeping_other_keys() -> None:
    text = json.dumps({"numStartups": 3, "mcpServers": {"docs": {"command": "d"}}})
    added = edits.set_claude_server(text, CLAUDE)
    assert added is not None
    doc = json.loads(added)
    assert doc["numStartups"] == 3 and doc["mcpServers"]["docs"] == {"command": "d"}
    assert edits.claude_server(added) == CLAUDE
    removed = edits.set_claude_server(added, None)
    assert removed is not None
    assert json.loads(removed) == json.loads(text)


def test_claude_entry_into_no_file_and_out_again() -> None:
    added = edits.set_claude_server(None, CLAUDE)
    assert added is not None and json.loads(added) == {"mcpServers": {"agentcall": CLAUDE}}
    assert edits.set_claude_server(added, None) is None
    assert edits.set_claude_server("  ", None) == "  "
    assert edits.claude_server("") is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not valid JSON"),
        ('{"a": 1, "a": 2}', "not valid JSON"),
        ("[]", "not a JSON object"),
        ('{"mcpServers": []}', "mcpServers is not an object"),
        ('{"mcpServers": {"agentcall": 3}}', "mcpServers.agentcall is not an object"),
    ],
)
def test_claude_files_that_are_not_safe_to_edit_are_refused(text: str, problem: str) -> None:
    with pytest.raises(EditError, match=problem):
        edits.claude_server(text)


def test_claude_cli_argv() -> None:
    argv = edits.claude_add_argv("/bin/claude", CLAUDE)
    assert argv[:6] == ["/bin/claude", "mcp", "add-json", "--scope", "user", "agentcall"]
    assert json.loads(argv[6]) == CLAUDE
    assert edits.claude_remove_argv("c") == ["c", "mcp", "remove", "--scope", "user", "agentcall"]


# --- instruction blocks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [None, "", "# Mine\n", "# Mine\n\n", "# Mine", "a\n\n\nb\n"],
)
def test_a_block_added_then_removed_gives_back_the_file(text: str | None) -> None:
    added = edits.add_block(text)
    assert edits.has_block(added)
    assert edits.INSTRUCTIONS.strip() in added
    removed = edits.remove_block(added, edits.separator_for(text))
    assert removed == (text if text and text.strip() else None)


def test_adding_twice_keeps_one_block() -> None:
    once = edits.add_block("# Mine\n")
    assert edits.add_block(once) == once


def test_an_old_block_is_replaced_where_it_stands() -> None:
    old = "top\n" + edits.block_text("old words") + "bottom\n"
    new = edits.add_block(old)
    assert new == "top\n" + edits.block_text() + "bottom\n"
    assert edits.remove_block(new) == "top\nbottom\n"


def test_without_the_recorded_separator_one_blank_line_counts_as_ours() -> None:
    assert edits.remove_block("# Mine\n\n" + edits.block_text()) == "# Mine\n"
    assert edits.remove_block("# Mine\n" + edits.block_text()) == "# Mine\n"
    assert edits.remove_block("# Mine\n\n" + edits.block_text(), "\n\n") == "# Mine"


def test_removing_leaves_text_without_a_block_alone() -> None:
    assert edits.remove_block("# Mine\n") == "# Mine\n"
    assert edits.remove_block(None) is None
    assert not edits.has_block(None) and not edits.has_block("x")


def test_a_begin_marker_without_its_end_is_refused() -> None:
    with pytest.raises(EditError, match="without its end"):
        edits.add_block(f"x\n{edits.BEGIN}\nhalf")
    with pytest.raises(EditError):
        edits.remove_block(f"{edits.BEGIN}\n")


def test_the_instructions_teach_the_tools_and_the_trust_rule() -> None:
    for word in ("contacts", "inspect", "`call`", "context", "jobs_get", "never follow"):
        assert word in edits.INSTRUCTIONS
