"""`agentcall config get|set|unset`: the settings validated as setup validates them, written
atomically and 0600, hostile files and values refused with nothing lost."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from agentcall.cli import config as config_cli
from agentcall.cli.config import ConfigDeps
from agentcall.cli.main import main
from agentcall.local.config import load_config
from agentcall.local.home import Home
from agentcall.testing.tlsca import make_ca
from agentcall.wire.http import AgentKind
from tests.unit.cli_helpers import TOKEN, install, isolate

PROGRAMS = {"claude": "/opt/claude/bin/claude", "codex": "/opt/codex/bin/codex"}


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Home:
    user_home = isolate(monkeypatch, tmp_path)
    state, _config, _keys = install(user_home)
    deps = ConfigDeps(which=PROGRAMS.get, environ={"HOME": str(user_home)})
    monkeypatch.setattr(config_cli, "DEPS", deps)
    return state


def config(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["config", *argv])
    out, err = capsys.readouterr()
    assert TOKEN not in out + err
    return code, out, err


def file_bytes(home: Home) -> bytes:
    return home.config_path.read_bytes()


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


# --- get ---------------------------------------------------------------------------------------


def test_get_prints_every_setting_and_never_the_token(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    """No key: one line per setting, in order; --json: the same as one object, null unset."""
    code, out, _err = config(capsys, "get")
    assert code == 0
    assert out.splitlines() == [
        "agent: claude",
        "agent-command: (not set)",
        "ca-file: (not set)",
        f"workdir: {home.user_home}",
    ]
    code, out, _err = config(capsys, "get", "--json")
    assert json.loads(out) == {
        "agent": "claude",
        "agent-command": None,
        "ca-file": None,
        "workdir": str(home.user_home),
    }
    assert config(capsys, "get", "agent")[1] == "claude\n"
    assert json.loads(config(capsys, "get", "ca-file", "--json")[1]) == {"ca-file": None}
    assert config(capsys, "get", "ca_file")[1] == ""  # config.json's name is understood


@pytest.mark.parametrize(
    ("key", "needle"),
    [
        ("token", "agentcall token rotate"),
        ("role", "agentcall members role"),
        ("handle", "AGENTCALL_HOME"),
        ("colour", "the settings are agent, agent-command, ca-file, workdir"),
    ],
)
def test_keys_that_are_not_settings_are_usage_errors_with_the_way_instead(
    home: Home, capsys: pytest.CaptureFixture[str], key: str, needle: str
) -> None:
    """An unknown key, or a field of config.json that is not a setting, exits 2 and says
    where that value is changed; the token's value is never shown."""
    before = file_bytes(home)
    for argv in (["get", key], ["set", key, "x"]):
        with pytest.raises(SystemExit) as exited:
            main(["config", *argv])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert needle in err and TOKEN not in err
    assert file_bytes(home) == before


# --- set: the agent ----------------------------------------------------------------------------


