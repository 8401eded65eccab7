"""A2A's ``contextId`` and AgentCall's conversations, tied together: pure.

A2A groups messages into a conversation by ``contextId``; AgentCall's conversations
(``agentcall call --continue``) have ids of their own (``ctx_…``), opened by the callee's
answer and kept in ``state.sqlite`` by the caller's side. :class:`ContextBook` remembers, for
each A2A context the bridge has seen, whom it is with and the AgentCall conversation its last
answer left open, so a message in that context continues it. In memory, bounded; time is
passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

import attrs

from agentcall import ids
from agentcall.a2a.tasks import Finish, TaskState
from agentcall.errors import CallErrorCode

MAX_CONTEXTS: Final = 1000


@attrs.frozen
class Conversation:
    """An A2A context: whom it is with, and the AgentCall conversation it continues (if open)."""

    address: str
    agentcall_context: str | None
    used: float


@attrs.frozen
class Continue:
    """What a message's contextId means: the A2A context the task joins, and the AgentCall
    conversation to continue (None: a fresh call)."""

    context_id: str
    agentcall_context: str | None


class ContextMismatch(Exception):
    """The contextId belongs to a conversation with someone else."""


class ContextBook:
    """A2A contexts this bridge has seen, the most recently used last; at most ``limit``."""

    def __init__(self, limit: int = MAX_CONTEXTS) -> None:
        self._limit = limit
        self._contexts: OrderedDict[str, Conversation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._contexts)

    def get(self, context_id: str) -> Conversation | None:
        return self._contexts.get(context_id)

    def resolve(self, context_id: str | None, address: str, minted: str) -> Continue:
        """The conversation a message to ``address`` joins. No contextId: a new context
        (``minted``). One this bridge bound: its open AgentCall conversation, if any. An
        AgentCall conversation id itself (``ctx_…``, as ``agentcall call --json`` prints it):
        that conversation. Any other: a new context under the client's id."""
        if context_id is None:
            return Continue(minted, None)
        known = self._contexts.get(context_id)
        if known is not None:
            if known.address != address:
                raise ContextMismatch(
                    f"contextId {context_id} is a conversation with {known.address}, not {address}"
                )
            return Continue(context_id, known.agentcall_context)
        if ids.CONTEXT_ID_RE.match(context_id) is not None:
            return Continue(context_id, context_id)
        return Continue(context_id, None)

    def settle(self, context_id: str, address: str, end: Finish, now: float) -> None:
        """Remember what the call made of the conversation: the AgentCall conversation an
        answer opened (or none, if it opened none); a conversation the callee no longer knows
        is dropped; any other failure leaves it to be tried again."""
        known = self._contexts.get(context_id)
        if end.state is TaskState.COMPLETED:
            bound = end.conversation
        elif end.code == str(CallErrorCode.CONTEXT_UNKNOWN):
            bound = None
        else:
            bound = None if known is None else known.agentcall_context
        self._contexts[context_id] = Conversation(address, bound, now)
        self._contexts.move_to_end(context_id)
        while len(self._contexts) > self._limit:
            self._contexts.popitem(last=False)
