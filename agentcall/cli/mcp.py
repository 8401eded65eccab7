"""``agentcall mcp``: AgentCall's tools for a coding agent, as a stdio MCP server.

A coding agent (Claude Code, Codex) starts this as one of its MCP servers
(``agentcall install claude|codex`` registers it) and speaks MCP on its stdin and stdout; the
server is :mod:`agentcall.mcp.server`.
"""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Serve AgentCall's tools to a coding agent over the Model Context Protocol, on stdin/stdout.

This is what Claude Code or Codex runs after `agentcall install claude` (or `codex`); a person
rarely starts it by hand. The tools:

  call         ask a coworker's agent one question (address, message; optional task,
               context, queue) and wait for the answer
  inspect      pin, published card and presence of an address
  contacts     the short names you gave the agents you call
  whoami       this installation's address, relay and local service
  jobs_list    calls the relay kept as jobs
  jobs_get     one job's state and, once answered, its answer (optional wait_s)
  jobs_cancel  cancel a job you sent

Each tool runs the matching `agentcall ... --json` command, so calls take the running local
service when there is one and dial the relay otherwise, as `agentcall call` does. Answers are
returned marked as written by another person's agent, cleaned like the CLI's output. A queued
call returns its job id (fetch the answer with jobs_get). Inside an agent that is answering
a call, the calling tools refuse, as `agentcall call` does. Tool reference: docs/agents.md."""

EPILOG = """\
examples:
  agentcall install claude        # registers `agentcall mcp` with Claude Code
  claude mcp add --scope user agentcall -- agentcall mcp   # the same, by hand"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options: the agent's client starts it as it is


def run(args: argparse.Namespace) -> int:
    del args
    import anyio

    from agentcall.mcp.server import serve_stdio

    anyio.run(serve_stdio)
    return 0
