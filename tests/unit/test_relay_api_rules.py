"""The relay API's decisions, with no web server: routes, roles, record ownership, key chains."""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest

from agentcall.crypto import records
from agentcall.crypto.keys import EncryptionKey
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.relay import api_rules as rules
from agentcall.relay.api_rules import Access, Route, RouteMatch
from agentcall.relay.mailbox import FailureReason, Job, JobState
from agentcall.relay.store_interface import Member, StoredJob
from agentcall.wire import codec
from agentcall.wire.frames import Direction, Terminal
from agentcall.wire.http import JobSide, KeysResponse, MemberInfo, MemberList, MemberRole
from tests.unit.crypto_helpers import DAY, NOW, ORIGIN, make_party, rotate
from tests.unit.relay_helpers import sealed_looking

INVITE_ID = "0f" * 32
JOB_ID = "0e4b7f0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
ANN = Member(org="acme", handle="ann", role=MemberRole.MEMBER, agent_kind=None, created_at=0.0)
ADA = attrs.evolve(ANN, handle="ada", role=MemberRole.ADMIN)


def refusal(exc: pytest.ExceptionInfo[ApiError]) -> tuple[int, ApiErrorCode]:
    return exc.value.status, exc.value.code


# --- routes ------------------------------------------------------------------------------------

ROUTES = {
    ("GET", "/v1/status"): RouteMatch(Route.STATUS),
    ("POST", "/v1/register"): RouteMatch(Route.REGISTER),
    ("POST", "/v1/recover"): RouteMatch(Route.RECOVER),
    ("GET", "/v1/me"): RouteMatch(Route.ME),
    ("GET", "/v1/presence"): RouteMatch(Route.PRESENCE),
    ("POST", "/v1/invites"): RouteMatch(Route.CREATE_INVITE),
    ("GET", "/v1/invites"): RouteMatch(Route.LIST_INVITES),
    ("POST", f"/v1/invites/{INVITE_ID}/revoke"): RouteMatch(Route.REVOKE_INVITE, INVITE_ID),
    ("PUT", "/v1/keys/identity"): RouteMatch(Route.PUBLISH_IDENTITY),
    ("PUT", "/v1/keys/encryption"): RouteMatch(Route.PUBLISH_ENCRYPTION),
    ("GET", "/v1/keys/ken"): RouteMatch(Route.FETCH_KEYS, "ken"),
    # The fixed key routes are PUT only, so handles named like them are still fetched.
    ("GET", "/v1/keys/identity"): RouteMatch(Route.FETCH_KEYS, "identity"),
    ("GET", "/v1/keys/encryption"): RouteMatch(Route.FETCH_KEYS, "encryption"),
    ("PUT", "/v1/me/offline-delivery"): RouteMatch(Route.SET_OFFLINE_DELIVERY),
    ("GET", "/v1/jobs"): RouteMatch(Route.LIST_JOBS),
    ("GET", f"/v1/jobs/{JOB_ID}"): RouteMatch(Route.GET_JOB, JOB_ID),
    ("POST", f"/v1/jobs/{JOB_ID}/cancel"): RouteMatch(Route.CANCEL_JOB, JOB_ID),
    ("GET", "/v1/members"): RouteMatch(Route.LIST_MEMBERS),
    ("POST", "/v1/me/token"): RouteMatch(Route.ROTATE_CREDENTIALS),
    ("POST", "/v1/members/ken/remove"): RouteMatch(Route.REMOVE_MEMBER, "ken"),
    ("PUT", "/v1/members/ken-lee/role"): RouteMatch(Route.SET_MEMBER_ROLE, "ken-lee"),
    ("PUT", "/v1/card"): RouteMatch(Route.PUBLISH_CARD),
    ("GET", "/v1/cards/ken-lee"): RouteMatch(Route.FETCH_CARD, "ken-lee"),
    ("GET", "/v1/audit/export"): RouteMatch(Route.EXPORT_AUDIT),
    ("GET", "/v1/audit/holds"): RouteMatch(Route.LIST_HOLDS),
    ("PUT", "/v1/audit/holds"): RouteMatch(Route.SET_HOLD),
    ("POST", "/v1/audit/holds/clear"): RouteMatch(Route.CLEAR_HOLD),
    # Asking about someone else by path is the presence route too, to be refused and recorded.
    ("GET", "/v1/presence/ken"): RouteMatch(Route.PRESENCE, "ken"),
    ("GET", "/v1/presence/@acme%2Fken"): RouteMatch(Route.PRESENCE, "@acme%2Fken"),
    ("GET", "/v1/presence/@acme/ken"): RouteMatch(Route.PRESENCE, "@acme/ken"),
}
FIXED_PATHS = {
    "/v1/status",
    "/v1/register",
    "/v1/recover",
    "/v1/me",
    "/v1/presence",
    "/v1/invites",
    "/v1/keys/identity",
    "/v1/keys/encryption",
    "/v1/me/offline-delivery",
    "/v1/jobs",
    "/v1/members",
    "/v1/card",
    "/v1/me/token",
    "/v1/audit/export",
    "/v1/audit/holds",
    "/v1/audit/holds/clear",
}
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")
PATHS = sorted(
    {path for (_method, path) in ROUTES}
    | {
        "/",
        "/v1",
        "/v1/nothing",
        "/v1/keys",
        "/v1/keys/K",
        "/v1/keys/a",
        "/v1/keys/" + "k" * 32,
        f"/v1/invites/{INVITE_ID}",
        f"/v1/invites/{INVITE_ID.upper()}/revoke",
        f"/v1/invites/{INVITE_ID[:-2]}/revoke",
        "/v1/me/more",
        f"/v1/jobs/{JOB_ID.upper()}",
        f"/v1/jobs/{JOB_ID[:-1]}",
        f"/v1/jobs/{JOB_ID}/more",
        "/v1/jobs/not-a-job",
        # Handles outside the grammar (doubled, leading or trailing hyphen, too long, upper
        # case, traversal) name no member.
        "/v1/members/ken",
        "/v1/members/ken--lee/remove",
        "/v1/members/-ken/remove",
        "/v1/members/ken-/role",
        "/v1/members/" + "k" * 32 + "/remove",
        "/v1/members/KEN/role",
        "/v1/members/../remove",
        "/v1/members/ken/remove/more",
        "/v1/cards",
        "/v1/cards/ken--lee",
        "/v1/cards/KEN",
        "/v1/cards/ken/more",
        "/v1/cards/" + "k" * 32,
        "/v1/audit",
        "/v1/audit/holds/ken",
        "/v1/audit/export/more",
        "/v1/presence/ken/more",
        "/v1/presence/@acme/ken/more",
        "/v1/presence/" + "k" * 101,
    }
)


