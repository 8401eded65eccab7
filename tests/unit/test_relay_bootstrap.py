"""Bootstrap: database, organisation and a fresh one-time admin invite, safe to run again."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from agentcall import limits
from agentcall.errors import ApiError, ApiErrorCode, StoreError
from agentcall.invites import parse_invite_url
from agentcall.relay.audit import AuditEntry
from agentcall.relay.bootstrap import bootstrap
from agentcall.relay.store import RELAY_SCHEMA, open_relay_store
from agentcall.wire.http import InviteStatus, MemberRole
from tests.unit.relay_helpers import Fired

T0 = 1_700_000_000.0
URL = "https://relay.example.com/"


def test_first_run_creates_everything(tmp_path: Path) -> None:
    """A new file gets the schema, the org and an admin invite that enrols an admin."""
    path = tmp_path / "relay.db"
    result = bootstrap(str(path), "acme", URL, T0)
    assert (result.database_created, result.org_created) == (True, True)
    assert (result.schema_version, result.upgraded_from) == (RELAY_SCHEMA.newest, None)
    assert result.expires_at == int(T0) + limits.INVITE_DEFAULT_DAYS * 86_400

    link = parse_invite_url(result.invite_url)
    assert (link.relay_url, link.org) == ("https://relay.example.com", "acme")
    store = Fired(open_relay_store(path))
    member, _token = store.register("acme", link.secret, "ken", None, T0 + 60)
    assert member.role is MemberRole.ADMIN
    store.close()


def test_second_run_keeps_state_and_mints_another_invite(tmp_path: Path) -> None:
    """Running again creates nothing new but a fresh invite; the first one stays valid."""
    path = tmp_path / "relay.db"
    first = bootstrap(path, "acme", URL, T0)
    second = bootstrap(path, "acme", URL, T0 + 10)
    assert (second.database_created, second.org_created) == (False, False)
    assert second.invite_url != first.invite_url and second.invite_id != first.invite_id
    store = Fired(open_relay_store(path))
    statuses = {info.id: info.status for info in store.list_invites("acme", T0 + 20)}
    assert statuses == {first.invite_id: InviteStatus.ACTIVE, second.invite_id: InviteStatus.ACTIVE}
    store.close()


def test_invite_is_one_time(tmp_path: Path) -> None:
    """The bootstrap invite enrols exactly one person."""
    path = tmp_path / "relay.db"
    secret = parse_invite_url(bootstrap(path, "acme", URL, T0).invite_url).secret
    store = Fired(open_relay_store(path))
    store.register("acme", secret, "ken", None, T0 + 1)
    with pytest.raises(ApiError) as exc:
        store.register("acme", secret, "amy", None, T0 + 2)
    assert exc.value.code is ApiErrorCode.INVITE_USED
    store.close()


def test_another_org_in_the_same_database(tmp_path: Path) -> None:
    """A second organisation is added beside the first without touching it."""
    path = tmp_path / "relay.db"
    bootstrap(path, "acme", URL, T0)
    result = bootstrap(path, "beta", URL, T0)
    assert (result.database_created, result.org_created) == (False, True)
    assert parse_invite_url(result.invite_url).org == "beta"


@pytest.mark.parametrize(
    ("org", "url"),
    [
        ("Acme Corp", URL),
        ("acme-", URL),
        ("ac--me", URL),
        ("acme", "http://relay.example.com"),
        ("acme", "relay.example.com"),
    ],
)
def test_bad_input_is_refused_before_the_database_exists(
    tmp_path: Path, org: str, url: str
) -> None:
    """A bad organisation name or an unsafe URL raises ValueError and creates no file."""
    path = tmp_path / "relay.db"
    with pytest.raises(ValueError):
        bootstrap(path, org, url, T0)
    assert not path.exists()


def test_result_repr_hides_the_invite(tmp_path: Path) -> None:
    """The invite URL carries the secret, so it is left out of the repr."""
    result = bootstrap(tmp_path / "relay.db", "acme", URL, T0)
    secret = parse_invite_url(result.invite_url).secret
    assert secret not in repr(result)
    assert "acme" in repr(result)


def test_the_database_and_its_wal_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    """SQLite gives -wal and -shm the database's mode, so a 0600 database keeps them private."""
    path = tmp_path / "relay.db"
    old = os.umask(0)
    try:
        bootstrap(path, "acme", URL, T0)
        store = Fired(open_relay_store(path))
        store.ensure_org("beta", T0)
        sides = [p for p in tmp_path.iterdir() if p.name.startswith("relay.db-")]
        modes = {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in [path, *sides]}
        store.close()
    finally:
        os.umask(old)
    assert "relay.db-wal" in modes
    assert set(modes.values()) == {0o600}


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o646])
def test_a_database_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    """Bootstrap and the relay both refuse it, naming the file and the chmod."""
    path = tmp_path / "relay.db"
    bootstrap(path, "acme", URL, T0)
    path.chmod(mode)
    with pytest.raises(StoreError, match=f"run `chmod go-w {path}`"):
        open_relay_store(path)
    with pytest.raises(StoreError, match=f"run `chmod go-w {path}`"):
        bootstrap(path, "acme", URL, T0)


