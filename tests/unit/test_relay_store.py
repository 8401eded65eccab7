"""The relay store on a real SQLite file: invites, registration, auth, keys and audit rows."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from agentcall import ids, limits
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.relay import audit
from agentcall.relay.audit import AuditEntry
from agentcall.relay.auth import hash_secret, secret_matches
from agentcall.relay.store import (
    RESERVED_HANDLES,
    Member,
    RelayStore,
    SqliteRegistry,
    Submission,
    open_relay_store,
)
from agentcall.wire.http import (
    SUITE_X25519,
    AgentKind,
    EncryptionKeyRecord,
    IdentityRecord,
    InviteStatus,
    MemberRole,
    SignedEncryptionKeyRecord,
    SignedIdentityRecord,
)
from tests.unit.relay_helpers import Fired

T0 = 1_700_000_000.25
DAY = 86_400
ORIGIN = "relay.example.com"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "relay.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[Fired]:
    opened = Fired(open_relay_store(db_path))
    opened.ensure_org("acme", T0)
    yield opened
    opened.close()


def invite(
    store: Fired,
    *,
    org: str = "acme",
    role: MemberRole = MemberRole.MEMBER,
    days: int = 7,
    now: float = T0,
) -> tuple[str, str]:
    """Issue an invite; returns (secret, id)."""
    secret, info = store.create_invite(
        org, created_by=None, role=role, expires_in_days=days, description=None, now=now
    )
    return secret, info.id


def enrol(store: Fired, handle: str, *, org: str = "acme") -> tuple[Member, str]:
    secret, _id = invite(store, org=org)
    enrolled: tuple[Member, str] = store.register(org, secret, handle, AgentKind.CLAUDE, T0 + 1)
    return enrolled


def api_error(exc: pytest.ExceptionInfo[ApiError]) -> tuple[int, ApiErrorCode]:
    return exc.value.status, exc.value.code


def identity(handle: str, pub: str = "A" * 43) -> SignedIdentityRecord:
    record = IdentityRecord(v=1, relay_origin=ORIGIN, address=f"@acme/{handle}", identity_pub=pub)
    return SignedIdentityRecord(record=record, signature="S" * 86)


def encryption(handle: str, epoch: int) -> SignedEncryptionKeyRecord:
    record = EncryptionKeyRecord(
        v=1,
        relay_origin=ORIGIN,
        address=f"@acme/{handle}",
        key_id=f"{epoch:032x}",
        suite=SUITE_X25519,
        pub="P" * 43,
        epoch=epoch,
        not_before=int(T0),
        not_after=int(T0) + 20 * DAY,
        prev=None if epoch == 1 else f"{epoch - 1:032x}",
    )
    return SignedEncryptionKeyRecord(record=record, signature="E" * 86)


# --- basics ------------------------------------------------------------------------------


def test_store_provides_the_interface(store: Fired) -> None:
    """The SQLite store implements RelayStore (mypy checks the assignment) and answers with
    Deferreds, a refusal included."""
    as_protocol: RelayStore = store.wrapped
    assert isinstance(as_protocol.org_exists("acme"), Deferred)
    refused = as_protocol.register("acme", "no-such-secret", "ken", None, T0)
    failure = SynchronousTestCase().failureResultOf(refused, ApiError)
    assert failure.value.code is ApiErrorCode.INVITE_UNKNOWN


def test_store_needs_an_autocommit_connection(tmp_path: Path) -> None:
    """A connection with Python's implicit transactions is refused up front."""
    conn = sqlite3.connect(tmp_path / "x.db")
    with pytest.raises(ValueError, match="autocommit"):
        SqliteRegistry(conn)
    conn.close()


def test_ensure_org_creates_once(store: Fired) -> None:
    """The first call creates the organisation, later ones report it existed."""
    assert store.ensure_org("beta", T0) is True
    assert store.ensure_org("beta", T0 + 5) is False
    assert store.org_exists("beta") and not store.org_exists("gamma")
    with pytest.raises(ValueError):
        store.ensure_org("Not An Org", T0)


