"""Callee conversations: the narrowing rules, the SQLite store, and the pipeline helper."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import attrs
import pytest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from agentcall import ids, limits
from agentcall.db import open_database
from agentcall.errors import StoreError
from agentcall.listener.agents.base import AgentSpec
from agentcall.listener.contexts import (
    Binding,
    ContextRefusal,
    Conversations,
    IContextStore,
    Kept,
    RefusalReason,
    SessionPlan,
    SqliteContextStore,
    check,
    mint,
    next_turn,
    session_plan,
)
from agentcall.local.statedb import STATE_SCHEMA

NOW = 1_750_000_000.0
TTL = limits.CONTEXT_TTL_S
ANN = "@acme/ann"
CTX = "ctx_" + "A" * 22
SESSION = "0b6f3a8e-5d3c-4f0e-9a51-7d1c2b3a4f5e"
WORKDIR = "/home/ken/AgentCall/public"


def a_binding(**changes: object) -> Binding:
    fields: dict[str, object] = {
        "context_id": CTX,
        "caller": ANN,
        "task": "ask",
        "agent_kind": "claude",
        "workdir": WORKDIR,
        "agent_session": SESSION,
        "turns": 1,
        "created_at": NOW,
        "last_used_at": NOW,
    }
    fields.update(changes)
    return Binding(**fields)  # type: ignore[arg-type]


def judge(
    binding: Binding | None,
    *,
    caller: str = ANN,
    task: str = "ask",
    agent_kind: str = "claude",
    workdir: str = WORKDIR,
    threadable: bool = True,
    now: float = NOW + 60,
) -> Binding | ContextRefusal:
    """check() for a call that fits a_binding(), unless told otherwise."""
    return check(
        binding,
        caller=caller,
        task=task,
        agent_kind=agent_kind,
        workdir=workdir,
        threadable=threadable,
        now=now,
    )


@pytest.mark.parametrize(
    ("binding", "call", "reason"),
    [
        (None, {}, RefusalReason.UNKNOWN),
        (a_binding(), {"caller": "@acme/eve"}, RefusalReason.OTHER_CALLER),
        (a_binding(), {"now": NOW + TTL}, RefusalReason.EXPIRED),
        (a_binding(), {"now": NOW + 10 * TTL}, RefusalReason.EXPIRED),
        (a_binding(turns=limits.MAX_CONTEXT_TURNS), {}, RefusalReason.TURN_CAP),
        (a_binding(turns=limits.MAX_CONTEXT_TURNS + 5), {}, RefusalReason.TURN_CAP),
        (a_binding(), {"task": "review"}, RefusalReason.OTHER_TASK),
        (a_binding(), {"agent_kind": "codex"}, RefusalReason.OTHER_AGENT),
        (a_binding(), {"workdir": "/home/ken"}, RefusalReason.OTHER_WORKDIR),
        (a_binding(), {"threadable": False}, RefusalReason.NOT_THREADABLE),
    ],
    ids=lambda value: str(value) if isinstance(value, RefusalReason) else "",
)
def test_every_mismatch_is_refused(
    binding: Binding | None, call: dict[str, object], reason: RefusalReason
) -> None:
    """Each way a conversation id can fail to fit the call has its own refusal reason."""
    verdict = judge(binding, **call)  # type: ignore[arg-type]
    assert verdict == ContextRefusal(reason)


def test_a_fitting_binding_is_confirmed() -> None:
    """The same caller, task, agent and directory, alive and under the cap: resume it."""
    binding = a_binding()
    assert judge(binding) is binding


def test_ttl_edge_is_exactly_thirty_minutes_after_the_last_turn() -> None:
    """Alive a moment before last_used_at + 30 min, gone exactly at it; created_at is moot."""
    binding = a_binding(created_at=NOW - 3 * TTL, last_used_at=NOW)
    assert TTL == 30 * 60
    assert judge(binding, now=NOW + TTL - 0.001) is binding
    assert judge(binding, now=NOW + TTL) == ContextRefusal(RefusalReason.EXPIRED)


def test_turn_cap_edge_is_ten() -> None:
    """Nine turns done may take a tenth; ten done may not."""
    assert limits.MAX_CONTEXT_TURNS == 10
    nine = a_binding(turns=9)
    assert judge(nine) is nine
    ten = a_binding(turns=10)
    assert judge(ten) == ContextRefusal(RefusalReason.TURN_CAP)


def test_someone_elses_conversation_is_reported_as_theirs_even_when_expired() -> None:
    """The log should show an attempt on another caller's conversation, not just 'expired'."""
    verdict = judge(a_binding(), caller="@acme/eve", now=NOW + 2 * TTL)
    assert verdict == ContextRefusal(RefusalReason.OTHER_CALLER)


