"""`agentcall relay backup`: a consistent, private, checked copy, taken while writes go on."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path
from typing import Any

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


def test_writes_during_the_backup_do_not_tear_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay writes between backup steps; the copy is one consistent state."""
    from agentcall.relay import backup as backup_module

    source = tmp_path / "relay.sqlite"
    store = relay_db(source)
    writer = sqlite3.connect(source)
    writer.execute("CREATE TABLE IF NOT EXISTS filler (n INTEGER, pad TEXT)")
    # Enough pages for many small steps.
    writer.executemany("INSERT INTO filler VALUES (?, ?)", [(n, "p" * 500) for n in range(3000)])
    writer.commit()
    monkeypatch.setattr(backup_module, "PAGES_PER_STEP", 8)
    real_connect = sqlite3.connect
    steps: list[int] = []

    class Source:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self._conn = conn

        def __getattr__(self, name: str) -> object:
            return getattr(self._conn, name)

        def backup(self, target: sqlite3.Connection, *, pages: int) -> None:
            def progress(_status: int, remaining: int, _total: int) -> None:
                steps.append(remaining)
                if len(steps) == 2:  # a write lands in the middle of the copy
                    writer.execute("INSERT INTO filler VALUES (-1, 'late')")
                    writer.commit()

            self._conn.backup(target, pages=pages, progress=progress)

    def connect(name: str, *args: Any, **kwargs: Any) -> object:
        conn = real_connect(name, *args, **kwargs)
        return Source(conn) if "mode=ro" in str(name) else conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    out = tmp_path / "backup.sqlite"
    backup_database(source, out)
    writer.close()
    store.close()
    assert len(steps) > 2
    with real_connect(out) as copy:
        count = copy.execute("SELECT COUNT(*) FROM filler").fetchone()[0]
        assert count in (3000, 3001)  # before the write or after it, never half of it
        assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)


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
