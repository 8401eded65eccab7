"""`agentcall uninstall`: the service first, keys only once asked, nothing but agentcall's own
files, and what stays on the relay said."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from agentcall.cli import uninstall as uninstall_cli
from agentcall.cli.main import main
from agentcall.cli.uninstall import UninstallDeps
from agentcall.local.home import Home
from tests.unit.cli_helpers import TOKEN, install, isolate

UNIT = "agentcall-listener.service"


@attrs.define
class FakeSystemctl:
    """`systemctl --user`: answers every call (or none, without systemd), records them."""

    available: bool = True
    fail: str | None = None
    calls: list[tuple[str, ...]] = attrs.field(factory=list)

    def __call__(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(tuple(args))
        ok = self.available and args[0] != self.fail
        return subprocess.CompletedProcess(list(args), 0 if ok else 1, "", "" if ok else "no bus")


@attrs.define
class World:
    home: Home
    systemctl: FakeSystemctl
    terminal: bool = False
    running: bool = False
    answers: list[str] = attrs.field(factory=list)
    asked: list[str] = attrs.field(factory=list)

    def deps(self) -> UninstallDeps:
        def ask(prompt: str) -> str:
            self.asked.append(prompt)
            if not self.answers:
                raise EOFError  # as input() at the end of input
            return self.answers.pop(0)

        return UninstallDeps(
            systemctl=self.systemctl,
            environ={"HOME": str(self.home.user_home)},
            is_terminal=lambda: self.terminal,
            ask=ask,
            listener_running=lambda _home: self.running,
        )

    @property
    def unit(self) -> Path:
        return self.home.user_home / ".config" / "systemd" / "user" / UNIT

    def install_unit(self) -> None:
        self.unit.parent.mkdir(parents=True, exist_ok=True)
        self.unit.write_text("[Unit]\n")


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> World:
    state, _config, _keys = install(isolate(monkeypatch, tmp_path))
    made = World(state, FakeSystemctl())
    made.install_unit()
    state.calls_log_path.write_text("{}\n")
    state.calls_log_path.chmod(0o600)
    monkeypatch.setattr(uninstall_cli, "DEPS", None)
    return made


def uninstall(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    monkeypatch.setattr(uninstall_cli, "DEPS", world.deps())
    code = main(["uninstall", *argv])
    out, err = capsys.readouterr()
    assert TOKEN not in out + err
    return code, out, err


def test_yes_stops_the_service_deletes_the_state_and_says_what_stays_on_the_relay(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The unit is disabled and stopped before any file goes; then keys, config, logs and the
    state directory itself; the tasks stay; the relay note names the admin's command."""
    task = world.home.tasks_dir / "review" / "SKILL.md"
    task.parent.mkdir(parents=True)
    task.write_text("---\ndescription: x\n---\n")
    code, out, _err = uninstall(world, monkeypatch, capsys, "--yes")
    assert code == 0, out
    assert ("disable", "--now", UNIT) in world.systemctl.calls
    assert not world.unit.exists()
    assert not world.home.state_dir.exists()
    assert task.exists()
    assert "stopped and removed the listener service" in out
    assert "your tasks in" in out
    assert "your membership @acme/ann and your published keys stay" in out
    assert "`agentcall members remove ann`" in out
    assert world.asked == []


def test_without_a_terminal_it_refuses_and_changes_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = uninstall(world, monkeypatch, capsys)
    assert code == 2 and "--yes" in err and "--keep-keys" in err
    assert world.systemctl.calls == []
    assert world.unit.exists() and world.home.keys_path.exists()