@pytest.mark.parametrize(("method", "path"), list(itertools.product(METHODS, PATHS)))
def test_every_method_and_path_has_one_answer(method: str, path: str) -> None:
    """A route where the table names one, 405 on a fixed path asked the wrong way, else 404."""
    expected = ROUTES.get((method, path))
    if expected is not None:
        assert rules.match(method, path) == expected
        return
    with pytest.raises(ApiError) as exc:
        rules.match(method, path)
    if path in FIXED_PATHS:
        assert refusal(exc) == (405, ApiErrorCode.METHOD_NOT_ALLOWED)
        assert method in exc.value.message
    else:
        assert refusal(exc) == (404, ApiErrorCode.NOT_FOUND)


def test_every_route_is_reachable_and_has_an_access_rule() -> None:
    assert {found.route for found in ROUTES.values()} == set(Route)
    assert set(rules.ACCESS) == set(Route)


# --- who may use a route -------------------------------------------------------------------------


@pytest.mark.parametrize("route", list(Route))
def test_admin_routes_are_refused_to_members_and_granted_to_admins(route: Route) -> None:
    rules.authorize(route, ADA)
    if rules.ACCESS[route] is Access.ADMIN:
        with pytest.raises(ApiError) as exc:
            rules.authorize(route, ANN)
        assert refusal(exc) == (403, ApiErrorCode.FORBIDDEN)
    else:
        rules.authorize(route, ANN)


def test_invite_member_and_audit_routes_are_for_admins_status_register_for_anyone() -> None:
    by_access = {access: {r for r, a in rules.ACCESS.items() if a is access} for access in Access}
    assert by_access[Access.ADMIN] == {
        Route.CREATE_INVITE,
        Route.LIST_INVITES,
        Route.REVOKE_INVITE,
        Route.LIST_MEMBERS,
        Route.REMOVE_MEMBER,
        Route.SET_MEMBER_ROLE,
        Route.EXPORT_AUDIT,
        Route.LIST_HOLDS,
        Route.SET_HOLD,
        Route.CLEAR_HOLD,
    }
    assert by_access[Access.ANYONE] == {Route.STATUS, Route.REGISTER, Route.RECOVER}
    assert RouteMatch(Route.ME).access is Access.MEMBER


