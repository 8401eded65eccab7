"""Open a SQLite file and bring it to the newest schema the code knows.

A schema set is a directory of ``.sql`` files for one schema name:

- ``<name>-v<N>.sql``: the whole schema at version N (a fresh database uses the newest);
- ``<name>-upgrade-<N>-to-<N+1>.sql``: one step from version N.

The engine owns a ``version`` table holding the schema name and version, so a file made for
another schema or by newer code is refused instead of being half-understood. Every change runs
inside one ``BEGIN IMMEDIATE`` transaction: a failed upgrade leaves the file as it was.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

from agentcall.errors import StoreError

DEFAULT_BUSY_TIMEOUT_S = 5.0

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_IN_MEMORY = frozenset({"", ":memory:"})


def _valid_name(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
    if _NAME_RE.match(value) is None:
        raise ValueError(f"not a valid schema name: {value!r}")


@attrs.frozen
class SchemaSet:
    """The ``.sql`` files of one schema name inside one directory (or package resource)."""

    name: str = attrs.field(validator=_valid_name)
    directory: Traversable = attrs.field(eq=False)

    def _scan(self) -> tuple[dict[int, Traversable], dict[int, Traversable]]:
        full_re = re.compile(rf"^{self.name}-v([1-9][0-9]*)\.sql$")
        step_re = re.compile(rf"^{self.name}-upgrade-([1-9][0-9]*)-to-([1-9][0-9]*)\.sql$")
        full: dict[int, Traversable] = {}
        steps: dict[int, Traversable] = {}
        for entry in self.directory.iterdir():
            if match := full_re.match(entry.name):
                full[int(match.group(1))] = entry
            elif match := step_re.match(entry.name):
                start, end = int(match.group(1)), int(match.group(2))
                if end != start + 1:
                    # Skipping versions would leave some starting points without a tested path.
                    raise StoreError(f"{entry.name}: an upgrade goes exactly one version up")
                steps[start] = entry
        return full, steps

    @property
    def newest(self) -> int:
        full, _steps = self._scan()
        if not full:
            raise StoreError(f"no {self.name}-v<N>.sql schema file found")
        return max(full)

    def versions(self) -> list[int]:
        """Every version with a full schema file, oldest first."""
        return sorted(self._scan()[0])

    def full_script(self, version: int) -> str:
        full, _steps = self._scan()
        if version not in full:
            raise StoreError(f"no schema file for {self.name} version {version}")
        return full[version].read_text(encoding="utf-8")

    def upgrade_script(self, from_version: int) -> str:
        _full, steps = self._scan()
        if from_version not in steps:
            raise StoreError(
                f"no upgrade from {self.name} version {from_version} to {from_version + 1}"
            )
        return steps[from_version].read_text(encoding="utf-8")


def packaged_schema(name: str, package: str = "agentcall.db", subdir: str = "schema") -> SchemaSet:
    """The schema set shipped as package data: the package's directory when it is one on disk
    (what ``importlib.resources`` would give for it, without importing that machinery, about
    10 ms of a one-call process's start), else read with ``importlib.resources`` (a zip)."""
    spec = importlib.util.find_spec(package)
    locations = None if spec is None else spec.submodule_search_locations
    if locations is not None and len(locations) == 1:
        directory = Path(next(iter(locations)), subdir)
        if directory.is_dir():
            return SchemaSet(name, directory)
    from importlib.resources import files

    return SchemaSet(name, files(package).joinpath(subdir))


@attrs.frozen
class OpenedDatabase:
    connection: sqlite3.Connection = attrs.field(eq=False, repr=False)
    schema_version: int
    created: bool
    upgraded_from: int | None


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction, taken up front so that reads inside it cannot go stale.

    The connection must be in autocommit mode (``isolation_level=None``), as
    :func:`open_database` leaves it. SQLite failures come out as :class:`StoreError`; any other
    exception (an ``ApiError`` refusal, say) rolls back and passes through unchanged.
    """
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        raise StoreError(f"database busy or unavailable: {exc}") from exc
    try:
        yield conn
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise StoreError(f"database error: {exc}") from exc
        raise
    else:
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise StoreError(f"database commit failed: {exc}") from exc


@contextlib.contextmanager
def durable_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """:func:`transaction`, whose commit reaches the disk even against power loss.

    The database runs ``synchronous = NORMAL`` (WAL: safe against a killed process, not a lost
    machine); for a commit whose success is promised to someone (a queued call acknowledged, an
    answer stored, a job accepted to run) it is ``FULL`` for that transaction only, so only
    those pay the extra flush.
    """
    _set_synchronous(conn, "FULL")
    try:
        with transaction(conn) as inside:
            yield inside
    finally:
        _set_synchronous(conn, "NORMAL")


def _set_synchronous(conn: sqlite3.Connection, level: str) -> None:
    try:
        conn.execute(f"PRAGMA synchronous = {level}")
    except sqlite3.Error as exc:
        raise StoreError(f"database unavailable: {exc}") from exc


def open_database(
    path: str | os.PathLike[str],
    schema: SchemaSet,
    *,
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
) -> OpenedDatabase:
    """Open (creating if needed) a SQLite file in WAL mode, at the newest version of ``schema``.

    The connection comes back in autocommit mode with foreign keys on; use :func:`transaction`
    for writes that must happen together.
    """
    newest = schema.newest
    target = os.fspath(path)
    try:
        conn = sqlite3.connect(target, timeout=busy_timeout_s, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open database {target}: {exc}") from exc
    try:
        _configure(conn, in_memory=target in _IN_MEMORY)
        # Upgrade scripts may rebuild tables, which foreign keys would block midway; the whole
        # result is checked with foreign_key_check before commit instead.
        conn.execute("PRAGMA foreign_keys = OFF")
        with transaction(conn):
            found = _read_version(conn, schema)
            if found is None:
                _run_script(conn, schema.full_script(newest), f"{schema.name}-v{newest}.sql")
                conn.execute(
                    "CREATE TABLE version (schema TEXT NOT NULL, version INTEGER NOT NULL)"
                )
                conn.execute(
                    "INSERT INTO version (schema, version) VALUES (?, ?)", (schema.name, newest)
                )
            elif found > newest:
                raise StoreError(
                    f"database {target} is at {schema.name} version {found}, newer than this"
                    f" code knows ({newest}); upgrade the software, not the database"
                )
            else:
                for step in range(found, newest):
                    label = f"{schema.name}-upgrade-{step}-to-{step + 1}.sql"
                    _run_script(conn, schema.upgrade_script(step), label)
                    conn.execute("UPDATE version SET version = ?", (step + 1,))
            if found != newest and conn.execute("PRAGMA foreign_key_check").fetchall():
                raise StoreError(f"database {target}: foreign key violations after the upgrade")
        conn.execute("PRAGMA foreign_keys = ON")
        if conn.execute("PRAGMA foreign_keys").fetchone()[0] != 1:
            raise StoreError("this SQLite build cannot enforce foreign keys")
    except sqlite3.Error as exc:
        conn.close()
        raise StoreError(f"cannot use database {target}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return OpenedDatabase(
        connection=conn,
        schema_version=newest,
        created=found is None,
        upgraded_from=found if found is not None and found != newest else None,
    )


def _configure(conn: sqlite3.Connection, *, in_memory: bool) -> None:
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    # An in-memory database has no journal file to put in WAL mode; any real file must have one,
    # or readers and the writer would block each other.
    if not in_memory and str(mode).lower() != "wal":
        raise StoreError(f"the database cannot use WAL mode (journal mode is {mode})")
    # WAL makes NORMAL durable against application crashes; only power loss can drop the tail.
    conn.execute("PRAGMA synchronous = NORMAL")


def _read_version(conn: sqlite3.Connection, schema: SchemaSet) -> int | None:
    """The stored version, or None for an empty file; anything unfamiliar is refused."""
    names = {
        row[0]
        for row in conn.execute("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
    }
    if not names:
        return None
    if "version" not in names:
        raise StoreError("the database has tables but no version table: not made by agentcall")
    try:
        rows = conn.execute("SELECT schema, version FROM version").fetchall()
    except sqlite3.Error as exc:
        raise StoreError(f"the version table is not readable: {exc}") from exc
    if len(rows) != 1:
        raise StoreError(f"the version table must hold one row, not {len(rows)}")
    name, version = rows[0]
    if name != schema.name:
        raise StoreError(f"the database holds the {name!r} schema, not {schema.name!r}")
    if type(version) is not int or version < 1:
        raise StoreError("the version table holds no valid version number")
    return version


def _run_script(conn: sqlite3.Connection, script: str, label: str) -> None:
    # executescript() would COMMIT first and run outside our transaction, so run statement by
    # statement instead; sqlite3.complete_statement knows where each one (triggers too) ends.
    for statement in split_statements(script, label):
        try:
            conn.execute(statement)
        except sqlite3.Error as exc:
            raise StoreError(f"{label}: {exc}") from exc


def split_statements(script: str, label: str = "script") -> list[str]:
    """The statements of a SQL script, each ending at the end of a line."""
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    leftover = [
        line for line in pending.splitlines() if line.strip() and not line.strip().startswith("--")
    ]
    if leftover:
        raise StoreError(f"{label}: ends with an incomplete statement")
    return statements