def test_mint_and_next_turn() -> None:
    """A new binding is turn 1; each turn counts up, moves last_used_at, keeps the rest."""
    first = mint(
        caller=ANN, task="ask", agent_kind="codex", workdir=WORKDIR, agent_session="t-1", now=NOW
    )
    assert ids.CONTEXT_ID_RE.match(first.context_id)
    assert (first.turns, first.created_at, first.last_used_at) == (1, NOW, NOW)
    second = next_turn(first, None, NOW + 100)
    assert (second.turns, second.last_used_at, second.agent_session) == (2, NOW + 100, "t-1")
    assert (second.context_id, second.created_at, second.caller) == (first.context_id, NOW, ANN)
    third = next_turn(second, "t-2", NOW + 200)
    assert (third.turns, third.agent_session) == (3, "t-2")
    other = mint(
        caller=ANN, task="ask", agent_kind="codex", workdir=WORKDIR, agent_session="t-1", now=NOW
    )
    assert other.context_id != first.context_id


def test_the_session_never_shows_in_a_repr() -> None:
    """The agent session stays on this machine: not in the repr of a binding or a plan."""
    binding = a_binding()
    assert SESSION not in repr(binding)
    assert SESSION not in str(binding)
    assert SESSION not in repr(session_plan(binding, threadable=True, agent_kind="claude"))
    assert CTX in repr(binding)


@pytest.mark.parametrize(
    "changes",
    [
        {"context_id": "ctx_short"},
        {"caller": "ann"},
        {"task": "Not A Task"},
        {"agent_kind": "command"},
        {"workdir": "relative/dir"},
        {"agent_session": "--dangerous"},
        {"agent_session": ""},
        {"turns": 0},
        {"turns": True},
        {"created_at": float("nan")},
        {"last_used_at": NOW - 1},
    ],
    ids=str,
)
def test_a_binding_refuses_nonsense(changes: dict[str, object]) -> None:
    """Only well-formed bindings exist; a session id could otherwise become a CLI flag."""
    with pytest.raises(ValueError):
        a_binding(**changes)


def test_a_stored_session_is_one_agent_spec_accepts() -> None:
    """Whatever a binding holds can be resumed: AgentSpec's own check agrees."""
    for session in (SESSION, "019a7c2e-thread", "a", "x" * 128):
        binding = a_binding(agent_session=session)
        spec = AgentSpec(
            binary="/usr/bin/claude",
            workdir=WORKDIR,
            tools={"read"},
            resume_session=session_plan(
                binding, threadable=True, agent_kind="claude"
            ).resume_session,
        )
        assert spec.resume_session == session


@pytest.mark.parametrize(
    ("binding", "threadable", "kind", "plan"),
    [
        (a_binding(), True, "claude", SessionPlan(SESSION, keep_session=True)),
        (None, True, "claude", SessionPlan(None, keep_session=True)),
        (None, True, "codex", SessionPlan(None, keep_session=True)),
        (None, False, "claude", SessionPlan(None, keep_session=False)),
        (None, True, "command", SessionPlan(None, keep_session=False)),
    ],
)
def test_session_plan(
    binding: Binding | None, threadable: bool, kind: str, plan: SessionPlan
) -> None:
    """Resume a confirmed binding; keep a fresh session only when a follow-up could use it."""
    assert session_plan(binding, threadable=threadable, agent_kind=kind) == plan


# --- the SQLite store ------------------------------------------------------------------------


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    opened = open_database(":memory:", STATE_SCHEMA)
    yield opened.connection
    opened.connection.close()


def ctx(n: int) -> str:
    return f"ctx_{n:022d}"


def test_store_provides_its_interface(conn: sqlite3.Connection) -> None:
    assert verifyObject(IContextStore, SqliteContextStore(conn))


