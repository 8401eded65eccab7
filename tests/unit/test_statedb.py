"""state.sqlite: pins, replay reservations and conversations that survive reopening the file,
and the upgrade of a database made by an earlier release."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from zope.interface.verify import verifyObject

from agentcall import limits
from agentcall.caller.outboundstore import SqliteOutboundStore
from agentcall.crypto import keys
from agentcall.crypto.pins import IPinStorage, Pin, PinBook
from agentcall.crypto.replay import IReplayStorage, ReplayWindow
from agentcall.db import open_database
from agentcall.errors import IdentityChanged, ReplayDetected, StoreError
from agentcall.listener.contexts import IContextStore, SqliteContextStore, mint
from agentcall.listener.journal import IJournal
from agentcall.local.home import Home, PrivateFileError
from agentcall.local.statedb import STATE_SCHEMA, SqlitePinStorage, SqliteReplayStorage, StateDb
from tests.unit.crypto_helpers import NOW, ORIGIN, make_party
from tests.unit.test_db_engine import fresh_snapshot, only_version, snapshot

KEN = "@acme/ken"
SENDER = "SHA256:" + "ab" * 16
REQUEST = "0123456789abcdef" * 2


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home.from_environ({"HOME": str(tmp_path)})


@pytest.fixture
def db(home: Home) -> Iterator[StateDb]:
    opened = StateDb.open(home)
    yield opened
    opened.close()


def reopen(home: Home, db: StateDb) -> StateDb:
    db.close()
    return StateDb.open(home)


def a_pin(**changes: object) -> Pin:
    fields: dict[str, object] = {
        "relay_origin": ORIGIN,
        "address": KEN,
        "identity_pub": "A" * 43,
        "fingerprint": "SHA256:" + "0" * 32,
        "first_seen_at": int(NOW),
        "highest_epoch": 1,
    }
    fields.update(changes)
    return Pin(**fields)  # type: ignore[arg-type]


def test_storages_provide_their_interfaces(db: StateDb) -> None:
    """The SQLite storages are complete implementations of the crypto interfaces."""
    assert verifyObject(IPinStorage, db.pins)
    assert verifyObject(IReplayStorage, db.replay)
    assert isinstance(db.pins, SqlitePinStorage)
    assert isinstance(db.replay, SqliteReplayStorage)


def test_file_is_private_and_in_wal_mode(home: Home, db: StateDb) -> None:
    """state.sqlite is 0600 in the 0700 state dir, in WAL mode, at the state schema."""
    assert os.stat(home.state_db_path).st_mode & 0o777 == 0o600
    assert os.stat(home.state_dir).st_mode & 0o777 == 0o700
    assert db.connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.connection.execute("SELECT schema, version FROM version").fetchall() == [("state", 6)]
    db.pins.put(a_pin())
    # SQLite gives its side files the database file's mode.
    for suffix in ("-wal", "-shm"):
        side = home.state_db_path.with_name(home.state_db_path.name + suffix)
        assert os.stat(side).st_mode & 0o777 == 0o600


def test_loose_database_file_is_refused(home: Home) -> None:
    """A state.sqlite others can read is refused before SQLite opens it."""
    StateDb.open(home).close()
    os.chmod(home.state_db_path, 0o644)
    with pytest.raises(PrivateFileError, match="chmod 600"):
        StateDb.open(home)


def test_another_schema_is_refused(home: Home) -> None:
    """A SQLite file that is not a state database is not used."""
    home.create_private(home.state_db_path)
    conn = sqlite3.connect(home.state_db_path)
    conn.execute("CREATE TABLE something (x)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError):
        StateDb.open(home)


def test_pins_put_get_remove(db: StateDb) -> None:
    """A pin is stored, replaced by key, and removed once."""
    assert db.pins.get(ORIGIN, KEN) is None
    db.pins.put(a_pin())
    db.pins.put(a_pin(highest_epoch=3))
    assert db.pins.get(ORIGIN, KEN) == a_pin(highest_epoch=3)
    assert db.pins.get("other.example", KEN) is None
    assert db.pins.remove(ORIGIN, KEN) is True
    assert db.pins.remove(ORIGIN, KEN) is False
    assert db.pins.get(ORIGIN, KEN) is None


def test_pins_persist_across_reopen(home: Home, db: StateDb) -> None:
    """A pin written before closing is there after reopening the same file."""
    db.pins.put(a_pin(highest_epoch=2))
    db = reopen(home, db)
    try:
        assert db.pins.get(ORIGIN, KEN) == a_pin(highest_epoch=2)
    finally:
        db.close()


def test_pin_book_refuses_a_changed_identity_after_restart(home: Home, db: StateDb) -> None:
    """TOFU holds across processes: a new identity key after reopening is a hard error."""
    ken = make_party(KEN)
    PinBook(db.pins).check_and_pin(KEN, ken.identity, ken.encryption, NOW)
    db = reopen(home, db)
    try:
        impostor = make_party(KEN)
        with pytest.raises(IdentityChanged):
            PinBook(db.pins).check_and_pin(KEN, impostor.identity, impostor.encryption, NOW)
        pinned = db.pins.get(ORIGIN, KEN)
        assert pinned is not None
        assert pinned.fingerprint == keys.fingerprint(ken.identity.record)
    finally:
        db.close()


def test_corrupt_pin_row_is_an_error(db: StateDb) -> None:
    """A row that is not a valid pin is refused rather than trusted."""
    db.pins.put(a_pin())
    db.connection.execute("UPDATE pins SET fingerprint = 'nonsense'")
    with pytest.raises(StoreError, match="corrupt"):
        db.pins.get(ORIGIN, KEN)


def test_replay_storage_basics(db: StateDb) -> None:
    """Reservations are found by key, counted while live and pruned when spent."""
    replay = db.replay
    assert replay.keep_until(SENDER, REQUEST) is None
    replay.add(SENDER, REQUEST, NOW + 10.5)
    replay.add(SENDER, "f" * 32, NOW + 20)
    assert replay.keep_until(SENDER, REQUEST) == NOW + 10.5
    assert replay.keep_until("SHA256:" + "cd" * 16, REQUEST) is None
    assert replay.count_live(NOW) == 2
    assert replay.count_live(NOW + 10.5) == 1
    replay.add(SENDER, REQUEST, NOW + 30)
    assert replay.keep_until(SENDER, REQUEST) == NOW + 30
    assert replay.prune(NOW + 20) == 1
    assert replay.keep_until(SENDER, "f" * 32) is None
    assert replay.prune(NOW + 20) == 0


def test_replayed_request_is_refused_after_restart(home: Home, db: StateDb) -> None:
    """The reason this table exists: a request replayed after a restart is still refused."""
    expires_at = NOW + limits.CALL_DEADLINE_S
    ReplayWindow(storage=db.replay).reserve(SENDER, REQUEST, expires_at, NOW)
    db = reopen(home, db)
    try:
        window = ReplayWindow(storage=db.replay)
        with pytest.raises(ReplayDetected):
            window.reserve(SENDER, REQUEST, expires_at, NOW + 60)
        # Once the reservation is spent the id is forgotten and the table does not grow.
        later = expires_at + limits.CLOCK_SKEW_S
        assert window.prune(later) == 1
        assert window.live_count(later) == 0
    finally:
        db.close()


def test_full_window_persists_its_count(home: Home, db: StateDb) -> None:
    """The live count a full window refuses on is the stored one, also after reopening."""
    window = ReplayWindow(max_entries=2, storage=db.replay)
    for request_id in ("1" * 32, "2" * 32):
        window.reserve(SENDER, request_id, NOW + 60, NOW)
    db = reopen(home, db)
    try:
        with pytest.raises(ReplayDetected, match="full"):
            ReplayWindow(max_entries=2, storage=db.replay).reserve(SENDER, "3" * 32, NOW + 60, NOW)
    finally:
        db.close()


def test_closed_database_raises_store_error(home: Home) -> None:
    """Using a closed database is a StoreError, not a bare sqlite3 error."""
    db = StateDb.open(home)
    db.close()
    with pytest.raises(StoreError):
        db.replay.count_live(NOW)
    with pytest.raises(StoreError):
        db.pins.put(a_pin())


def test_the_state_schema_is_at_version_six_with_the_seen_cards() -> None:
    """Version 2 added the callee's bindings and the caller's open conversations, version 3 the
    execution journal of mailbox jobs, version 4 the caller's sent jobs, version 5 the callees'
    key records the caller keeps, version 6 the dates of the newest cards seen."""
    assert STATE_SCHEMA.versions() == [1, 2, 3, 4, 5, 6]
    script = STATE_SCHEMA.full_script(6)
    tables = ("pins", "replay", "contexts", "contexts_out", "journal", "jobs_out", "peer_keys")
    for table in (*tables, "seen_cards"):
        assert f"CREATE TABLE {table} (" in script
    assert "CREATE TABLE seen_cards (" not in STATE_SCHEMA.full_script(5)
    assert "CREATE TABLE journal (" not in STATE_SCHEMA.full_script(2)
    assert "CREATE TABLE jobs_out (" not in STATE_SCHEMA.full_script(3)
    assert "CREATE TABLE peer_keys (" not in STATE_SCHEMA.full_script(4)


@pytest.mark.parametrize("start", STATE_SCHEMA.versions())
def test_every_state_upgrade_path_equals_the_fresh_schema(start: int, tmp_path: Path) -> None:
    """A state database made by any earlier release upgrades to exactly the fresh schema."""
    path = tmp_path / "old.sqlite"
    old_code = only_version(STATE_SCHEMA, start, tmp_path / "old-code")
    open_database(path, old_code).connection.close()
    upgraded = open_database(path, STATE_SCHEMA)
    try:
        assert upgraded.schema_version == STATE_SCHEMA.newest
        assert snapshot(upgraded.connection) == fresh_snapshot(STATE_SCHEMA, tmp_path / "new.db")
    finally:
        upgraded.connection.close()


def test_a_version_one_database_upgrades_and_keeps_its_rows(home: Home, tmp_path: Path) -> None:
    """The state.sqlite of the previous release: pins and replay rows survive the upgrade."""
    home.create_private(home.state_db_path)
    old = open_database(home.state_db_path, only_version(STATE_SCHEMA, 1, tmp_path / "v1"))
    SqlitePinStorage(old.connection).put(a_pin(highest_epoch=4))
    SqliteReplayStorage(old.connection).add(SENDER, REQUEST, NOW + 30)
    assert {row[0] for row in old.connection.execute("SELECT name FROM sqlite_master")} >= {
        "pins",
        "replay",
    }
    assert "contexts" not in {
        row[0] for row in old.connection.execute("SELECT name FROM sqlite_master")
    }
    old.connection.close()

    db = StateDb.open(home)
    try:
        assert db.connection.execute("SELECT version FROM version").fetchone() == (6,)
        assert db.pins.get(ORIGIN, KEN) == a_pin(highest_epoch=4)
        assert db.replay.keep_until(SENDER, REQUEST) == NOW + 30
        # The new tables work straight away.
        db.outbound(ORIGIN).remember(KEN, "ask", "ctx_" + "q" * 22, NOW)
        assert [e.context_id for e in db.outbound(ORIGIN).open_for(KEN, NOW)] == ["ctx_" + "q" * 22]
        assert db.contexts.get("ctx_" + "q" * 22) is None
        assert db.journal.get("j" * 22) is None
    finally:
        db.close()


def test_conversation_stores_share_the_file_and_persist(home: Home, db: StateDb) -> None:
    """Both new stores are exposed on StateDb and what they hold survives reopening."""
    binding = mint(
        caller=KEN,
        task="ask",
        agent_kind="claude",
        workdir="/srv/share",
        agent_session="sess-1",
        now=NOW,
    )
    assert verifyObject(IContextStore, db.contexts)
    db.contexts.put(binding)
    db.outbound(ORIGIN).remember(KEN, "review", binding.context_id, NOW)
    db = reopen(home, db)
    try:
        assert db.contexts.get(binding.context_id) == binding
        assert db.outbound(ORIGIN).get(binding.context_id) is not None
        assert isinstance(db.outbound(ORIGIN), SqliteOutboundStore)
    finally:
        db.close()


def test_a_version_two_database_upgrades_and_keeps_its_conversations(
    home: Home, tmp_path: Path
) -> None:
    """The previous release's state.sqlite keeps its bindings and gains an empty journal."""
    binding = mint(
        caller=KEN,
        task="ask",
        agent_kind="claude",
        workdir="/srv/share",
        agent_session="sess-1",
        now=NOW,
    )
    home.create_private(home.state_db_path)
    old = open_database(home.state_db_path, only_version(STATE_SCHEMA, 2, tmp_path / "v2"))
    SqliteContextStore(old.connection).put(binding)
    old.connection.close()

    db = StateDb.open(home)
    try:
        assert db.connection.execute("SELECT version FROM version").fetchone() == (6,)
        assert db.contexts.get(binding.context_id) == binding
        assert db.connection.execute("SELECT COUNT(*) FROM journal").fetchone() == (0,)
        assert verifyObject(IJournal, db.journal)
    finally:
        db.close()


def test_seen_cards_keep_the_newest_date_per_peer(db: StateDb) -> None:
    PEER = "@acme/bob"
    seen = db.seen_cards(ORIGIN)
    assert seen.newest(PEER) is None
    seen.saw(PEER, int(NOW))
    seen.saw(PEER, int(NOW) - 60)  # an older date never replaces a newer one
    assert seen.newest(PEER) == int(NOW)
    seen.saw(PEER, int(NOW) + 60)
    assert seen.newest(PEER) == int(NOW) + 60
    assert db.seen_cards("other.example").newest(PEER) is None
