"""The state directory: where it is, its modes, atomic private writes, and refused reads."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from agentcall.local.home import Home, HomeError, PrivateFileError


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home.from_environ({"HOME": str(tmp_path / "user")})


def test_state_dir_defaults_under_home(tmp_path: Path) -> None:
    """Without AGENTCALL_HOME the state is $HOME/.agentcall and tasks are under $HOME."""
    got = Home.from_environ({"HOME": str(tmp_path)})
    assert got.state_dir == tmp_path / ".agentcall"
    assert got.tasks_dir == tmp_path / "AgentCall" / "tasks"
    assert got.config_path == tmp_path / ".agentcall" / "config.json"
    assert got.state_db_path == tmp_path / ".agentcall" / "state.sqlite"
    assert got.relay_override is None


def test_agentcall_home_relocates_state_but_not_tasks(tmp_path: Path) -> None:
    """AGENTCALL_HOME moves the state directory; tasks stay under $HOME."""
    got = Home.from_environ({"HOME": str(tmp_path), "AGENTCALL_HOME": str(tmp_path / "s")})
    assert got.state_dir == tmp_path / "s"
    assert got.keys_path == tmp_path / "s" / "keys.json"
    assert got.contacts_path.parent == got.policy_path.parent == tmp_path / "s"
    assert {got.calls_log_path.name, got.tools_log_path.name, got.listener_log_path.name} == {
        "calls.log",
        "tools.log",
        "listener.log",
    }
    assert got.tasks_dir == tmp_path / "AgentCall" / "tasks"


def test_empty_variables_count_as_unset(tmp_path: Path) -> None:
    """An empty AGENTCALL_HOME or AGENTCALL_RELAY is ignored."""
    got = Home.from_environ({"HOME": str(tmp_path), "AGENTCALL_HOME": "", "AGENTCALL_RELAY": ""})
    assert got.state_dir == tmp_path / ".agentcall"
    assert got.relay_override is None


def test_relay_override_is_captured(tmp_path: Path) -> None:
    """AGENTCALL_RELAY is read from the same mapping as the paths."""
    got = Home.from_environ({"HOME": str(tmp_path), "AGENTCALL_RELAY": "https://r.example"})
    assert got.relay_override == "https://r.example"


@pytest.mark.parametrize("name", ["HOME", "AGENTCALL_HOME"])
def test_relative_directories_are_refused(tmp_path: Path, name: str) -> None:
    """A relative path would mean different state for the CLI and the service."""
    environ = {"HOME": str(tmp_path), name: "relative/dir"}
    with pytest.raises(HomeError, match=name):
        Home.from_environ(environ)


def test_missing_home_falls_back_to_the_user_database() -> None:
    """Without HOME the user's home directory comes from the password database."""
    got = Home.from_environ({})
    assert got.user_home == Path(pwd.getpwuid(os.getuid()).pw_dir)


def test_ensure_creates_the_state_dir_0700(home: Home) -> None:
    """The state directory (and missing parents) is created, itself 0700."""
    home.ensure()
    assert mode_of(home.state_dir) == 0o700


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o705, 0o770, 0o777])
def test_ensure_refuses_a_state_dir_others_can_use(home: Home, mode: int) -> None:
    """A state directory with group or other bits is refused with the chmod, not tightened."""
    home.state_dir.mkdir(parents=True)
    os.chmod(home.state_dir, mode)
    with pytest.raises(PrivateFileError, match=f"run `chmod 700 {home.state_dir}`"):
        home.ensure()
    assert mode_of(home.state_dir) == mode


def test_ensure_gives_the_owner_back_their_own_bits(home: Home) -> None:
    """Only a dir missing some of the owner's own bits is set to 0700."""
    home.state_dir.mkdir(parents=True)
    os.chmod(home.state_dir, 0o500)
    home.ensure()
    assert mode_of(home.state_dir) == 0o700


def test_read_private_refuses_a_file_in_a_state_dir_others_can_use(home: Home) -> None:
    """A 0600 config.json in a loose state directory is refused: it could have been replaced."""
    home.write_private(home.config_path, b"{}")
    os.chmod(home.state_dir, 0o755)
    with pytest.raises(PrivateFileError, match=f"{home.state_dir}: is accessible by group"):
        home.read_private(home.config_path)


def test_ensure_refuses_a_file_in_the_way(home: Home) -> None:
    """A regular file where the directory should be is refused, naming the path."""
    home.state_dir.parent.mkdir(parents=True)
    home.state_dir.write_text("x")
    with pytest.raises((PrivateFileError, HomeError), match=str(home.state_dir)):
        home.ensure()