def test_store_put_get_replace_delete(conn: sqlite3.Connection) -> None:
    """A binding round-trips exactly, is replaced by id, and is deleted once."""
    store = SqliteContextStore(conn)
    assert store.get(CTX) is None
    store.put(a_binding())
    assert store.get(CTX) == a_binding()
    rolled = a_binding(turns=4, last_used_at=NOW + 90.5, agent_session="s-2")
    store.put(rolled)
    assert store.get(CTX) == rolled
    assert conn.execute("SELECT COUNT(*) FROM contexts").fetchone()[0] == 1
    assert store.delete(CTX) is True
    assert store.delete(CTX) is False
    assert store.get(CTX) is None


def test_store_persists_across_connections(tmp_path: object) -> None:
    """A binding written by one connection is read by the next (a listener restart)."""
    path = f"{tmp_path}/state.sqlite"
    first = open_database(path, STATE_SCHEMA).connection
    SqliteContextStore(first).put(a_binding(turns=3))
    first.close()
    second = open_database(path, STATE_SCHEMA).connection
    try:
        assert SqliteContextStore(second).get(CTX) == a_binding(turns=3)
    finally:
        second.close()


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("agent_session", "-rf"),
        ("caller", "nobody"),
        ("workdir", "relative"),
        ("turns", "many"),
        ("turns", 0),
        ("agent_kind", "command"),
        ("last_used_at", "yesterday"),
        ("created_at", NOW + 1),
    ],
)
def test_a_corrupt_row_is_unknown(conn: sqlite3.Connection, column: str, value: object) -> None:
    """Fail safe: a row that is not a valid binding resumes nothing."""
    store = SqliteContextStore(conn)
    store.put(a_binding())
    conn.execute(f"UPDATE contexts SET {column} = ?", (value,))
    found = store.get(CTX)
    assert found is None
    assert judge(found) == ContextRefusal(RefusalReason.UNKNOWN)


def test_prune_drops_expired_then_least_recently_used(conn: sqlite3.Connection) -> None:
    """Expired bindings go first; then only the most recently used MAX_CONTEXTS stay."""
    store = SqliteContextStore(conn, max_contexts=3)
    gone = NOW - TTL
    store.put(a_binding(context_id=ctx(0), created_at=gone, last_used_at=gone))
    alive = NOW - TTL + 1
    store.put(a_binding(context_id=ctx(9), created_at=alive, last_used_at=alive))  # oldest
    for n in range(1, 5):
        store.put(a_binding(context_id=ctx(n), last_used_at=NOW + n))
    assert store.prune(NOW) == 1 + 2
    kept = {row[0] for row in conn.execute("SELECT context_id FROM contexts")}
    assert kept == {ctx(2), ctx(3), ctx(4)}
    assert store.prune(NOW) == 0


def test_prune_keeps_up_to_the_default_cap(conn: sqlite3.Connection) -> None:
    """With the real limit, MAX_CONTEXTS live bindings all stay and one more evicts the oldest."""
    store = SqliteContextStore(conn)
    for n in range(limits.MAX_CONTEXTS + 1):
        store.put(a_binding(context_id=ctx(n), last_used_at=NOW + n))
    assert store.prune(NOW) == 1
    assert store.get(ctx(0)) is None
    assert store.get(ctx(1)) is not None


def test_closed_connection_is_a_store_error(conn: sqlite3.Connection) -> None:
    store = SqliteContextStore(conn)
    conn.close()
    with pytest.raises(StoreError):
        store.get(CTX)


# --- the pipeline helper ---------------------------------------------------------------------


@implementer(IContextStore)
@attrs.define
class FlakyStore:
    """A store in memory that can be told to fail."""

    rows: dict[str, Binding] = attrs.field(factory=dict)
    fail: bool = False
    pruned: list[float] = attrs.field(factory=list)

    def _maybe_fail(self) -> None:
        if self.fail:
            raise StoreError("disk full")

    def get(self, context_id: str) -> Binding | None:
        self._maybe_fail()
        return self.rows.get(context_id)

    def put(self, binding: Binding) -> None:
        self._maybe_fail()
        self.rows[binding.context_id] = binding

    def delete(self, context_id: str) -> bool:
        self._maybe_fail()
        return self.rows.pop(context_id, None) is not None

    def prune(self, now: float) -> int:
        self._maybe_fail()
        self.pruned.append(now)
        return 0