# --- invites -----------------------------------------------------------------------------


def test_create_invite_keeps_only_the_hash(store: Fired) -> None:
    """The secret is a fresh token; the id is its SHA-256; times are whole seconds."""
    secret, info = store.create_invite(
        "acme",
        created_by=None,
        role=MemberRole.ADMIN,
        expires_in_days=3,
        description="first",
        now=T0,
    )
    assert ids.TOKEN_RE.match(secret)
    assert info.id == hashlib.sha256(secret.encode()).hexdigest()
    assert (info.status, info.role, info.description) == (
        InviteStatus.ACTIVE,
        MemberRole.ADMIN,
        "first",
    )
    assert (info.created_at, info.expires_at) == (int(T0), int(T0) + 3 * DAY)
    assert store.list_invites("acme", T0) == [info]


@pytest.mark.parametrize("days", [0, limits.INVITE_MAX_DAYS + 1, True])
def test_create_invite_refuses_bad_expiry(store: Fired, days: int) -> None:
    """Expiry outside 1..90 days is a 400, before anything is stored."""
    with pytest.raises(ApiError) as exc:
        invite(store, days=days)
    assert api_error(exc) == (400, ApiErrorCode.BAD_REQUEST)
    assert store.list_invites("acme", T0) == []


def test_create_invite_refuses_long_description(store: Fired) -> None:
    """Descriptions are capped."""
    with pytest.raises(ApiError) as exc:
        store.create_invite(
            "acme",
            created_by=None,
            role=MemberRole.MEMBER,
            expires_in_days=7,
            description="x" * (limits.MAX_INVITE_DESCRIPTION_CHARS + 1),
            now=T0,
        )
    assert api_error(exc) == (400, ApiErrorCode.BAD_REQUEST)


def test_create_invite_for_unknown_org(store: Fired) -> None:
    """No invites for an organisation that does not exist."""
    with pytest.raises(ApiError) as exc:
        invite(store, org="nowhere")
    assert api_error(exc) == (404, ApiErrorCode.NOT_FOUND)


def test_active_invite_cap(store: Fired) -> None:
    """At most 100 active invites; used, revoked and expired ones free a place."""
    made = [invite(store, days=1) for _ in range(limits.MAX_ACTIVE_INVITES_PER_ORG)]
    with pytest.raises(ApiError) as exc:
        invite(store)
    assert api_error(exc) == (409, ApiErrorCode.TOO_MANY_INVITES)

    store.revoke_invite("acme", made[0][1], actor=None, now=T0)
    invite(store)
    store.register("acme", made[1][0], "ken", None, T0)
    invite(store)
    with pytest.raises(ApiError):
        invite(store)
    # A day later the 98 one-day invites have expired; only the two 7-day ones are active.
    later = T0 + DAY
    for _ in range(limits.MAX_ACTIVE_INVITES_PER_ORG - 2):
        invite(store, now=later)
    with pytest.raises(ApiError) as exc:
        invite(store, now=later)
    assert api_error(exc) == (409, ApiErrorCode.TOO_MANY_INVITES)


def test_list_invites_shows_status_active_first_and_is_bounded(store: Fired) -> None:
    """Statuses are computed at `now`; active invites come first; at most 200 are listed."""
    for _round in range(2):
        for _secret, invite_id in [invite(store) for _ in range(limits.MAX_ACTIVE_INVITES_PER_ORG)]:
            store.revoke_invite("acme", invite_id, actor=None, now=T0)
    used_secret, used_id = invite(store)
    store.register("acme", used_secret, "ken", None, T0)
    _s, short_id = invite(store, days=1)
    _s, active_id = invite(store, days=2)

    listed = store.list_invites("acme", T0 + DAY)
    assert len(listed) == limits.MAX_INVITES_LISTED
    assert listed[0].id == active_id and listed[0].status is InviteStatus.ACTIVE
    assert all(info.status is not InviteStatus.ACTIVE for info in listed[1:])
    every = {info.id: info for info in listed}
    assert every[short_id].status is InviteStatus.EXPIRED
    assert every[used_id].status is InviteStatus.USED and every[used_id].used_by == "ken"
    assert store.list_invites("other", T0) == []


