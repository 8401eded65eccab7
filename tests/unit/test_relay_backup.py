"""`agentcall relay backup`: a consistent, private, checked copy, taken while writes go on."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from agentcall.cli.main import main
from agentcall.errors import StoreError
from agentcall.relay.backup import backup_database
from agentcall.relay.store import RELAY_SCHEMA, open_relay_store
from tests.unit.relay_helpers import Fired

T0 = 1_700_000_000.0


def relay_db(path: Path) -> Fired:
    store = Fired(open_relay_store(path))
    store.ensure_org("acme", T0)
    return store


def test_a_backup_is_a_whole_private_relay_database(tmp_path: Path) -> None:
    source = tmp_path / "relay.sqlite"
    store = relay_db(source)
    for n in range(50):
        store.create_invite(
            "acme", created_by=None, role="member", expires_in_days=7, description=f"n{n}",
            now=T0,
        )  # fmt: skip
    out = tmp_path / "backup.sqlite"
    done = backup_database(source, out)
    store.close()
    assert done.schema_version == RELAY_SCHEMA.newest and done.pages > 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with sqlite3.connect(out) as copy:
        assert copy.execute("SELECT COUNT(*) FROM invites").fetchone() == (50,)
        assert copy.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    # It opens as a relay database: a restore needs nothing else.
    restored = Fired(open_relay_store(out))
    assert restored.org_exists("acme")
    restored.close()
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


def test_a_write_in_progress_neither_blocks_the_backup_nor_gets_into_it(tmp_path: Path) -> None:
    """The relay is writing (a transaction open, not committed) while the backup runs: the
    backup does not wait for it, holds the state before it, and the write then commits."""
    source = tmp_path / "relay.sqlite"
    store = relay_db(source)
    writer = sqlite3.connect(source, isolation_level=None, timeout=0)
    writer.execute("CREATE TABLE filler (n INTEGER, pad TEXT)")
    writer.executemany("INSERT INTO filler VALUES (?, ?)", [(n, "p" * 500) for n in range(3000)])
    writer.execute("BEGIN IMMEDIATE")
    writer.executemany("INSERT INTO filler VALUES (?, ?)", [(-n, "late") for n in range(500)])
    out = tmp_path / "backup.sqlite"
    backup_database(source, out)  # with the write transaction still open
    writer.execute("COMMIT")  # the backup's read did not get in the writer's way either
    writer.close()
    store.close()
    with sqlite3.connect(out) as copy:
        assert copy.execute("SELECT COUNT(*) FROM filler").fetchone() == (3000,)
        assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with sqlite3.connect(source) as now:
        assert now.execute("SELECT COUNT(*) FROM filler").fetchone() == (3500,)


@pytest.mark.parametrize("case", ["missing", "exists", "not_relay"])
def test_refusals_leave_nothing_behind(tmp_path: Path, case: str) -> None:
    source, out = tmp_path / "relay.sqlite", tmp_path / "backup.sqlite"
    if case != "missing":
        relay_db(source).close()
    if case == "exists":
        out.write_text("an older backup")
    if case == "not_relay":
        source.unlink()
        with sqlite3.connect(source) as other:
            other.execute("CREATE TABLE x (y)")
    with pytest.raises(StoreError):
        backup_database(source, out)
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []
    if case == "exists":
        assert out.read_text() == "an older backup"
    else:
        assert not out.exists()


def test_the_command_says_what_it_copied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "relay.sqlite"
    relay_db(source).close()
    out = tmp_path / "b.sqlite"
    assert main(["relay", "backup", "--database", str(source), "--output", str(out)]) == 0
    assert f"to {out}" in capsys.readouterr().out
    assert main(["relay", "backup", "--database", str(source), "--output", str(out)]) != 0
    assert "already exists" in capsys.readouterr().err
