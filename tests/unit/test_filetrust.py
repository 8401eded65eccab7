"""Whether a file may be trusted: the pure decisions, exhaustively, then the thin I/O."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcall.filetrust import (
    FileTrust,
    PrivateFileError,
    database_directory_problem,
    link_problem,
    mode_problem,
    prepare_database_file,
    read_trusted,
    trusted_problem,
)

ME, SOMEONE = 1000, 1001
PATH = Path("/home/me/.agentcall/policy.json")
BASE = Path("/home/me/.agentcall")
IS_ROOT = os.getuid() == 0


def judged(permissions: int, *, trust: FileTrust, directory: bool = False, uid: int = ME) -> str:
    kind = stat.S_IFDIR if directory else stat.S_IFREG
    problem = mode_problem(
        PATH, mode=kind | permissions, uid=uid, my_uid=ME, trust=trust, directory=directory
    )
    return "" if problem is None else str(problem)


@pytest.mark.parametrize("permissions", range(0o1000))
@pytest.mark.parametrize("directory", [False, True])
def test_every_mode_is_judged_by_who_else_may_read_or_write(
    permissions: int, directory: bool
) -> None:
    """PRIVATE refuses any group/other bit; OWNED refuses only group/other write."""
    private = judged(permissions, trust=FileTrust.PRIVATE, directory=directory)
    owned = judged(permissions, trust=FileTrust.OWNED, directory=directory)
    assert (private != "") == bool(permissions & 0o077)
    assert (owned != "") == bool(permissions & 0o022)
    if private:
        assert f"chmod {'700' if directory else '600'} {PATH}" in private
    if owned:
        assert f"`chmod go-w {PATH}`" in owned


@pytest.mark.parametrize("trust", list(FileTrust))
def test_another_owner_is_refused_with_the_chown_that_fixes_it(trust: FileTrust) -> None:
    """Even a 0600 file is not ours when someone else owns it."""
    message = judged(0o600, trust=trust, uid=SOMEONE)
    assert f"owned by uid {SOMEONE}, not by you (uid {ME})" in message
    assert f"sudo chown {ME} {PATH}" in message


@pytest.mark.parametrize(
    ("kind", "directory", "expected"),
    [
        (stat.S_IFDIR, False, "not a regular file"),
        (stat.S_IFIFO, False, "not a regular file"),
        (stat.S_IFREG, True, "not a directory"),
        (stat.S_IFLNK, False, "symbolic link"),
        (stat.S_IFLNK, True, "symbolic link"),
    ],
)
def test_the_wrong_kind_of_file_is_refused(kind: int, directory: bool, expected: str) -> None:
    """A FIFO, a directory for a file (or the reverse) or an unfollowed link is refused."""
    for trust in FileTrust:
        problem = mode_problem(
            PATH, mode=kind | 0o600, uid=ME, my_uid=ME, trust=trust, directory=directory
        )
        assert problem is not None and expected in problem.problem


def test_a_followed_link_names_its_target_in_the_problem_and_the_fix() -> None:
    """The owner sees the name they know and the real file the command must change."""
    target = BASE / "policies" / "work.json"
    problem = mode_problem(
        PATH, mode=stat.S_IFREG | 0o666, uid=ME, my_uid=ME, trust=FileTrust.OWNED, target=target
    )
    assert problem is not None and problem.path == PATH
    assert problem.problem.startswith(f"links to {target}, which can be changed")
    assert problem.fix == f"run `chmod go-w {target}`"


@pytest.mark.parametrize(
    ("target", "allowed"),
    [
        (BASE / "policies" / "work.json", True),
        (BASE / "other.json", True),
        (Path("/tmp/policy.json"), False),
        (Path("/home/me/policy.json"), False),
        (Path("/home/me/.agentcall-evil/policy.json"), False),
    ],
)
def test_an_owned_link_may_lead_only_inside_its_base(target: Path, allowed: bool) -> None:
    """A symlink staying in the directory is followed; one leaving it is refused with a fix."""
    problem = link_problem(PATH, target=target, base=BASE, trust=FileTrust.OWNED)
    assert (problem is None) == allowed
    if problem is not None:
        assert f"outside {BASE}" in problem.problem
        assert f"rm {PATH} && cp {target} {PATH}" in problem.fix


def test_a_private_file_is_never_read_through_a_link() -> None:
    """Secrets keep their stricter rule: no symlink at all, even inside the directory."""
    problem = link_problem(PATH, target=BASE / "x", base=BASE, trust=FileTrust.PRIVATE)
    assert problem is not None and problem.problem == "is a symbolic link"


# --- the thin I/O, on real files ------------------------------------------------------------


@pytest.fixture
def base(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    return directory


def a_file(path: Path, mode: int = 0o644, text: str = "{}") -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o644, 0o640, 0o604, 0o400])
def test_a_file_only_we_can_write_is_read(base: Path, mode: int) -> None:
    """Readable by others is fine for an owned file."""
    assert read_trusted(a_file(base / "policy.json", mode), base, limit=100) == b"{}"


@pytest.mark.parametrize("mode", [0o666, 0o646, 0o662, 0o620, 0o602])
def test_a_file_others_can_write_is_refused(base: Path, mode: int) -> None:
    """World- or group-writable: refused, naming the file and the chmod."""
    path = a_file(base / "policy.json", mode)
    with pytest.raises(PrivateFileError, match="can be changed by group or others") as caught:
        read_trusted(path, base, limit=100)
    assert caught.value.path == path and caught.value.fix == f"run `chmod go-w {path}`"


@pytest.mark.skipif(not IS_ROOT, reason="making a file of another user needs root")
def test_a_file_of_another_user_is_refused(base: Path) -> None:
    """A file chowned to nobody (65534) is not ours, whatever its mode."""
    path = a_file(base / "policy.json", 0o600)
    os.chown(path, 65534, -1)
    with pytest.raises(PrivateFileError, match="owned by uid 65534, not by you"):
        read_trusted(path, base, limit=100)


def test_a_link_leaving_the_directory_is_refused(base: Path, tmp_path: Path) -> None:
    """Even to a perfectly good file of ours: the place it points to is not guarded."""
    outside = a_file(tmp_path / "elsewhere.json", 0o600)
    link = base / "policy.json"
    link.symlink_to(outside)
    with pytest.raises(PrivateFileError, match=r"is a symbolic link to .* outside") as caught:
        read_trusted(link, base, limit=100)
    assert f"rm {link} && cp {outside.resolve()} {link}" in caught.value.fix


def test_a_link_staying_inside_the_directory_is_followed(base: Path) -> None:
    """Inside the base, a link reads its target, which must pass the same checks."""
    (base / "policies").mkdir(mode=0o755)
    target = a_file(base / "policies" / "work.json", 0o600, '{"v": 1}')
    link = base / "policy.json"
    link.symlink_to(target)
    assert read_trusted(link, base, limit=100) == b'{"v": 1}'
    target.chmod(0o666)
    with pytest.raises(PrivateFileError, match=f"links to {target.resolve()}, which can be"):
        read_trusted(link, base, limit=100)


def test_a_link_through_a_directory_others_can_write_is_refused(base: Path) -> None:
    """Whoever can write a directory on the way could swap the target."""
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    link = base / "policy.json"
    link.symlink_to(a_file(shared / "work.json", 0o600))
    with pytest.raises(PrivateFileError, match=f"chmod go-w {shared.resolve()}"):
        read_trusted(link, base, limit=100)


def test_a_missing_file_or_target_is_file_not_found(base: Path) -> None:
    """Missing is the caller's to interpret (policy.json: the default policy)."""
    with pytest.raises(FileNotFoundError):
        read_trusted(base / "policy.json", base, limit=100)
    (base / "dangling").symlink_to(base / "nowhere")
    with pytest.raises(FileNotFoundError):
        read_trusted(base / "dangling", base, limit=100)