def test_revoke_invite_rules(store: Fired) -> None:
    """Unknown -> 404; used -> 409; revoking twice is harmless; an expired one can be revoked."""
    with pytest.raises(ApiError) as exc:
        store.revoke_invite("acme", "0" * 64, actor="boss", now=T0)
    assert api_error(exc) == (404, ApiErrorCode.NOT_FOUND)

    used_secret, used_id = invite(store)
    store.register("acme", used_secret, "ken", None, T0)
    with pytest.raises(ApiError) as exc:
        store.revoke_invite("acme", used_id, actor="boss", now=T0)
    assert api_error(exc) == (409, ApiErrorCode.INVITE_USED)

    _secret, invite_id = invite(store)
    first = store.revoke_invite("acme", invite_id, actor="ken", now=T0 + 1)
    second = store.revoke_invite("acme", invite_id, actor="ken", now=T0 + 2)
    assert first.status is second.status is InviteStatus.REVOKED
    revokes = [r for r in store.audit_rows("acme") if r.event == audit.INVITE_REVOKE]
    assert len(revokes) == 1

    _secret, old_id = invite(store, days=1)
    assert store.revoke_invite("acme", old_id, actor=None, now=T0 + 2 * DAY).status is (
        InviteStatus.REVOKED
    )


def test_revoke_is_scoped_to_the_org(store: Fired) -> None:
    """An admin of one organisation cannot revoke another's invite, nor learn it exists."""
    store.ensure_org("beta", T0)
    _secret, beta_id = invite(store, org="beta")
    with pytest.raises(ApiError) as exc:
        store.revoke_invite("acme", beta_id, actor="boss", now=T0)
    assert api_error(exc) == (404, ApiErrorCode.NOT_FOUND)
    assert store.list_invites("beta", T0)[0].status is InviteStatus.ACTIVE


# --- registration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "handle",
    ["Ken", "k", "-ken", "ken-", "ke--n", "ken_smith", "x" * 32, "", *sorted(RESERVED_HANDLES)],
)
def test_register_refuses_invalid_or_reserved_handles(store: Fired, handle: str) -> None:
    """Bad grammar and reserved names are 400 handle_invalid, and the invite is not spent."""
    secret, _id = invite(store)
    with pytest.raises(ApiError) as exc:
        store.register("acme", secret, handle, None, T0)
    assert api_error(exc) == (400, ApiErrorCode.HANDLE_INVALID)
    assert store.list_invites("acme", T0)[0].status is InviteStatus.ACTIVE


def test_register_unknown_invite_or_org(store: Fired) -> None:
    """A made-up secret, or a real one presented to another org, is 404 invite_unknown.

    The invite is checked before the handle, so without one nobody learns which handles exist.
    """
    store.ensure_org("beta", T0)
    enrol(store, "ken")
    enrol(store, "ken", org="beta")
    secret, _id = invite(store)
    for org, presented in [("acme", ids.mint_token()), ("beta", secret), ("nowhere", secret)]:
        with pytest.raises(ApiError) as exc:
            store.register(org, presented, "ken", None, T0)
        assert api_error(exc) == (404, ApiErrorCode.INVITE_UNKNOWN)


def test_register_used_invite(store: Fired) -> None:
    """An invite enrols exactly one handle: the second use is 410 invite_used."""
    secret, _id = invite(store)
    store.register("acme", secret, "ken", None, T0)
    with pytest.raises(ApiError) as exc:
        store.register("acme", secret, "amy", None, T0)
    assert api_error(exc) == (410, ApiErrorCode.INVITE_USED)
    assert not store.handle_exists("acme", "amy")


