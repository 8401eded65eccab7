"""``agentcall relay backup``: a consistent copy of a relay database, taken while it runs.

SQLite's online backup API copies the whole database in one step, inside one read transaction:
the copy is the state of one moment even while the relay writes, and in WAL mode that reader
never blocks the relay's writer, nor it the reader. (In several steps, a write by another
connection between two of them would start the copy over, and a busy relay could keep it from
ever finishing.) The copy is written to a new private file beside its final name and renamed into
place only once it is whole and passes ``PRAGMA integrity_check``: an interrupted backup never
leaves a file that looks like one. It is checked to be a relay database of a version this code
knows, so restoring it (stop the relay, put the file at ``--database``, start it) is safe.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import attrs

from agentcall.errors import StoreError


@attrs.frozen
class BackupResult:
    output: Path
    pages: int
    schema_version: int


def backup_database(
    database: str | os.PathLike[str], output: str | os.PathLike[str]
) -> BackupResult:
    """Copy the relay database at ``database`` to ``output`` (which must not exist yet).

    :raises StoreError: the source is missing or not a relay database, the output exists, or
        the copy is not sound; the message says which, and nothing is left at ``output``.
    """
    from agentcall.filetrust import PRIVATE_FILE_MODE

    source_path, final = Path(database), Path(output)
    if not source_path.is_file():
        raise StoreError(f"{source_path}: no such database file")
    if os.path.lexists(final):
        raise StoreError(f"{final} already exists; choose a new name (a backup never overwrites)")
    partial = final.with_name(f".{final.name}.partial-{os.getpid()}")
    # Created 0600 before SQLite opens it: the copy holds every token hash the relay has.
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    os.close(fd)
    try:
        source = sqlite3.connect(f"file:{source_path}?mode=ro", uri=True)
        try:
            version = _relay_version(source, source_path)
            copy = sqlite3.connect(partial)
            try:
                source.backup(copy)  # every page in one step: one snapshot
                (pages,) = copy.execute("PRAGMA page_count").fetchone()
                (verdict,) = copy.execute("PRAGMA integrity_check").fetchone()
                if verdict != "ok":
                    raise StoreError(f"the copy failed its integrity check ({verdict})")
                # A self-contained file: no -wal beside it to forget when it is moved.
                copy.execute("PRAGMA journal_mode = DELETE")
            finally:
                copy.close()
        finally:
            source.close()
        _fsync(partial)
        os.replace(partial, final)
        _fsync(final.parent)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return BackupResult(final, int(pages), version)


def _relay_version(conn: sqlite3.Connection, path: Path) -> int:
    from agentcall.relay.store import RELAY_SCHEMA

    try:
        row = conn.execute("SELECT schema, version FROM version").fetchone()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: not a relay database ({exc})") from None
    if row is None or row[0] != RELAY_SCHEMA.name:
        raise StoreError(f"{path}: not a relay database")
    if not 1 <= int(row[1]) <= RELAY_SCHEMA.newest:
        raise StoreError(f"{path}: relay schema {row[1]} is newer than this agentcall knows")
    return int(row[1])


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
