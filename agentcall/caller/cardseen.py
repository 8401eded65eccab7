"""The newest card seen of each peer (``seen_cards`` in ``state.sqlite``).

``agentcall inspect`` shows a peer's card as genuine only if it is not older than one it showed
before (:func:`agentcall.crypto.card.verify_card`'s ``newer_than``): the relay keeps only the
newest card, so an older one served later is a replay. Only issue times are kept, never a card.
"""

from __future__ import annotations

import sqlite3

from agentcall.errors import StoreError


class SqliteSeenCards:
    def __init__(self, conn: sqlite3.Connection, relay_origin: str) -> None:
        self._conn = conn
        self._origin = relay_origin

    def newest(self, address: str) -> int | None:
        """The issue time of the newest card of ``address`` shown as genuine, or None."""
        try:
            row = self._conn.execute(
                "SELECT issued_at FROM seen_cards WHERE relay_origin = ? AND address = ?",
                (self._origin, address),
            ).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"state database: {exc}") from exc
        return None if row is None else int(row[0])

    def saw(self, address: str, issued_at: int) -> None:
        """Remember a card verified against the pin (an older time never replaces a newer one).

        Only verified cards: one checked against a key the relay served unpinned could carry
        any date, and a far-future one would make every genuine card look like a replay."""
        try:
            self._conn.execute(
                "INSERT INTO seen_cards (relay_origin, address, issued_at) VALUES (?, ?, ?)"
                " ON CONFLICT (relay_origin, address) DO UPDATE SET"
                " issued_at = MAX(issued_at, excluded.issued_at)",
                (self._origin, address, issued_at),
            )
        except sqlite3.Error as exc:
            raise StoreError(f"state database: {exc}") from exc
