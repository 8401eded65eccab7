"""Conversations on the callee's side: which earlier agent session a follow-up call may resume.

A conversation id sent by a caller can only *narrow* a call that admission has already allowed:
it is looked up to confirm a binding made for the same caller, task, agent kind and working
directory, still alive (:data:`~agentcall.limits.CONTEXT_TTL_S` after its last turn) and under
the turn cap. Anything else is refused, and the pipeline answers ``context_unknown`` for every
refusal rather than silently starting afresh. The id never selects a task or a directory.

The agent session (Claude's session id, Codex's thread id) is what the agent CLI resumes. It
stays on this machine: it is not in any repr, log line or reply.

Pure rules (:func:`check`, :func:`mint`, :func:`next_turn`, :func:`session_plan`) take ``now``
as a parameter; :class:`SqliteContextStore` keeps bindings in ``state.sqlite``;
:class:`Conversations` is what the listener pipeline calls.
"""

from __future__ import annotations

import enum
import math
import os
import re
import sqlite3
from collections.abc import Callable
from typing import Final

import attrs
from zope.interface import Interface, implementer

from agentcall import ids, limits
from agentcall.errors import StoreError
from agentcall.wire import fields as f

# Agent kinds whose CLI can resume a session. A generic command agent cannot.
RESUMABLE_AGENTS: Final = frozenset({"claude", "codex"})
# The rule AgentSpec applies to resume_session: the id goes into argv, so no leading "-".
SESSION_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


def _positive_int(_inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name}: not a positive integer")