def test_a_directory_is_checked_like_a_file(base: Path) -> None:
    """A task directory: ours and not writable by others."""
    task = base / "ci"
    task.mkdir(mode=0o755)
    assert trusted_problem(task, base, directory=True) is None
    task.chmod(0o775)
    problem = trusted_problem(task, base, directory=True)
    assert problem is not None and problem.fix == f"run `chmod go-w {task}`"


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("open_umask")
def test_a_new_database_file_is_0600_whatever_the_umask(base: Path) -> None:
    """Created before SQLite would create it with the umask's mode."""
    path = base / "relay.sqlite"
    prepare_database_file(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    prepare_database_file(":memory:")


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm"])
def test_a_database_others_can_write_is_refused(base: Path, suffix: str) -> None:
    """The database or either side file, writable by others, is refused with the chmod."""
    path = a_file(base / "relay.sqlite", 0o600, "")
    side = a_file(base / f"relay.sqlite{suffix}", 0o666, "")
    with pytest.raises(PrivateFileError, match=f"chmod go-w {side}"):
        prepare_database_file(path)


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775, 0o757])
def test_a_database_in_a_directory_others_can_add_files_to_is_refused(
    base: Path, mode: int
) -> None:
    """Whoever can add files there can swap the database or plant its -wal before SQLite;
    a sticky directory such as /tmp does not stop the planting."""
    base.chmod(mode)
    with pytest.raises(PrivateFileError, match=f"chmod go-w {base}"):
        prepare_database_file(base / "relay.sqlite")
    assert not (base / "relay.sqlite").exists()


def test_the_database_directory_rule() -> None:
    """Ours or root's, and writable by nobody else; the fix is named."""
    here = Path("/srv/relay")
    directory = stat.S_IFDIR
    assert database_directory_problem(here, mode=directory | 0o755, uid=7, my_uid=7) is None
    assert database_directory_problem(here, mode=directory | 0o700, uid=0, my_uid=7) is None
    other = database_directory_problem(here, mode=directory | 0o700, uid=8, my_uid=7)
    assert other is not None and "uid 8" in other.problem and "chown 7" in other.fix
    loose = database_directory_problem(here, mode=directory | 0o1777, uid=0, my_uid=7)
    assert loose is not None and "mode 1777" in loose.problem
    not_dir = database_directory_problem(here, mode=stat.S_IFREG | 0o700, uid=7, my_uid=7)
    assert not_dir is not None and "not a directory" in not_dir.problem