def test_set_agent_writes_atomically_0600_and_says_to_restart(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    """The new agent is saved (the rest of the file untouched), the file stays 0600, and the
    person is told the running listener keeps the old one until restarted."""
    code, out, _err = config(capsys, "set", "agent", "codex")
    assert code == 0
    saved = load_config(home)
    assert saved.agent_kind is AgentKind.CODEX and saved.token == TOKEN
    assert stat.S_IMODE(os.stat(home.config_path).st_mode) == 0o600
    assert "agent: codex (was claude)" in out
    assert "until it is restarted" in out and "agentcall listen" in out
    assert list(home.state_dir.glob(".config.json.*")) == []  # no temporary left behind
    # Setting the same value again changes nothing.
    before = file_bytes(home)
    assert "(unchanged)" in config(capsys, "set", "agent", "codex")[1]
    assert file_bytes(home) == before


def test_with_a_unit_installed_the_restart_command_is_systemctl(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    unit = home.user_home / ".config" / "systemd" / "user" / "agentcall-listener.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Unit]\n")
    out = config(capsys, "set", "agent", "codex")[1]
    assert "`systemctl --user restart agentcall-listener`" in out


def test_agent_command_is_split_made_absolute_and_makes_the_agent_command(
    home: Home, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """As setup's --agent-command: shlex-split, the program resolved; kind becomes command,
    and `set agent claude` later drops the command again."""
    program = executable(tmp_path / "bin" / "my agent")
    code, out, _err = config(capsys, "set", "agent-command", f"'{program}' --quiet 'two words'")
    assert code == 0, out
    saved = load_config(home)
    assert saved.agent_kind is AgentKind.COMMAND
    assert saved.agent_command == (str(program), "--quiet", "two words")
    assert "agent: command (was claude)" in out
    assert config(capsys, "get", "agent-command")[1].strip() == (f"'{program}' --quiet 'two words'")
    # `set agent command` keeps the command, checked again: gone, it is refused.
    assert "(unchanged)" in config(capsys, "set", "agent", "command")[1]
    program.unlink()
    code, _out, err = config(capsys, "set", "agent", "command")
    assert code == 1 and "is not an executable program" in err
    assert config(capsys, "set", "agent", "claude")[0] == 0
    saved = load_config(home)
    assert (saved.agent_kind, saved.agent_command) == (AgentKind.CLAUDE, None)


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["set", "agent", "gemini"], 2, "is not one of claude, codex, command"),
        (["set", "agent", "none"], 2, "caller-only installation is chosen at setup"),
        (["set", "agent", "command"], 2, "agentcall config set agent-command"),
        (["set", "agent-command", "'unclosed"], 2, "cannot split"),
        (["set", "agent-command", ""], 2, 'expected "CMD ARGS"'),
        (["set", "agent-command", "''"], 1, "is not an executable program"),
        (["set", "agent-command", "nosuchprogram --x"], 1, "is not an executable program"),
        (["set", "agent-command", "/etc"], 1, "is not an executable program"),
        (["unset", "agent"], 2, "cannot be unset"),
    ],
)
def test_bad_agent_values_are_refused_and_nothing_changes(
    home: Home, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, needle: str
) -> None:
    before = file_bytes(home)
    got, _out, err = config(capsys, *argv)
    assert (got, needle in err) == (code, True), err
    assert file_bytes(home) == before


