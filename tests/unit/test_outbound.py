"""The caller's open conversations: storage, what --continue/--context mean, and settling."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from agentcall import limits
from agentcall.caller.outbound import (
    DEFAULT_TASK,
    Continuation,
    ConversationError,
    Settled,
    choose,
    settle,
)
from agentcall.caller.outboundstore import OpenConversation, SqliteOutboundStore
from agentcall.db import open_database
from agentcall.errors import CallErrorCode, StoreError
from agentcall.local.statedb import STATE_SCHEMA
from agentcall.wire.payloads import Reply

NOW = 1_750_000_000.0
TTL = limits.CONTEXT_TTL_S
ORIGIN = "relay.example"
BOB = "@acme/bob"
KEN = "@acme/ken"


def ctx(letter: str) -> str:
    return "ctx_" + letter * 22


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    opened = open_database(":memory:", STATE_SCHEMA)
    yield opened.connection
    opened.connection.close()


@pytest.fixture
def store(conn: sqlite3.Connection) -> SqliteOutboundStore:
    return SqliteOutboundStore(conn, ORIGIN)


def test_remember_get_forget(store: SqliteOutboundStore) -> None:
    """An entry is found by id and by peer, and forgotten once."""
    entry = store.remember(BOB, "ask", ctx("a"), NOW)
    assert entry == OpenConversation(BOB, "ask", ctx("a"), NOW)
    assert store.get(ctx("a")) == entry
    assert store.open_for(BOB, NOW + 1) == [entry]
    assert store.open_for(KEN, NOW + 1) == []
    assert store.forget(ctx("a")) is True
    assert store.forget(ctx("a")) is False
    assert store.get(ctx("a")) is None


def test_one_open_conversation_per_peer_and_task(store: SqliteOutboundStore) -> None:
    """A newer conversation on the same task replaces the older; other tasks stay."""
    store.remember(BOB, "ask", ctx("a"), NOW)
    store.remember(BOB, "review", ctx("b"), NOW + 1)
    store.remember(BOB, "ask", ctx("c"), NOW + 2)
    assert [(e.task, e.context_id) for e in store.open_for(BOB, NOW + 3)] == [
        ("ask", ctx("c")),
        ("review", ctx("b")),
    ]
    assert store.get(ctx("a")) is None


def test_an_id_names_one_conversation(store: SqliteOutboundStore) -> None:
    """The same id coming back for another peer moves the entry rather than failing."""
    store.remember(BOB, "ask", ctx("a"), NOW)
    store.remember(KEN, "ask", ctx("a"), NOW + 1)
    assert store.open_for(BOB, NOW + 2) == []
    assert store.get(ctx("a")) == OpenConversation(KEN, "ask", ctx("a"), NOW + 1)


def test_open_means_less_than_thirty_minutes_since_the_last_answer(
    store: SqliteOutboundStore,
) -> None:
    """Computed locally with the callee's rule: gone exactly at last_at + 30 min."""
    entry = store.remember(BOB, "ask", ctx("a"), NOW)
    assert store.open_for(BOB, NOW + TTL - 0.001) == [entry]
    assert entry.is_open(NOW + TTL - 0.001)
    assert store.open_for(BOB, NOW + TTL) == []
    assert not entry.is_open(NOW + TTL)
    # Still there for an explicit --context, until something prunes it.
    assert store.get(ctx("a")) == entry
    assert store.prune(NOW + TTL) == 1
    assert store.get(ctx("a")) is None


def test_remembering_prunes_expired_entries(store: SqliteOutboundStore) -> None:
    store.remember(BOB, "ask", ctx("a"), NOW)
    store.remember(KEN, "ask", ctx("b"), NOW + TTL)
    assert store.get(ctx("a")) is None


def test_entries_are_per_relay(conn: sqlite3.Connection, store: SqliteOutboundStore) -> None:
    """A conversation opened through one relay is not offered through another."""
    store.remember(BOB, "ask", ctx("a"), NOW)
    elsewhere = SqliteOutboundStore(conn, "relay.other.example")
    assert elsewhere.open_for(BOB, NOW) == []
    assert elsewhere.get(ctx("a")) is None
    assert elsewhere.forget(ctx("a")) is False
    with pytest.raises(ValueError):
        SqliteOutboundStore(conn, "https://relay.example")