# --- members ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"), [(None, ""), ([], ""), ([b"ken"], "ken"), ([b"ken-lee"], "ken-lee")]
)
def test_members_after_is_absent_or_one_handle(values: list[bytes] | None, expected: str) -> None:
    assert rules.members_after(values) == expected


@pytest.mark.parametrize(
    "values", [[b""], [b"KEN"], [b"ken--lee"], [b"a" * 40], [b"ken", b"ann"], [b"\xff"]]
)
def test_members_after_refuses_anything_else(values: list[bytes]) -> None:
    with pytest.raises(ApiError) as exc:
        rules.members_after(values)
    assert refusal(exc) == (400, ApiErrorCode.BAD_REQUEST)


def _info(handle: str) -> MemberInfo:
    return MemberInfo(handle=handle, role=MemberRole.MEMBER, status="active", enrolled_at=1)


def test_a_full_member_page_says_where_the_next_starts_and_a_short_one_ends() -> None:
    full = rules.member_page([_info("ann"), _info("ken")], 2)
    assert (len(full.members), full.next_after) == (2, "ken")
    assert rules.member_page([_info("ann")], 2).next_after is None
    assert rules.member_page([], 2) == MemberList(members=())


# --- record ownership --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "origin", "message"),
    [
        ("@acme/bob", ORIGIN, "yourself"),
        ("@other/ann", ORIGIN, "yourself"),
        ("@acme/ann", "relay.elsewhere", "another relay"),
        ("@acme/bob", "relay.elsewhere", "yourself"),
    ],
)
def test_a_record_names_its_publisher_on_this_relay(
    address: str, origin: str, message: str
) -> None:
    with pytest.raises(ApiError, match=message) as exc:
        rules.check_record_names(ANN, address, origin, ORIGIN)
    assert refusal(exc) == (400, ApiErrorCode.RECORD_INVALID)
    rules.check_record_names(ANN, "@acme/ann", ORIGIN, ORIGIN)


def test_an_identity_record_must_be_ones_own_and_self_signed() -> None:
    ann = make_party("@acme/ann")
    rules.check_identity_record(ANN, ann.identity, ORIGIN)
    with pytest.raises(ApiError) as exc:
        rules.check_identity_record(ANN, make_party("@acme/bob").identity, ORIGIN)
    assert refusal(exc) == (400, ApiErrorCode.RECORD_INVALID)
    forged = attrs.evolve(ann.identity, signature=make_party("@acme/ann").identity.signature)
    with pytest.raises(ApiError) as exc:
        rules.check_identity_record(ANN, forged, ORIGIN)
    assert refusal(exc) == (400, ApiErrorCode.SIGNATURE_INVALID)


# --- the encryption key chain --------------------------------------------------------------------


def test_the_first_encryption_record_needs_the_identity_key_first() -> None:
    ann = make_party("@acme/ann")
    with pytest.raises(ApiError) as exc:
        rules.check_encryption_record(ANN, ann.encryption, None, ORIGIN, NOW)
    assert refusal(exc) == (409, ApiErrorCode.IDENTITY_KEY_MISSING)
    rules.check_encryption_record(ANN, ann.encryption, KeysResponse(ann.identity), ORIGIN, NOW)


def test_the_names_are_checked_before_anything_else() -> None:
    bob = make_party("@acme/bob")
    with pytest.raises(ApiError) as exc:
        rules.check_encryption_record(ANN, bob.encryption, None, ORIGIN, NOW)
    assert refusal(exc) == (400, ApiErrorCode.RECORD_INVALID)


def test_an_encryption_record_signed_by_another_identity_is_refused() -> None:
    ann, impostor = make_party("@acme/ann"), make_party("@acme/ann")
    current = KeysResponse(ann.identity)
    with pytest.raises(ApiError, match="signature") as exc:
        rules.check_encryption_record(ANN, impostor.encryption, current, ORIGIN, NOW)
    assert refusal(exc) == (400, ApiErrorCode.SIGNATURE_INVALID)


