"""Agent adapters: pure argv builders and output parsers, one per agent CLI kind."""

from __future__ import annotations

from collections.abc import Mapping

from agentcall.listener.agents import claude, codex, command
from agentcall.listener.agents.base import (
    AgentAdapter,
    AgentAnswer,
    AgentFailure,
    AgentParser,
    AgentSpec,
    FailureKind,
    Invocation,
    Outcome,
    cut_utf8,
)

ADAPTERS: Mapping[str, AgentAdapter] = {
    "claude": claude.ADAPTER,
    "codex": codex.ADAPTER,
    "command": command.ADAPTER,
}


def adapter_for(kind: str) -> AgentAdapter:
    """The adapter for an agent kind (``claude``, ``codex`` or ``command``)."""
    try:
        return ADAPTERS[kind]
    except KeyError:
        raise ValueError(f"unknown agent kind: {kind!r}") from None


__all__ = [
    "ADAPTERS",
    "AgentAdapter",
    "AgentAnswer",
    "AgentFailure",
    "AgentParser",
    "AgentSpec",
    "FailureKind",
    "Invocation",
    "Outcome",
    "adapter_for",
    "cut_utf8",
]