def test_register_revoked_invite(store: Fired) -> None:
    """A revoked invite is 410 invite_revoked."""
    secret, invite_id = invite(store)
    store.revoke_invite("acme", invite_id, actor=None, now=T0)
    with pytest.raises(ApiError) as exc:
        store.register("acme", secret, "ken", None, T0)
    assert api_error(exc) == (410, ApiErrorCode.INVITE_REVOKED)


def test_register_expiry_boundary(store: Fired) -> None:
    """Valid until just before expires_at; at expires_at exactly it is 410 invite_expired."""
    early, _id = invite(store, days=1)
    late, late_id = invite(store, days=1)
    expires_at = int(T0) + DAY
    assert [i.status for i in store.list_invites("acme", expires_at - 0.001)] == [
        InviteStatus.ACTIVE,
        InviteStatus.ACTIVE,
    ]
    member, _token = store.register("acme", early, "ken", None, expires_at - 0.001)
    assert member.handle == "ken"
    with pytest.raises(ApiError) as exc:
        store.register("acme", late, "amy", None, float(expires_at))
    assert api_error(exc) == (410, ApiErrorCode.INVITE_EXPIRED)
    statuses = {i.id: i.status for i in store.list_invites("acme", expires_at)}
    assert statuses[late_id] is InviteStatus.EXPIRED


def test_register_taken_handle_keeps_the_invite(store: Fired) -> None:
    """409 handle_taken leaves the invite unused, so it can enrol another handle."""
    enrol(store, "ken")
    secret, _id = invite(store)
    with pytest.raises(ApiError) as exc:
        store.register("acme", secret, "ken", None, T0)
    assert api_error(exc) == (409, ApiErrorCode.HANDLE_TAKEN)
    member, _token = store.register("acme", secret, "amy", None, T0)
    assert member.handle == "amy"


def test_register_takes_role_from_invite_and_handles_are_per_org(store: Fired) -> None:
    """The invite decides the role; the same handle may exist in two organisations."""
    store.ensure_org("beta", T0)
    admin_secret, _id = invite(store, role=MemberRole.ADMIN)
    boss, token = store.register("acme", admin_secret, "ken", AgentKind.CODEX, T0 + 3)
    assert boss == Member("acme", "ken", MemberRole.ADMIN, AgentKind.CODEX, T0 + 3)
    assert ids.TOKEN_RE.match(token)
    other, _token = enrol(store, "ken", org="beta")
    assert other.role is MemberRole.MEMBER and other.org == "beta"
    assert store.get_member("acme", "ken") == boss
    assert store.get_member("acme", "nobody") is None


def test_tokens_and_secrets_never_reach_the_database_file(store: Fired, db_path: Path) -> None:
    """Only SHA-256 digests are written: the raw token and invite secret are in no file."""
    secret, _id = invite(store)
    _member, token = store.register("acme", secret, "ken", None, T0)
    data = b"".join(path.read_bytes() for path in db_path.parent.glob("relay.db*"))
    assert token.encode() not in data
    assert secret.encode() not in data
    # The scan does see what was written: the digests are there.
    assert hash_secret(token).encode() in data
    assert hash_secret(secret).encode() in data


# --- authentication ----------------------------------------------------------------------


def test_authenticate(store: Fired) -> None:
    """The right token gives the member; a wrong token, handle or org gives None."""
    member, token = enrol(store, "ken")
    store.ensure_org("beta", T0)
    enrol(store, "ken", org="beta")
    assert store.authenticate("acme", "ken", token) == member
    assert store.authenticate("acme", "ken", ids.mint_token()) is None
    assert store.authenticate("acme", "ken", token[:-1]) is None
    assert store.authenticate("acme", "ken", "") is None
    assert store.authenticate("acme", "nobody", token) is None
    assert store.authenticate("beta", "ken", token) is None