def test_a_damaged_row_is_no_conversation(
    conn: sqlite3.Connection, store: SqliteOutboundStore
) -> None:
    """A row that does not parse is skipped: the worst outcome is a fresh call."""
    store.remember(BOB, "ask", ctx("a"), NOW)
    store.remember(BOB, "review", ctx("b"), NOW)
    conn.execute("UPDATE contexts_out SET task = 'Not A Task' WHERE context_id = ?", (ctx("b"),))
    assert [e.context_id for e in store.open_for(BOB, NOW)] == [ctx("a")]
    assert store.get(ctx("b")) is None


def test_a_closed_connection_is_a_store_error(
    conn: sqlite3.Connection, store: SqliteOutboundStore
) -> None:
    conn.close()
    with pytest.raises(StoreError):
        store.remember(BOB, "ask", ctx("a"), NOW)
    with pytest.raises(StoreError):
        store.open_for(BOB, NOW)


# --- choose ------------------------------------------------------------------------------------


def pick(
    store: SqliteOutboundStore,
    *,
    task: str | None = None,
    use_continue: bool = False,
    context_id: str | None = None,
    peer: str = BOB,
    now: float = NOW + 60,
) -> Continuation | None:
    return choose(
        store, peer=peer, task=task, use_continue=use_continue, context_id=context_id, now=now
    )


def test_without_flags_a_call_is_fresh(store: SqliteOutboundStore) -> None:
    store.remember(BOB, "ask", ctx("a"), NOW)
    assert pick(store) is None


def test_continue_picks_the_one_open_conversation(store: SqliteOutboundStore) -> None:
    store.remember(BOB, "review", ctx("a"), NOW)
    store.remember(KEN, "ask", ctx("k"), NOW)
    assert pick(store, use_continue=True) == Continuation(ctx("a"), "review")


def test_continue_with_several_asks_for_a_task(store: SqliteOutboundStore) -> None:
    """Two open tasks with one peer: --continue alone is refused, --task chooses."""
    store.remember(BOB, "ask", ctx("a"), NOW)
    store.remember(BOB, "review", ctx("b"), NOW)
    with pytest.raises(ConversationError, match="several open conversations") as err:
        pick(store, use_continue=True)
    assert err.value.code == "several_conversations"
    assert "--task" in str(err.value) and "ask, review" in str(err.value)
    assert pick(store, use_continue=True, task="review") == Continuation(ctx("b"), "review")


@pytest.mark.parametrize(
    ("task", "now"),
    [(None, NOW + 60), ("deploy", NOW + 60), (None, NOW + TTL)],
    ids=["nothing-open", "other-task", "expired"],
)
def test_continue_with_nothing_open_says_so(
    store: SqliteOutboundStore, task: str | None, now: float
) -> None:
    """No (live) conversation with that peer on that task: a clear error, nothing sent."""
    if task is not None or now != NOW + 60:
        store.remember(BOB, "ask", ctx("a"), NOW)
    store.remember(KEN, "ask", ctx("k"), NOW)
    with pytest.raises(ConversationError, match="no open conversation with @acme/bob") as err:
        pick(store, use_continue=True, task=task, now=now)
    assert err.value.code == "no_conversation"
    assert "without --continue" in str(err.value)


def test_an_explicit_id_is_sent_as_it_is(store: SqliteOutboundStore) -> None:
    """An id we never stored is sent with the task given; the callee decides."""
    assert pick(store, context_id=ctx("z")) == Continuation(ctx("z"), None)
    assert pick(store, context_id=ctx("z"), task="review") == Continuation(ctx("z"), "review")


def test_an_explicit_id_we_know_brings_its_task(store: SqliteOutboundStore) -> None:
    """A stored id supplies its task; a --task that disagrees, or another peer, is refused."""
    store.remember(BOB, "review", ctx("a"), NOW)
    assert pick(store, context_id=ctx("a")) == Continuation(ctx("a"), "review")
    assert pick(store, context_id=ctx("a"), task="review") == Continuation(ctx("a"), "review")
    with pytest.raises(ConversationError, match="about task 'review', not 'ask'"):
        pick(store, context_id=ctx("a"), task="ask")
    with pytest.raises(ConversationError, match="is with @acme/bob, not @acme/ken"):
        pick(store, context_id=ctx("a"), peer=KEN)