def admit(talks: Conversations, context_id: str | None, now: float) -> object:
    return talks.admit(
        context_id,
        caller=ANN,
        task="ask",
        agent_kind="claude",
        workdir=WORKDIR,
        threadable=True,
        now=now,
    )


def keep(
    talks: Conversations,
    resumed: Binding | None,
    session: str | None,
    now: float,
    *,
    agent_kind: str = "claude",
    threadable: bool = True,
) -> Kept:
    return talks.keep(
        resumed,
        session,
        caller=ANN,
        task="ask",
        agent_kind=agent_kind,
        workdir=WORKDIR,
        threadable=threadable,
        now=now,
    )


def test_admit_without_an_id_is_a_fresh_call() -> None:
    """No conversation id: nothing to confirm, and the store is not even asked."""
    store = FlakyStore(fail=True)
    assert admit(Conversations(store), None, NOW) is None


def test_admit_confirms_or_refuses() -> None:
    """A fitting binding comes back; a store that cannot answer refuses (fail safe)."""
    store = FlakyStore({CTX: a_binding()})
    talks = Conversations(store)
    assert admit(talks, CTX, NOW + 1) == a_binding()
    refused = admit(talks, "ctx_" + "Z" * 22, NOW + 1)
    assert refused == ContextRefusal(RefusalReason.UNKNOWN)
    store.fail = True
    refused = admit(talks, CTX, NOW + 1)
    assert refused == ContextRefusal(RefusalReason.STORE_ERROR)


def test_keep_mints_on_a_first_turn_and_rolls_on_later_ones() -> None:
    """Turn 1 gets a fresh id; a resumed turn keeps it, counts up and prunes the store."""
    store = FlakyStore()
    talks = Conversations(store, mint_id=lambda: CTX)
    kept = keep(talks, None, SESSION, NOW)
    assert kept == Kept(CTX, 1)
    assert store.rows[CTX] == a_binding()
    kept = keep(talks, store.rows[CTX], None, NOW + 60)
    assert kept == Kept(CTX, 2)
    assert store.rows[CTX] == a_binding(turns=2, last_used_at=NOW + 60)
    assert store.pruned == [NOW, NOW + 60]


@pytest.mark.parametrize(
    ("scope", "session"),
    [({"threadable": False}, SESSION), ({"agent_kind": "command"}, SESSION)],
)
def test_keep_offers_nothing_when_no_follow_up_is_possible(
    scope: dict[str, object], session: str
) -> None:
    """A task that is not threadable, or an agent that cannot resume, opens no conversation."""
    store = FlakyStore()
    kept = keep(Conversations(store), None, session, NOW, **scope)  # type: ignore[arg-type]
    assert kept == Kept()
    assert store.rows == {}


@pytest.mark.parametrize("session", [None, "-rf"])
def test_keep_without_a_usable_session_opens_nothing(session: str | None) -> None:
    """Without a session id that can go into argv there is nothing to resume: no context id."""
    store = FlakyStore()
    kept = keep(Conversations(store), None, session, NOW)
    assert (kept.context_id, kept.turn) == (None, 1)
    assert kept.error is not None
    assert store.rows == {}


def test_the_last_allowed_turn_closes_the_conversation() -> None:
    """Turn 10 is answered but offers no follow-up, and its binding is gone."""
    store = FlakyStore({CTX: a_binding(turns=9)})
    talks = Conversations(store)
    kept = keep(talks, store.rows[CTX], SESSION, NOW + 1)
    assert kept == Kept(None, 10)
    assert store.rows == {}


def test_keep_survives_a_store_failure() -> None:
    """A write failure costs only the follow-up: no id is offered, the error is reported."""
    store = FlakyStore(fail=True)
    kept = keep(Conversations(store, mint_id=lambda: CTX), None, SESSION, NOW)
    assert (kept.context_id, kept.turn, kept.error) == (None, 1, "disk full")


def test_end_forgets_a_binding_the_agent_cannot_resume() -> None:
    """After a resume failure the binding is gone, so the next try is context_unknown."""
    store = FlakyStore({CTX: a_binding()})
    talks = Conversations(store)
    assert talks.end(a_binding()) is None
    assert admit(talks, CTX, NOW) == ContextRefusal(RefusalReason.UNKNOWN)
    store.fail = True
    assert talks.end(a_binding()) == "disk full"
