"""The published-key half of the relay store: identity keys (once, never replaced),
encryption keys (epochs only go up) and each member's signed card (the newest only).

Functions here run inside a transaction opened by :class:`~agentcall.relay.store.SqliteRelayStore`,
which also writes the audit rows. The relay distributes these records but is not trusted for
them: clients verify signatures and pin keys themselves, and the web layer verifies signatures
before anything reaches this module.
"""

from __future__ import annotations

import sqlite3
from typing import TypeVar

from agentcall import ids
from agentcall.errors import ApiError, ApiErrorCode, MalformedFrame, StoreError
from agentcall.wire import codec
from agentcall.wire.http import (
    KeysResponse,
    SignedCardRecord,
    SignedEncryptionKeyRecord,
    SignedIdentityRecord,
)

T = TypeVar("T")


def _check_address(org: str, handle: str, address: str) -> None:
    # A record names the address it belongs to; storing it under another would let a member
    # hand out a record that clients then reject (or, worse, pin under the wrong name).
    if address != ids.format_address(org, handle):
        raise ApiError(400, ApiErrorCode.RECORD_INVALID, "the record names another address")


def _load(text: str, cls: type[T]) -> T:
    try:
        return codec.decode(text, cls)
    except MalformedFrame as exc:
        raise StoreError(f"a stored {cls.__name__} is unreadable") from exc


def _dump(value: object) -> str:
    return codec.encode(value).decode("utf-8")


def insert_identity(
    conn: sqlite3.Connection, org: str, handle: str, signed: SignedIdentityRecord, now: float
) -> bool:
    """Store a member's identity record; False when the very same record is already there."""
    _check_address(org, handle, signed.record.address)
    row = conn.execute(
        "SELECT record_json FROM identity_keys WHERE org = ? AND handle = ?", (org, handle)
    ).fetchone()
    if row is not None:
        if _load(row[0], SignedIdentityRecord).record == signed.record:
            return False
        raise ApiError(
            409,
            ApiErrorCode.IDENTITY_KEY_EXISTS,
            "an identity key is already published for this member and is never replaced",
        )
    member = conn.execute(
        "SELECT 1 FROM members WHERE org = ? AND handle = ?", (org, handle)
    ).fetchone()
    if member is None:
        raise ApiError(404, ApiErrorCode.NOT_FOUND, "no such member")
    conn.execute(
        "INSERT INTO identity_keys (org, handle, record_json, identity_pub, created_at)"
        " VALUES (?, ?, ?, ?, ?)",
        (org, handle, _dump(signed), signed.record.identity_pub, now),
    )
    return True


def insert_encryption(
    conn: sqlite3.Connection,
    org: str,
    handle: str,
    signed: SignedEncryptionKeyRecord,
    now: float,
) -> None:
    """Store a new encryption key epoch; it must be above every epoch stored before."""
    _check_address(org, handle, signed.record.address)
    identity = conn.execute(
        "SELECT 1 FROM identity_keys WHERE org = ? AND handle = ?", (org, handle)
    ).fetchone()
    if identity is None:
        raise ApiError(
            409,
            ApiErrorCode.IDENTITY_KEY_MISSING,
            "publish the identity key before encryption keys",
        )
    record = signed.record
    # The epoch rule lives in the statement itself (and again in a schema trigger), so two
    # racing publishers cannot both pass a check made before the insert.
    cursor = conn.execute(
        "INSERT INTO encryption_keys (org, handle, epoch, key_id, record_json, created_at)"
        " SELECT ?, ?, ?, ?, ?, ?"
        " WHERE ? > (SELECT COALESCE(MAX(epoch), 0) FROM encryption_keys"
        "            WHERE org = ? AND handle = ?)",
        (org, handle, record.epoch, record.key_id, _dump(signed), now, record.epoch, org, handle),
    )
    if cursor.rowcount != 1:
        raise ApiError(
            409,
            ApiErrorCode.EPOCH_NOT_INCREASING,
            "the encryption key epoch must be above every epoch published before",
        )


def fetch_keys(conn: sqlite3.Connection, org: str, handle: str) -> KeysResponse | None:
    """The identity record and the highest encryption epoch, or None without an identity."""
    identity = conn.execute(
        "SELECT record_json FROM identity_keys WHERE org = ? AND handle = ?", (org, handle)
    ).fetchone()
    if identity is None:
        return None
    newest = conn.execute(
        "SELECT record_json FROM encryption_keys WHERE org = ? AND handle = ?"
        " ORDER BY epoch DESC LIMIT 1",
        (org, handle),
    ).fetchone()
    return KeysResponse(
        identity=_load(identity[0], SignedIdentityRecord),
        encryption=None if newest is None else _load(newest[0], SignedEncryptionKeyRecord),
    )


def put_card(
    conn: sqlite3.Connection, org: str, handle: str, signed: SignedCardRecord, now: float
) -> bool:
    """Keep ``signed`` as the member's card; False when the very same card is already kept.

    Only the newest is kept: a card dated no later than the kept one is refused (409
    ``card_not_newer``), so nobody — the relay's own operator replaying a stored body
    included — can put an older card back in front of callers through this route.
    """
    _check_address(org, handle, signed.record.address)
    identity = conn.execute(
        "SELECT 1 FROM identity_keys WHERE org = ? AND handle = ?", (org, handle)
    ).fetchone()
    if identity is None:
        raise ApiError(409, ApiErrorCode.IDENTITY_KEY_MISSING, "publish the identity key first")
    row = conn.execute(
        "SELECT record_json FROM cards WHERE org = ? AND handle = ?", (org, handle)
    ).fetchone()
    if row is not None:
        kept = _load(row[0], SignedCardRecord)
        if kept == signed:
            return False
        if signed.record.issued_at <= kept.record.issued_at:
            raise ApiError(
                409,
                ApiErrorCode.CARD_NOT_NEWER,
                "a card dated no later than the one published is refused",
            )
    conn.execute(
        "INSERT INTO cards (org, handle, record_json, issued_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (org, handle) DO UPDATE SET record_json = excluded.record_json,"
        " issued_at = excluded.issued_at, updated_at = excluded.updated_at",
        (org, handle, _dump(signed), signed.record.issued_at, now),
    )
    return True


def fetch_card(conn: sqlite3.Connection, org: str, handle: str) -> SignedCardRecord | None:
    row = conn.execute(
        "SELECT record_json FROM cards WHERE org = ? AND handle = ?", (org, handle)
    ).fetchone()
    return None if row is None else _load(row[0], SignedCardRecord)


def withdraw(conn: sqlite3.Connection, org: str, handle: str) -> None:
    """Delete every published record of a removed member, their card included (inside the
    caller's transaction).

    Records are never replaced, but a member who left has none: nobody should seal to keys
    whose owner is gone, and a later owner of the handle publishes an identity of their own.
    """
    conn.execute("DELETE FROM cards WHERE org = ? AND handle = ?", (org, handle))
    conn.execute("DELETE FROM encryption_keys WHERE org = ? AND handle = ?", (org, handle))
    conn.execute("DELETE FROM identity_keys WHERE org = ? AND handle = ?", (org, handle))
