"""`agentcall invite create|list|revoke` against a fake relay API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer

from agentcall.cli import call as call_cli
from agentcall.cli import invite as invite_cli
from agentcall.cli.main import main
from agentcall.client.api import RelayUnreachable
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.wire.http import InviteCreated, InviteCreateRequest, InviteInfo, InviteList
from tests.unit.cli_helpers import TOKEN, install, isolate, run_with_clock

ID = "ab" * 32
URL = "https://relay.example/invite/acme#" + "q" * 43
INFO = InviteInfo(
    id=ID,
    org="acme",
    role="member",
    status="active",
    created_by="ann",
    created_at=1_750_000_000,
    expires_at=1_750_604_800,
    description="Ken\x1b[31m, backend",
)


@attrs.define
class FakeApi:
    requests: list[object] = attrs.field(factory=list)
    failure: Exception | None = None

    def _answer(self, value: Any) -> defer.Deferred[Any]:
        if self.failure is not None:
            return defer.fail(self.failure)
        return defer.succeed(value)

    def create_invite(self, request: InviteCreateRequest) -> defer.Deferred[InviteCreated]:
        self.requests.append(request)
        return self._answer(InviteCreated(invite=URL, info=INFO))

    def list_invites(self) -> defer.Deferred[InviteList]:
        self.requests.append("list")
        return self._answer(InviteList(invites=(INFO,)))

    def revoke_invite(self, invite_id: str) -> defer.Deferred[InviteInfo]:
        self.requests.append(("revoke", invite_id))
        return self._answer(attrs.evolve(INFO, status="revoked"))


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeApi:
    install(isolate(monkeypatch, tmp_path))
    fake = FakeApi()
    monkeypatch.setattr(invite_cli, "_api", lambda _reactor, _config: fake)
    monkeypatch.setattr(call_cli, "run_on_reactor", run_with_clock)
    return fake


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["invite", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_create_prints_only_the_link_on_stdout(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script can capture the link; the id and expiry go to stderr."""
    code, out, err = run(capsys, "create", "--role", "admin", "--expires-in-days", "3",
                         "--description", "Ken")  # fmt: skip
    assert (code, out) == (0, URL + "\n")
    assert ID in err and "2025-06-22" in err
    assert api.requests == [InviteCreateRequest(role="admin", expires_in_days=3, description="Ken")]
    assert TOKEN not in out + err


def test_list_is_a_safe_table(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    """The table shows the full id and status; remote text cannot inject escapes."""
    code, out, _err = run(capsys, "list")
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[:3] == ["ID", "ROLE", "STATUS"]
    assert row.startswith(ID) and "active" in row
    assert "\x1b" not in out


def test_list_json_is_one_object(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints the invites as one object, escapes escaped."""
    code, out, _err = run(capsys, "list", "--json")
    body = json.loads(out)
    assert code == 0
    assert body["invites"][0]["id"] == ID and body["invites"][0]["status"] == "active"
    assert "\x1b" not in out


def test_revoke_sends_the_id(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    """revoke names the invite and reports its new status."""
    code, out, _err = run(capsys, "revoke", ID)
    assert code == 0 and "revoked" in out
    assert api.requests == [("revoke", ID)]


@pytest.mark.parametrize(
    ("failure", "needle"),
    [
        (ApiError(403, ApiErrorCode.FORBIDDEN, "admins only"), "only an organisation admin"),
        (RelayUnreachable("relay.example refused the connection"), "cannot reach the relay"),
    ],
)
def test_refusals_are_one_line(
    api: FakeApi, capsys: pytest.CaptureFixture[str], failure: Exception, needle: str
) -> None:
    """A member (not admin) or an unreachable relay gets one line and exit 1."""
    api.failure = failure
    code, out, err = run(capsys, "list")
    assert (code, out) == (1, "")
    assert needle in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["revoke", "not-an-id"],
        ["create", "--expires-in-days", "91"],
        ["create", "--role", "owner"],
        ["create", "--description", "x" * 101],
    ],
)
def test_usage_errors_exit_two(argv: list[str], api: FakeApi) -> None:
    """Ids, durations, roles and descriptions are checked before the relay is asked."""
    with pytest.raises(SystemExit) as exited:
        main(["invite", *argv])
    assert exited.value.code == 2
    assert api.requests == []
