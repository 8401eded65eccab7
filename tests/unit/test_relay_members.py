"""Members on the relay store (a real SQLite file): listing, removal, release, roles, last seen."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcall import limits
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.relay import audit
from agentcall.relay.store import open_relay_store
from agentcall.wire.http import AgentKind, MemberRole, MemberStatus
from tests.unit.crypto_helpers import make_party
from tests.unit.relay_helpers import Fired

T0 = 1_700_000_000.0


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "relay.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[Fired]:
    opened = Fired(open_relay_store(db_path))
    opened.ensure_org("acme", T0)
    yield opened
    opened.close()


def enrol(store: Fired, handle: str, role: MemberRole = MemberRole.MEMBER) -> str:
    secret, _info = store.create_invite(
        "acme", created_by=None, role=role, expires_in_days=7, description=None, now=T0
    )
    _member, token = store.register("acme", secret, handle, AgentKind.CLAUDE, T0 + 1)
    return str(token)


def refusal(exc: pytest.ExceptionInfo[ApiError]) -> tuple[int, ApiErrorCode]:
    return exc.value.status, exc.value.code


def events(store: Fired, event: str) -> list[tuple[str | None, str | None, str | None]]:
    rows = store.audit_rows("acme", limit=500)
    return [(row.actor, row.target, row.detail) for row in rows if row.event == event]


def test_members_are_listed_by_handle_a_page_at_a_time(store: Fired) -> None:
    for handle in ("ken", "ada", "bob"):
        enrol(store, handle, MemberRole.ADMIN if handle == "ada" else MemberRole.MEMBER)
    listed = store.list_members("acme", limit=2)
    assert [(m.handle, m.role, m.status) for m in listed] == [
        ("ada", MemberRole.ADMIN, MemberStatus.ACTIVE),
        ("bob", MemberRole.MEMBER, MemberStatus.ACTIVE),
    ]
    assert listed[0].enrolled_at == int(T0 + 1) and listed[0].last_seen is None
    assert [m.handle for m in store.list_members("acme", after="bob", limit=2)] == ["ken"]
    assert store.list_members("beta", limit=2) == []
    for bad in (0, limits.MAX_MEMBERS_LISTED + 1):
        with pytest.raises(ValueError):
            store.list_members("acme", limit=bad)


def test_a_removed_member_is_cut_off_but_keeps_the_handle_reserved(store: Fired) -> None:
    enrol(store, "ada", MemberRole.ADMIN)
    token = enrol(store, "ken")
    party = make_party("@acme/ken")
    store.publish_identity("acme", "ken", party.identity, T0 + 2)
    store.publish_encryption("acme", "ken", party.encryption, T0 + 2)
    assert store.fetch_keys("acme", "ken") is not None  # read once: the registry caches it
    assert store.handle_exists("acme", "ken")  # and remembers that ken is a member

    removed = store.remove_member("acme", "ken", release=False, actor="ada", now=T0 + 10)

    assert (removed.status, removed.removed_by, removed.removed_at) == (
        MemberStatus.REMOVED,
        "ada",
        int(T0 + 10),
    )
    assert store.authenticate("acme", "ken", token) is None
    assert store.handle_exists("acme", "ken") is False
    assert store.get_member("acme", "ken") is None
    assert store.fetch_keys("acme", "ken") is None  # withdrawn, the cached copy too
    assert events(store, audit.MEMBER_REMOVE) == [("ada", "ken", "role=member")]
    # Nobody else can take the handle and be mistaken for Ken.
    with pytest.raises(ApiError) as exc:
        enrol(store, "ken")
    assert refusal(exc) == (409, ApiErrorCode.HANDLE_TAKEN)
    assert [(m.handle, m.status) for m in store.list_members("acme", limit=10)] == [
        ("ada", MemberStatus.ACTIVE),
        ("ken", MemberStatus.REMOVED),
    ]
    # Asking again changes nothing and writes no second row.
    again = store.remove_member("acme", "ken", release=False, actor="ada", now=T0 + 20)
    assert again.removed_at == int(T0 + 10)
    assert len(events(store, audit.MEMBER_REMOVE)) == 1


def test_a_released_handle_can_be_taken_again_by_someone_with_new_keys(store: Fired) -> None:
    enrol(store, "ada", MemberRole.ADMIN)
    enrol(store, "ken")
    store.publish_identity("acme", "ken", make_party("@acme/ken").identity, T0 + 2)
    store.remove_member("acme", "ken", release=False, actor="ada", now=T0 + 10)

    released = store.remove_member("acme", "ken", release=True, actor="ada", now=T0 + 20)

    assert released.status is MemberStatus.RELEASED
    assert events(store, audit.MEMBER_RELEASE) == [("ada", "ken", None)]
    new_token = enrol(store, "ken")
    assert store.authenticate("acme", "ken", new_token) is not None
    assert store.fetch_keys("acme", "ken") is None  # the old identity is not theirs
    newcomer = make_party("@acme/ken")
    store.publish_identity("acme", "ken", newcomer.identity, T0 + 30)
    assert store.fetch_keys("acme", "ken").identity == newcomer.identity


def test_remove_and_release_at_once(store: Fired) -> None:
    enrol(store, "ada", MemberRole.ADMIN)
    enrol(store, "ken")
    assert (
        store.remove_member("acme", "ken", release=True, actor="ada", now=T0).status
        is MemberStatus.RELEASED
    )
    assert [row[1] for row in events(store, audit.MEMBER_REMOVE)] == ["ken"]
    assert [m.handle for m in store.list_members("acme", limit=10)] == ["ada"]


def test_a_handle_is_not_released_while_the_mailbox_keeps_its_jobs(
    store: Fired, db_path: Path
) -> None:
    enrol(store, "ada", MemberRole.ADMIN)
    enrol(store, "ken")
    expires = T0 + 72 * 3600
    with sqlite3.connect(db_path) as db:
        db.execute(
            "INSERT INTO jobs (job_id, org, caller, callee, request_bytes, created_at,"
            " expires_at, state, attempts, cancel_requested, holds_ciphertext, last_delivery)"
            " VALUES ('j1', 'acme', 'ada', 'ken', 10, ?, ?, 'failed', 0, 0, 0, 0)",
            (T0, expires),
        )
    with pytest.raises(ApiError) as exc:
        store.remove_member("acme", "ken", release=True, actor="ada", now=T0 + 5)
    assert refusal(exc) == (409, ApiErrorCode.HANDLE_BUSY)
    assert "2023-11-18" in exc.value.message  # expiry plus the metadata grace, in UTC
    # The whole change was refused: Ken is still an active member.
    assert store.handle_exists("acme", "ken")
    assert events(store, audit.MEMBER_REMOVE) == []


def test_an_organisation_always_keeps_one_admin(store: Fired) -> None:
    enrol(store, "ada", MemberRole.ADMIN)
    enrol(store, "ken")
    for attempt in (
        lambda: store.remove_member("acme", "ada", release=False, actor="ada", now=T0),
        lambda: store.set_member_role("acme", "ada", MemberRole.MEMBER, actor="ada", now=T0),
    ):
        with pytest.raises(ApiError) as exc:
            attempt()
        assert refusal(exc) == (409, ApiErrorCode.LAST_ADMIN)
    promoted = store.set_member_role("acme", "ken", MemberRole.ADMIN, actor="ada", now=T0 + 1)
    assert promoted.role is MemberRole.ADMIN
    # With a second admin the first may step down, or leave.
    assert store.set_member_role("acme", "ada", "member", actor="ken", now=T0 + 2).role == "member"
    assert events(store, audit.MEMBER_ROLE) == [
        ("ada", "ken", "member->admin"),
        ("ken", "ada", "admin->member"),
    ]
    with pytest.raises(ApiError) as exc:
        store.remove_member("acme", "ken", release=False, actor="ken", now=T0 + 3)
    assert refusal(exc) == (409, ApiErrorCode.LAST_ADMIN)


def test_a_role_given_again_changes_nothing_and_unknown_or_removed_members_are_404(
    store: Fired,
) -> None:
    enrol(store, "ada", MemberRole.ADMIN)
    enrol(store, "ken")
    same = store.set_member_role("acme", "ken", MemberRole.MEMBER, actor="ada", now=T0)
    assert same.role is MemberRole.MEMBER and events(store, audit.MEMBER_ROLE) == []
    store.remove_member("acme", "ken", release=False, actor="ada", now=T0)
    for handle in ("ken", "nobody"):
        with pytest.raises(ApiError) as exc:
            store.set_member_role("acme", handle, MemberRole.ADMIN, actor="ada", now=T0)
        assert refusal(exc) == (404, ApiErrorCode.NOT_FOUND)
    with pytest.raises(ApiError) as exc:
        store.remove_member("acme", "nobody", release=False, actor="ada", now=T0)
    assert refusal(exc) == (404, ApiErrorCode.NOT_FOUND)
    # Another organisation's member is not found either.
    store.ensure_org("beta", T0)
    with pytest.raises(ApiError) as exc:
        store.remove_member("beta", "ada", release=False, actor="ada", now=T0)
    assert refusal(exc) == (404, ApiErrorCode.NOT_FOUND)


def test_last_seen_only_moves_forward_and_skips_removed_members(store: Fired) -> None:
    enrol(store, "ada", MemberRole.ADMIN)
    enrol(store, "ken")
    store.record_seen([("acme", "ada", T0 + 50), ("acme", "ken", T0 + 60)])
    store.record_seen([("acme", "ada", T0 + 40)])  # an older time from a late batch
    store.remove_member("acme", "ken", release=False, actor="ada", now=T0 + 70)
    store.record_seen([("acme", "ken", T0 + 80), ("acme", "nobody", T0 + 80)])
    seen = {m.handle: m.last_seen for m in store.list_members("acme", limit=10)}
    assert seen == {"ada": int(T0 + 50), "ken": int(T0 + 60)}
    store.record_seen([])


def test_a_rotated_token_replaces_the_old_one_at_once(store: Fired) -> None:
    old = enrol(store, "ken")
    new = "n" * 43
    store.rotate_token("acme", "ken", new, T0 + 5)
    assert store.authenticate("acme", "ken", old) is None
    assert store.authenticate("acme", "ken", new) is not None
    assert events(store, audit.MEMBER_CREDENTIALS_ROTATED) == [("ken", "ken", None)]
    with pytest.raises(ApiError) as exc:
        store.rotate_token("acme", "ken", "too-short", T0 + 6)
    assert refusal(exc) == (400, ApiErrorCode.BAD_REQUEST)
    enrol(store, "ada", MemberRole.ADMIN)
    store.remove_member("acme", "ken", release=False, actor="ada", now=T0 + 7)
    with pytest.raises(ApiError) as exc:
        store.rotate_token("acme", "ken", "m" * 43, T0 + 8)
    assert refusal(exc) == (404, ApiErrorCode.NOT_FOUND)
    assert store.authenticate("acme", "ken", "m" * 43) is None
