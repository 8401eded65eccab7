"""The ``peer_keys`` table of state.sqlite: the callees' key records a caller keeps and reuses.

Placing a call used to start with ``GET /v1/keys/<callee>``. The records it returns change
rarely: an encryption epoch lasts 30 days and its owner mints the next one only in the last
``KEY_ROTATE_BEFORE_S`` (7 days) of it. So the caller keeps the records it last believed and
reuses them (:func:`decide`):

- while the encryption record is inside its window and the callee cannot be rotating yet
  (more than ``KEY_ROTATE_BEFORE_S`` before ``not_after``), without asking the relay;
- inside that last stretch, asking again at most once every ``KEY_CACHE_REFETCH_S``;
- never once the record has expired (or is not valid yet): then it fetches.

Keeping records is no shortcut around trust. Every use checks them against the pin again
(:meth:`agentcall.crypto.pins.PinBook.check_and_pin`: a changed identity is still a hard error)
and records are stored only after they passed that check. The table holds public records
only, in the caller's own 0600 state file. When a callee refuses a request sealed with kept
records, the caller fetches again and retries once if they changed (:mod:`agentcall.caller.call`).

Only storage and the rule live here; the state database (:mod:`agentcall.local.statedb`) builds
the store on its connection, so this module imports neither it nor the caller.
"""

from __future__ import annotations

import sqlite3

import attrs

from agentcall import ids, limits
from agentcall.errors import MalformedFrame, StoreError
from agentcall.wire import codec
from agentcall.wire.keyrecords import KeysResponse


@attrs.frozen
class KeptKeys:
    """A callee's records as last fetched and believed, and when they were fetched."""

    address: str
    keys: KeysResponse
    fetched_at: float


@attrs.frozen
class Reuse:
    """Seal with the kept records; no fetch."""

    kept: KeptKeys


@attrs.frozen
class Fetch:
    """Ask the relay; ``reason`` says why (for logs and tests)."""

    reason: str


def decide(
    kept: KeptKeys | None,
    now: float,
    *,
    rotate_before_s: float = limits.KEY_ROTATE_BEFORE_S,
    refetch_s: float = limits.KEY_CACHE_REFETCH_S,
) -> Reuse | Fetch:
    """Whether the kept records may seal a call at ``now`` without asking the relay."""
    if kept is None:
        return Fetch("none_kept")
    encryption = kept.keys.encryption
    if encryption is None:
        return Fetch("no_encryption_record")
    record = encryption.record
    if not record.not_before <= now < record.not_after:
        return Fetch("outside_window")
    if now < record.not_after - rotate_before_s:
        return Reuse(kept)
    # The callee may have minted its next epoch: look again, but not on every call.
    if kept.fetched_at <= now < kept.fetched_at + refetch_s:
        return Reuse(kept)
    return Fetch("may_have_rotated")


_UPSERT = (
    "INSERT INTO peer_keys (relay_origin, address, records, fetched_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (relay_origin, address) DO UPDATE SET"
    " records = excluded.records, fetched_at = excluded.fetched_at"
)
_SELECT = "SELECT records, fetched_at FROM peer_keys WHERE relay_origin = ? AND address = ?"
_DELETE = "DELETE FROM peer_keys WHERE relay_origin = ? AND address = ?"


def _execute(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> sqlite3.Cursor:
    try:
        return conn.execute(sql, params)
    except sqlite3.Error as exc:
        raise StoreError(f"state database (peer keys): {exc}") from exc


class SqlitePeerKeys:
    """Kept key records in the ``peer_keys`` table, for the relay at ``relay_origin``."""

    def __init__(self, conn: sqlite3.Connection, relay_origin: str) -> None:
        if ids.RELAY_ORIGIN_RE.match(relay_origin) is None:
            raise ValueError(f"not a relay origin: {relay_origin!r}")
        self._conn = conn
        self._origin = relay_origin

    def get(self, address: str) -> KeptKeys | None:
        """The kept records of ``address``, or None (none kept, or a damaged row)."""
        found = _execute(self._conn, _SELECT, (self._origin, address)).fetchone()
        if found is None:
            return None
        raw, fetched_at = found
        try:
            if not isinstance(raw, bytes) or not isinstance(fetched_at, int | float):
                raise TypeError("not a kept record")
            keys = codec.decode(raw, KeysResponse, max_bytes=limits.MAX_CALLER_KEYS_BYTES)
        except (MalformedFrame, TypeError):
            # Nothing is guessed from a damaged row: the caller fetches afresh.
            return None
        identity = keys.identity.record
        if (identity.relay_origin, identity.address) != (self._origin, address):
            return None
        return KeptKeys(address=address, keys=keys, fetched_at=float(fetched_at))

    def keep(self, address: str, keys: KeysResponse, fetched_at: float) -> None:
        """Keep records that were just fetched and believed (replacing older ones)."""
        identity = keys.identity.record
        if (identity.relay_origin, identity.address) != (self._origin, address):
            raise ValueError("the records belong to another address or relay")
        _execute(self._conn, _UPSERT, (self._origin, address, codec.encode(keys), fetched_at))

    def forget(self, address: str) -> bool:
        return _execute(self._conn, _DELETE, (self._origin, address)).rowcount > 0
