"""state.sqlite: the installation's machine state, one SQLite file.

It holds pins and replay reservations (queried here), the conversations this installation
answers (:mod:`agentcall.listener.contexts`), the ones it opened as a caller
(:mod:`agentcall.caller.outboundstore`), the execution journal of mailbox jobs
(:mod:`agentcall.listener.journal`), the mailbox jobs it queued as a caller
(:mod:`agentcall.caller.jobstore`) and the callees' key records it keeps as a caller
(:mod:`agentcall.caller.keycache`) and the newest card seen of each peer
(:mod:`agentcall.caller.cardseen`). People edit the JSON files next to it; nobody edits this
one, so it can be a database: WAL mode, versioned schema files
(``agentcall/db/schema/state-*.sql``), one writer at a time. Nothing here reads the clock;
callers pass ``now``.
"""

from __future__ import annotations

import functools
import sqlite3
from typing import TYPE_CHECKING

from zope.interface import implementer

from agentcall.caller.cardseen import SqliteSeenCards
from agentcall.caller.jobstore import SqliteSentJobs
from agentcall.caller.keycache import SqlitePeerKeys
from agentcall.caller.outboundstore import SqliteOutboundStore
from agentcall.crypto.pins import IPinStorage, Pin
from agentcall.crypto.replay import IReplayStorage
from agentcall.db import open_database, packaged_schema
from agentcall.errors import StoreError
from agentcall.local.home import Home

if TYPE_CHECKING:
    from agentcall.listener.contexts import SqliteContextStore
    from agentcall.listener.journal import SqliteJournal

STATE_SCHEMA = packaged_schema("state")

_SELECT_PIN = (
    "SELECT relay_origin, address, identity_pub, fingerprint, first_seen_at, highest_epoch"
    " FROM pins WHERE relay_origin = ? AND address = ?"
)
_UPSERT_PIN = (
    "INSERT INTO pins"
    " (relay_origin, address, identity_pub, fingerprint, first_seen_at, highest_epoch)"
    " VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (relay_origin, address) DO UPDATE SET"
    " identity_pub = excluded.identity_pub, fingerprint = excluded.fingerprint,"
    " first_seen_at = excluded.first_seen_at, highest_epoch = excluded.highest_epoch"
)
_DELETE_PIN = "DELETE FROM pins WHERE relay_origin = ? AND address = ?"
_SELECT_RESERVATION = (
    "SELECT keep_until FROM replay WHERE sender_fingerprint = ? AND request_id = ?"
)
_UPSERT_RESERVATION = (
    "INSERT INTO replay (sender_fingerprint, request_id, keep_until) VALUES (?, ?, ?)"
    " ON CONFLICT (sender_fingerprint, request_id) DO UPDATE SET keep_until = excluded.keep_until"
)
_COUNT_LIVE = "SELECT COUNT(*) FROM replay WHERE keep_until > ?"
_PRUNE = "DELETE FROM replay WHERE keep_until <= ?"


def _run(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> sqlite3.Cursor:
    # Each statement runs in autocommit mode, so each is its own durable transaction.
    try:
        return conn.execute(sql, params)
    except sqlite3.Error as exc:
        raise StoreError(f"state database: {exc}") from exc


@implementer(IPinStorage)
class SqlitePinStorage:
    """Pins in the ``pins`` table, keyed by (relay_origin, address)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def get(self, relay_origin: str, address: str) -> Pin | None:
        row = _run(self._conn, _SELECT_PIN, (relay_origin, address)).fetchone()
        if row is None:
            return None
        try:
            return Pin(*row)
        except (TypeError, ValueError):
            # A pin is a trust decision: a row that is not a valid pin must not be guessed at.
            raise StoreError(f"state database: the pin for {address} is corrupt") from None

    def put(self, pin: Pin) -> None:
        _run(
            self._conn,
            _UPSERT_PIN,
            (
                pin.relay_origin,
                pin.address,
                pin.identity_pub,
                pin.fingerprint,
                pin.first_seen_at,
                pin.highest_epoch,
            ),
        )

    def remove(self, relay_origin: str, address: str) -> bool:
        return _run(self._conn, _DELETE_PIN, (relay_origin, address)).rowcount > 0


@implementer(IReplayStorage)
class SqliteReplayStorage:
    """Replay reservations in the ``replay`` table; they outlive the process that made them."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def keep_until(self, sender_fingerprint: str, request_id: str) -> float | None:
        row = _run(self._conn, _SELECT_RESERVATION, (sender_fingerprint, request_id)).fetchone()
        return None if row is None else float(row[0])

    def add(self, sender_fingerprint: str, request_id: str, keep_until: float) -> None:
        _run(self._conn, _UPSERT_RESERVATION, (sender_fingerprint, request_id, keep_until))

    def count_live(self, now: float) -> int:
        count: int = _run(self._conn, _COUNT_LIVE, (now,)).fetchone()[0]
        return count

    def prune(self, now: float) -> int:
        return _run(self._conn, _PRUNE, (now,)).rowcount


class StateDb:
    """The open state database and the storages built on it."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.pins = SqlitePinStorage(conn)
        self.replay = SqliteReplayStorage(conn)

    # The listener's two stores are made (and their modules imported) on first use: a caller
    # that only places a call never touches them.
    @functools.cached_property
    def contexts(self) -> SqliteContextStore:
        from agentcall.listener.contexts import SqliteContextStore

        return SqliteContextStore(self._conn)

    @functools.cached_property
    def journal(self) -> SqliteJournal:
        from agentcall.listener.journal import SqliteJournal

        return SqliteJournal(self._conn)

    def outbound(self, relay_origin: str) -> SqliteOutboundStore:
        """The conversations this installation opened as a caller through ``relay_origin``."""
        return SqliteOutboundStore(self._conn, relay_origin)

    def sent_jobs(self, relay_origin: str) -> SqliteSentJobs:
        """The mailbox jobs this installation queued as a caller through ``relay_origin``."""
        return SqliteSentJobs(self._conn, relay_origin)

    def peer_keys(self, relay_origin: str) -> SqlitePeerKeys:
        """The callees' key records this installation keeps for calls through ``relay_origin``."""
        return SqlitePeerKeys(self._conn, relay_origin)

    def seen_cards(self, relay_origin: str) -> SqliteSeenCards:
        """The newest card seen of each peer through ``relay_origin`` (``agentcall inspect``)."""
        return SqliteSeenCards(self._conn, relay_origin)

    @classmethod
    def open(cls, home: Home) -> StateDb:
        """Open (creating 0600 if needed) ``state.sqlite`` at the newest state schema."""
        # Created empty and private first: SQLite would use the umask, and its -wal and -shm
        # files copy the database file's mode.
        home.create_private(home.state_db_path)
        opened = open_database(home.state_db_path, STATE_SCHEMA)
        return cls(opened.connection)

    @property
    def connection(self) -> sqlite3.Connection:
        return self._conn

    def close(self) -> None:
        self._conn.close()
