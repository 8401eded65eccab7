"""The published-key half of the relay store: identity keys (never replaced but by a
recovery, which keeps a link), encryption keys (epochs only go up), recovery links, and each
member's signed card (the newest only).

Functions here run inside a transaction opened by :class:`~agentcall.relay.store.SqliteRelayStore`,
which also writes the audit rows. The relay distributes these records but is not trusted for
them: clients verify signatures and pin keys themselves, and the web layer verifies signatures
before anything reaches this module.
"""

from __future__ import annotations

import enum
import sqlite3
from typing import TypeVar

from agentcall import ids, limits
from agentcall.errors import ApiError, ApiErrorCode, MalformedFrame, StoreError
from agentcall.wire import codec
from agentcall.wire.http import (
    KeysResponse,
    SignedCardRecord,
    SignedEncryptionKeyRecord,
    SignedIdentityRecord,
)
from agentcall.wire.keyrecords import RecoveryLink, SignedRecoveryStatement

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


class Published(enum.Enum):
    """What :func:`insert_identity` did."""

    NOTHING = "nothing"  # the very same record was already there
    NEW = "new"  # the member's first identity record
    RECOVERY_KEY = "recovery_key"  # the same identity key, re-signed to name a newer recovery key


def insert_identity(
    conn: sqlite3.Connection, org: str, handle: str, signed: SignedIdentityRecord, now: float
) -> Published:
    """Store a member's identity record (its signature already verified).

    The identity key is never replaced; the record may be, by one that the same key signed and
    that names a recovery key issued later than the one stored (a new code retires the old).
    """
    _check_address(org, handle, signed.record.address)
    row = conn.execute(
        "SELECT record_json FROM identity_keys WHERE org = ? AND handle = ?", (org, handle)
    ).fetchone()
    if row is not None:
        stored = _load(row[0], SignedIdentityRecord).record
        if stored == signed.record:
            return Published.NOTHING
        new = signed.record
        if (
            new.identity_pub == stored.identity_pub
            and new.recovery_issued_at is not None
            and new.recovery_issued_at > (stored.recovery_issued_at or 0)
        ):
            conn.execute(
                "UPDATE identity_keys SET record_json = ? WHERE org = ? AND handle = ?",
                (_dump(signed), org, handle),
            )
            return Published.RECOVERY_KEY
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
    return Published.NEW


def recover(
    conn: sqlite3.Connection,
    org: str,
    handle: str,
    previous: SignedIdentityRecord,
    statement: SignedRecoveryStatement,
    new_identity: SignedIdentityRecord,
    now: float,
) -> None:
    """Move the member to ``new_identity`` (inside the caller's transaction): the link is
    kept, the old encryption keys go (they were the old key's), the new record takes the row.

    ``previous`` is the record the statement was checked against; if another request changed
    it meanwhile, nothing is done (409).
    """
    row = conn.execute(
        "SELECT record_json FROM identity_keys WHERE org = ? AND handle = ?", (org, handle)
    ).fetchone()
    if row is None or _load(row[0], SignedIdentityRecord) != previous:
        raise ApiError(409, ApiErrorCode.RECOVERY_REFUSED, "the identity changed meanwhile")
    (seq,) = conn.execute(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM recovery_links WHERE org = ? AND handle = ?",
        (org, handle),
    ).fetchone()
    conn.execute(
        "INSERT INTO recovery_links (org, handle, seq, previous_json, statement_json, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (org, handle, seq, _dump(previous), _dump(statement), now),
    )
    # Only the newest links are served; a caller pinned further back is told of a change.
    conn.execute(
        "DELETE FROM recovery_links WHERE org = ? AND handle = ? AND seq <= ?",
        (org, handle, seq - limits.MAX_RECOVERY_LINKS),
    )
    # The card was signed by the old key; the new identity's listener publishes its own.
    conn.execute("DELETE FROM cards WHERE org = ? AND handle = ?", (org, handle))
    conn.execute("DELETE FROM encryption_keys WHERE org = ? AND handle = ?", (org, handle))
    conn.execute("DELETE FROM identity_keys WHERE org = ? AND handle = ?", (org, handle))
    conn.execute(
        "INSERT INTO identity_keys (org, handle, record_json, identity_pub, created_at)"
        " VALUES (?, ?, ?, ?, ?)",
        (org, handle, _dump(new_identity), new_identity.record.identity_pub, now),
    )


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
    links = conn.execute(
        "SELECT previous_json, statement_json FROM recovery_links WHERE org = ? AND handle = ?"
        " ORDER BY seq",
        (org, handle),
    ).fetchall()
    return KeysResponse(
        identity=_load(identity[0], SignedIdentityRecord),
        encryption=None if newest is None else _load(newest[0], SignedEncryptionKeyRecord),
        recovered=tuple(
            RecoveryLink(
                previous=_load(previous, SignedIdentityRecord),
                statement=_load(statement, SignedRecoveryStatement),
            )
            for previous, statement in links
        ),
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
    conn.execute("DELETE FROM recovery_links WHERE org = ? AND handle = ?", (org, handle))
    conn.execute("DELETE FROM encryption_keys WHERE org = ? AND handle = ?", (org, handle))
    conn.execute("DELETE FROM identity_keys WHERE org = ? AND handle = ?", (org, handle))
