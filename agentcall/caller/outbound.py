"""Conversations on the caller's side: which follow-up ``agentcall call --continue`` means.

When an answer carries a conversation id, the caller remembers it under (relay, peer, task):
one open conversation per peer and task, a newer one replacing the older. An entry counts as
open for :data:`~agentcall.limits.CONTEXT_TTL_S` after its last answer, computed here from our
own clock; the callee decides for real, and its ``context_unknown`` makes us forget the entry.

:func:`choose` turns ``--continue`` / ``--context`` / ``--task`` into the conversation to send,
or a :class:`ConversationError` whose message tells the person what to type instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

import attrs

from agentcall import ids, limits
from agentcall.caller.outboundstore import OpenConversation, SqliteOutboundStore
from agentcall.errors import AgentCallError, CallErrorCode
from agentcall.local.home import Home
from agentcall.local.statedb import StateDb
from agentcall.wire.payloads import Reply

# The task a call without --task runs on the callee (its built-in one). Conversations are
# remembered per task, so an answer that names no task is filed under this one.
DEFAULT_TASK: Final = "ask"
_TTL_MIN: Final = round(limits.CONTEXT_TTL_S / 60)


class ConversationError(AgentCallError):
    """``--continue`` or ``--context`` cannot be honoured; the message says what to do.

    ``code`` names the reason for ``--json`` output: ``bad_request``, ``no_conversation``,
    ``several_conversations`` or ``local_error``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen
class Continuation:
    """The conversation a call continues: the id and task its request carries."""

    context_id: str
    task: str | None


def choose(
    store: SqliteOutboundStore,
    *,
    peer: str,
    task: str | None,
    use_continue: bool,
    context_id: str | None,
    now: float,
) -> Continuation | None:
    """What ``--continue`` / ``--context ID`` (with an optional ``--task``) mean; None: a fresh
    call. Raises :class:`ConversationError` when they cannot be honoured."""
    if use_continue and context_id is not None:
        raise ConversationError("bad_request", "use either --continue or --context, not both")
    if context_id is not None:
        if ids.CONTEXT_ID_RE.match(context_id) is None:
            raise ConversationError("bad_request", f"{context_id!r} is not a conversation id")
        known = store.get(context_id)
        if known is None:
            # Not ours to judge: the callee knows whether it is still open.
            return Continuation(context_id, task)
        if known.peer != peer:
            raise ConversationError(
                "bad_request", f"conversation {context_id} is with {known.peer}, not {peer}"
            )
        if task is not None and task != known.task:
            raise ConversationError(
                "bad_request",
                f"conversation {context_id} is about task {known.task!r}, not {task!r}; "
                "drop --task or give the matching one",
            )
        return Continuation(context_id, known.task)
    if not use_continue:
        return None
    entries = store.open_for(peer, now)
    if task is not None:
        entries = [entry for entry in entries if entry.task == task]
    if not entries:
        about = f" about task {task!r}" if task is not None else ""
        raise ConversationError(
            "no_conversation",
            f"no open conversation with {peer}{about} (one ends {_TTL_MIN} minutes after its "
            "last answer); place a new call without --continue",
        )
    if len(entries) > 1:
        tasks = ", ".join(sorted(entry.task for entry in entries))
        raise ConversationError(
            "several_conversations",
            f"several open conversations with {peer} (tasks: {tasks}); "
            "add --task ID to say which one to continue",
        )
    return Continuation(entries[0].context_id, entries[0].task)


@attrs.frozen
class Settled:
    """What a finished call did to the open conversations."""

    opened: OpenConversation | None = None  # the answer opened (or kept open) this one
    several_open: bool = False  # ... and others with the same peer are open too
    closed: bool = False  # the agent answered a follow-up but takes no more on it
    ended: bool = False  # the agent does not know the conversation (context_unknown)

    def note(self, peer: str) -> str | None:
        """The line for stderr, if the person should hear about it."""
        if self.opened is not None:
            text = "conversation open — add --continue to follow up"
            if self.several_open:
                text += f" (with --task {self.opened.task}: several are open with {peer})"
            return text
        if self.closed:
            return (
                "conversation closed — the agent takes no follow-up on it; "
                "the next call starts a new one"
            )
        return None


def settle(
    store: SqliteOutboundStore,
    *,
    peer: str,
    sent: Continuation | None,
    task: str | None,
    reply: Reply | None,
    code: CallErrorCode | None,
    now: float,
) -> Settled:
    """Remember the conversation an answer carries; forget one the callee no longer keeps.

    ``sent`` is the conversation the call continued (if any), ``task`` the one asked for, and
    ``reply`` / ``code`` how the call ended.
    """
    if reply is None:
        if sent is not None and code is CallErrorCode.CONTEXT_UNKNOWN:
            store.forget(sent.context_id)
            return Settled(ended=True)
        # Anything else (busy, offline, a timeout) leaves the conversation to try again.
        return Settled()
    if sent is not None and sent.context_id != reply.context_id:
        store.forget(sent.context_id)
    if reply.context_id is None:
        return Settled(closed=sent is not None)
    task = reply.task or (sent.task if sent is not None else None) or task or DEFAULT_TASK
    entry = store.remember(peer, task, reply.context_id, now)
    return Settled(opened=entry, several_open=len(store.open_for(peer, now)) > 1)


# --- against the installation's state.sqlite -----------------------------------------------------


@contextlib.contextmanager
def opened_store(home: Home, relay_origin: str) -> Iterator[SqliteOutboundStore]:
    """The open conversations in ``home``'s state.sqlite, closed again afterwards."""
    db = StateDb.open(home)
    try:
        yield db.outbound(relay_origin)
    finally:
        db.close()


def load_continuation(
    home: Home,
    relay_origin: str,
    *,
    peer: str,
    task: str | None,
    use_continue: bool,
    context_id: str | None,
    now: float,
) -> Continuation | None:
    """:func:`choose` against the installation's store; trouble with the store is a
    :class:`ConversationError` too (``local_error``), since nothing can be guessed without it."""
    try:
        with opened_store(home, relay_origin) as store:
            return choose(
                store,
                peer=peer,
                task=task,
                use_continue=use_continue,
                context_id=context_id,
                now=now,
            )
    except ConversationError:
        raise
    except AgentCallError as exc:
        raise ConversationError(
            "local_error", f"cannot read your open conversations: {exc}"
        ) from None


def record_outcome(
    home: Home,
    relay_origin: str,
    *,
    peer: str,
    sent: Continuation | None,
    task: str | None,
    reply: Reply | None,
    code: CallErrorCode | None,
    now: float,
) -> Settled:
    """:func:`settle` against the installation's store (raises AgentCallError on trouble)."""
    with opened_store(home, relay_origin) as store:
        return settle(store, peer=peer, sent=sent, task=task, reply=reply, code=code, now=now)
