"""The bridge's token file: made 0600 on first use, rotated whole, and refused when unsafe."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from agentcall.filetrust import PrivateFileError
from agentcall.local import a2atoken
from agentcall.local.home import Home

ROTATE = "agentcall a2a token --rotate"
IS_ROOT = os.getuid() == 0


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home.from_environ({"HOME": str(tmp_path / "user")})


def test_the_first_use_makes_a_private_random_token(home: Home) -> None:
    token = a2atoken.ensure(home)
    path = a2atoken.token_path(home)
    assert path == home.state_dir / "a2a.token"
    assert a2atoken.is_token(token) and len(token) == 43
    assert path.read_text() == token + "\n"
    assert mode_of(path) == 0o600
    assert mode_of(home.state_dir) == 0o700
    assert sorted(p.name for p in home.state_dir.iterdir()) == ["a2a.token"]  # no temporaries
    assert a2atoken.ensure(home) == token
    assert a2atoken.read(home) == token
    assert a2atoken.ensure(Home.from_environ({"HOME": str(home.user_home.parent / "b")})) != token


def test_agentcall_home_moves_the_token(tmp_path: Path) -> None:
    home = Home.from_environ({"HOME": str(tmp_path), "AGENTCALL_HOME": str(tmp_path / "elsewhere")})
    a2atoken.ensure(home)
    assert (tmp_path / "elsewhere" / "a2a.token").is_file()


def test_ensure_keeps_a_token_that_appeared_meanwhile(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two first uses at once: the one that loses the race takes the other's token rather
    than replacing it (a bridge already serving with it would refuse its own clients)."""
    theirs = "o" * 43
    real_read = a2atoken.read
    calls: list[int] = []

    def read_after_a_rival(of: Home) -> str:
        calls.append(1)
        if len(calls) == 1:
            of.write_private(a2atoken.token_path(of), theirs.encode() + b"\n")
            raise FileNotFoundError
        return real_read(of)

    monkeypatch.setattr(a2atoken, "read", read_after_a_rival)
    assert a2atoken.ensure(home) == theirs
    assert a2atoken.token_path(home).read_text() == theirs + "\n"


def test_rotate_replaces_the_token(home: Home) -> None:
    old = a2atoken.ensure(home)
    new = a2atoken.rotate(home)
    assert new != old and a2atoken.is_token(new)
    assert a2atoken.read(home) == new
    assert mode_of(a2atoken.token_path(home)) == 0o600
    assert sorted(p.name for p in home.state_dir.iterdir()) == ["a2a.token"]


def test_rotate_makes_the_first_token_too(home: Home) -> None:
    assert not a2atoken.token_path(home).exists()
    token = a2atoken.rotate(home)
    assert a2atoken.read(home) == token


def _loose(mode: int) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_text("k" * 43 + "\n")
        os.chmod(path, mode)

    return make


def _symlink(path: Path) -> None:
    target = path.parent.parent / "elsewhere.token"
    target.write_text("k" * 43 + "\n")
    os.chmod(target, 0o600)
    os.symlink(target, path)


def _fifo(path: Path) -> None:
    os.mkfifo(path, 0o600)


