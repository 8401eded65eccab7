"""The enumerations a member's config shares with the relay's HTTP API: a member's role and the
kind of agent it answers with.

They live apart from :mod:`agentcall.wire.http` (which names them too) so that loading the
config does not build every HTTP body's class: a call placed with kept keys needs none of them.
"""

from __future__ import annotations

import enum


class MemberRole(enum.StrEnum):
    MEMBER = "member"
    ADMIN = "admin"


class AgentKind(enum.StrEnum):
    CLAUDE = "claude"
    CODEX = "codex"
    COMMAND = "command"
