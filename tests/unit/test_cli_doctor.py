"""`agentcall doctor`: every check in order, each failure with its fix, the real guard run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer

from agentcall.cli import card as card_cli
from agentcall.cli import doctor, owner
from agentcall.cli.doctor_checks import DoctorDeps
from agentcall.cli.main import main
from agentcall.cli.policy_report import kernel_abi
from agentcall.client.api import RelayUnreachable
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.guard.main import DENY_OUTPUT
from agentcall.listener.card import sign_offer
from agentcall.listener.ceiling import TEST_OVERRIDE_ENV, Ceiling, load_ceiling
from agentcall.local.config import load_config, save_config
from agentcall.local.home import Home
from agentcall.local.keystore import LocalKeys, create_keys
from agentcall.wire.http import (
    KeysResponse,
    MemberRole,
    PresenceResponse,
    SignedCardRecord,
    StatusResponse,
    WhoAmIResponse,
)
from tests.unit.cli_helpers import NOW, ORIGIN, install, isolate, run_with_clock

ALL_CHECKS = [
    "installation",
    "private files",
    "config",
    "keys",
    "key expiry",
    "recovery code",
    "relay",
    "published keys",
    "offline delivery",
    "listener service",
    "listener connected",
    "agent",
    "agent login",
    "tool guard",
    "claude settings",
    "kernel read boundary",
    "tasks",
    "policy",
    "admin ceiling",
    "assertions",
    "limits",
    "card",
]


@attrs.define
class FakeApi:
    keys: KeysResponse | None
    online: bool = True
    offline_delivery: bool = False
    fail: dict[str, Exception] = attrs.field(factory=dict)
    asked: list[str] = attrs.field(factory=list)
    # The card the relay serves: made when asked (by default from the local files as they are
    # then, so a healthy installation's card matches); None serves 404.
    card: Callable[[], SignedCardRecord | None] = lambda: None

    def _answer(self, route: str, value: object) -> defer.Deferred[Any]:
        self.asked.append(route)
        if route in self.fail:
            return defer.fail(self.fail[route])
        return defer.succeed(value)

    def status(self) -> defer.Deferred[StatusResponse]:
        return self._answer("status", StatusResponse(ok=True, version="9", relay_origin=ORIGIN))

    def get_keys(self, handle: str) -> defer.Deferred[KeysResponse]:
        assert handle == "ann"
        return self._answer("get_keys", self.keys)

    def get_card(self, handle: str) -> defer.Deferred[SignedCardRecord]:
        assert handle == "ann"
        card = self.card()
        if card is None and "get_card" not in self.fail:
            self.asked.append("get_card")
            return defer.fail(ApiError(404, ApiErrorCode.NOT_FOUND, "no card"))
        return self._answer("get_card", card)

    def presence(self) -> defer.Deferred[PresenceResponse]:
        return self._answer("presence", PresenceResponse("@acme/ann", self.online))

    def whoami(self) -> defer.Deferred[WhoAmIResponse]:
        me = WhoAmIResponse(
            org="acme",
            handle="ann",
            address="@acme/ann",
            role=MemberRole.MEMBER,
            relay_origin=ORIGIN,
            offline_delivery=self.offline_delivery,
        )
        return self._answer("whoami", me)


@attrs.define
class FakeRunner:
    """`systemctl --user is-active …` and `<agent> auth|login status`, by their last words."""

    answers: dict[str, subprocess.CompletedProcess[str] | Exception]
    ran: list[tuple[str, ...]] = attrs.field(factory=list)

    def __call__(self, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        assert timeout_s <= 10
        self.ran.append(tuple(argv))
        key = "is-active" if "is-active" in argv else " ".join(argv[-2:])
        answer = self.answers[key]
        if isinstance(answer, Exception):
            raise answer
        return answer


def done(code: int, out: str = "", err: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], code, out, err)


@attrs.define
class World:
    home: Path
    keys: LocalKeys
    api: FakeApi
    runner: FakeRunner
    ceiling_path: Path
    managed: Path
    programs: dict[str, str] = attrs.field(
        factory=lambda: {
            "systemctl": "/usr/bin/systemctl",
            "claude": "/usr/bin/claude",
            "codex": "/usr/bin/codex",
        }
    )
    guard_argv: list[str] | None = None
    path: str = "/nonexistent"
    now: float = NOW  # what doctor takes as the time (the keys were made at NOW)

    def deps(self) -> DoctorDeps:
        deps = DoctorDeps(
            make_api=lambda _reactor, _config: self.api,
            run_network=run_with_clock,
            run=self.runner,
            which=lambda program, _path: self.programs.get(program),
            managed_settings=lambda: (str(self.managed),),
            environ={"HOME": str(self.home), "PATH": self.path},
            clock=lambda: self.now,
        )
        argv = self.guard_argv
        return deps if argv is None else attrs.evolve(deps, guard_argv=lambda: argv)

    @property
    def state(self) -> Home:
        return Home.from_environ({"HOME": str(self.home)})

    def reconfigure(self, **changes: Any) -> None:
        save_config(self.state, attrs.evolve(load_config(self.state), **changes))

    def task(self, task_id: str, front: str) -> Path:
        path = self.home / "AgentCall" / "tasks" / task_id / "SKILL.md"
        path.parent.mkdir(parents=True)
        path.write_text(f"---\n{front}\n---\nDo it.\n")
        return path

    def recovery(self, document: dict[str, Any] | str, mode: int = 0o600) -> Path:
        """The marker `agentcall recovery issue` leaves in the state directory."""
        path = self.state.state_dir / "recovery.json"
        path.write_text(document if isinstance(document, str) else json.dumps(document))
        path.chmod(mode)
        return path

    def policy(self, document: dict[str, Any] | str) -> None:
        text = document if isinstance(document, str) else json.dumps(document)
        path = self.state.policy_path
        path.write_text(text)
        path.chmod(0o600)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> World:
    home = isolate(monkeypatch, tmp_path)
    _state, _config, keys = install(home)
    api = FakeApi(KeysResponse(keys.identity_record, keys.current_record))
    runner = FakeRunner({"is-active": done(0, "active\n"), "auth status": done(0, "{}")})
    ceiling_path = tmp_path / "admin" / "policy.json"
    ceiling_path.parent.mkdir()

    def test_ceiling() -> Ceiling | None:
        environ = {TEST_OVERRIDE_ENV: str(ceiling_path)}
        return load_ceiling(environ=environ, allow_test_override=True)

    monkeypatch.setattr(owner, "load_admin_ceiling", test_ceiling)
    monkeypatch.setattr(owner, "ceiling_path", lambda: str(ceiling_path))
    made = World(home, keys, api, runner, ceiling_path, tmp_path / "managed-settings.json")
    api.card = lambda: local_card(made)
    made.recovery({"issued_at": int(NOW)})  # a healthy installation has a recovery code
    monkeypatch.setattr(doctor, "DEPS", None)
    return made


def local_card(world: World, now: float = NOW) -> SignedCardRecord:
    """The card the local files make now, signed as the listener would sign it."""
    config = load_config(world.state)
    offer = card_cli.local_offer(world.state, config, "test")
    return sign_offer(offer, world.keys.identity, ORIGIN, config.address, now)


def run_doctor(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any]]:
    """Runs `doctor --json` and returns the exit status and the report, checks by name."""
    monkeypatch.setattr(doctor, "DEPS", world.deps())
    code = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is (code == 0)
    return code, report


def by_name(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [check for check in report["checks"] if check["name"] == name]


def one(report: dict[str, Any], name: str) -> dict[str, Any]:
    [check] = by_name(report, name)
    return check


# --- the whole run -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_healthy_installation_passes_every_check_in_order(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Everything fine: each check once, in the documented order, all ✓, exit 0; the real
    guard refused the key and allowed the read root."""
    code, report = run_doctor(world, monkeypatch, capsys)
    assert code == 0, report
    assert [check["name"] for check in report["checks"]] == ALL_CHECKS
    assert {check["status"] for check in report["checks"]} == {"pass"}
    guard = one(report, "tool guard")["detail"]
    assert f"{world.home}/.ssh/id_ed25519" in guard and "logged both" in guard
    assert world.runner.ran == [
        ("systemctl", "--user", "is-active", "agentcall-listener.service"),
        ("/usr/bin/claude", "auth", "status"),
    ]
    assert world.api.asked == ["status", "get_keys", "presence", "whoami", "get_card"]
    # The text form: a mark per check and a summary line.
    code = main(["doctor"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and len(lines) == len(ALL_CHECKS) + 1
    assert all(line.startswith("✓ ") for line in lines[:-1])
    assert lines[-1] == "doctor: all checks passed, 0 warning(s)"


@pytest.mark.slow
def test_text_output_marks_failures_with_their_fix_and_exits_one(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """✗ lines are followed by `fix:`, ! lines mark the unproven; a failure means exit 1."""
    world.api.fail["presence"] = RelayUnreachable("no answer from relay.example within 10 s")
    world.runner.answers["auth status"] = done(1, "", "Not logged in\n")
    monkeypatch.setattr(doctor, "DEPS", world.deps())
    code = main(["doctor"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    failed = lines.index("✗ agent login: `claude auth status` exited 1: Not logged in")
    assert lines[failed + 1] == "    fix: run `claude auth login` (or start `claude` and /login)"
    assert "! listener connected: unproven: no answer from relay.example within 10 s" in lines
    assert lines[-1] == "doctor: 1 check(s) failed, 1 warning(s)"


# --- the installation ----------------------------------------------------------------------------


def test_not_set_up_fails_at_config_and_stops(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without config.json nothing later can be checked; the fix is setup."""
    world.state.config_path.unlink()
    code, report = run_doctor(world, monkeypatch, capsys)
    assert code == 1
    assert [check["name"] for check in report["checks"]] == ALL_CHECKS[:3]
    assert "agentcall setup --invite" in one(report, "config")["hint"]
    assert world.api.asked == []


def test_a_readable_config_is_a_private_file_failure(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config others can read fails the permission check with `chmod 600`, and config."""
    config = world.state.config_path
    config.chmod(0o644)
    code, report = run_doctor(world, monkeypatch, capsys)
    assert code == 1
    problem = one(report, "private files")
    assert problem["status"] == "fail" and problem["hint"] == f"run `chmod 600 {config}`"
    assert one(report, "config")["status"] == "fail"


@pytest.mark.slow
def test_several_agentcall_programs_on_path_are_a_warning(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Two different `agentcall` executables on PATH: the one that runs may not be yours."""
    dirs = []
    for name in ("a", "b"):
        program = tmp_path / name / "agentcall"
        program.parent.mkdir()
        program.write_text(f"#!/bin/sh\n# {name}\n")
        program.chmod(0o755)
        dirs.append(str(program.parent))
    world.path = ":".join(dirs)
    _code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "installation")
    assert (
        check["status"] == "warn" and f"{dirs[0]}/agentcall, {dirs[1]}/agentcall" in check["detail"]
    )


@pytest.mark.slow
def test_keys_of_another_identity_fail(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """keys.json for another address than config.json is caught before the relay is asked."""
    world.state.keys_path.unlink()
    create_keys(world.state, ORIGIN, "@acme/bob", NOW)
    code, report = run_doctor(world, monkeypatch, capsys)
    assert code == 1
    assert "keys.json is for @acme/bob" in one(report, "keys")["detail"]
    assert one(report, "published keys")["status"] == "warn"


# --- the relay -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_unreachable_relay_fails_and_leaves_presence_unproven(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.api.fail["status"] = RelayUnreachable("cannot resolve relay.example")
    code, report = run_doctor(world, monkeypatch, capsys)
    assert code == 1
    relay = one(report, "relay")
    assert relay["status"] == "fail" and "cannot resolve relay.example" in relay["detail"]
    assert by_name(report, "published keys") == []
    assert one(report, "listener connected")["status"] == "warn"


@pytest.mark.slow
def test_published_keys_must_be_the_local_ones(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Another identity, another encryption key, or none: each is a failure with a fix."""
    other_home = Home.from_environ({"HOME": str(tmp_path)})
    other = create_keys(other_home, ORIGIN, "@acme/ann", NOW)
    cases = [
        (KeysResponse(other.identity_record, world.keys.current_record), "different identity"),
        (KeysResponse(world.keys.identity_record, other.current_record), "does not hold"),
        (KeysResponse(world.keys.identity_record, None), "no encryption key"),
    ]
    for served, expected in cases:
        world.api.keys = served
        code, report = run_doctor(world, monkeypatch, capsys)
        check = one(report, "published keys")
        assert code == 1 and check["status"] == "fail" and expected in check["detail"]
    from agentcall.errors import ApiError, ApiErrorCode

    world.api.fail["get_keys"] = ApiError(404, ApiErrorCode.NOT_FOUND, "no published keys")
    _code, report = run_doctor(world, monkeypatch, capsys)
    assert "agentcall setup --resume" in one(report, "published keys")["hint"]


def test_a_refused_token_is_named_with_its_two_causes_not_a_resume_hint(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A removed member (or a token rotated elsewhere) gets advice that can work."""
    from agentcall.errors import ApiError, ApiErrorCode

    world.api.fail["get_keys"] = ApiError(401, ApiErrorCode.UNAUTHORIZED, "invalid credentials")
    code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "credentials")
    assert code == 1 and check["status"] == "fail"
    assert "admin removed you" in check["detail"] and "rotated" in check["detail"]
    assert "agentcall members list" in check["hint"]
    assert by_name(report, "published keys") == []


@pytest.mark.slow
def test_a_relay_at_another_origin_fails(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.reconfigure(relay_origin="other.example")
    _code, report = run_doctor(world, monkeypatch, capsys)
    relay = one(report, "relay")
    assert relay["status"] == "fail" and "other.example" in relay["detail"]


# --- the listener --------------------------------------------------------------------------------


@pytest.mark.slow
def test_listener_states(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Offline at the relay fails; an installed unit that is not active fails with the restart
    command; no unit, or no systemctl, is a warning."""
    world.api.online = False
    world.runner.answers["is-active"] = done(3, "inactive\n")
    _code, report = run_doctor(world, monkeypatch, capsys)
    connected = one(report, "listener connected")
    assert connected["status"] == "fail" and "agentcall listen" in connected["hint"]
    assert one(report, "listener service")["status"] == "warn"  # no unit file
    unit = world.home / ".config" / "systemd" / "user" / "agentcall-listener.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Unit]\n")
    _code, report = run_doctor(world, monkeypatch, capsys)
    service = one(report, "listener service")
    assert service["status"] == "fail" and "not active (inactive)" in service["detail"]
    assert "systemctl --user restart agentcall-listener.service" in service["hint"]
    del world.programs["systemctl"]
    _code, report = run_doctor(world, monkeypatch, capsys)
    assert "no systemctl" in one(report, "listener service")["detail"]


# --- the agent -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_agent_missing_unauthenticated_or_silent(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.runner.answers["auth status"] = subprocess.TimeoutExpired(["claude"], 10)
    _code, report = run_doctor(world, monkeypatch, capsys)
    assert one(report, "agent login")["status"] == "warn"
    del world.programs["claude"]
    code, report = run_doctor(world, monkeypatch, capsys)
    assert code == 1 and "`claude` is not found on PATH" in one(report, "agent")["detail"]
    assert by_name(report, "agent login") == []


@pytest.mark.slow
def test_codex_is_asked_with_login_status_and_its_limits_warn(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Codex: `codex login status`; no Claude settings check; no read floor is a warning."""
    world.reconfigure(agent_kind="codex")
    world.runner.answers["login status"] = done(1, "", "Not logged in\n")
    code, report = run_doctor(world, monkeypatch, capsys)
    assert code == 1
    assert ("/usr/bin/codex", "login", "status") in world.runner.ran
    assert one(report, "agent login")["hint"] == "run `codex login`"
    assert by_name(report, "claude settings") == []
    limits = one(report, "limits")
    if kernel_abi() >= 1:
        assert limits["status"] == "pass" and "kernel bounds every read" in limits["detail"]
    else:
        assert limits["status"] == "warn" and "no read floor" in limits["detail"]
    assert one(report, "tool guard")["status"] == "pass"
    # Without the kernel boundary Codex's missing read floor is a warning.
    monkeypatch.setattr("agentcall.cli.policy_report.kernel_abi", lambda: 0)
    _code, report = run_doctor(world, monkeypatch, capsys)
    limits = one(report, "limits")
    assert limits["status"] == "warn" and "no read floor" in limits["detail"]


def test_a_command_agent_has_no_guard(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    program = tmp_path / "answer"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    world.reconfigure(agent_kind="command", agent_command=(str(program),))
    world.programs[str(program)] = str(program)
    code, report = run_doctor(world, monkeypatch, capsys)
    assert code == 0
    assert one(report, "tool guard")["status"] == "warn"
    assert one(report, "agent login")["status"] == "pass"
    assert not any("status" in argv for argv in world.runner.ran)


# --- the guard -----------------------------------------------------------------------------------

_LOGS_NOTHING = f"import sys; print({DENY_OUTPUT!r} if 'id_ed25519' in sys.stdin.read() else '')"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("program", "expected"),
    [
        ("pass", "id_ed25519 was not refused"),
        (f"print({DENY_OUTPUT!r})", "was not let through"),
        ("import sys; sys.exit(2)", "id_ed25519 was not refused (exit 2"),
        (_LOGS_NOTHING, "did not log both decisions"),
    ],
    ids=["allows-all", "denies-all", "crashes", "never-logs"],
)
def test_a_guard_that_does_not_guard_fails(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    program: str,
    expected: str,
) -> None:
    """A hook that lets the key through, refuses everything, crashes, or decides right but
    keeps no record is a failure: each half of the check can fail on its own."""
    world.guard_argv = [sys.executable, "-c", program]
    code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "tool guard")
    assert code == 1 and check["status"] == "fail" and expected in check["detail"]


def test_a_missing_read_root_fails_the_guard_check(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    world.reconfigure(read_roots=(str(tmp_path / "gone"),))
    _code, report = run_doctor(world, monkeypatch, capsys)
    assert "none of the read roots exists" in one(report, "tool guard")["detail"]


@pytest.mark.slow
def test_claude_settings_that_switch_hooks_off(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The owner's own settings cannot (we pass --setting-sources ""): a warning that says
    so. Managed settings can: a failure."""
    settings = world.home / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{"disableAllHooks": true}')
    code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "claude settings")
    assert code == 0 and check["status"] == "warn"
    assert "disableAllHooks" in check["detail"] and '--setting-sources ""' in check["detail"]
    world.managed.write_text('{"allowManagedHooksOnly": true}')
    code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "claude settings")
    assert code == 1 and check["status"] == "fail" and "allowManagedHooksOnly" in check["detail"]


# --- owner control -------------------------------------------------------------------------------


@pytest.mark.slow
def test_task_policy_and_assertion_problems_fail(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Task problems with file:line; a failing assertion; dangling grants as a warning; a task
    with a shell makes Claude's limits a warning (Bash is not bounded)."""
    bad = world.task("broken", "description: d\ntools: [sudo]")
    world.task("deploy", "description: d\ntools: [read, exec]")
    world.policy(
        {
            "version": 2,
            "callers": {"ana": {"grants": ["deploy", "gone"]}},
            "assertions": [{"caller": "bob", "accept": ["deploy"]}],
        }
    )
    code, report = run_doctor(world, monkeypatch, capsys)
    assert code == 1
    assert one(report, "tasks")["detail"].startswith(f"{bad}:3: unknown tool 'sudo'")
    assert "bob does not get deploy" in one(report, "assertions")["detail"]
    assert "names gone, which is not a task on disk" in one(report, "policy notes")["detail"]
    limits = one(report, "limits")
    assert limits["status"] == "warn"
    if kernel_abi() >= 1:
        assert "Bash included" in limits["detail"] and "keeps the network" in limits["detail"]
    else:
        assert "Bash is recorded, not bounded" in limits["detail"]


@pytest.mark.slow
def test_unusable_policy_or_ceiling_fail(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.policy('{"version": 2, "callers": []}')
    _code, report = run_doctor(world, monkeypatch, capsys)
    assert '"callers" must be an object' in one(report, "policy")["detail"]
    assert by_name(report, "assertions") == []
    world.state.policy_path.unlink()
    world.ceiling_path.write_text('{"version": 1, "max_tools": "all"}')
    code, report = run_doctor(world, monkeypatch, capsys)
    ceiling = one(report, "admin ceiling")
    assert code == 1 and "no call is answered" in ceiling["detail"]


@pytest.mark.slow
def test_files_others_could_have_written_name_the_fix(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A world-writable policy.json and SKILL.md each fail with the exact chmod as the fix."""
    skill = world.task("deploy", "description: d\ntools: [read, exec]")
    skill.chmod(0o666)
    world.policy({"version": 2})
    world.state.policy_path.chmod(0o666)
    code, report = run_doctor(world, monkeypatch, capsys)
    assert code == 1
    policy, tasks = one(report, "policy"), one(report, "tasks")
    assert policy["detail"].startswith(f"{world.state.policy_path}: can be changed by group")
    assert policy["hint"] == f"run `chmod go-w {world.state.policy_path}`"
    assert "no call is answered" in tasks["detail"]
    assert tasks["hint"] == f"run `chmod go-w {skill.resolve()}`"


# --- key expiry -----------------------------------------------------------------------------------

DAY = 24 * 3600


def expiry_of(world: World) -> int:
    return world.keys.current_record.record.not_after


@pytest.mark.slow
@pytest.mark.parametrize(
    ("left", "status", "shown"),
    [
        (30 * DAY - 200, "pass", "(in 30 days); renewed automatically"),
        (6 * DAY + 60, "pass", "(in 6 days)"),
        (6 * DAY - 60, "warn", "(in 6 days); nothing has renewed it"),
        (3600, "warn", "(in 1 hour)"),
        (0, "fail", "expired on 2025-07-15 15:04 UTC (0 hours ago): callers are told you"),
        (-40 * DAY, "fail", "(40 days ago)"),
    ],
)
def test_key_expiry_shows_the_date_and_warns_before_it(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    left: int,
    status: str,
    shown: str,
) -> None:
    """✓ with the date while more than 6 days remain; ! inside 6 days (a running listener
    renews at 7, so nothing is renewing it); ✗ once expired, with the way to a fresh key."""
    world.now = expiry_of(world) - left
    code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "key expiry")
    assert check["status"] == status, check
    assert check["detail"].startswith("encryption key epoch 1 ")
    assert "2025-07-15 15:04 UTC" in check["detail"] and shown in check["detail"]
    if status == "pass":
        assert "hint" not in check
    else:
        assert "agentcall listen" in check["hint"] and "fresh key" in check["hint"]
    assert (code == 1) is (status == "fail")


def test_an_expired_key_of_a_caller_only_installation_is_a_warning(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A caller-only installation is reached only by answers to its own calls, and each call
    renews the key first: expiry is worth knowing, not a failure."""
    world.reconfigure(agent_kind=None)
    world.now = expiry_of(world) + DAY
    code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "key expiry")
    assert (code, check["status"]) == (0, "warn")
    assert check["hint"] == "your next `agentcall call` mints and publishes a fresh one"


@pytest.mark.slow
def test_key_expiry_in_the_text_report(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The text form marks an expired key ✗ and prints the fix under it."""
    world.now = expiry_of(world) + 2 * DAY
    monkeypatch.setattr(doctor, "DEPS", world.deps())
    assert main(["doctor"]) == 1
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("✗ key expiry: "))
    assert lines[at + 1].startswith("    fix: start the listener")


# --- caller-only and terminal safety -------------------------------------------------------------


def test_caller_only_skips_the_answering_side(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.reconfigure(agent_kind=None)
    code, report = run_doctor(world, monkeypatch, capsys)
    assert code == 0
    names = [check["name"] for check in report["checks"]]
    assert names == [n for n in ALL_CHECKS if n not in SKIPPED_WHEN_CALLER_ONLY]
    assert world.runner.ran == [] and "presence" not in world.api.asked
    assert "caller-only" in report["notes"][0]


SKIPPED_WHEN_CALLER_ONLY = {
    "listener service",
    "listener connected",
    "agent",
    "agent login",
    "tool guard",
    "claude settings",
    "kernel read boundary",
    "limits",
}


@pytest.mark.slow
def test_what_others_say_is_made_terminal_safe(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent CLI's or relay's text with escape sequences never reaches the terminal raw."""
    world.runner.answers["auth status"] = done(1, "", "\x1b]0;owned\x07bad\u202e\n")
    monkeypatch.setattr(doctor, "DEPS", world.deps())
    main(["doctor"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    # The whole OSC sequence goes, payload included (agentcall.safetext).
    assert "exited 1: bad" in out and "owned" not in out
    main(["doctor", "--json"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\u202e" in out


def test_help_explains_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["doctor", "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "agentcall doctor --json" in out.split("examples:")[1]


# --- offline delivery ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("enabled", "caller_only", "status", "said"),
    [
        (False, False, "pass", "disabled: calls while you are offline or busy fail"),
        (True, False, "pass", "enabled: the relay keeps calls for you"),
        (True, True, "warn", "enabled, but this installation answers no calls"),
    ],
)
def test_offline_delivery_is_reported_as_the_relay_has_it(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    enabled: bool,
    caller_only: bool,
    status: str,
    said: str,
) -> None:
    """doctor says what the relay holds for this member; a caller-only installation that
    opted in is warned that calls kept for it would expire unanswered."""
    world.api.offline_delivery = enabled
    if caller_only:
        world.reconfigure(agent_kind=None)
    _code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "offline delivery")
    assert check["status"] == status
    assert check["detail"].startswith(said)
    assert "whoami" in world.api.asked


def test_offline_delivery_is_unproven_when_the_relay_cannot_say(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed /v1/me is a warning with its reason, never a guess either way."""
    world.api.fail["whoami"] = RelayUnreachable("no answer from relay.example within 10 s")
    _code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "offline delivery")
    assert check["status"] == "warn"
    assert check["detail"] == "unproven: no answer from relay.example within 10 s"


# --- the recovery code ---------------------------------------------------------------------------


def test_the_recovery_code_is_reported_with_its_date(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """recovery.json's issued_at is shown as a date; nothing else of the file is."""
    world.recovery({"issued_at": 1_764_633_600, "code_id": "do-not-show-me"})
    code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "recovery code")
    assert code == 0 and check["status"] == "pass"
    assert check["detail"].startswith("issued on 2025-12-02 00:00 UTC")
    assert "do-not-show-me" not in json.dumps(report)


def test_no_recovery_code_is_a_warning_naming_the_command(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Absent marker: worth knowing (a lost state directory loses the address), not a failure."""
    (world.state.state_dir / "recovery.json").unlink()
    code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "recovery code")
    assert code == 0 and check["status"] == "warn"
    assert check["detail"] == "no recovery code issued: `agentcall recovery issue` makes one"


@pytest.mark.parametrize(
    ("document", "mode", "said"),
    [
        ("{not json", 0o600, "is not valid JSON"),
        ({"issued_at": "yesterday"}, 0o600, "has no valid issued_at"),
        ({"issued_at": True}, 0o600, "has no valid issued_at"),
        ([1], 0o600, "has no valid issued_at"),
        ({"issued_at": 1_764_633_600}, 0o666, "accessible by group or others"),
    ],
)
def test_a_recovery_marker_that_cannot_be_trusted_is_unproven(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    document: Any,
    mode: int,
    said: str,
) -> None:
    """A malformed marker, or one others could have written, proves nothing either way."""
    world.recovery(document if isinstance(document, (dict, str)) else json.dumps(document), mode)
    _code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "recovery code")
    assert check["status"] == "warn" and check["detail"].startswith("unproven: ")
    assert said in check["detail"]


def test_a_symlinked_recovery_marker_is_not_followed(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"issued_at": 1_764_633_600}))
    planted.chmod(0o600)
    marker = world.state.state_dir / "recovery.json"
    marker.unlink()
    marker.symlink_to(planted)
    _code, report = run_doctor(world, monkeypatch, capsys)
    check = one(report, "recovery code")
    assert check["status"] == "warn" and "symbolic link" in check["detail"]


# --- the published card ---------------------------------------------------------------------------


def test_card_drift_is_reported_with_what_differs(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The relay's card was made before a task was offered: doctor names the task and the fix;
    once the card is published again it passes."""
    published = local_card(world)
    world.api.card = lambda: published
    world.task("review", 'description: "Review a diff"')
    world.policy({"version": 2, "default_offer": ["ask", "review"]})
    check = one(run_doctor(world, monkeypatch, capsys)[1], "card")
    assert check["status"] == "warn"
    assert "task review offered here but not on the published card" in check["detail"]
    assert "agentcall card --publish" in check["hint"]
    world.api.card = lambda: local_card(world, NOW + 60)
    assert one(run_doctor(world, monkeypatch, capsys)[1], "card")["status"] == "pass"


def test_a_card_not_signed_by_this_identity_fails(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    other = install(tmp_path / "other")[2]
    offer = card_cli.local_offer(world.state, load_config(world.state), "test")
    forged = sign_offer(offer, other.identity, ORIGIN, "@acme/ann", NOW)
    world.api.card = lambda: forged
    check = one(run_doctor(world, monkeypatch, capsys)[1], "card")
    assert check["status"] == "fail" and "does not verify" in check["detail"]


def test_no_published_card_or_an_unreachable_one_warns(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.api.card = lambda: None
    check = one(run_doctor(world, monkeypatch, capsys)[1], "card")
    assert check["status"] == "warn" and "no card is published" in check["detail"]
    world.reconfigure(agent_kind=None)  # caller-only: no card is expected
    check = one(run_doctor(world, monkeypatch, capsys)[1], "card")
    assert check["status"] == "pass" and "caller-only" in check["detail"]
    world.reconfigure(agent_kind="claude")
    world.api.fail["get_card"] = ApiError(500, ApiErrorCode.INTERNAL, "boom")
    check = one(run_doctor(world, monkeypatch, capsys)[1], "card")
    assert check["status"] == "warn" and "could not be fetched" in check["detail"]