def _finite_time(_inst: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{attribute.name}: not a finite time")
    if value < 0:
        raise ValueError(f"{attribute.name}: before the epoch")


def _absolute(_inst: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not os.path.isabs(value) or "\0" in value:
        raise ValueError(f"{attribute.name}: not an absolute path")


def _agent_kind(_inst: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in RESUMABLE_AGENTS:
        raise ValueError(f"{attribute.name}: not an agent that can resume")


@attrs.frozen
class Binding:
    """One conversation: the agent session that a follow-up from ``caller`` may resume."""

    context_id: str = attrs.field(validator=f.context_id)
    caller: str = attrs.field(validator=f.address)
    task: str = attrs.field(validator=f.task_id)
    agent_kind: str = attrs.field(validator=_agent_kind)
    workdir: str = attrs.field(validator=_absolute)
    # Never leaves the machine: kept out of repr (and so out of any log that formats a binding).
    agent_session: str = attrs.field(validator=f.matches(SESSION_RE), repr=False)
    turns: int = attrs.field(validator=_positive_int)
    created_at: float = attrs.field(validator=_finite_time)
    last_used_at: float = attrs.field(validator=_finite_time)

    def __attrs_post_init__(self) -> None:
        if self.last_used_at < self.created_at:
            raise ValueError("last_used_at: before created_at")


class RefusalReason(enum.StrEnum):
    """Why a conversation id did not confirm a binding (for the owner's log only)."""

    UNKNOWN = "unknown"
    EXPIRED = "expired"
    TURN_CAP = "turn_cap"
    OTHER_CALLER = "other_caller"
    OTHER_TASK = "other_task"
    OTHER_AGENT = "other_agent"
    OTHER_WORKDIR = "other_workdir"
    NOT_THREADABLE = "not_threadable"
    STORE_ERROR = "store_error"


@attrs.frozen
class ContextRefusal:
    """The call must be answered ``context_unknown``; nothing may be spawned for it."""

    reason: RefusalReason


def expires_at(binding: Binding) -> float:
    return binding.last_used_at + limits.CONTEXT_TTL_S


def check(
    binding: Binding | None,
    *,
    caller: str,
    task: str,
    agent_kind: str,
    workdir: str,
    threadable: bool,
    now: float,
) -> Binding | ContextRefusal:
    """Confirm that ``binding`` may carry this admitted call, or say why not.

    ``task`` is the task admission chose and ``workdir`` the directory this call would run in;
    both come from local files, never from the conversation.
    """
    if binding is None:
        return ContextRefusal(RefusalReason.UNKNOWN)
    # Someone else's conversation is reported first: it is the interesting case in the log.
    if binding.caller != caller:
        return ContextRefusal(RefusalReason.OTHER_CALLER)
    if now >= expires_at(binding):
        return ContextRefusal(RefusalReason.EXPIRED)
    if binding.turns >= limits.MAX_CONTEXT_TURNS:
        return ContextRefusal(RefusalReason.TURN_CAP)
    if binding.task != task:
        return ContextRefusal(RefusalReason.OTHER_TASK)
    if binding.agent_kind != agent_kind:
        return ContextRefusal(RefusalReason.OTHER_AGENT)
    if binding.workdir != workdir:
        return ContextRefusal(RefusalReason.OTHER_WORKDIR)
    if not threadable:
        return ContextRefusal(RefusalReason.NOT_THREADABLE)
    return binding


def mint(
    *,
    caller: str,
    task: str,
    agent_kind: str,
    workdir: str,
    agent_session: str,
    now: float,
    context_id: str | None = None,
) -> Binding:
    """The binding after a conversation's first turn (a fresh id unless one is given)."""
    return Binding(
        context_id=ids.mint_context_id() if context_id is None else context_id,
        caller=caller,
        task=task,
        agent_kind=agent_kind,
        workdir=workdir,
        agent_session=agent_session,
        turns=1,
        created_at=now,
        last_used_at=now,
    )


def next_turn(binding: Binding, agent_session: str | None, now: float) -> Binding:
    """The binding after one more turn; the session the agent reported wins, if it did."""
    session = binding.agent_session if agent_session is None else agent_session
    return attrs.evolve(
        binding,
        agent_session=session,
        turns=binding.turns + 1,
        last_used_at=max(now, binding.created_at),
    )


@attrs.frozen
class SessionPlan:
    """The two AgentSpec fields a call's conversation decides."""

    resume_session: str | None = attrs.field(repr=False)
    keep_session: bool


def session_plan(binding: Binding | None, *, threadable: bool, agent_kind: str) -> SessionPlan:
    """Resume the binding's session; else keep a new one only if a follow-up could use it."""
    if binding is not None:
        return SessionPlan(binding.agent_session, keep_session=True)
    return SessionPlan(None, keep_session=threadable and agent_kind in RESUMABLE_AGENTS)


# --- storage -----------------------------------------------------------------------------------


class IContextStore(Interface):
    """Where bindings live, keyed by context id."""

    def get(context_id: str) -> Binding | None:
        """The binding, or None if unknown (a corrupt row counts as unknown)."""

    def put(binding: Binding) -> None:
        """Create or replace the binding with ``binding.context_id``."""

    def delete(context_id: str) -> bool:
        """Forget a binding; True if there was one."""

    def prune(now: float) -> int:
        """Drop expired bindings, then the least recently used beyond MAX_CONTEXTS."""


_COLUMNS = (
    "context_id, caller, task, agent_kind, workdir, agent_session, turns, created_at, last_used_at"
)
_SELECT = f"SELECT {_COLUMNS} FROM contexts WHERE context_id = ?"  # noqa: S608 (constant)
_UPSERT = (
    f"INSERT INTO contexts ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"  # noqa: S608
    " ON CONFLICT (context_id) DO UPDATE SET"
    " caller = excluded.caller, task = excluded.task, agent_kind = excluded.agent_kind,"
    " workdir = excluded.workdir, agent_session = excluded.agent_session,"
    " turns = excluded.turns, created_at = excluded.created_at,"
    " last_used_at = excluded.last_used_at"
)
_DELETE = "DELETE FROM contexts WHERE context_id = ?"
_PRUNE_EXPIRED = "DELETE FROM contexts WHERE last_used_at + ? <= ?"
_PRUNE_OLDEST = (
    "DELETE FROM contexts WHERE context_id NOT IN"
    " (SELECT context_id FROM contexts ORDER BY last_used_at DESC, context_id LIMIT ?)"
)


def _execute(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> sqlite3.Cursor:
    try:
        return conn.execute(sql, params)
    except sqlite3.Error as exc:
        raise StoreError(f"state database (conversations): {exc}") from exc


@implementer(IContextStore)
class SqliteContextStore:
    """Bindings in the ``contexts`` table of ``state.sqlite``."""

    def __init__(self, conn: sqlite3.Connection, *, max_contexts: int = limits.MAX_CONTEXTS):
        self._conn = conn
        self._max = max_contexts

    def get(self, context_id: str) -> Binding | None:
        row = _execute(self._conn, _SELECT, (context_id,)).fetchone()
        if row is None:
            return None
        try:
            return Binding(*row)
        except (TypeError, ValueError):
            # Fail safe: a row that is not a valid binding resumes nothing.
            return None

    def put(self, binding: Binding) -> None:
        _execute(
            self._conn,
            _UPSERT,
            (
                binding.context_id,
                binding.caller,
                binding.task,
                binding.agent_kind,
                binding.workdir,
                binding.agent_session,
                binding.turns,
                binding.created_at,
                binding.last_used_at,
            ),
        )

    def delete(self, context_id: str) -> bool:
        return _execute(self._conn, _DELETE, (context_id,)).rowcount > 0

    def prune(self, now: float) -> int:
        expired = _execute(self._conn, _PRUNE_EXPIRED, (limits.CONTEXT_TTL_S, now)).rowcount
        oldest = _execute(self._conn, _PRUNE_OLDEST, (self._max,)).rowcount
        return expired + oldest


# --- what the pipeline calls ---------------------------------------------------------------------


@attrs.frozen
class Kept:
    """What a successful run left behind, for the reply and for calls.log.

    ``context_id`` goes into the Reply (None: no follow-up is possible); ``turn`` is this call's
    turn number in its conversation; ``error`` says why a binding could not be saved (the answer
    is still sent: a write failure costs only the follow-up).
    """

    context_id: str | None = None
    turn: int | None = None
    error: str | None = None


class Conversations:
    """The conversation steps of the listener pipeline, over one store."""

    def __init__(
        self, store: IContextStore, *, mint_id: Callable[[], str] = ids.mint_context_id
    ) -> None:
        self._store = store
        self._mint_id = mint_id

    def admit(
        self,
        context_id: str | None,
        *,
        caller: str,
        task: str,
        agent_kind: str,
        workdir: str,
        threadable: bool,
        now: float,
    ) -> Binding | ContextRefusal | None:
        """After admission, before the queue: None for a fresh call, the binding to resume, or
        a refusal (answer ``context_unknown``, spawn nothing)."""
        if context_id is None:
            return None
        try:
            binding = self._store.get(context_id)
        except StoreError:
            return ContextRefusal(RefusalReason.STORE_ERROR)
        return check(
            binding,
            caller=caller,
            task=task,
            agent_kind=agent_kind,
            workdir=workdir,
            threadable=threadable,
            now=now,
        )

    def keep(
        self,
        resumed: Binding | None,
        agent_session: str | None,
        *,
        caller: str,
        task: str,
        agent_kind: str,
        workdir: str,
        threadable: bool,
        now: float,
    ) -> Kept:
        """After the agent answered: mint or roll the binding and store it."""
        if resumed is None and not (threadable and agent_kind in RESUMABLE_AGENTS):
            return Kept()
        if agent_session is not None and not SESSION_RE.match(agent_session):
            agent_session = None
        if resumed is None:
            if agent_session is None:
                return Kept(turn=1, error="the agent reported no session to resume")
            binding = mint(
                caller=caller,
                task=task,
                agent_kind=agent_kind,
                workdir=workdir,
                agent_session=agent_session,
                now=now,
                context_id=self._mint_id(),
            )
        else:
            binding = next_turn(resumed, agent_session, now)
        try:
            if binding.turns >= limits.MAX_CONTEXT_TURNS:
                # The last turn the cap allows: the conversation is complete.
                self._store.delete(binding.context_id)
                return Kept(turn=binding.turns)
            self._store.put(binding)
            self._store.prune(now)
        except StoreError as exc:
            return Kept(turn=binding.turns, error=str(exc))
        return Kept(binding.context_id, binding.turns)

    def end(self, binding: Binding) -> str | None:
        """The agent CLI could not resume ``binding``: forget it. The error, if any."""
        try:
            self._store.delete(binding.context_id)
        except StoreError as exc:
            return str(exc)
        return None
