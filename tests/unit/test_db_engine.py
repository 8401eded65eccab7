"""The SQLite engine: fresh creation, every upgrade path, refusals, connection settings."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agentcall.db import SchemaSet, durable_transaction, open_database, transaction
from agentcall.db.engine import split_statements
from agentcall.errors import StoreError
from agentcall.relay.store import RELAY_SCHEMA

FIXTURES = Path(__file__).parent / "schema_fixtures"
DEMO = SchemaSet("demo", FIXTURES)

Snapshot = tuple[list[tuple[str, str, str, str]], list[tuple[str, int]]]


def _normalise(sql: str) -> str:
    # SQLite keeps the text of each CREATE as written, edited in place by ALTER TABLE (which
    # quotes renamed names and appends added columns), so compare it modulo layout and quotes.
    text = re.sub(r"\s+", " ", sql.replace('"', "")).strip()
    return re.sub(r"\s*([(),])\s*", r"\1", text)


def snapshot(conn: sqlite3.Connection) -> Snapshot:
    objects = [
        (kind, name, table, _normalise(sql))
        for kind, name, table, sql in conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master"
            " WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
        )
    ]
    versions = conn.execute("SELECT schema, version FROM version").fetchall()
    return objects, versions


def only_version(schema: SchemaSet, version: int, directory: Path) -> SchemaSet:
    """A schema set that knows ``version`` and nothing newer (the code as it was back then)."""
    directory.mkdir(exist_ok=True)
    (directory / f"{schema.name}-v{version}.sql").write_text(schema.full_script(version))
    return SchemaSet(schema.name, directory)


def fresh_snapshot(schema: SchemaSet, path: Path) -> Snapshot:
    opened = open_database(path, schema)
    try:
        return snapshot(opened.connection)
    finally:
        opened.connection.close()


@pytest.mark.parametrize("schema", [DEMO, RELAY_SCHEMA], ids=["demo", "relay"])
def test_fresh_database_gets_the_newest_schema(schema: SchemaSet, tmp_path: Path) -> None:
    """An empty file is created straight at the newest version, recorded in the version table."""
    opened = open_database(tmp_path / "fresh.db", schema)
    conn = opened.connection
    assert (opened.created, opened.schema_version, opened.upgraded_from) == (
        True,
        schema.newest,
        None,
    )
    assert conn.execute("SELECT schema, version FROM version").fetchall() == [
        (schema.name, schema.newest)
    ]
    conn.close()


def test_demo_schema_set_has_three_versions() -> None:
    """The synthetic set really exercises a chain of two upgrades."""
    assert DEMO.versions() == [1, 2, 3]
    assert DEMO.newest == 3


@pytest.mark.parametrize("start", DEMO.versions())
def test_every_demo_upgrade_path_equals_the_fresh_schema(start: int, tmp_path: Path) -> None:
    """A database made at any older version and upgraded matches one created fresh."""
    path = tmp_path / "old.db"
    old = open_database(path, only_version(DEMO, start, tmp_path / "old-code"))
    columns = {row[1] for row in old.connection.execute("PRAGMA table_info(notes)")}
    if "created_at" in columns:
        old.connection.execute("INSERT INTO notes (id, body, created_at) VALUES (1, 'kept', 0)")
    else:
        old.connection.execute("INSERT INTO notes (id, body) VALUES (1, 'kept')")
    old.connection.close()

    upgraded = open_database(path, DEMO)
    assert upgraded.created is False
    assert upgraded.upgraded_from == (None if start == DEMO.newest else start)
    assert snapshot(upgraded.connection) == fresh_snapshot(DEMO, tmp_path / "fresh.db")
    # The data survives every step, the table rebuild of 2 -> 3 included.
    assert upgraded.connection.execute("SELECT body FROM notes").fetchall() == [("kept",)]
    upgraded.connection.close()


@pytest.mark.parametrize("start", RELAY_SCHEMA.versions())
def test_every_relay_upgrade_path_equals_the_fresh_schema(start: int, tmp_path: Path) -> None:
    """Every relay schema version that ever shipped upgrades to exactly the fresh schema."""
    path = tmp_path / "old.db"
    open_database(path, only_version(RELAY_SCHEMA, start, tmp_path / "old-code")).connection.close()
    upgraded = open_database(path, RELAY_SCHEMA)
    assert upgraded.schema_version == RELAY_SCHEMA.newest
    assert snapshot(upgraded.connection) == fresh_snapshot(RELAY_SCHEMA, tmp_path / "fresh.db")
    upgraded.connection.close()


def test_relay_schema_is_package_data_with_every_table() -> None:
    """The relay schema is found through importlib.resources and defines the registry tables."""
    script = RELAY_SCHEMA.full_script(RELAY_SCHEMA.newest)
    tables = ("orgs", "members", "invites", "identity_keys", "encryption_keys", "audit")
    for table in (*tables, "audit_holds"):
        assert f"CREATE TABLE {table} (" in script


def test_newer_database_than_the_code_is_refused(tmp_path: Path) -> None:
    """Code that knows only version 1 will not touch a version 3 file."""
    path = tmp_path / "new.db"
    open_database(path, DEMO).connection.close()
    with pytest.raises(StoreError, match="newer than this code knows"):
        open_database(path, only_version(DEMO, 1, tmp_path / "old-code"))
    check = sqlite3.connect(path)
    assert check.execute("SELECT version FROM version").fetchall() == [(3,)]
    check.close()


def test_connection_settings(tmp_path: Path) -> None:
    """WAL journal, foreign keys enforced, a busy timeout, and autocommit for explicit BEGINs."""
    conn = open_database(tmp_path / "s.db", DEMO, busy_timeout_s=2.5).connection
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    assert conn.isolation_level is None
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO tags (note_id, tag) VALUES (42, 'orphan')")
    conn.close()


def test_in_memory_database_for_tests() -> None:
    """':memory:' is accepted without WAL (there is no journal file) and gets the schema."""
    opened = open_database(":memory:", DEMO)
    assert opened.created and opened.schema_version == DEMO.newest
    assert opened.connection.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    opened.connection.close()


def test_failed_upgrade_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    """A step that fails halfway rolls back: version and tables stay at the old version."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "demo-v1.sql").write_text(DEMO.full_script(1))
    (code / "demo-v2.sql").write_text(DEMO.full_script(2))
    (code / "demo-upgrade-1-to-2.sql").write_text(
        "ALTER TABLE notes ADD COLUMN created_at REAL;\nCREATE TABLE broken (;\n"
    )
    path = tmp_path / "d.db"
    old = open_database(path, only_version(DEMO, 1, tmp_path / "old-code"))
    before = snapshot(old.connection)
    old.connection.close()
    with pytest.raises(StoreError, match=re.escape("demo-upgrade-1-to-2.sql")):
        open_database(path, SchemaSet("demo", code))
    again = open_database(path, only_version(DEMO, 1, tmp_path / "old-code"))
    assert snapshot(again.connection) == before
    again.connection.close()


