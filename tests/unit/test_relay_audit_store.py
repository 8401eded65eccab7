"""Audit rows on a real SQLite file: export pages, legal holds, and retention's deletes, which
must say exactly what :mod:`agentcall.relay.retention` says."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcall import limits
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.relay import audit
from agentcall.relay.audit import AuditEntry
from agentcall.relay.retention import EndedInvite, HoldKey, keeps_event, keeps_invite
from agentcall.relay.store import SqliteRegistry, open_relay_store
from agentcall.wire.http import AuditHold, HoldScope
from tests.unit.relay_helpers import Fired

T0 = 1_700_000_000.0
DAY = 86_400


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Fired]:
    opened = Fired(open_relay_store(tmp_path / "relay.db"))
    opened.ensure_org("acme", T0)
    opened.ensure_org("beta", T0)
    yield opened
    opened.close()


def registry(store: Fired) -> SqliteRegistry:
    found: SqliteRegistry = store.wrapped.registry
    return found


def row(event: str, at: float, *, org: str = "acme", actor: str | None = None,
        target: str | None = None) -> AuditEntry:  # fmt: skip
    return AuditEntry(event=event, org=org, actor=actor, target=target, call_id=None, at=at)


def events(store: Fired, org: str = "acme") -> list[tuple[str, str | None, str | None]]:
    return [(r.event, r.actor, r.target) for r in store.audit_rows(org, limit=500)]


# --- export pages ------------------------------------------------------------------------------


def test_audit_rows_page_by_id_within_a_window_and_up_to_an_id(store: Fired) -> None:
    store.record_many([row(audit.CALL_SUBMIT, T0 + i, actor=f"a{i}") for i in range(10)])
    store.record(row(audit.CALL_SUBMIT, T0, org="beta"))
    everything = store.audit_rows("acme", limit=500)
    assert [r.actor for r in everything] == [f"a{i}" for i in range(10)]
    ids = [r.id for r in everything]
    assert store.last_audit_id("acme") == ids[-1]
    assert store.last_audit_id("nobody") == 0
    page = store.audit_rows("acme", limit=3, after_id=ids[1])
    assert [r.id for r in page] == ids[2:5]
    # since is inclusive, until exclusive.
    window = store.audit_rows("acme", limit=500, since=T0 + 2, until=T0 + 5)
    assert [r.actor for r in window] == ["a2", "a3", "a4"]
    capped = store.audit_rows("acme", limit=500, up_to_id=ids[3])
    assert [r.id for r in capped] == ids[:4]
    # The same window, three rows a page, the way an export reads it.
    got: list[int] = []
    after = 0
    while True:
        found = store.audit_rows("acme", limit=3, after_id=after, since=T0 + 1, until=T0 + 9)
        got += [r.id for r in found]
        if len(found) < 3:
            break
        after = found[-1].id
    assert got == ids[1:9]


# --- legal holds -------------------------------------------------------------------------------


def test_holds_are_set_once_listed_cleared_and_audited(store: Fired) -> None:
    assert store.list_holds("acme") == []
    ken = store.set_hold("acme", "ken", note="case 14", actor="ada", now=T0)
    assert ken == AuditHold(HoldScope.HANDLE, "ken", int(T0), "ada", "case 14")
    org = store.set_hold("acme", None, note=None, actor="ada", now=T0 + 1)
    assert org == AuditHold(HoldScope.ORGANISATION, None, int(T0) + 1, "ada", None)
    # Setting again changes nothing (the first note stays) and writes no second row.
    assert store.set_hold("acme", "ken", note="other", actor="bob", now=T0 + 2) == ken
    assert store.list_holds("acme") == [org, ken]
    assert store.list_holds("beta") == []
    assert store.clear_hold("acme", "ken", actor="bob", now=T0 + 3) == ken
    assert store.list_holds("acme") == [org]
    with pytest.raises(ApiError) as exc:
        store.clear_hold("acme", "ken", actor="bob", now=T0 + 4)
    assert (exc.value.status, exc.value.code) == (404, ApiErrorCode.NOT_FOUND)
    assert events(store) == [
        (audit.AUDIT_HOLD_SET, "ada", "ken"),
        (audit.AUDIT_HOLD_SET, "ada", None),
        (audit.AUDIT_HOLD_CLEAR, "bob", "ken"),
    ]
    details = [r.detail for r in store.audit_rows("acme", limit=10)]
    assert details == ["handle", "organisation", "handle"]


def test_holds_are_capped_per_organisation(store: Fired, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_AUDIT_HOLDS", 2)
    store.set_hold("acme", "ann", note=None, actor="ada", now=T0)
    store.set_hold("acme", "ken", note=None, actor="ada", now=T0)
    with pytest.raises(ApiError) as exc:
        store.set_hold("acme", "bob", note=None, actor="ada", now=T0)
    assert (exc.value.status, exc.value.code) == (409, ApiErrorCode.TOO_MANY_HOLDS)
    # One that stands is still answered, and another organisation has its own.
    store.set_hold("acme", "ann", note=None, actor="ada", now=T0)
    store.set_hold("beta", "bob", note=None, actor="ada", now=T0)


# --- retention ---------------------------------------------------------------------------------


def test_prune_deletes_old_unheld_rows_oldest_first_in_batches(store: Fired) -> None:
    store.record_many([row(audit.CALL_SUBMIT, T0 + i, actor="ann", target="bob") for i in range(7)])
    store.record(row(audit.MEMBER_ROLE, T0, actor="ada", target="ken"))
    store.record(row(audit.CALL_SUBMIT, T0, org="beta"))
    store.set_hold("acme", "ken", note=None, actor="ada", now=T0 + 100)
    assert store.prune_audit("acme", T0 + 5, 3) == 3
    assert store.prune_audit("acme", T0 + 5, 3) == 2
    assert store.prune_audit("acme", T0 + 5, 3) == 0
    left = store.audit_rows("acme", limit=500)
    assert [(r.event, r.at) for r in left] == [
        (audit.CALL_SUBMIT, T0 + 5),
        (audit.CALL_SUBMIT, T0 + 6),
        (audit.MEMBER_ROLE, T0),  # ken is held
        (audit.AUDIT_HOLD_SET, T0 + 100),
    ]
    assert len(store.audit_rows("beta", limit=500)) == 1  # another organisation's are its own
    with pytest.raises(ValueError):
        store.prune_audit("acme", T0, limits.RETENTION_BATCH_ROWS + 1)


def test_relay_wide_rows_are_pruned_and_listed_first(store: Fired) -> None:
    assert store.retention_orgs() == [audit.RELAY_WIDE, "acme", "beta"]
    store.record(row(audit.AUTH_FAILED, T0, org=audit.RELAY_WIDE, target="10.0.0.1"))
    assert store.prune_audit(audit.RELAY_WIDE, T0 + 1, 10) == 1


def _invite(conn: sqlite3.Connection, invite_id: str, org: str, *, created_by: str | None,
            expires_at: float, used_at: float | None = None, used_by: str | None = None,
            revoked_at: float | None = None) -> None:  # fmt: skip
    conn.execute(
        "INSERT INTO invites (id, org, role, created_by, created_at, expires_at, used_at,"
        " used_by, revoked_at) VALUES (?, ?, 'member', ?, ?, ?, ?, ?, ?)",
        (invite_id, org, created_by, int(T0), expires_at, used_at, used_by, revoked_at),
    )


def test_purge_invites_drops_ended_ones_older_than_the_cutoff(store: Fired) -> None:
    conn = registry(store)._conn
    cutoff = T0 + 10 * DAY
    _invite(conn, "a" * 64, "acme", created_by="ada", expires_at=T0 + 20 * DAY, used_at=T0 + 1,
            used_by="ann")  # fmt: skip
    _invite(conn, "b" * 64, "acme", created_by="ada", expires_at=T0 + 20 * DAY, revoked_at=T0)
    _invite(conn, "c" * 64, "acme", created_by=None, expires_at=T0 + DAY)  # expired long ago
    _invite(conn, "d" * 64, "acme", created_by="ada", expires_at=cutoff + 1)  # expired too late
    _invite(conn, "e" * 64, "acme", created_by="ada", expires_at=T0 + 30 * DAY)  # active
    _invite(conn, "f" * 64, "acme", created_by="ada", expires_at=T0 + 20 * DAY,
            used_at=cutoff + 5, used_by="ken")  # used after the cutoff  # fmt: skip
    _invite(conn, "9" * 64, "beta", created_by=None, expires_at=T0)
    assert store.purge_invites("acme", cutoff) == 3
    left = {r[0][0] for r in conn.execute("SELECT id FROM invites WHERE org = 'acme'")}
    assert left == {"d", "e", "f"}
    assert conn.execute("SELECT COUNT(*) FROM invites WHERE org = 'beta'").fetchone() == (1,)


def test_purge_invites_respects_holds(store: Fired) -> None:
    conn = registry(store)._conn
    _invite(conn, "a" * 64, "acme", created_by="ada", expires_at=T0)
    _invite(conn, "b" * 64, "acme", created_by="bob", expires_at=T0, used_at=T0, used_by="ken")
    _invite(conn, "c" * 64, "acme", created_by=None, expires_at=T0)
    store.set_hold("acme", "ken", note=None, actor="ada", now=T0)
    assert store.purge_invites("acme", T0 + DAY) == 2
    assert conn.execute("SELECT id FROM invites").fetchall() == [("b" * 64,)]
    store.set_hold("acme", None, note=None, actor="ada", now=T0)
    store.clear_hold("acme", "ken", actor="ada", now=T0)
    assert store.purge_invites("acme", T0 + DAY) == 0


HANDLES = st.sampled_from([None, "ann", "ken", "bob"])
HOLDS = st.sets(
    st.builds(HoldKey, org=st.sampled_from(["acme", "beta"]), handle=HANDLES), max_size=3
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from(["acme", "beta"]), st.integers(0, 9), HANDLES, HANDLES),
        max_size=20,
    ),
    holds=HOLDS,
    cutoff=st.integers(0, 10),
)
def test_prune_deletes_exactly_what_keeps_event_lets_go(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[str, int, str | None, str | None]],
    holds: set[HoldKey],
    cutoff: int,
) -> None:
    store = Fired(open_relay_store(tmp_path_factory.mktemp("p") / "relay.db"))
    try:
        for org in ("acme", "beta"):
            store.ensure_org(org, T0)
        conn = registry(store)._conn
        for key in holds:
            conn.execute(
                "INSERT INTO audit_holds (org, handle, set_at, set_by) VALUES (?, ?, 0, 'ada')",
                (key.org, key.handle or ""),
            )
        store.record_many(
            [row(audit.CALL_SUBMIT, T0 + at, org=org, actor=a, target=t) for org, at, a, t in rows]
        )
        before = {org: store.audit_rows(org, limit=500) for org in ("acme", "beta")}
        for org in ("acme", "beta"):
            store.prune_audit(org, T0 + cutoff, 500)
            expected = [r for r in before[org] if keeps_event(r, T0 + cutoff, holds)]
            assert store.audit_rows(org, limit=500) == expected
    finally:
        store.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    invites=st.lists(
        st.tuples(
            st.sampled_from(["acme", "beta"]),
            st.sampled_from(["used", "revoked", "open"]),
            st.integers(0, 9),
            HANDLES,
            HANDLES,
        ),
        max_size=12,
    ),
    holds=HOLDS,
    cutoff=st.integers(0, 10),
)
def test_purge_deletes_exactly_what_keeps_invite_lets_go(
    tmp_path_factory: pytest.TempPathFactory,
    invites: list[tuple[str, str, int, str | None, str | None]],
    holds: set[HoldKey],
    cutoff: int,
) -> None:
    store = Fired(open_relay_store(tmp_path_factory.mktemp("i") / "relay.db"))
    try:
        for org in ("acme", "beta"):
            store.ensure_org(org, T0)
        conn = registry(store)._conn
        for key in holds:
            conn.execute(
                "INSERT INTO audit_holds (org, handle, set_at, set_by) VALUES (?, ?, 0, 'ada')",
                (key.org, key.handle or ""),
            )
        ended: dict[str, EndedInvite] = {}
        for n, (org, how, at, creator, user) in enumerate(invites):
            invite_id = f"{n:064x}"
            when = T0 + at
            if how == "used":
                _invite(conn, invite_id, org, created_by=creator, expires_at=when + 99,
                        used_at=when, used_by=user)  # fmt: skip
                ended[invite_id] = EndedInvite(org, when, creator, user)
            elif how == "revoked":
                _invite(conn, invite_id, org, created_by=creator, expires_at=when + 99,
                        revoked_at=when)  # fmt: skip
                ended[invite_id] = EndedInvite(org, when, creator, None)
            else:
                _invite(conn, invite_id, org, created_by=creator, expires_at=when)
                ended[invite_id] = EndedInvite(org, when, creator, None)
        for org in ("acme", "beta"):
            store.purge_invites(org, T0 + cutoff)
        left = {r[0] for r in conn.execute("SELECT id FROM invites")}
        assert left == {i for i, e in ended.items() if keeps_invite(e, T0 + cutoff, holds)}
    finally:
        store.close()