def test_the_relay_service_refuses_a_loose_database_with_one_line(tmp_path: Path) -> None:
    """``twistd agentcall-relay`` exits with the fix, not a traceback from deep in makeService."""
    from twisted.internet.testing import MemoryReactorClock

    from agentcall.relay import tap

    path = tmp_path / "relay.db"
    bootstrap(path, "acme", URL, T0)
    path.chmod(0o666)
    options = tap.Options()
    options.parseOptions(["--database", str(path), "--url", "http://127.0.0.1:8765"])
    with pytest.raises(SystemExit) as exc:
        tap.makeService(options, reactor=MemoryReactorClock())
    assert str(exc.value).startswith("agentcall-relay: relay database")
    assert f"chmod go-w {path}" in str(exc.value)


def test_the_relay_service_stops_the_mailbox_timers_with_it(tmp_path: Path) -> None:
    """Stopping the relay cancels the mailbox's sweep and rest timers (none left armed)."""
    from twisted.application.service import MultiService
    from twisted.internet.testing import MemoryReactorClock

    from agentcall.relay import tap

    path = tmp_path / "relay.db"
    bootstrap(path, "acme", URL, T0)
    options = tap.Options()
    options.parseOptions(["--database", str(path), "--url", "http://127.0.0.1:8765"])
    top = tap.makeService(options, reactor=MemoryReactorClock())
    assert isinstance(top, MultiService)
    (timers,) = [s for s in top if isinstance(s, tap._MailboxTimers)]
    stopped: list[bool] = []
    timers._jobs = type("Jobs", (), {"stop": lambda _self: stopped.append(True)})()
    timers.startService()
    timers.stopService()
    assert stopped == [True]


def test_the_relay_takes_a_cap_on_upgrades_in_flight() -> None:
    from twisted.python import usage

    from agentcall import limits
    from agentcall.relay import tap

    base = ["--database", "relay.db", "--url", "http://127.0.0.1:8765"]
    options = tap.Options()
    options.parseOptions(base)
    assert options["door"].caps.upgrades == limits.MAX_UPGRADES_IN_FLIGHT
    options = tap.Options()
    options.parseOptions([*base, "--max-upgrades", "7"])
    assert options["door"].caps.upgrades == 7
    with pytest.raises(usage.UsageError, match="--max-upgrades must be between 1 and 100000"):
        tap.Options().parseOptions([*base, "--max-upgrades", "0"])


def test_the_relay_service_flushes_its_audit_rows_when_it_stops(tmp_path: Path) -> None:
    from twisted.application.service import MultiService
    from twisted.internet.testing import MemoryReactorClock

    from agentcall.relay import tap

    path = tmp_path / "relay.db"
    bootstrap(path, "acme", URL, T0)
    options = tap.Options()
    options.parseOptions(["--database", str(path), "--url", "http://127.0.0.1:8765"])
    top = tap.makeService(options, reactor=MemoryReactorClock())
    assert isinstance(top, MultiService)
    # Last to stop: every other service may still record rows while it stops.
    first = next(iter(top))
    assert isinstance(first, tap._AuditFlush)
    flushed: list[bool] = []
    first._sink = type("Sink", (), {"flush": lambda _self: flushed.append(True)})()
    first.startService()
    first.stopService()
    assert flushed == [True]


def test_the_relay_takes_a_head_grace() -> None:
    from twisted.python import usage

    from agentcall import limits
    from agentcall.relay import tap

    base = ["--database", "relay.db", "--url", "http://127.0.0.1:8765"]
    options = tap.Options()
    options.parseOptions(base)
    assert options["door"].caps.head_grace_s == limits.HEAD_EVICT_AFTER_S == 2.0
    options = tap.Options()
    options.parseOptions([*base, "--handshake-grace", "0"])
    assert options["door"].caps.head_grace_s == 0.0
    with pytest.raises(usage.UsageError, match="--handshake-grace must be between 0 and 60"):
        tap.Options().parseOptions([*base, "--handshake-grace", "61"])


def test_the_relay_holds_accept_at_the_handshake_cap_unless_told_not_to() -> None:
    from agentcall.relay import tap
    from agentcall.relay.door import Door

    base = ["--database", "relay.db", "--url", "http://127.0.0.1:8765"]
    held = tap.Options()
    held.parseOptions(base)
    assert held["door"].hold_accept is True
    closing = tap.Options()
    closing.parseOptions([*base, "--no-accept-hold"])
    assert closing["door"].hold_accept is False
    # Disabled, the valve never takes the port, so it never stops it; enabled, it does.
    stops = []
    for options in (held, closing):
        door = Door(options["door"], Clock(), sink=_NoSink())
        port = _Port()
        door.valve.attach(port)
        for i in range(options["door"].caps.handshakes):
            door.gate.admit(f"10.0.{i // 250}.{i % 250}", 0.0)
        door.valve.check()
        stops.append(port.stops)
    assert stops == [1, 0]


class _Port:
    stops = 0

    def stopReading(self) -> None:
        self.stops += 1

    def startReading(self) -> None:
        pass


class _NoSink:
    def record(self, entry: AuditEntry) -> Deferred[None]:
        return succeed(None)