def test_member_repr_has_no_secret(store: Fired) -> None:
    """A member carries no token or hash, so logging one cannot leak it."""
    member, token = enrol(store, "ken")
    text = repr(member)
    assert token not in text and hash_secret(token) not in text
    assert not hasattr(member, "token_hash")
    assert member.address == "@acme/ken"


def test_secret_matching() -> None:
    """hash_secret is SHA-256 hex; secret_matches accepts only the exact secret."""
    assert hash_secret("abc") == hashlib.sha256(b"abc").hexdigest()
    assert secret_matches("abc", hash_secret("abc"))
    assert not secret_matches("abd", hash_secret("abc"))
    assert not secret_matches("\udc80", hash_secret("abc"))


# --- keys --------------------------------------------------------------------------------


def test_identity_is_published_once_and_never_replaced(store: Fired) -> None:
    """The same record again is a no-op; a different key is 409 and the first one stays."""
    enrol(store, "ken")
    store.publish_identity("acme", "ken", identity("ken"), T0)
    store.publish_identity("acme", "ken", identity("ken"), T0 + 1)
    with pytest.raises(ApiError) as exc:
        store.publish_identity("acme", "ken", identity("ken", pub="B" * 43), T0 + 2)
    assert api_error(exc) == (409, ApiErrorCode.IDENTITY_KEY_EXISTS)
    keys = store.fetch_keys("acme", "ken")
    assert keys is not None and keys.identity == identity("ken") and keys.encryption is None
    publishes = [r for r in store.audit_rows("acme") if r.event == audit.KEYS_IDENTITY_PUBLISH]
    assert len(publishes) == 1


def test_identity_rules_for_address_and_membership(store: Fired) -> None:
    """A record naming someone else is 400; a handle that is not a member is 404."""
    enrol(store, "ken")
    with pytest.raises(ApiError) as exc:
        store.publish_identity("acme", "ken", identity("amy"), T0)
    assert api_error(exc) == (400, ApiErrorCode.RECORD_INVALID)
    with pytest.raises(ApiError) as exc:
        store.publish_identity("acme", "amy", identity("amy"), T0)
    assert api_error(exc) == (404, ApiErrorCode.NOT_FOUND)
    assert store.fetch_keys("acme", "ken") is None


def test_encryption_epochs_only_go_up(store: Fired) -> None:
    """No encryption key before an identity; each epoch must exceed every stored one."""
    enrol(store, "ken")
    with pytest.raises(ApiError) as exc:
        store.publish_encryption("acme", "ken", encryption("ken", 1), T0)
    assert api_error(exc) == (409, ApiErrorCode.IDENTITY_KEY_MISSING)

    store.publish_identity("acme", "ken", identity("ken"), T0)
    store.publish_encryption("acme", "ken", encryption("ken", 1), T0)
    store.publish_encryption("acme", "ken", encryption("ken", 3), T0)
    for stale in (1, 2, 3):
        with pytest.raises(ApiError) as exc:
            store.publish_encryption("acme", "ken", encryption("ken", stale), T0)
        assert api_error(exc) == (409, ApiErrorCode.EPOCH_NOT_INCREASING)
    keys = store.fetch_keys("acme", "ken")
    assert keys is not None and keys.encryption == encryption("ken", 3)


def test_schema_itself_guards_keys(store: Fired, db_path: Path) -> None:
    """Even a writer that bypasses the store cannot lower an epoch or rewrite an identity."""
    enrol(store, "ken")
    store.publish_identity("acme", "ken", identity("ken"), T0)
    store.publish_encryption("acme", "ken", encryption("ken", 2), T0)
    raw = sqlite3.connect(db_path)
    with pytest.raises(sqlite3.IntegrityError, match="epochs only go up"):
        raw.execute(
            "INSERT INTO encryption_keys VALUES ('acme', 'ken', 1, 'k', '{}', 0)",
        )
    with pytest.raises(sqlite3.IntegrityError, match="never replaced"):
        raw.execute("UPDATE identity_keys SET identity_pub = 'x'")
    raw.close()


