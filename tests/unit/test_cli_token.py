"""`agentcall token rotate` against a fake relay API: nothing lost wherever it stops."""

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
from agentcall.local.config import Config, load_config
from agentcall.local.home import Home
from agentcall.wire.http import MemberRole, TokenRotated, WhoAmIResponse
from tests.unit.cli_helpers import NOW, TOKEN, install, isolate, run_with_clock

ORIGIN = "relay.example.com"


@attrs.define
class FakeRelay:
    """The relay's view: the one token it accepts, and what each API instance asked."""

    accepted: str = TOKEN
    asked: list[tuple[str, str]] = attrs.field(factory=list)
    unreachable: bool = False

    def api(self, _reactor: Any, config: Config) -> FakeApi:
        return FakeApi(self, config.token)


@attrs.define
class FakeApi:
    relay: FakeRelay
    token: str

    def _check(self, route: str) -> None:
        self.relay.asked.append((route, self.token))
        if self.relay.unreachable:
            raise RelayUnreachable("relay.example.com refused the connection")
        if self.token != self.relay.accepted:
            raise ApiError(401, ApiErrorCode.UNAUTHORIZED, "missing or invalid credentials")

    def whoami(self) -> defer.Deferred[WhoAmIResponse]:
        try:
            self._check("whoami")
        except Exception as exc:
            return defer.fail(exc)
        me = WhoAmIResponse("acme", "ann", "@acme/ann", MemberRole.MEMBER, ORIGIN)
        return defer.succeed(me)

    def rotate_token(self, token: str) -> defer.Deferred[TokenRotated]:
        try:
            self._check("rotate")
        except Exception as exc:
            return defer.fail(exc)
        self.relay.accepted = token
        return defer.succeed(TokenRotated(rotated_at=int(NOW)))


@pytest.fixture
def relay(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeRelay:
    install(isolate(monkeypatch, tmp_path))
    fake = FakeRelay()
    monkeypatch.setattr(call_cli, "relay_api", fake.api)
    monkeypatch.setattr(call_cli, "run_on_reactor", run_with_clock)
    return fake


def home() -> Home:
    return Home.from_environ()


def rotate(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["token", "rotate", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_rotation_saves_the_token_the_relay_took_and_prints_none(
    relay: FakeRelay, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = rotate(capsys)
    saved = load_config(home()).token
    assert code == 0 and "the old one no longer works" in out
    assert saved == relay.accepted and saved != TOKEN
    assert not home().pending_token_path.exists()
    assert saved not in out + err and TOKEN not in out + err
    assert (home().config_path.stat().st_mode & 0o777) == 0o600


def test_an_interrupted_rotation_the_relay_took_is_finished(
    relay: FakeRelay, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped after the relay took the new token, before config.json had it."""
    taken = "T" * 43
    home().write_private(home().pending_token_path, taken.encode() + b"\n")
    relay.accepted = taken
    code, out, _err = rotate(capsys, "--json")
    assert code == 0 and json.loads(out)["outcome"] == "finished"
    assert load_config(home()).token == taken
    assert not home().pending_token_path.exists()
    assert [route for route, _ in relay.asked] == ["whoami"]


def test_a_pending_token_the_relay_never_took_is_replaced_by_a_fresh_rotation(
    relay: FakeRelay, capsys: pytest.CaptureFixture[str]
) -> None:
    home().write_private(home().pending_token_path, b"P" * 43 + b"\n")
    code, _out, _err = rotate(capsys)
    assert code == 0
    assert [route for route, _ in relay.asked] == ["whoami", "rotate"]
    assert load_config(home()).token == relay.accepted not in (TOKEN, "P" * 43)


def test_an_unreachable_relay_keeps_the_pending_token_and_says_to_run_again(
    relay: FakeRelay, capsys: pytest.CaptureFixture[str]
) -> None:
    relay.unreachable = True
    code, out, err = rotate(capsys)
    assert code != 0 and out == ""
    assert "run `agentcall token rotate` again" in err
    assert load_config(home()).token == TOKEN
    pending = home().pending_token_path.read_text().strip()
    assert len(pending) == 43 and pending not in err
    # The next run, the relay reachable again (and having never taken it), rotates afresh.
    relay.unreachable = False
    assert rotate(capsys)[0] == 0 and load_config(home()).token == relay.accepted


def test_a_refused_token_is_explained_and_nothing_is_left_pending(
    relay: FakeRelay, capsys: pytest.CaptureFixture[str]
) -> None:
    relay.accepted = "someone-else-rotated-it-" + "x" * 19
    code, _out, err = rotate(capsys)
    assert code != 0 and "ask an organisation admin" in err
    assert load_config(home()).token == TOKEN
    assert not home().pending_token_path.exists()


def test_a_setting_changed_during_the_rotation_is_kept(
    relay: FakeRelay, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`config set` between minting and saving: the new token lands beside it, not over it."""
    import attrs as _attrs

    from agentcall.local.config import save_config

    workdir = tmp_path / "work"
    workdir.mkdir()
    rotate_token = FakeApi.rotate_token

    def meanwhile(api: FakeApi, token: str) -> defer.Deferred[TokenRotated]:
        on_disk = load_config(home(), apply_override=False)
        save_config(home(), _attrs.evolve(on_disk, read_roots=(str(workdir),)))
        return rotate_token(api, token)

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(FakeApi, "rotate_token", meanwhile)
    try:
        assert rotate(capsys)[0] == 0
    finally:
        monkeypatch.undo()
    saved = load_config(home())
    assert saved.token == relay.accepted and saved.read_roots == (str(workdir),)