def _content(data: bytes) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_bytes(data)
        os.chmod(path, 0o600)

    return make


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "readable by others": (_loose(0o644), "accessible by group or others"),
    "readable by the group": (_loose(0o640), "accessible by group or others"),
    "writable by others": (_loose(0o602), "accessible by group or others"),
    "a symlink": (_symlink, "symbolic link"),
    "a fifo": (_fifo, "not a regular file"),
    "empty": (_content(b""), "is empty"),
    "blank": (_content(b"\n \n"), "is empty"),
    "too short": (_content(b"short\n"), "does not hold a bridge token"),
    "two lines": (_content(b"k" * 43 + b"\n" + b"j" * 43 + b"\n"), "does not hold"),
    "trailing spaces": (_content(b"k" * 43 + b"  \n"), "does not hold"),
    "not ascii": (_content(b"k" * 42 + "é".encode() + b"\n"), "does not hold"),
    "a header": (_content(b"Bearer " + b"k" * 43 + b"\n"), "does not hold"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_an_unsafe_or_malformed_file_fails_closed(home: Home, case: str) -> None:
    """Neither read nor ensure uses it or silently replaces it; the error names the file and
    says to rotate (a token others could read stays exposed whatever its mode becomes)."""
    make, problem = HOSTILE[case]
    home.ensure()
    path = a2atoken.token_path(home)
    make(path)
    before = os.lstat(path)
    for use in (a2atoken.read, a2atoken.ensure, lambda h: a2atoken.TokenFile(h).current()):
        with pytest.raises(PrivateFileError) as refused:
            use(home)
        assert refused.value.path == path
        assert problem in refused.value.problem
        assert ROTATE in str(refused.value)
    after = os.lstat(path)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    # The fix it names works.
    token = a2atoken.rotate(home)
    assert a2atoken.read(home) == token
    assert stat.S_ISREG(os.lstat(path).st_mode)


def test_rotate_replaces_a_symlink_and_leaves_its_target_alone(home: Home) -> None:
    home.ensure()
    path = a2atoken.token_path(home)
    _symlink(path)
    target = path.parent.parent / "elsewhere.token"
    a2atoken.rotate(home)
    assert not path.is_symlink()
    assert target.read_text() == "k" * 43 + "\n"


def test_a_directory_in_its_place_says_to_move_it(home: Home) -> None:
    home.ensure()
    path = a2atoken.token_path(home)
    path.mkdir()
    with pytest.raises(PrivateFileError) as refused:
        a2atoken.read(home)
    assert "not a regular file" in refused.value.problem
    assert f"rm -r {path}" in refused.value.fix and ROTATE in refused.value.fix
    with pytest.raises(PrivateFileError, match="is a directory"):
        a2atoken.rotate(home)
    assert path.is_dir()


@pytest.mark.skipif(not IS_ROOT, reason="making a file of another user needs root")
def test_a_file_of_another_user_fails_closed(home: Home) -> None:
    a2atoken.ensure(home)
    path = a2atoken.token_path(home)
    os.chown(path, 65534, -1)
    with pytest.raises(PrivateFileError, match="owned by uid 65534") as refused:
        a2atoken.read(home)
    assert ROTATE in refused.value.fix
    a2atoken.rotate(home)
    assert os.lstat(path).st_uid == os.getuid()


def test_a_loose_state_directory_is_the_directory_s_problem(home: Home) -> None:
    """The error names the directory and its own fix, not a rotation."""
    a2atoken.ensure(home)
    os.chmod(home.state_dir, 0o755)
    with pytest.raises(PrivateFileError) as refused:
        a2atoken.read(home)
    assert refused.value.path == home.state_dir
    assert "chmod 700" in refused.value.fix


# --- a running bridge's view -------------------------------------------------------------------


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []
    real = a2atoken.read

    def counted(home: Home) -> str:
        reads.append(1)
        return real(home)

    monkeypatch.setattr(a2atoken, "read", counted)
    return reads


def test_the_bridge_rereads_only_when_the_file_changes(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = a2atoken.ensure(home)
    tokens = a2atoken.TokenFile(home)
    reads = _counting_reads(monkeypatch)
    assert [tokens.current() for _ in range(5)] == [first] * 5
    assert len(reads) == 1
    second = a2atoken.rotate(home)
    assert tokens.current() == second
    assert tokens.current() == second
    assert len(reads) == 2


def test_the_bridge_sees_a_file_that_turns_unsafe_or_goes(home: Home) -> None:
    a2atoken.ensure(home)
    tokens = a2atoken.TokenFile(home)
    tokens.current()
    path = a2atoken.token_path(home)
    os.chmod(path, 0o644)  # same inode and contents, only the mode changed
    with pytest.raises(PrivateFileError, match="accessible by group or others"):
        tokens.current()
    os.chmod(path, 0o600)
    assert a2atoken.is_token(tokens.current())
    os.chmod(home.state_dir, 0o755)  # the directory loosened
    with pytest.raises(PrivateFileError, match="accessible by group or others"):
        tokens.current()
    os.chmod(home.state_dir, 0o700)
    path.unlink()
    with pytest.raises(PrivateFileError, match="is missing") as refused:
        tokens.current()
    assert ROTATE in refused.value.fix
    new = a2atoken.rotate(home)
    assert tokens.current() == new


def test_a_broken_file_is_not_read_again_until_it_changes(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    home.ensure()
    path = a2atoken.token_path(home)
    _content(b"short\n")(path)
    tokens = a2atoken.TokenFile(home)
    reads = _counting_reads(monkeypatch)
    for _ in range(3):
        with pytest.raises(PrivateFileError, match="does not hold"):
            tokens.current()
    assert len(reads) == 1
    token = a2atoken.rotate(home)
    assert tokens.current() == token
    assert len(reads) == 2