def test_ensure_refuses_a_dir_owned_by_someone_else(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state directory of another user is not ours to use."""
    home.ensure()
    monkeypatch.setattr(os, "getuid", lambda: os.stat(home.state_dir).st_uid + 1)
    with pytest.raises(PrivateFileError, match="not by you"):
        home.ensure()


def test_write_private_is_0600_even_with_an_open_umask(home: Home) -> None:
    """New private files are 0600 whatever the umask."""
    old = os.umask(0)
    try:
        home.write_private(home.config_path, b"{}")
    finally:
        os.umask(old)
    assert mode_of(home.config_path) == 0o600
    assert mode_of(home.state_dir) == 0o700
    assert home.read_private(home.config_path) == b"{}"


def test_write_private_replaces_and_leaves_no_temp_files(home: Home) -> None:
    """A rewrite replaces the content and leaves only the target in the directory."""
    home.write_private(home.config_path, b"one")
    home.write_private(home.config_path, b"two")
    assert home.read_private(home.config_path) == b"two"
    assert sorted(os.listdir(home.state_dir)) == ["config.json"]


def test_write_private_tightens_a_loose_existing_file(home: Home) -> None:
    """Replacing a 0644 file yields a 0600 file (a new inode, not a chmod of the old)."""
    home.ensure()
    home.config_path.write_bytes(b"old")
    os.chmod(home.config_path, 0o644)
    home.write_private(home.config_path, b"new")
    assert mode_of(home.config_path) == 0o600


def test_failed_write_keeps_the_old_file_and_no_temp(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the final rename fails, the old content stays and the temp file is removed."""
    home.write_private(home.config_path, b"old")

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        home.write_private(home.config_path, b"new")
    monkeypatch.undo()
    assert home.read_private(home.config_path) == b"old"
    assert sorted(os.listdir(home.state_dir)) == ["config.json"]


def test_exclusive_write_never_replaces(home: Home) -> None:
    """With exclusive=True an existing file is kept and no temp file is left."""
    home.write_private(home.keys_path, b"first", exclusive=True)
    with pytest.raises(FileExistsError):
        home.write_private(home.keys_path, b"second", exclusive=True)
    assert home.read_private(home.keys_path) == b"first"
    assert sorted(os.listdir(home.state_dir)) == ["keys.json"]


def test_read_private_missing_file_is_file_not_found(home: Home) -> None:
    """A missing file is left for the caller to interpret."""
    home.ensure()
    with pytest.raises(FileNotFoundError):
        home.read_private(home.config_path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o620, 0o602])
def test_read_private_refuses_group_or_world_access(home: Home, mode: int) -> None:
    """Any group or other permission bit is refused, with the chmod that fixes it."""
    home.write_private(home.config_path, b"secret")
    os.chmod(home.config_path, mode)
    with pytest.raises(PrivateFileError) as info:
        home.read_private(home.config_path)
    assert str(home.config_path) in str(info.value)
    assert f"chmod 600 {home.config_path}" in str(info.value)
    assert "secret" not in str(info.value)


def test_read_private_refuses_a_symlink(home: Home) -> None:
    """A symlink is refused even when it points at a proper 0600 file."""
    home.write_private(home.state_dir / "real.json", b"{}")
    home.config_path.symlink_to(home.state_dir / "real.json")
    with pytest.raises(PrivateFileError, match="symbolic link"):
        home.read_private(home.config_path)


def test_read_private_refuses_a_directory(home: Home) -> None:
    """A directory in a file's place is refused."""
    home.ensure()
    home.config_path.mkdir(mode=0o700)
    with pytest.raises(PrivateFileError, match="not a regular file"):
        home.read_private(home.config_path)


def test_read_private_refuses_a_fifo_without_blocking(home: Home) -> None:
    """A FIFO is refused at once instead of waiting for a writer."""
    home.ensure()
    os.mkfifo(home.config_path, 0o600)
    with pytest.raises(PrivateFileError, match="not a regular file"):
        home.read_private(home.config_path)


def test_read_private_refuses_a_file_of_another_user(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file owned by someone else is refused, naming both owners."""
    home.write_private(home.config_path, b"{}")
    owner = os.stat(home.config_path).st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)
    with pytest.raises(PrivateFileError, match=f"owned by uid {owner}, not by you"):
        home.read_private(home.config_path)


def test_create_private_makes_an_empty_0600_file_once(home: Home) -> None:
    """create_private makes the file 0600 and leaves existing content alone."""
    path = home.state_db_path
    home.create_private(path)
    assert mode_of(path) == 0o600
    path.write_bytes(b"kept")
    home.create_private(path)
    assert path.read_bytes() == b"kept"


def test_create_private_refuses_a_loose_or_linked_file(home: Home) -> None:
    """create_private applies the same checks as read_private."""
    home.ensure()
    home.state_db_path.write_bytes(b"")
    os.chmod(home.state_db_path, 0o644)
    with pytest.raises(PrivateFileError, match="chmod 600"):
        home.create_private(home.state_db_path)
    home.state_db_path.unlink()
    home.state_db_path.symlink_to(home.state_dir / "elsewhere")
    with pytest.raises(PrivateFileError, match="symbolic link"):
        home.create_private(home.state_db_path)


def test_problems_empty_for_a_clean_or_missing_home(home: Home) -> None:
    """Nothing is reported before setup, nor for private files that are correct."""
    assert home.private_file_problems() == []
    home.write_private(home.config_path, b"{}")
    home.write_private(home.keys_path, b"{}")
    assert home.private_file_problems() == []


def test_problems_list_every_unsafe_file(home: Home) -> None:
    """A loose directory, a loose file and a symlink are each reported with a fix."""
    home.write_private(home.config_path, b"{}")
    os.chmod(home.config_path, 0o644)
    home.write_private(home.state_dir / "real", b"")
    home.contacts_path.symlink_to(home.state_dir / "real")
    os.chmod(home.state_dir, 0o755)
    problems = {problem.path: problem for problem in home.private_file_problems()}
    assert set(problems) == {home.state_dir, home.config_path, home.contacts_path}
    assert "chmod 700" in problems[home.state_dir].fix
    assert "chmod 600" in problems[home.config_path].fix
    assert "symbolic link" in str(problems[home.contacts_path])