def test_continue_and_context_exclude_each_other(store: SqliteOutboundStore) -> None:
    store.remember(BOB, "ask", ctx("a"), NOW)
    with pytest.raises(ConversationError, match="not both") as err:
        pick(store, use_continue=True, context_id=ctx("a"))
    assert err.value.code == "bad_request"


def test_a_malformed_id_is_refused(store: SqliteOutboundStore) -> None:
    with pytest.raises(ConversationError, match="not a conversation id"):
        pick(store, context_id="ctx_../../etc")


# --- settle ------------------------------------------------------------------------------------


def finish(
    store: SqliteOutboundStore,
    *,
    sent: Continuation | None = None,
    task: str | None = None,
    reply: Reply | None = None,
    code: CallErrorCode | None = None,
    now: float = NOW,
) -> Settled:
    return settle(store, peer=BOB, sent=sent, task=task, reply=reply, code=code, now=now)


def test_an_answer_with_an_id_opens_a_conversation(store: SqliteOutboundStore) -> None:
    """Filed under the answer's task, else the asked task, else the built-in one."""
    settled = finish(store, reply=Reply(text="hi", context_id=ctx("a"), task="review"))
    assert settled == Settled(opened=OpenConversation(BOB, "review", ctx("a"), NOW))
    settled = finish(store, reply=Reply(text="hi", context_id=ctx("b")), task="deploy", now=NOW + 1)
    assert settled.opened == OpenConversation(BOB, "deploy", ctx("b"), NOW + 1)
    assert settled.several_open
    settled = finish(store, reply=Reply(text="hi", context_id=ctx("c")), now=NOW + 2)
    assert settled.opened is not None and settled.opened.task == DEFAULT_TASK


def test_an_answer_without_an_id_changes_nothing(store: SqliteOutboundStore) -> None:
    store.remember(BOB, "ask", ctx("a"), NOW)
    assert finish(store, reply=Reply(text="hi")) == Settled()
    assert store.get(ctx("a")) is not None


def test_a_follow_up_answer_keeps_the_conversation_going(store: SqliteOutboundStore) -> None:
    """The same id comes back: its clock restarts at this answer."""
    store.remember(BOB, "review", ctx("a"), NOW)
    sent = Continuation(ctx("a"), "review")
    settled = finish(store, sent=sent, reply=Reply(text="hi", context_id=ctx("a")), now=NOW + 600)
    assert settled.opened == OpenConversation(BOB, "review", ctx("a"), NOW + 600)
    assert store.open_for(BOB, NOW + 600 + TTL - 1) != []


def test_a_follow_up_answer_without_an_id_closes_it(store: SqliteOutboundStore) -> None:
    """The last turn the agent allows: answered, and the local entry is gone."""
    store.remember(BOB, "ask", ctx("a"), NOW)
    settled = finish(store, sent=Continuation(ctx("a"), "ask"), reply=Reply(text="bye"))
    assert settled == Settled(closed=True)
    assert store.get(ctx("a")) is None


def test_context_unknown_forgets_the_continued_conversation(store: SqliteOutboundStore) -> None:
    store.remember(BOB, "ask", ctx("a"), NOW)
    settled = finish(store, sent=Continuation(ctx("a"), "ask"), code=CallErrorCode.CONTEXT_UNKNOWN)
    assert settled == Settled(ended=True)
    assert store.get(ctx("a")) is None


@pytest.mark.parametrize("code", [CallErrorCode.BUSY, CallErrorCode.OFFLINE, CallErrorCode.TIMEOUT])
def test_other_failures_leave_the_conversation_open(
    store: SqliteOutboundStore, code: CallErrorCode
) -> None:
    """Busy or offline is no reason to lose the thread: --continue can try again."""
    store.remember(BOB, "ask", ctx("a"), NOW)
    assert finish(store, sent=Continuation(ctx("a"), "ask"), code=code) == Settled()
    assert store.get(ctx("a")) is not None