# --- audit -------------------------------------------------------------------------------


def test_changes_write_audit_rows_without_secrets(store: Fired) -> None:
    """Issue, redeem, register, revoke and key publishes are audited; no secret is in a row."""
    secret, _info = store.create_invite(
        "acme",
        created_by=None,
        role=MemberRole.ADMIN,
        expires_in_days=7,
        description="for ken",
        now=T0,
    )
    _member, token = store.register("acme", secret, "ken", None, T0 + 1)
    _other, revoked_id = invite(store)
    store.revoke_invite("acme", revoked_id, actor="ken", now=T0 + 2)
    store.publish_identity("acme", "ken", identity("ken"), T0 + 3)
    store.publish_encryption("acme", "ken", encryption("ken", 1), T0 + 4)

    rows = store.audit_rows("acme")
    assert [(r.event, r.actor, r.target) for r in rows] == [
        (audit.INVITE_ISSUE, None, hash_secret(secret)),
        (audit.INVITE_REDEEM, "ken", hash_secret(secret)),
        (audit.MEMBER_REGISTER, "ken", "ken"),
        (audit.INVITE_ISSUE, None, revoked_id),
        (audit.INVITE_REVOKE, "ken", revoked_id),
        (audit.KEYS_IDENTITY_PUBLISH, "ken", "ken"),
        (audit.KEYS_ENCRYPTION_PUBLISH, "ken", "ken"),
    ]
    assert rows[2].detail == "role=admin" and rows[-1].detail == "epoch=1"
    text = repr(rows)
    assert secret not in text and token not in text and hash_secret(token) not in text
    assert "for ken" not in text


def test_record_accepts_only_the_vocabulary(store: Fired) -> None:
    """record() writes call events and refuses anything outside EVENTS."""
    call_id = ids.mint_call_id()
    store.record(AuditEntry(audit.CALL_SUBMIT, "acme", "amy", "ken", call_id, T0, "bytes=12"))
    with pytest.raises(ValueError, match="not an audit event"):
        store.record(AuditEntry("call.peek", "acme", "amy", "ken", call_id, T0, None))
    rows = store.audit_rows("acme")
    assert [(r.event, r.call_id, r.at, r.detail) for r in rows] == [
        (audit.CALL_SUBMIT, call_id, T0, "bytes=12")
    ]


def test_audit_rows_page_by_id_and_cap_details(store: Fired) -> None:
    """Pages continue after an id, are per organisation, and details are truncated."""
    for n in range(5):
        store.record(AuditEntry(audit.CALL_FAIL, "acme", "amy", "ken", None, T0 + n, "x" * 1000))
    store.record(AuditEntry(audit.CALL_FAIL, "beta", "amy", "ken", None, T0, None))
    first = store.audit_rows("acme", limit=2)
    rest = store.audit_rows("acme", after_id=first[-1].id)
    assert [r.at for r in first + rest] == [T0 + n for n in range(5)]
    assert all(len(r.detail or "") == limits.MAX_DETAIL_CHARS for r in first)
    assert [r.org for r in store.audit_rows("beta")] == ["beta"]
    with pytest.raises(ValueError):
        store.audit_rows("acme", limit=0)


def test_audit_events_vocabulary() -> None:
    """The fixed vocabulary is exactly the thirty-two named events."""
    assert {
        "invite.issue",
        "invite.redeem",
        "invite.revoke",
        "member.register",
        "member.remove",
        "member.release",
        "member.role",
        "member.token_rotate",
        "recovery.issue",
        "recovery.redeem",
        "member.offline_delivery",
        "keys.identity.publish",
        "keys.encryption.publish",
        "card.publish",
        "call.submit",
        "call.accept",
        "call.complete",
        "call.fail",
        "call.cancel",
        "call.timeout",
        "job.queue",
        "job.deliver",
        "job.accept",
        "job.complete",
        "job.fail",
        "job.expire",
        "job.cancel",
        "auth.failed",
        "audit.export",
        "audit.hold.set",
        "audit.hold.clear",
        "audit.prune",
        "presence.refused",
    } == audit.EVENTS