def test_an_agent_missing_from_path_is_refused(
    home: Home, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As setup: an agent that is not on PATH is not saved to fail at the first call."""
    deps = ConfigDeps(
        which={"claude": "/usr/bin/claude"}.get, environ={"HOME": str(home.user_home)}
    )
    monkeypatch.setattr(config_cli, "DEPS", deps)
    before = file_bytes(home)
    code, _out, err = config(capsys, "set", "agent", "codex")
    assert code == 1 and "`codex` was not found on PATH" in err
    assert file_bytes(home) == before


def test_a_caller_only_installation_is_told_how_to_start_a_listener(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    import attrs

    from agentcall.local.config import save_config

    save_config(home, attrs.evolve(load_config(home), agent_kind=None))
    assert "agent: none (caller-only" in config(capsys, "get")[1]
    code, out, _err = config(capsys, "set", "agent", "claude")
    assert code == 0 and "`agentcall setup --resume` installs and starts" in out


# --- set: the CA file --------------------------------------------------------------------------


def test_ca_file_must_be_a_pem_file_and_the_listener_takes_it_at_its_next_connection(
    home: Home, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ca_file = str(make_ca(tmp_path / "ca").cert_file)
    code, out, _err = config(capsys, "set", "ca-file", ca_file)
    assert code == 0
    assert load_config(home).ca_file == ca_file
    assert "next connection to the relay" in out
    code, out, _err = config(capsys, "unset", "ca-file")
    assert code == 0 and load_config(home).ca_file is None
    assert "ca-file: (not set) (was" in out


@pytest.mark.parametrize("what", ["missing", "directory", "not pem", "empty"])
def test_a_bad_ca_file_is_refused(
    home: Home, capsys: pytest.CaptureFixture[str], tmp_path: Path, what: str
) -> None:
    path = tmp_path / "ca.pem"
    if what == "directory":
        path.mkdir()
    elif what == "not pem":
        path.write_text("hello, I am not a certificate\n")
    elif what == "empty":
        path.write_text("")
    before = file_bytes(home)
    code, _out, err = config(capsys, "set", "ca-file", str(path))
    assert code == 1 and err.startswith("agentcall: ca-file: ")
    assert file_bytes(home) == before


# --- set: the workdir --------------------------------------------------------------------------


def test_workdir_replaces_the_first_read_root(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    """The workdir becomes the first read root (what calls run in); unset goes back home."""
    project = home.user_home / "src" / "project"
    project.mkdir(parents=True)
    code, out, _err = config(capsys, "set", "workdir", "~/src/project")
    assert code == 0
    assert load_config(home).read_roots == (str(project),)
    assert f"workdir: {project} (was {home.user_home})" in out
    assert config(capsys, "unset", "workdir")[0] == 0
    assert load_config(home).read_roots == (str(home.user_home),)


def test_a_workdir_change_that_strands_a_task_is_warned_about(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task whose own workdir is no longer inside a read root stops loading: said at once."""
    (home.user_home / "elsewhere").mkdir()
    (home.user_home / "project").mkdir()
    skill = home.tasks_dir / "build" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text(
        f"---\ndescription: build it\nworkdir: {home.user_home / 'elsewhere'}\n---\nBuild.\n"
    )
    out = config(capsys, "set", "workdir", str(home.user_home / "project"))[1]
    assert "warning:" in out and "not inside any of your read roots" in out


@pytest.mark.parametrize("where", ["state dir", "inside state dir", "tasks dir", "link to state"])
def test_a_workdir_that_would_expose_keys_or_tasks_is_refused(
    home: Home, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """The state directory (keys, token) and the tasks directory are never a workdir, also not
    through a symlink that leads there."""
    home.tasks_dir.mkdir(parents=True)
    inner = home.state_dir / "sub"
    inner.mkdir()
    target = {
        "state dir": home.state_dir,
        "inside state dir": inner,
        "tasks dir": home.tasks_dir,
        "link to state": home.user_home / "innocent",
    }[where]
    if where == "link to state":
        target.symlink_to(home.state_dir)
    before = file_bytes(home)
    code, _out, err = config(capsys, "set", "workdir", str(target))
    assert code == 1 and "is inside" in err
    assert file_bytes(home) == before


@pytest.mark.parametrize("value", ["/no/such/dir", "relative-missing", "/etc/hostname"])
def test_a_workdir_must_be_an_existing_directory(
    home: Home, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    code, _out, err = config(capsys, "set", "workdir", value)
    assert code == 1 and "is not an existing directory" in err


# --- hostile files -----------------------------------------------------------------------------


def test_a_config_others_could_write_is_refused_not_rewritten(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config.json group or others can use is not trusted (nor silently tightened)."""
    home.config_path.chmod(0o666)
    before = file_bytes(home)
    code, _out, err = config(capsys, "set", "agent", "codex")
    assert code == 1 and "chmod 600" in err
    assert file_bytes(home) == before
    assert stat.S_IMODE(os.stat(home.config_path).st_mode) == 0o666
    assert config(capsys, "get")[0] == 1


def test_a_symlinked_config_is_refused_and_its_target_untouched(
    home: Home, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """config.json as a link (to a file someone else placed) is never followed or written."""
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_bytes(file_bytes(home))
    elsewhere.chmod(0o600)
    home.config_path.unlink()
    home.config_path.symlink_to(elsewhere)
    code, _out, err = config(capsys, "set", "agent", "codex")
    assert code == 1 and "symbolic link" in err
    assert home.config_path.is_symlink()
    assert json.loads(elsewhere.read_text())["agent_kind"] == "claude"


def test_a_hand_edited_config_with_an_unknown_field_is_refused_naming_it(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(file_bytes(home))
    data["agnet_kind"] = "codex"
    home.config_path.write_text(json.dumps(data))
    code, _out, err = config(capsys, "set", "agent", "codex")
    assert code == 1 and "agnet_kind" in err
    assert json.loads(file_bytes(home)) == data


def test_agentcall_relay_is_never_written_into_the_file(
    home: Home, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    environ = {"HOME": str(home.user_home), "AGENTCALL_RELAY": "https://other.example"}
    monkeypatch.setattr(config_cli, "DEPS", ConfigDeps(which=PROGRAMS.get, environ=environ))
    assert config(capsys, "set", "agent", "codex")[0] == 0
    assert json.loads(file_bytes(home))["relay_url"] == "https://relay.example"


def test_not_set_up_says_how_to_set_up(home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    home.config_path.unlink()
    code, _out, err = config(capsys, "get")
    assert code == 1 and "agentcall setup --invite" in err
