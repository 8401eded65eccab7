"""A2A contexts tied to AgentCall conversations."""

from __future__ import annotations

import pytest

from agentcall.a2a import contexts
from agentcall.a2a.tasks import Finish, TaskState

NOW = 1_780_000_000.25
KEN = "@acme/ken"
CTX = "ctx_" + "A" * 22


def test_contexts_without_an_id_are_minted() -> None:
    book = contexts.ContextBook()
    assert book.resolve(None, KEN, "minted") == contexts.Continue("minted", None)


def test_a_bound_context_continues_its_conversation() -> None:
    book = contexts.ContextBook()
    answered = Finish(TaskState.COMPLETED, "ok", answer="a", conversation=CTX)
    book.settle("c1", KEN, answered, NOW)
    assert book.resolve("c1", KEN, "m") == contexts.Continue("c1", CTX)
    with pytest.raises(contexts.ContextMismatch):
        book.resolve("c1", "@acme/ann", "m")
    # A busy callee leaves the conversation to try again.
    book.settle("c1", KEN, Finish(TaskState.FAILED, "busy", "busy"), NOW + 1)
    assert book.resolve("c1", KEN, "m").agentcall_context == CTX
    # One the callee no longer knows is dropped: the next message starts afresh.
    book.settle("c1", KEN, Finish(TaskState.FAILED, "gone", "context_unknown"), NOW + 2)
    assert book.resolve("c1", KEN, "m") == contexts.Continue("c1", None)
    # An answer that opened no conversation binds none.
    book.settle("c1", KEN, answered, NOW + 3)
    book.settle("c1", KEN, Finish(TaskState.COMPLETED, "ok", answer="b"), NOW + 4)
    assert book.get("c1") == contexts.Conversation(KEN, None, NOW + 4)


def test_an_agentcall_conversation_id_is_taken_as_it_is() -> None:
    book = contexts.ContextBook()
    assert book.resolve(CTX, KEN, "m") == contexts.Continue(CTX, CTX)
    assert book.resolve("client-chosen", KEN, "m") == contexts.Continue("client-chosen", None)
    book.settle("never-answered", KEN, Finish(TaskState.FAILED, "x", "busy"), NOW)
    assert book.get("never-answered") == contexts.Conversation(KEN, None, NOW)


def test_the_context_book_is_bounded() -> None:
    book = contexts.ContextBook(limit=2)
    end = Finish(TaskState.COMPLETED, "ok", answer="a")
    for name in ("a", "b", "c"):
        book.settle(name, KEN, end, NOW)
    assert len(book) == 2 and book.get("a") is None
    book.settle("b", KEN, end, NOW)  # used again: now the newest
    book.settle("d", KEN, end, NOW)
    assert book.get("c") is None and book.get("b") is not None
