"""``agentcall install`` into the real Claude Code and Codex, and a call placed by each.

A real relay, ann (the caller, whose HOME the real CLI runs in) and ken (the callee: a real
``twistd agentcall-listen`` answering with the suite's fake agent). ``agentcall install
claude|codex`` registers ``agentcall mcp`` in ann's HOME; the CLIs' own ``mcp list`` must show
it. Then the real CLI, driven by the loopback mock model, calls the ``call`` tool: the MCP
server runs ``agentcall call``, the relay routes it to ken's listener, and the answer comes
back into the CLI's conversation, where the test reads it in the next request the mock
receives, fenced as another person's agent's words.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import attrs
import pytest
from mcp import Client, StdioServerParameters

from agentcall.install import edits
from agentcall.mcp import results
from tests.e2e.installs import Install, World, two_people
from tests.e2e.processes import BIN
from tests.realagents.harness import DUMMY_ANTHROPIC_KEY, MOCK_KEY_ENV, write_codex_config
from tests.realagents.install import InstalledAgent
from tests.realagents.mock_anthropic import Final, MockAnthropic, ToolUse
from tests.realagents.mock_openai import Final as CodexFinal
from tests.realagents.mock_openai import MockResponses, mcp_tool

pytestmark = [pytest.mark.realagent, pytest.mark.slow]

RUN_TIMEOUT_S = 240.0
_AGENT_PREFIXES = ("ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_")
QUIET = {
    "CLAUDE_CODE_MAX_RETRIES": "0",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "API_TIMEOUT_MS": "60000",
}


@attrs.frozen
class Caller:
    """ann's side: her Install, and the environment the real CLIs run in there."""

    install: Install
    bins: tuple[Path, ...]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in self.install.env().items() if not k.startswith(_AGENT_PREFIXES)}
        # The real CLIs first on PATH, in place of the fake agent's directory.
        fake = str(self.install.root / "bin")
        rest = [p for p in env["PATH"].split(os.pathsep) if p and p != fake]
        env["PATH"] = os.pathsep.join([*(str(b) for b in self.bins), str(BIN), *rest])
        env.update(extra)
        return env

    def run(self, *argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd=self.install.home,
        )

    def agentcall(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-m", "agentcall", *args)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("mcp-real").resolve()) as world:
        world.ken.start_listener()
        yield world


@pytest.fixture(scope="module")
def caller(world: World, claude_install: InstalledAgent, codex_install: InstalledAgent) -> Caller:
    return Caller(world.ann, (claude_install.binary.parent, codex_install.binary.parent))


def _listed_tools(caller: Caller, entry: dict[str, object]) -> list[str]:
    """The tools the registered command serves, asked over stdio with the SDK's client."""
    command = str(entry["command"])
    args = [str(a) for a in entry["args"]]  # type: ignore[attr-defined]

    async def ask() -> list[str]:
        params = StdioServerParameters(command=command, args=args, env=caller.env())
        async with Client(params) as client:
            return [tool.name for tool in (await client.list_tools()).tools]

    return anyio.run(ask)


ALL_TOOLS = ["call", "inspect", "contacts", "whoami", "jobs_list", "jobs_get", "jobs_cancel"]


def test_claude_mcp_list_shows_the_installed_server(caller: Caller) -> None:
    done = caller.agentcall("install", "claude")
    assert done.returncode == 0, done.stderr
    assert "added the agentcall MCP server" in done.stdout
    # `claude mcp add-json` did it: the real CLI is on PATH.
    listed = caller.run("claude", "mcp", "list", **QUIET)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith("agentcall:"))
    # Claude Code started the server and completed the MCP handshake with it.
    assert "-m agentcall mcp" in line and "Connected" in line, listed.stdout
    entry = edits.claude_server((caller.install.home / ".claude.json").read_text())
    assert entry is not None
    assert _listed_tools(caller, entry) == ALL_TOOLS
    again = caller.agentcall("install", "claude", "--json")
    assert '"changed": false' in again.stdout, again.stdout
    # --remove undoes it through `claude mcp remove`: the real CLI lists no agentcall then.
    removed = caller.agentcall("install", "--remove", "claude")
    assert removed.returncode == 0, removed.stderr
    listed = caller.run("claude", "mcp", "list", **QUIET)
    assert not any(x.startswith("agentcall:") for x in listed.stdout.splitlines()), listed.stdout
    assert not (caller.install.home / ".claude" / "CLAUDE.md").exists()


