"""The ``contexts_out`` table of state.sqlite: the conversations this installation opened as a
caller, per relay, so ``agentcall call --continue`` can find them again.

Only storage lives here; what a follow-up means is decided in :mod:`agentcall.caller.outbound`. The
state database (:mod:`agentcall.local.statedb`) builds this store on its connection, so this module
imports neither of them.
"""

from __future__ import annotations

import sqlite3

import attrs

from agentcall import ids, limits
from agentcall.db import transaction
from agentcall.errors import StoreError
from agentcall.wire import fields as f


@attrs.frozen
class OpenConversation:
    """A conversation this installation may follow up on."""

    peer: str = attrs.field(validator=f.address)
    task: str = attrs.field(validator=f.task_id)
    context_id: str = attrs.field(validator=f.context_id)
    last_at: float

    def is_open(self, now: float) -> bool:
        return now < self.last_at + limits.CONTEXT_TTL_S


_SELECT_PEER = (
    "SELECT peer, task, context_id, last_at FROM contexts_out"
    " WHERE relay_origin = ? AND peer = ? AND last_at + ? > ?"
    " ORDER BY last_at DESC, task"
)
_SELECT_ID = (
    "SELECT peer, task, context_id, last_at FROM contexts_out"
    " WHERE relay_origin = ? AND context_id = ?"
)
_DELETE_ID = "DELETE FROM contexts_out WHERE relay_origin = ? AND context_id = ?"
_DELETE_ANY_WITH_ID = "DELETE FROM contexts_out WHERE context_id = ?"
_UPSERT = (
    "INSERT INTO contexts_out (relay_origin, peer, task, context_id, last_at)"
    " VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (relay_origin, peer, task) DO UPDATE SET"
    " context_id = excluded.context_id, last_at = excluded.last_at"
)
_PRUNE = "DELETE FROM contexts_out WHERE last_at + ? <= ?"


def _execute(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> sqlite3.Cursor:
    try:
        return conn.execute(sql, params)
    except sqlite3.Error as exc:
        raise StoreError(f"state database (open conversations): {exc}") from exc


def _row(row: tuple[object, ...]) -> OpenConversation | None:
    try:
        return OpenConversation(*row)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        # A damaged row is no conversation: the worst outcome is a fresh call.
        return None


class SqliteOutboundStore:
    """Open conversations in the ``contexts_out`` table, for the relay at ``relay_origin``."""

    def __init__(self, conn: sqlite3.Connection, relay_origin: str) -> None:
        if ids.RELAY_ORIGIN_RE.match(relay_origin) is None:
            raise ValueError(f"not a relay origin: {relay_origin!r}")
        self._conn = conn
        self._origin = relay_origin

    def remember(self, peer: str, task: str, context_id: str, now: float) -> OpenConversation:
        """Record an answer's conversation id; it replaces any earlier one for (peer, task)."""
        entry = OpenConversation(peer, task, context_id, now)
        with transaction(self._conn) as conn:
            # A conversation id names one conversation: drop any other row holding it.
            conn.execute(_DELETE_ANY_WITH_ID, (context_id,))
            conn.execute(_UPSERT, (self._origin, peer, task, context_id, now))
            conn.execute(_PRUNE, (limits.CONTEXT_TTL_S, now))
        return entry

    def open_for(self, peer: str, now: float) -> list[OpenConversation]:
        """The open conversations with ``peer``, most recently answered first."""
        rows = _execute(
            self._conn, _SELECT_PEER, (self._origin, peer, limits.CONTEXT_TTL_S, now)
        ).fetchall()
        return [entry for entry in map(_row, rows) if entry is not None]

    def get(self, context_id: str) -> OpenConversation | None:
        """The entry for ``context_id``, open or not, or None."""
        row = _execute(self._conn, _SELECT_ID, (self._origin, context_id)).fetchone()
        return None if row is None else _row(row)

    def forget(self, context_id: str) -> bool:
        return _execute(self._conn, _DELETE_ID, (self._origin, context_id)).rowcount > 0

    def prune(self, now: float) -> int:
        return _execute(self._conn, _PRUNE, (limits.CONTEXT_TTL_S, now)).rowcount
