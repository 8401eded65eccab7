"""`agentcall members list|remove|role` against a fake relay API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer

from agentcall.cli import call as call_cli
from agentcall.cli.main import main
from agentcall.client.api import RelayUnreachable
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.wire.http import MemberInfo, MemberList, MemberRole, MemberStatus
from tests.unit.cli_helpers import TOKEN, install, isolate, run_with_clock


def member(handle: str, **changes: Any) -> MemberInfo:
    info = MemberInfo(
        handle=handle,
        role=MemberRole.MEMBER,
        status=MemberStatus.ACTIVE,
        enrolled_at=1_750_000_000,
        last_seen=1_750_086_400,
    )
    return attrs.evolve(info, **changes)


@attrs.define
class FakeApi:
    pages: dict[str, MemberList] = attrs.field(factory=dict)
    requests: list[object] = attrs.field(factory=list)
    failure: Exception | None = None

    def _answer(self, value: Any) -> defer.Deferred[Any]:
        if self.failure is not None:
            return defer.fail(self.failure)
        return defer.succeed(value)

    def list_members(self, after: str = "") -> defer.Deferred[MemberList]:
        self.requests.append(("list", after))
        return self._answer(self.pages[after])

    def remove_member(self, handle: str, *, release: bool = False) -> defer.Deferred[MemberInfo]:
        self.requests.append(("remove", handle, release))
        status = MemberStatus.RELEASED if release else MemberStatus.REMOVED
        return self._answer(member(handle, status=status, removed_by="ann"))

    def set_member_role(self, handle: str, role: MemberRole) -> defer.Deferred[MemberInfo]:
        self.requests.append(("role", handle, role))
        return self._answer(member(handle, role=role))


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeApi:
    install(isolate(monkeypatch, tmp_path))  # an installation of @acme/ann
    fake = FakeApi()
    monkeypatch.setattr(call_cli, "relay_api", lambda _reactor, _config: fake)
    monkeypatch.setattr(call_cli, "run_on_reactor", run_with_clock)
    return fake


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["members", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_walks_every_page_into_one_table(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.pages = {
        "": MemberList(
            members=(member("ann", role=MemberRole.ADMIN), member("bob")), next_after="bob"
        ),
        "bob": MemberList(
            members=(member("ken", status=MemberStatus.REMOVED, removed_by="ann", last_seen=None),)
        ),
    }
    code, out, _err = run(capsys, "list")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["HANDLE", "ROLE", "STATUS"]
    assert [row.split()[:3] for row in rows] == [
        ["ann", "admin", "active"],
        ["bob", "member", "active"],
        ["ken", "member", "removed"],
    ]
    assert "2025-06-16" in rows[0] and "never" in rows[2] and rows[2].endswith("ann")
    assert api.requests == [("list", ""), ("list", "bob")]


def test_list_json_is_one_object(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.pages = {"": MemberList(members=(member("ann"),))}
    code, out, _err = run(capsys, "list", "--json")
    body = json.loads(out)
    assert code == 0 and [m["handle"] for m in body["members"]] == ["ann"]
    assert body["members"][0]["status"] == "active"
    assert TOKEN not in out


@pytest.mark.parametrize(
    ("argv", "sent", "needle"),
    [
        (["remove", "ken"], ("remove", "ken", False), "stays reserved"),
        (["remove", "@acme/ken", "--release"], ("remove", "ken", True), "released the handle"),
        (["role", "ken", "admin"], ("role", "ken", MemberRole.ADMIN), "@acme/ken is now admin"),
    ],
)
def test_remove_and_role_send_the_handle_and_say_what_happened(
    api: FakeApi,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    sent: tuple[object, ...],
    needle: str,
) -> None:
    code, out, _err = run(capsys, *argv)
    assert code == 0 and needle in out
    assert api.requests == [sent]


def test_remove_json_is_the_member_as_the_relay_left_it(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _err = run(capsys, "remove", "ken", "--json")
    assert code == 0 and json.loads(out)["status"] == "removed"


def test_an_address_in_another_organisation_is_refused_before_the_relay(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = run(capsys, "remove", "@beta/ken")
    assert code != 0 and "not in your organisation" in err
    assert api.requests == []


@pytest.mark.parametrize("bad", ["KEN", "ken--x", "@acme", "../ken"])
def test_a_handle_outside_the_grammar_is_a_usage_error(
    api: FakeApi, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["members", "remove", bad])
    assert exited.value.code == 2 and api.requests == []


@pytest.mark.parametrize(
    ("failure", "needle"),
    [
        (ApiError(403, ApiErrorCode.FORBIDDEN, "admins only"), "only an organisation admin"),
        (ApiError(404, ApiErrorCode.NOT_FOUND, "no such member"), "no member @acme/ken"),
        (
            ApiError(409, ApiErrorCode.LAST_ADMIN, "the only admin cannot be removed"),
            "the only admin cannot be removed (last_admin)",
        ),
        (RelayUnreachable("relay.example refused the connection"), "cannot reach the relay"),
    ],
)
def test_refusals_are_one_line(
    api: FakeApi, capsys: pytest.CaptureFixture[str], failure: Exception, needle: str
) -> None:
    api.failure = failure
    code, out, err = run(capsys, "remove", "ken")
    assert code != 0 and out == ""
    assert needle in err and len(err.strip().splitlines()) == 1