@pytest.mark.parametrize(
    ("now", "word"), [(NOW - 2 * DAY, "not valid yet"), (NOW + 30 * DAY, "expired")]
)
def test_an_encryption_record_outside_its_window_at_now_is_refused(now: float, word: str) -> None:
    ann = make_party("@acme/ann")
    with pytest.raises(ApiError, match=word) as exc:
        rules.check_encryption_record(ANN, ann.encryption, KeysResponse(ann.identity), ORIGIN, now)
    assert refusal(exc) == (400, ApiErrorCode.SIGNATURE_INVALID)


def test_a_new_encryption_record_is_the_next_epoch_chained_to_the_current_one() -> None:
    ann = make_party("@acme/ann")
    nxt = rotate(ann)
    current = KeysResponse(ann.identity, ann.encryption)
    rules.check_encryption_record(ANN, nxt.encryption, current, ORIGIN, NOW)
    # Epoch 2 of another epoch 1 signed by the same identity: right epoch, wrong link.
    sibling = records.make_encryption_record(
        ann.identity_key,
        EncryptionKey.generate(),
        ORIGIN,
        "@acme/ann",
        epoch=1,
        not_before=NOW - DAY,
        not_after=NOW + 29 * DAY,
        previous=None,
    )
    refused = {
        "the same epoch again": ann.encryption,
        "an epoch skipped": rotate(nxt).encryption,
        "another branch": rotate(attrs.evolve(ann, encryption=sibling)).encryption,
    }
    for record in refused.values():
        with pytest.raises(ApiError, match="chain") as exc:
            rules.check_encryption_record(ANN, record, current, ORIGIN, NOW)
        assert refusal(exc) == (400, ApiErrorCode.SIGNATURE_INVALID)


def test_published_keys_or_404() -> None:
    ann = make_party("@acme/ann")
    keys = KeysResponse(ann.identity)
    assert rules.published(keys) is keys
    with pytest.raises(ApiError) as exc:
        rules.published(None)
    assert refusal(exc) == (404, ApiErrorCode.NOT_FOUND)


# --- the offline mailbox -------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "seconds"), [(None, 0), ([], 0), ([b"0"], 0), ([b"30"], 30)])
def test_wait_is_a_whole_number_of_seconds_up_to_the_cap(
    raw: list[bytes] | None, seconds: int
) -> None:
    assert rules.wait_seconds(raw) == seconds


@pytest.mark.parametrize(
    "raw", [[b"31"], [b"-1"], [b"1.5"], [b""], [b"1e1"], [b" 3"], [b"3", b"4"], [b"0030"]]
)
def test_any_other_wait_is_400(raw: list[bytes]) -> None:
    with pytest.raises(ApiError) as exc:
        rules.wait_seconds(raw)
    assert refusal(exc) == (400, ApiErrorCode.BAD_REQUEST)


def _job(**changes: Any) -> Job:
    job = Job(JOB_ID, "acme", "ann", "ken", 100, 1000.5, 1000.5 + 72 * 3600)
    return attrs.evolve(job, **changes)


def _answered() -> StoredJob:
    answer = sealed_looking(Direction.RESPONSE, "@acme/ken", "@acme/ann", ORIGIN)
    job = _job(state=JobState.ANSWERED, answer_bytes=300, attempts=1, last_delivery=1)
    return StoredJob(job, answer=codec.encode(answer), terminal=Terminal.COMPLETED)


def test_the_caller_sees_the_answer_of_an_answered_job() -> None:
    info = rules.job_info(_answered(), ANN)
    assert (info.side, info.state, info.terminal) == (
        JobSide.SENT,
        JobState.ANSWERED,
        Terminal.COMPLETED,
    )
    assert info.answer is not None and info.answer.from_ == "@acme/ken"
    assert (info.caller, info.callee, info.created_at) == ("@acme/ann", "@acme/ken", 1000)


def test_the_callee_and_lists_never_get_the_answer() -> None:
    ken = attrs.evolve(ANN, handle="ken")
    info = rules.job_info(_answered(), ken)
    assert (info.side, info.answer, info.terminal) == (JobSide.RECEIVED, None, None)
    listed = rules.job_info(_answered().job, ANN)
    assert (listed.answer, listed.terminal) == (None, None)