def test_missing_upgrade_step_is_refused(tmp_path: Path) -> None:
    """Without a script for every step, an old database is not touched."""
    code = tmp_path / "code"
    code.mkdir()
    for version in (1, 2):
        (code / f"demo-v{version}.sql").write_text(DEMO.full_script(version))
    path = tmp_path / "d.db"
    open_database(path, only_version(DEMO, 1, tmp_path / "old-code")).connection.close()
    with pytest.raises(StoreError, match="no upgrade from demo version 1 to 2"):
        open_database(path, SchemaSet("demo", code))


def test_upgrade_scripts_go_one_version_at_a_time(tmp_path: Path) -> None:
    """A script that skips a version is refused when the set is read."""
    (tmp_path / "demo-v1.sql").write_text(DEMO.full_script(1))
    (tmp_path / "demo-upgrade-1-to-3.sql").write_text("SELECT 1;\n")
    with pytest.raises(StoreError, match="exactly one version up"):
        SchemaSet("demo", tmp_path).versions()


def test_schema_set_without_files_is_refused(tmp_path: Path) -> None:
    """A set with no full schema cannot create anything."""
    with pytest.raises(StoreError, match=re.escape("no demo-v<N>.sql")):
        open_database(tmp_path / "x.db", SchemaSet("demo", tmp_path))
    assert not (tmp_path / "x.db").exists()