def test_on_a_terminal_it_asks_and_no_means_nothing_changes(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.terminal = True
    world.answers = ["", "yes"]
    code, out, _err = uninstall(world, monkeypatch, capsys)
    assert code == 1 and "nothing was changed" in out
    assert "Delete the keys and state of @acme/ann" in world.asked[0]
    assert world.systemctl.calls == [] and world.home.keys_path.exists()
    code, _out, _err = uninstall(world, monkeypatch, capsys)
    assert code == 0 and not world.home.state_dir.exists()


def test_keep_keys_removes_only_the_service_without_asking(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _err = uninstall(world, monkeypatch, capsys, "--keep-keys")
    assert code == 0
    assert not world.unit.exists()
    assert world.home.keys_path.exists() and world.home.config_path.exists()
    assert "agentcall setup --resume" in out and world.asked == []


def test_without_systemd_the_unit_file_goes_and_the_person_is_told_to_stop_their_own(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.systemctl.available = False
    code, out, _err = uninstall(world, monkeypatch, capsys, "--yes")
    assert code == 0
    assert world.systemctl.calls == [("show-environment",)]
    assert not world.unit.exists() and not world.home.state_dir.exists()
    assert "no systemd user manager answers here" in out and "agentcall listen" in out


def test_a_service_that_cannot_be_stopped_keeps_every_file(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting the keys under a listener that still runs would leave it restarting forever."""
    world.systemctl.fail = "disable"
    code, _out, err = uninstall(world, monkeypatch, capsys, "--yes")
    assert code == 1 and "nothing was deleted" in err
    assert world.home.keys_path.exists() and world.home.config_path.exists()


def test_only_agentcalls_own_files_are_deleted(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:  # fmt: skip
    """A file of someone else's in the state directory, and a symlink's target, survive; the
    directory stays with what is left, which is named."""
    other = world.home.state_dir / "notes.txt"
    other.write_text("mine")
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    world.home.contacts_path.symlink_to(target)
    code, out, _err = uninstall(world, monkeypatch, capsys, "--yes")
    assert code == 0
    assert other.read_text() == "mine" and target.read_text() == "keep me"
    assert not world.home.contacts_path.is_symlink()
    assert not world.home.keys_path.exists() and not world.home.config_path.exists()
    assert "notes.txt" in out


def keep_some_code(world: World) -> Path:
    from agentcall.client import codecache

    directory = codecache.cache_directory(world.home.state_dir)
    assert directory is not None
    codecache.CodeCache(directory).compile("x = 1\n", "<generated x>", "exec")
    assert len(os.listdir(directory)) == 1
    return Path(directory)


def test_the_kept_generated_code_goes_too(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A direct call's code cache (cache/code-*/) is agentcall's own: it goes with the rest,
    and the state directory with it."""
    keep_some_code(world)
    code, _out, _err = uninstall(world, monkeypatch, capsys, "--yes")
    assert code == 0
    assert not world.home.state_dir.exists()


def test_a_file_of_someone_elses_in_the_code_cache_stays(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = keep_some_code(world)
    foreign = world.home.state_dir / "cache" / "theirs.txt"
    foreign.write_text("keep")
    code, out, _err = uninstall(world, monkeypatch, capsys, "--yes")
    assert code == 0
    assert foreign.read_text() == "keep" and not directory.exists()
    assert "cache" in out


def test_a_state_directory_others_can_use_is_refused_before_anything_is_stopped(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.home.state_dir.chmod(0o777)
    try:
        code, _out, err = uninstall(world, monkeypatch, capsys, "--yes")
    finally:
        world.home.state_dir.chmod(0o700)
    assert code == 1 and "not deleting anything" in err
    assert world.systemctl.calls == [] and world.unit.exists()


def test_nothing_installed_is_said_and_succeeds(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert uninstall(world, monkeypatch, capsys, "--yes")[0] == 0
    code, out, _err = uninstall(world, monkeypatch, capsys)
    assert code == 0 and "nothing to uninstall" in out


def test_a_broken_config_still_uninstalls_with_a_general_relay_note(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.home.config_path.write_text("{not json")
    code, out, _err = uninstall(world, monkeypatch, capsys, "--yes")
    assert code == 0 and not world.home.state_dir.exists()
    assert "`agentcall members remove HANDLE`" in out


def test_end_of_input_at_the_prompt_is_a_no(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.terminal = True
    code, out, _err = uninstall(world, monkeypatch, capsys)  # no answers queued: EOF
    assert code == 1 and "nothing was changed" in out and world.home.keys_path.exists()


def test_a_symlinked_state_directory_is_emptied_and_the_link_left(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:  # fmt: skip
    """~/.agentcall as a link into the person's dotfiles: agentcall's files go, the link and
    its target directory stay, and that is said."""
    real = tmp_path / "dotfiles" / "agentcall"
    real.parent.mkdir()
    world.home.state_dir.rename(real)
    world.home.state_dir.symlink_to(real)
    code, out, _err = uninstall(world, monkeypatch, capsys, "--yes")
    assert code == 0
    assert world.home.state_dir.is_symlink() and real.is_dir()
    assert list(real.iterdir()) == []
    assert "the symbolic link" in out


def test_a_listener_still_running_outside_systemd_keeps_the_keys(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A listener answering on service.sock after the unit is gone (a foreground `agentcall
    listen`) holds the keys in memory: they are not deleted under it."""
    world.running = True
    code, _out, err = uninstall(world, monkeypatch, capsys, "--yes")
    assert code == 1 and "a listener still answers" in err and "nothing was deleted" in err
    assert world.home.keys_path.exists() and world.home.config_path.exists()
    world.running = False
    assert uninstall(world, monkeypatch, capsys, "--yes")[0] == 0
    assert not world.home.state_dir.exists()


def test_the_real_probe_sees_a_listening_socket_and_not_a_stale_file(world: World) -> None:
    from agentcall.cli.uninstall import _listener_answers
    from agentcall.local.unixsocket import bind_listening

    assert _listener_answers(world.home) is False
    sock, _identity = bind_listening(world.home.service_socket_path)
    try:
        assert _listener_answers(world.home) is True
    finally:
        sock.close()
    # The file a killed service leaves behind answers nothing.
    assert world.home.service_socket_path.exists()
    assert _listener_answers(world.home) is False