@pytest.mark.parametrize(
    "asker",
    [
        attrs.evolve(ANN, handle="bob"),
        attrs.evolve(ANN, org="beta"),
        attrs.evolve(ANN, org="beta", handle="ken"),
    ],
)
def test_someone_elses_job_is_not_found_exactly_like_no_job(asker: Member) -> None:
    with pytest.raises(ApiError) as theirs:
        rules.job_info(_answered(), asker)
    with pytest.raises(ApiError) as none:
        rules.job_info(None, asker)
    assert refusal(theirs) == refusal(none) == (404, ApiErrorCode.NOT_FOUND)
    assert theirs.value.message == none.value.message


def test_a_failed_job_shows_its_reason() -> None:
    failed = _job(state=JobState.FAILED, reason=FailureReason.DELIVERY_FAILED, attempts=3)
    info = rules.job_info(failed, ANN)
    assert (info.state, info.reason, info.attempts) == (
        JobState.FAILED,
        FailureReason.DELIVERY_FAILED,
        3,
    )


# --- presence -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "args", "expected"),
    [
        (None, {}, None),
        (None, {b"handle": [b"ann"]}, None),  # oneself, by handle or address
        (None, {b"address": [b"@acme/ann"]}, None),
        ("ann", {}, None),
        (None, {b"handle": [b"ken"]}, "ken"),
        (None, {b"address": [b"@acme/ken"]}, "ken"),
        ("ken", {}, "ken"),
        ("@acme/ken", {}, "ken"),
        ("@acme%2Fken", {}, "ken"),
        # Someone of another organisation is named by address (and refused alike).
        (None, {b"address": [b"@other/ann"]}, "@other/ann"),
        # Nobody enrolled is refused the same way: the answer reveals no existence.
        (None, {b"handle": [b"nobody-here"]}, "nobody-here"),
    ],
)
def test_presence_subject_is_none_for_oneself_and_names_anyone_else(
    argument: str | None, args: dict[bytes, list[bytes]], expected: str | None
) -> None:
    assert rules.presence_subject(ANN, argument, args) == expected


@pytest.mark.parametrize(
    ("argument", "args"),
    [
        (None, {b"handle": [b"Ken"]}),
        (None, {b"address": [b"acme/ken"]}),
        (None, {b"handle": [b"ken", b"bob"]}),
        (None, {b"handle": [b"ken"], b"address": [b"@acme/bob"]}),
        ("ken", {b"handle": [b"ken"]}),
        ("..", {}),
    ],
)
def test_presence_naming_no_one_or_several_is_400(
    argument: str | None, args: dict[bytes, list[bytes]]
) -> None:
    with pytest.raises(ApiError) as exc:
        rules.presence_subject(ANN, argument, args)
    assert refusal(exc) == (400, ApiErrorCode.BAD_REQUEST)


# --- audit export ---------------------------------------------------------------------------------


def test_export_window_takes_whole_seconds_since_before_until() -> None:
    assert rules.export_window({}) == rules.ExportWindow()
    window = rules.export_window({b"since": [b"100"], b"until": [b"200"]})
    assert window == rules.ExportWindow(100, 200)
    assert window.describe() == "since=100 until=200"
    assert rules.ExportWindow(until=5).describe() == "since=start until=5"
    assert rules.export_window({b"until": [b"0"]}) == rules.ExportWindow(until=0)


@pytest.mark.parametrize(
    "args",
    [
        {b"since": [b"-1"]},
        {b"since": [b"1.5"]},
        {b"since": [b"2026-01-01"]},
        {b"until": [b"1", b"2"]},
        {b"since": [b""]},
        {b"since": [str(2**40 + 1).encode()]},
        {b"since": [b"200"], b"until": [b"200"]},
        {b"since": [b"201"], b"until": [b"200"]},
    ],
)
def test_a_bad_export_window_is_400(args: dict[bytes, list[bytes]]) -> None:
    with pytest.raises(ApiError) as exc:
        rules.export_window(args)
    assert refusal(exc) == (400, ApiErrorCode.BAD_REQUEST)


def test_an_export_line_is_the_rows_metadata_in_milliseconds() -> None:
    from agentcall.relay.store_interface import AuditRow
    from agentcall.wire.http import AuditEvent

    row = AuditRow(7, 1_700_000_000.1234, "acme", "member.role", "ada", "ann", None, "a->b")
    assert rules.export_event(row) == AuditEvent(
        id=7,
        at_ms=1_700_000_000_123,
        event="member.role",
        actor="ada",
        target="ann",
        call_id=None,
        detail="a->b",
    )
