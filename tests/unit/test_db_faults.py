"""Telling a failing storage apart from every other store error (agentcall.db.faults)."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pytest

from agentcall.db.faults import storage_fault
from agentcall.errors import CallErrorCode, StorageFault, StoreError


def _raised(conn: sqlite3.Connection, sql: str) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as caught:
        conn.execute(sql)
    return caught.value


def test_a_database_that_cannot_grow_is_storage_full(tmp_path: Path) -> None:
    """SQLite's own SQLITE_FULL, made by capping the file at the pages it has."""
    conn = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    conn.execute("CREATE TABLE t (x BLOB)")
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    conn.execute(f"PRAGMA max_page_count = {pages}")
    error = _raised(conn, "INSERT INTO t VALUES (zeroblob(100000))")
    fault = storage_fault(error)
    assert fault is not None and fault.code is CallErrorCode.STORAGE_FULL
    assert "the relay's storage is full" in str(fault)


def test_a_read_only_database_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.commit()
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    fault = storage_fault(_raised(reader, "INSERT INTO t VALUES (1)"))
    assert fault is not None and fault.code is CallErrorCode.UNAVAILABLE


def test_a_fault_is_found_under_the_store_errors_raised_from_it(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    conn.execute("CREATE TABLE t (x BLOB)")
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    conn.execute(f"PRAGMA max_page_count = {pages}")
    try:
        try:
            conn.execute("INSERT INTO t VALUES (zeroblob(100000))")
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc
    except StoreError as wrapped:
        fault = storage_fault(wrapped)
    assert fault is not None and fault.code is CallErrorCode.STORAGE_FULL


@pytest.mark.parametrize(
    ("number", "code"),
    [
        (errno.ENOSPC, CallErrorCode.STORAGE_FULL),
        (errno.EDQUOT, CallErrorCode.STORAGE_FULL),
        (errno.EIO, CallErrorCode.UNAVAILABLE),
        (errno.EROFS, CallErrorCode.UNAVAILABLE),
    ],
)
def test_operating_system_errors_of_the_storage(number: int, code: CallErrorCode) -> None:
    fault = storage_fault(OSError(number, "no"))
    assert fault is not None and fault.code is code


def test_other_errors_are_not_faults_of_the_storage(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    conn.execute("CREATE TABLE t (x PRIMARY KEY)")
    conn.execute("INSERT INTO t VALUES (1)")
    assert storage_fault(_raised(conn, "INSERT INTO t VALUES (1)")) is None  # a constraint
    assert storage_fault(_raised(conn, "SELECT nonsense FROM t")) is None  # a bug
    assert storage_fault(StoreError("the journal row is corrupt")) is None
    assert storage_fault(ValueError("no")) is None
    assert storage_fault(OSError(errno.EPERM, "no")) is None


def test_a_fault_already_named_is_itself_and_a_cycle_ends_the_walk() -> None:
    named = StorageFault(CallErrorCode.UNAVAILABLE, "the relay's storage is failing: x")
    assert storage_fault(named) is named
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    assert storage_fault(first) is None


def test_older_sqlite_without_codes_is_read_from_the_message() -> None:
    assert storage_fault(sqlite3.OperationalError("database or disk is full")) is not None
    old = storage_fault(sqlite3.OperationalError("disk I/O error"))
    assert old is not None and old.code is CallErrorCode.UNAVAILABLE
    assert storage_fault(sqlite3.OperationalError("no such table: x")) is None
