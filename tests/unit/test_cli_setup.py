"""`agentcall setup`: agent resolution, enrolment order, resumability, service and self-check."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer

from agentcall.caller.call import CallResult
from agentcall.cli import setup as setup_cli
from agentcall.cli.main import CommandError, main
from agentcall.cli.setup import resolve_agent
from agentcall.cli.setup_finish import SetupDeps
from agentcall.client.api import RelayUnreachable
from agentcall.errors import ApiError, ApiErrorCode, CallErrorCode
from agentcall.local.config import load_config
from agentcall.local.home import Home
from agentcall.local.keystore import load_keys
from agentcall.wire.http import (
    AgentKind,
    KeysResponse,
    MemberRole,
    PresenceResponse,
    RegisterRequest,
    RegisterResponse,
    StatusResponse,
)
from agentcall.wire.payloads import Reply
from tests.unit.cli_helpers import ORIGIN, TOKEN, run_with_clock

SECRET = "s" * 43
INVITE = f"https://relay.example/invite/acme#{SECRET}"
PATHS = {"claude": "/opt/claude/bin/claude", "codex": "/opt/codex/bin/codex", "node": None}


@attrs.define
class FakeRelay:
    """The relay's HTTP routes for one enrolment, with failures that can be armed per route."""

    home: Path
    log: list[str] = attrs.field(factory=list)
    fail: dict[str, Exception] = attrs.field(factory=dict)
    keys: KeysResponse | None = None
    registered: RegisterRequest | None = None
    online_after: int = 0
    keys_existed_at_register: bool = False

    def api(self, _reactor: Any, _url: Any, credentials: Any, _ca: Any) -> FakeRelay:
        self.log.append("api:" + ("auth" if credentials else "anon"))
        return self

    def _answer(self, route: str, value: Any) -> defer.Deferred[Any]:
        self.log.append(route)
        if route in self.fail:
            return defer.fail(self.fail.pop(route))
        return defer.succeed(value)

    def status(self) -> defer.Deferred[StatusResponse]:
        return self._answer("status", StatusResponse(ok=True, version="1", relay_origin=ORIGIN))

    def register(self, request: RegisterRequest) -> defer.Deferred[RegisterResponse]:
        self.registered = request
        self.keys_existed_at_register = (self.home / ".agentcall" / "keys.json").exists()
        address = f"@{request.org}/{request.handle}"
        body = RegisterResponse(request.org, request.handle, address, "member", TOKEN, ORIGIN)
        return self._answer("register", body)

    def get_keys(self, _handle: str) -> defer.Deferred[KeysResponse]:
        if self.keys is None:
            return self._answer("get_keys", None).addCallback(_not_found)
        return self._answer("get_keys", self.keys)

    def put_identity_key(self, record: Any) -> defer.Deferred[KeysResponse]:
        d = self._answer("put_identity", None)
        return d.addCallback(lambda _: self._store(record))

    def put_encryption_key(self, record: Any) -> defer.Deferred[KeysResponse]:
        d = self._answer("put_encryption", None)
        return d.addCallback(lambda _: self._store(None, record))

    def _store(self, identity: Any, encryption: Any = None) -> KeysResponse:
        if identity is None and self.keys is not None:
            identity = self.keys.identity
        self.keys = KeysResponse(identity=identity, encryption=encryption)
        return self.keys

    def presence(self) -> defer.Deferred[PresenceResponse]:
        self.online_after -= 1
        return self._answer("presence", PresenceResponse("@acme/ken", self.online_after < 0))


def _not_found(_: object) -> KeysResponse:
    raise ApiError(404, ApiErrorCode.NOT_FOUND, "no published keys")