def test_codex_mcp_list_shows_the_installed_server(caller: Caller) -> None:
    codex_home = caller.install.home / ".codex"
    codex_home.mkdir(exist_ok=True)
    config = codex_home / "config.toml"
    config.write_text('# the owner\'s own settings\nmodel = "gpt-5"  # keep me\n')
    done = caller.agentcall("install", "codex")
    assert done.returncode == 0, done.stderr
    listed = caller.run("codex", "mcp", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(x for x in listed.stdout.splitlines() if x.startswith("agentcall "))
    assert "-m agentcall mcp" in row and "enabled" in row, listed.stdout
    text = config.read_text()
    assert text.startswith('# the owner\'s own settings\nmodel = "gpt-5"  # keep me\n')
    entry = edits.codex_server(text)
    assert entry is not None and entry["tool_timeout_sec"] == edits.CODEX_TOOL_TIMEOUT_S
    assert _listed_tools(caller, entry) == ALL_TOOLS
    removed = caller.agentcall("install", "--remove", "codex")
    assert removed.returncode == 0, removed.stderr
    listed = caller.run("codex", "mcp", "list")
    assert not any(x.startswith("agentcall ") for x in listed.stdout.splitlines()), listed.stdout
    assert config.read_text() == '# the owner\'s own settings\nmodel = "gpt-5"  # keep me\n'


def _fenced_answer(text: str, marker: str) -> None:
    assert "Answer from @acme/ken" in text, text
    assert results.NOTICE.split("{")[0] in text, text
    begin = text.index(f"<<<{results.FENCE}-")
    assert marker in text[begin:], text


def test_claude_calls_a_coworker_through_the_mcp_server(
    world: World, caller: Caller, claude_install: InstalledAgent
) -> None:
    assert caller.agentcall("install", "claude").returncode == 0
    mock = MockAnthropic(lifetime_s=RUN_TIMEOUT_S * 2).start()
    try:
        question = "which port does the billing service listen on?"
        (call_id,) = mock.script(
            [
                ToolUse("mcp__agentcall__call", {"address": "ken", "message": question}),
                Final("ken's agent answered"),
            ]
        )
        done = caller.run(
            str(claude_install.binary),
            "-p",
            "ask ken which port billing uses",
            "--output-format",
            "json",
            "--allowedTools",
            "mcp__agentcall__call",
            ANTHROPIC_BASE_URL=mock.base_url,
            ANTHROPIC_API_KEY=DUMMY_ANTHROPIC_KEY,
            **QUIET,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        result = mock.tool_results().get(call_id)
        assert result is not None, (mock.tool_results(), done.stdout, done.stderr)
        assert not result.is_error, result.text
        # The fake agent echoes the first line of what it was asked.
        _fenced_answer(result.text, f"FAKE-AGENT-ANSWER: {question}")
        assert "ken's agent answered" in done.stdout
    finally:
        mock.stop()
    runs = world.ken.agent_runs()
    assert any(question in str(run.get("prompt")) for run in runs), runs


def test_codex_calls_a_coworker_through_the_mcp_server(
    world: World, caller: Caller, codex_install: InstalledAgent
) -> None:
    mock = MockResponses(lifetime_s=RUN_TIMEOUT_S * 2).start()
    try:
        write_codex_config(caller.install.home, mock.base_url)
        assert caller.agentcall("install", "codex").returncode == 0
        # Codex starts MCP servers in the background and offers a server's tools once it is
        # up, so a one-shot `codex exec` may make its first request before that. A required
        # server is waited for: the first turn then surely has the tools.
        config = caller.install.home / ".codex" / "config.toml"
        entry = edits.codex_server(config.read_text())
        assert entry is not None
        config.write_text(
            str(edits.set_codex_server(config.read_text(), {**entry, "required": True}))
        )
        question = "which queue does the mailer read?"
        (call_id,) = mock.script(
            [
                mcp_tool("agentcall", "call", {"address": "ken", "message": question}),
                CodexFinal("ken's agent answered"),
            ]
        )
        done = caller.run(
            str(codex_install.binary),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "ask ken which queue the mailer reads",
            **{MOCK_KEY_ENV: "dummy-key"},
        )
        assert done.returncode == 0, done.stdout + done.stderr
        output = mock.tool_outputs().get(call_id)
        assert output is not None, (mock.tool_outputs(), done.stdout, done.stderr)
        assert "\nisError=false\n" in output.text, (output.text, done.stderr)
        _fenced_answer(output.text, f"FAKE-AGENT-ANSWER: {question}")
        assert "ken's agent answered" in done.stdout
    finally:
        mock.stop()
    runs = world.ken.agent_runs()
    assert any(question in str(run.get("prompt")) for run in runs), runs