def test_submissions_since_lists_the_calls_that_rang_in_every_org(store: Fired) -> None:
    """Only call.submit rows at or after ``since``, oldest first, across organisations."""
    store.ensure_org("acme", T0)
    store.ensure_org("beta", T0)
    store.record(AuditEntry(audit.CALL_SUBMIT, "acme", "ana", "ken", "c1", T0 - 10, None))
    store.record(AuditEntry(audit.CALL_SUBMIT, "beta", "bo", "al", "c2", T0 + 5, None))
    store.record(AuditEntry(audit.CALL_SUBMIT, "acme", "ana", "ken", "c3", T0 + 1, None))
    store.record(AuditEntry(audit.CALL_COMPLETE, "acme", "ken", "ana", "c3", T0 + 2, "completed"))
    assert store.submissions_since(T0) == [
        Submission("acme", "ana", "ken", T0 + 1),
        Submission("beta", "bo", "al", T0 + 5),
    ]
    assert store.submissions_since(T0 + 6) == []


def test_key_records_are_read_from_the_file_once_until_they_change(db_path: Path) -> None:
    """The relay reads a caller's records on every call; the registry keeps them decoded and
    drops them when a new record is published, so a read never serves an older epoch."""
    raw = open_relay_store(db_path)
    store = Fired(raw)
    store.ensure_org("acme", T0)
    enrol(store, "ken")
    statements: list[str] = []
    raw.registry._conn.set_trace_callback(statements.append)

    def key_reads() -> int:
        # fetch_keys' own query (publishing reads the table too, to check the chain).
        return sum("SELECT record_json FROM identity_keys" in sql for sql in statements)

    assert store.fetch_keys("acme", "ken") is None
    assert store.fetch_keys("acme", "ken") is None
    assert key_reads() == 1
    store.publish_identity("acme", "ken", identity("ken"), T0)
    store.publish_encryption("acme", "ken", encryption("ken", 1), T0)
    before = key_reads()
    first = store.fetch_keys("acme", "ken")
    assert first is not None and first.encryption == encryption("ken", 1)
    assert key_reads() == before + 1  # the publish dropped what was kept
    assert store.fetch_keys("acme", "ken") == first
    assert key_reads() == before + 1
    store.publish_encryption("acme", "ken", encryption("ken", 2), T0)
    newer = store.fetch_keys("acme", "ken")
    assert newer is not None and newer.encryption == encryption("ken", 2)
    # A refused publish changes nothing, and what was kept is still served.
    with pytest.raises(ApiError):
        store.publish_encryption("acme", "ken", encryption("ken", 1), T0)
    assert store.fetch_keys("acme", "ken") == newer
    store.close()


def test_a_member_once_found_is_not_looked_up_again(store: Fired) -> None:
    """handle_exists runs on every call: a member found once is remembered; a handle not
    found is asked each time, so one registered since is seen at once."""
    registry = store.wrapped.registry
    statements: list[str] = []
    registry._conn.set_trace_callback(statements.append)
    assert not store.handle_exists("acme", "ken")
    assert not store.handle_exists("acme", "ken")
    assert len([s for s in statements if "FROM members" in s]) == 2
    enrol(store, "ken")
    statements.clear()
    assert store.handle_exists("acme", "ken")
    assert store.handle_exists("acme", "ken")
    assert not store.handle_exists("beta", "ken")  # another org's handle is its own
    registry._conn.set_trace_callback(None)
    assert len([s for s in statements if "FROM members" in s]) == 2