def test_foreign_database_is_refused(tmp_path: Path) -> None:
    """A file with tables but no version table was not made by us and is left alone."""
    path = tmp_path / "other.db"
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE something (x)")
    other.commit()
    other.close()
    with pytest.raises(StoreError, match="no version table"):
        open_database(path, DEMO)


def test_database_of_another_schema_is_refused(tmp_path: Path) -> None:
    """A relay database is not opened as some other schema, even at a matching version."""
    path = tmp_path / "relay.db"
    open_database(path, RELAY_SCHEMA).connection.close()
    with pytest.raises(StoreError, match="holds the 'relay' schema, not 'demo'"):
        open_database(path, DEMO)


def test_not_a_database_file_is_refused(tmp_path: Path) -> None:
    """Random bytes give a StoreError, not a raw sqlite3 exception."""
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(StoreError):
        open_database(path, DEMO)


def test_split_statements_keeps_triggers_whole() -> None:
    """Semicolons inside a trigger body do not split it; comments between statements vanish."""
    script = (
        "-- header\nCREATE TABLE t (x);\n\n"
        "CREATE TRIGGER g BEFORE DELETE ON t\nBEGIN\n  SELECT 1;\n  SELECT 2;\nEND;\n-- tail\n"
    )
    statements = split_statements(script)
    assert len(statements) == 2
    assert statements[1].startswith("CREATE TRIGGER g") and statements[1].endswith("END;")


def test_split_statements_refuses_an_unfinished_statement() -> None:
    """A script ending mid-statement is an error, not a silently dropped statement."""
    with pytest.raises(StoreError, match="incomplete statement"):
        split_statements("CREATE TABLE t (x);\nCREATE TABLE u (y)\n", "u.sql")


def test_transaction_rolls_back_on_any_exception(tmp_path: Path) -> None:
    """Work inside a transaction that raises is undone and the exception passes through."""
    conn = open_database(tmp_path / "t.db", DEMO).connection

    class Refused(Exception):
        pass

    with pytest.raises(Refused), transaction(conn):
        conn.execute("INSERT INTO notes (id, body, created_at) VALUES (1, 'x', 0)")
        raise Refused
    assert conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0] == 0
    with pytest.raises(StoreError, match="database error"), transaction(conn):
        conn.execute("INSERT INTO notes (id, body) VALUES (2, 'no time')")
    assert not conn.in_transaction
    conn.close()


def test_a_packaged_schema_on_disk_is_the_package_directory_importlib_resources_names() -> None:
    """Read from the directory itself (no importlib.resources in a one-call process), the same
    files as importlib.resources finds, and a schema that opens."""
    from importlib.resources import files

    from agentcall.db import packaged_schema

    schema = packaged_schema("state")
    assert isinstance(schema.directory, Path)
    served = files("agentcall.db").joinpath("schema")
    assert schema.directory == Path(str(served))
    assert sorted(e.name for e in schema.directory.iterdir()) == sorted(
        e.name for e in served.iterdir()
    )
    opened = open_database(":memory:", schema)
    assert (opened.created, opened.schema_version) == (True, schema.newest)


def test_a_packaged_schema_on_disk_needs_no_importlib_resources() -> None:
    probe = (
        "import sys\n"
        "from agentcall.db import open_database, packaged_schema\n"
        "open_database(':memory:', packaged_schema('state'))\n"
        "print('importlib.resources' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False", done.stderr


def test_a_durable_transaction_flushes_fully_for_its_commit_only(tmp_path: Path) -> None:
    """FULL around the one transaction (its commit waits for the disk), NORMAL again after,
    whether it committed or rolled back."""
    conn = open_database(tmp_path / "s.db", DEMO).connection
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    with durable_transaction(conn):
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        conn.execute("INSERT INTO notes (body, created_at) VALUES ('kept', 1.0)")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    full, begin, commit = (
        seen.index("PRAGMA synchronous = FULL"),
        seen.index("BEGIN IMMEDIATE"),
        seen.index("COMMIT"),
    )
    assert full < begin < commit < seen.index("PRAGMA synchronous = NORMAL")
    with pytest.raises(RuntimeError), durable_transaction(conn):
        conn.execute("INSERT INTO notes (body, created_at) VALUES ('dropped', 2.0)")
        raise RuntimeError("refused")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1
    assert [row[0] for row in conn.execute("SELECT body FROM notes")] == ["kept"]
    conn.close()