@attrs.define
class FakeSystemctl:
    available: bool = True
    active: bool = False
    calls: list[tuple[str, ...]] = attrs.field(factory=list)

    def __call__(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(tuple(args))
        ok = self.available and (args[0] != "is-active" or self.active)
        return subprocess.CompletedProcess(list(args), 0 if ok else 1, "", "" if ok else "no bus")


@attrs.define
class World:
    home: Path
    relay: FakeRelay
    systemctl: FakeSystemctl
    answers: list[CallResult]
    placed: list[str] = attrs.field(factory=list)

    async def place(self, _reactor: Any, _home: Any, _config: Any, _keys: Any, target: str,
                    *_rest: Any, **_kw: Any) -> CallResult:  # fmt: skip
        self.placed.append(target)
        return self.answers.pop(0)

    def deps(self, **changes: Any) -> SetupDeps:
        base = SetupDeps(
            make_api=self.relay.api,
            run=run_with_clock,
            place=self.place,
            systemctl=self.systemctl,
            which=PATHS.get,
            environ={"HOME": str(self.home)},
            python="/usr/bin/python3",
            presence_wait_s=2.0,
        )
        return attrs.evolve(base, **changes)

    @property
    def state(self) -> Home:
        return Home.from_environ({"HOME": str(self.home)})


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    home = tmp_path / "home"
    home.mkdir()
    answered = CallResult("@acme/ken", "c", 1.5, reply=Reply(text="got it"))
    made = World(home, FakeRelay(home), FakeSystemctl(available=False), [answered])
    monkeypatch.setattr(setup_cli, "DEPS", made.deps())
    return made


def setup(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["setup", *argv])
    out, err = capsys.readouterr()
    return code, out, err


ENROL = ("--invite", INVITE, "--handle", "ken")


# --- agent resolution ---------------------------------------------------------------------------


def test_detection_prefers_claude_then_codex() -> None:
    """Without --agent, claude wins when both exist, codex when it is the only one."""
    assert resolve_agent(None, None, False, PATHS.get).kind is AgentKind.CLAUDE
    only_codex = {"codex": "/usr/bin/codex"}.get
    choice = resolve_agent(None, None, False, only_codex)
    assert (choice.kind, choice.executable) == (AgentKind.CODEX, "/usr/bin/codex")


def test_no_agent_found_suggests_the_alternatives() -> None:
    """With nothing on PATH the error points at --agent command and --caller-only."""
    with pytest.raises(CommandError) as error:
        resolve_agent(None, None, False, lambda _name: None)
    assert "--agent command" in str(error.value) and "--caller-only" in str(error.value)
    assert resolve_agent(None, None, True, lambda _name: None).kind is None


def test_an_explicit_agent_must_be_on_path() -> None:
    """--agent codex is not silently replaced by claude when codex is missing."""
    with pytest.raises(CommandError, match="`codex` was not found on PATH"):
        resolve_agent("codex", None, False, {"claude": "/usr/bin/claude"}.get)


def test_a_command_agent_is_split_and_made_absolute(tmp_path: Path) -> None:
    """shlex splits --agent-command; its program is resolved to an absolute executable."""
    program = tmp_path / "my agent"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    line = f"'{program}' --flag 'two words'"
    choice = resolve_agent("command", line, False, lambda _name: None)
    assert choice.kind is AgentKind.COMMAND
    assert choice.command == (str(program), "--flag", "two words")
    via_path = resolve_agent(None, "helper -q", False, {"helper": "/usr/bin/helper"}.get)
    assert via_path.command == ("/usr/bin/helper", "-q")


@pytest.mark.parametrize(
    ("agent", "command", "caller_only", "needle"),
    [
        ("command", None, False, "needs --agent-command"),
        ("command", "'unclosed", False, "cannot split"),
        ("command", "nosuchprogram", False, "is not an executable program"),
        ("claude", "x", False, "goes with --agent command"),
        ("claude", None, True, "--caller-only answers no calls"),
    ],
)
def test_agent_flag_mistakes_are_explained(
    agent: str, command: str | None, caller_only: bool, needle: str
) -> None:
    """Each inconsistent combination fails with a sentence saying which flag is wrong."""
    with pytest.raises(CommandError, match=needle):
        resolve_agent(agent, command, caller_only, lambda _name: None)


# --- enrolment ------------------------------------------------------------------------------------


def test_enrolment_saves_private_config_and_publishes_in_order(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Keys exist before registering; identity is published before encryption; 0600/0700."""
    code, out, err = setup(capsys, *ENROL, "--skip-service")
    assert code == 0
    assert world.relay.keys_existed_at_register
    routes = [r for r in world.relay.log if not r.startswith("api:")]
    assert routes == ["status", "register", "get_keys", "put_identity", "put_encryption"]
    config = load_config(world.state)
    assert (config.address, config.role, config.agent_kind) == (
        "@acme/ken",
        MemberRole.MEMBER,
        AgentKind.CLAUDE,
    )
    assert config.read_roots == (str(world.home),)
    assert stat.S_IMODE(os.stat(world.state.config_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(world.state.state_dir).st_mode) == 0o700
    assert "address: @acme/ken" in out and "fingerprint: SHA256:" in out
    assert "agentcall listen" in err
    assert TOKEN not in out + err and SECRET not in out + err


def test_the_invite_can_come_from_the_environment(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """AGENTCALL_INVITE stands in for --invite, keeping the secret out of argv."""
    monkeypatch.setattr(
        setup_cli, "DEPS", world.deps(environ={"HOME": str(world.home), "AGENTCALL_INVITE": INVITE})
    )
    assert setup(capsys, "--handle", "ken", "--skip-service")[0] == 0
    assert world.relay.registered is not None and world.relay.registered.invite == SECRET


def test_caller_only_registers_without_an_agent(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """--caller-only enrols with no agent kind and never touches systemd."""
    world.systemctl.available = True
    assert setup(capsys, *ENROL, "--caller-only")[0] == 0
    assert world.relay.registered is not None and world.relay.registered.agent_kind is None
    assert load_config(world.state).caller_only
    assert world.systemctl.calls == [] and world.placed == []


def test_a_second_setup_is_refused_naming_the_identity(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once set up, setup --invite says as whom and how to resume instead."""
    setup(capsys, *ENROL, "--skip-service")
    code, _out, err = setup(capsys, "--invite", INVITE, "--handle", "other")
    assert code == 1
    assert "already set up as @acme/ken" in err and "--resume" in err
    assert "agentcall config set KEY VALUE" in err and "agentcall uninstall" in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--agent", "codex"], "--agent is changed with `agentcall config set agent VALUE`"),
        (["--agent-command", "x"], "`agentcall config set agent-command VALUE`"),
        (["--ca-file", "/x.pem"], "`agentcall config set ca-file VALUE`"),
        (["--handle", "bob"], "agentcall config set KEY VALUE"),
    ],
)
def test_setup_flags_on_an_installed_machine_point_at_config(
    world: World, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    """Changing the agent or CA with setup's flags once installed is shown the setting that
    does it, and changes nothing."""
    setup(capsys, *ENROL, "--skip-service")
    before = world.state.config_path.read_bytes()
    world.relay.log.clear()
    code, _out, err = setup(capsys, *argv)
    assert code == 2 and needle in err
    assert world.state.config_path.read_bytes() == before and world.relay.log == []


def test_a_refused_registration_leaves_nothing_behind(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """An invite the relay refuses leaves no config and no keys, so a retry starts clean."""
    world.relay.fail["register"] = ApiError(410, ApiErrorCode.INVITE_USED, "already used")
    code, _out, err = setup(capsys, *ENROL, "--skip-service")
    assert code == 1 and "already used" in err
    assert not world.state.config_path.exists() and not world.state.keys_path.exists()
    assert setup(capsys, *ENROL, "--skip-service")[0] == 0


def test_a_bad_invite_is_refused_without_echoing_it(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed link is explained, and its text (which may hold a secret) is not shown."""
    code, _out, err = setup(capsys, "--invite", f"http://evil.example/invite/acme#{SECRET}",
                            "--handle", "ken")  # fmt: skip
    assert code == 1 and "--invite" in err and SECRET not in err
    assert world.relay.log == []


# --- resuming -------------------------------------------------------------------------------------


def test_a_failed_publish_is_finished_by_resume(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Config and keys survive a publish failure; --resume sends only what is missing."""
    world.relay.fail["put_encryption"] = RelayUnreachable("relay.example refused the connection")
    code, _out, err = setup(capsys, *ENROL, "--skip-service")
    assert code == 1
    assert "enrolled as @acme/ken" in err and "agentcall setup --resume" in err
    keys = load_keys(world.state)
    world.relay.log.clear()
    code, out, _err = setup(capsys, "--resume", "--skip-service")
    assert code == 0
    routes = [r for r in world.relay.log if not r.startswith("api:")]
    assert routes == ["get_keys", "put_encryption"]
    assert world.relay.keys is not None and world.relay.keys.encryption is not None
    assert world.relay.keys.encryption == keys.current_record
    assert "address: @acme/ken" in out


def test_plain_setup_resumes_an_existing_installation(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """`agentcall setup` with no invite on an enrolled machine finishes instead of failing."""
    setup(capsys, *ENROL, "--skip-service")
    world.relay.log.clear()
    code, _out, err = setup(capsys, "--skip-service")
    assert code == 0
    assert "keys already published" in err
    assert "put_identity" not in world.relay.log


def test_resume_takes_no_enrolment_flags(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """--resume with --invite is a usage error, not a second enrolment."""
    code, _out, err = setup(capsys, "--resume", "--invite", INVITE)
    assert code == 2 and "--resume" in err


def test_resume_before_setup_says_how_to_start(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing to resume: the message names the enrolment command."""
    code, _out, err = setup(capsys, "--resume")
    assert code == 1 and "agentcall setup --invite" in err


# --- service and self-check -----------------------------------------------------------------------


def test_with_systemd_the_unit_is_installed_and_verified(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """The unit lands in ~/.config/systemd/user, is enabled and started, then answers a call."""
    world.systemctl.available = True
    code, out, err = setup(capsys, *ENROL)
    assert code == 0
    unit = world.home / ".config" / "systemd" / "user" / "agentcall-listener.service"
    text = unit.read_text()
    assert '"/usr/bin/python3" "-m" "agentcall" "listen"' in text
    assert "/opt/claude/bin" in text
    assert [c for c in world.systemctl.calls if c[0] != "show-environment"] == [
        ("daemon-reload",),
        ("enable", "agentcall-listener.service"),
        ("restart", "agentcall-listener.service"),
    ]
    assert world.placed == ["@acme/ken"]
    assert "test call answered" in err and "fingerprint:" in out


def test_on_macos_a_launchd_agent_is_loaded_instead(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plist lands in ~/Library/LaunchAgents and is bootstrapped into the login session."""
    import plistlib

    asked: list[tuple[str, ...]] = []

    def launchctl(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        asked.append(tuple(args))
        return subprocess.CompletedProcess(list(args), 0, "", "")

    monkeypatch.setattr(setup_cli, "DEPS", world.deps(platform="darwin", launchctl=launchctl))
    code, _out, err = setup(capsys, *ENROL)
    assert code == 0, err
    path = world.home / "Library" / "LaunchAgents" / "com.agentcall.listener.plist"
    agent = plistlib.loads(path.read_bytes())
    assert agent["ProgramArguments"] == ["/usr/bin/python3", "-m", "agentcall", "listen"]
    assert agent["EnvironmentVariables"]["HOME"] == str(world.home)
    assert "/opt/claude/bin" in agent["EnvironmentVariables"]["PATH"]
    assert agent["KeepAlive"] == {"Crashed": True} and agent["RunAtLoad"] is True
    uid = f"gui/{os.getuid()}"
    assert asked == [("bootout", f"{uid}/com.agentcall.listener"), ("bootstrap", uid, str(path))]
    assert world.systemctl.calls == []
    assert world.placed == ["@acme/ken"] and "listener agent loaded" in err


def test_a_launchctl_that_refuses_is_a_resumable_failure(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def launchctl(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        code = 5 if args[0] == "bootstrap" else 0
        return subprocess.CompletedProcess(list(args), code, "", "Bootstrap failed: 5: I/O error")

    monkeypatch.setattr(setup_cli, "DEPS", world.deps(platform="darwin", launchctl=launchctl))
    code, _out, err = setup(capsys, *ENROL)
    assert code != 0
    assert "launchctl bootstrap" in err and "agentcall setup --resume" in err


def test_a_failed_self_check_exits_one_with_the_reason(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Setup finishes, prints who we are, and reports why the test call failed."""
    world.systemctl.available = True
    world.answers[:] = [CallResult("@acme/ken", None, 0.1, code=CallErrorCode.AGENT_ERROR)]
    code, out, err = setup(capsys, *ENROL)
    assert code == 1
    assert "address: @acme/ken" in out
    assert "the test call failed: The agent you called failed" in err


def test_the_self_check_waits_for_the_listener_then_gives_up(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A listener that never connects is reported after the wait, with where to look."""
    world.systemctl.available = True
    world.relay.online_after = 1_000
    code, _out, err = setup(capsys, *ENROL)
    assert code == 1
    assert "did not connect to the relay within 2 s" in err
    assert world.placed == []


def test_no_verify_and_no_systemd_skip_the_test_call(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a started listener, or with --no-verify, nothing is called."""
    assert setup(capsys, *ENROL)[0] == 0  # no systemd here
    assert world.placed == []
    world.systemctl.available = True
    assert setup(capsys, "--resume", "--no-verify")[0] == 0
    assert world.placed == []
    assert ("restart", "agentcall-listener.service") in world.systemctl.calls


def test_an_unchanged_running_unit_is_not_restarted(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Resuming a healthy install leaves the running listener (and its call) alone."""
    world.systemctl.available = True
    world.answers.append(world.answers[0])
    setup(capsys, *ENROL)
    world.systemctl.calls.clear()
    world.systemctl.active = True
    assert setup(capsys, "--resume")[0] == 0
    assert not any(call[0] == "restart" for call in world.systemctl.calls)


@pytest.mark.parametrize(
    "argv",
    [
        ["--handle", "Bad_Handle"],
        ["--handle", "bob-"],
        ["--handle", "bo--b"],
        ["--agent", "gemini"],
        ["--no-such-flag"],
    ],
)
def test_usage_errors_exit_two(argv: list[str], world: World) -> None:
    """Invalid handles and unknown agents are rejected by the parser."""
    with pytest.raises(SystemExit) as exited:
        main(["setup", *argv])
    assert exited.value.code == 2


def test_a_caller_only_install_given_an_agent_by_config_is_finished_by_resume(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`config set agent` on a caller-only machine says to resume; resume then installs and
    starts the listener that answers with it."""
    from agentcall.cli import config as config_cli

    world.systemctl.available = True
    assert setup(capsys, *ENROL, "--caller-only")[0] == 0
    deps = config_cli.ConfigDeps(which=PATHS.get, environ={"HOME": str(world.home)})
    monkeypatch.setattr(config_cli, "DEPS", deps)
    assert main(["config", "set", "agent", "claude"]) == 0
    assert "agentcall setup --resume" in capsys.readouterr().out
    assert world.systemctl.calls == []
    assert setup(capsys, "--resume", "--no-verify")[0] == 0
    assert ("restart", "agentcall-listener.service") in world.systemctl.calls
    unit = world.home / ".config" / "systemd" / "user" / "agentcall-listener.service"
    assert "/opt/claude/bin" in unit.read_text()
