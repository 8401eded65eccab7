"""Whether a file may be trusted: who owns it, who else may change it, where its links lead.

Two levels (:class:`FileTrust`): a ``PRIVATE`` file (tokens, keys, the state database, logs) must
be ours alone, 0600, and is never read through a symlink; an ``OWNED`` file (the owner's
policy.json and tasks, the relay database) must be ours and not writable by group or others,
may be readable by others, and may be a symlink only when it leads somewhere else inside the
directory that holds it. The decisions are pure functions of
a stat result (:func:`link_problem`, :func:`mode_problem`); the rest is thin I/O around them.
Every refusal names the path and the command that fixes it.
"""

from __future__ import annotations

import enum
import os
import stat
from pathlib import Path

from agentcall.errors import AgentCallError
from agentcall.frozen import Frozen

PRIVATE_FILE_MODE = 0o600


class LocalStateError(AgentCallError):
    """The installation's local files are missing, unsafe or malformed (one-line reason)."""


class PrivateFileError(LocalStateError):
    """A private file or the state directory is not safe to use; the message says the fix."""

    def __init__(self, path: Path, problem: str, fix: str) -> None:
        super().__init__(f"{path}: {problem}; {fix}")
        self.path = path
        self.problem = problem
        self.fix = fix


class PrivateFileProblem(Frozen):
    """One finding of :meth:`Home.private_file_problems`, for ``doctor``."""

    _fields = ("path", "problem", "fix")
    __slots__ = _fields
    path: Path
    problem: str
    fix: str

    def __init__(self, path: Path, problem: str, fix: str) -> None:
        self._set(path=path, problem=problem, fix=fix)

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}; {self.fix}"


class FileTrust(enum.Enum):
    """How far a file must be ours before it is used."""

    # Tokens, keys, the state database and logs: nobody else may read or write them, and a
    # symlink is never followed.
    PRIVATE = "private"
    # The owner's instructions (policy.json, tasks): nobody else may change them, reading is
    # harmless; a symlink may lead elsewhere inside the directory that holds it, never out.
    OWNED = "owned"


def _inside(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


def link_problem(
    path: Path, *, target: Path, base: Path, trust: FileTrust, directory: bool = False
) -> PrivateFileProblem | None:
    """Whether the symlink ``path``, fully resolved to ``target``, may be followed.

    Pure: ``target`` and ``base`` are already resolved. A link that leaves ``base`` would let
    whoever controls the place it points to decide what we read.
    """
    kind = "directory" if directory else "file"
    if trust is FileTrust.PRIVATE:
        return PrivateFileProblem(
            path, "is a symbolic link", f"replace it with the {kind} itself (rm {path}, re-create)"
        )
    if not _inside(target, base):
        copy = "cp -R" if directory else "cp"
        return PrivateFileProblem(
            path,
            f"is a symbolic link to {target}, outside {base}",
            f"check {target}, then replace the link with a copy: "
            f"`rm {path} && {copy} {target} {path}`",
        )
    return None


def mode_problem(
    path: Path,
    *,
    mode: int,
    uid: int,
    my_uid: int,
    trust: FileTrust,
    directory: bool = False,
    target: Path | None = None,
) -> PrivateFileProblem | None:
    """What is wrong with a stat result (``st_mode``, ``st_uid``) for ``path``, if anything.

    Pure. ``target``: where ``path`` leads when it is a symlink that :func:`link_problem`
    allowed; the stat is then the target's, and the fix names the target.
    """
    subject = target if target is not None else path
    via = f"links to {target}, which " if target is not None else ""
    if stat.S_ISLNK(mode):
        kind = "directory" if directory else "file"
        return PrivateFileProblem(
            path, "is a symbolic link", f"replace it with the {kind} itself (rm {path}, re-create)"
        )
    if directory and not stat.S_ISDIR(mode):
        return PrivateFileProblem(path, f"{via}is not a directory", f"move it away ({subject})")
    if not directory and not stat.S_ISREG(mode):
        return PrivateFileProblem(
            path, f"{via}is not a regular file", f"remove it (rm -r {subject})"
        )
    if uid != my_uid:
        return PrivateFileProblem(
            path,
            f"{via}is owned by uid {uid}, not by you (uid {my_uid})",
            f"check who made it, then remove it or run `sudo chown {my_uid} {subject}`",
        )
    permissions = stat.S_IMODE(mode)
    if trust is FileTrust.PRIVATE and permissions & 0o077:
        wanted = "700" if directory else "600"
        return PrivateFileProblem(
            path,
            f"{via}is accessible by group or others (mode {permissions:04o})",
            f"run `chmod {wanted} {subject}`",
        )
    if trust is FileTrust.OWNED and permissions & 0o022:
        return PrivateFileProblem(
            path,
            f"{via}can be changed by group or others (mode {permissions:04o})",
            f"run `chmod go-w {subject}`",
        )
    return None


def private_dir_problem(directory: Path) -> PrivateFileProblem | None:
    """What is wrong with a directory that must be ours alone (0700), if anything.

    :raises FileNotFoundError: there is no such directory.
    """
    st = os.stat(directory)
    return mode_problem(
        directory,
        mode=st.st_mode,
        uid=st.st_uid,
        my_uid=os.getuid(),
        trust=FileTrust.PRIVATE,
        directory=True,
    )


def _follow_trusted(
    path: Path, base: Path, my_uid: int
) -> tuple[Path | None, PrivateFileProblem | None]:
    """Where ``path`` leads if it is a symlink (None if not), and any reason not to follow it.

    :raises FileNotFoundError: nothing is at ``path``.
    """
    if not stat.S_ISLNK(os.lstat(path).st_mode):
        return None, None
    real_base = Path(os.path.realpath(base))
    target = Path(os.path.realpath(path))
    problem = link_problem(path, target=target, base=real_base, trust=FileTrust.OWNED)
    if problem is not None:
        return target, problem
    # Whoever can write a directory between the base and the target can swap the target.
    for directory in reversed(target.parents):
        if directory != real_base and _inside(directory, real_base):
            st = os.lstat(directory)
            problem = mode_problem(
                directory,
                mode=st.st_mode,
                uid=st.st_uid,
                my_uid=my_uid,
                trust=FileTrust.OWNED,
                directory=True,
            )
            if problem is not None:
                return target, problem
    return target, None


def trusted_problem(
    path: Path, base: Path, *, directory: bool = False
) -> PrivateFileProblem | None:
    """Whether ``path`` (a file, or a ``directory``) may be trusted as the owner's own.

    Owned by us, not writable by group or others, and if a symlink, one that stays inside
    ``base``. :raises FileNotFoundError: nothing is at ``path`` (or it leads nowhere).
    """
    my_uid = os.getuid()
    target, problem = _follow_trusted(path, base, my_uid)
    if problem is not None:
        return problem
    st = os.lstat(target if target is not None else path)
    return mode_problem(
        path,
        mode=st.st_mode,
        uid=st.st_uid,
        my_uid=my_uid,
        trust=FileTrust.OWNED,
        directory=directory,
        target=target,
    )


def read_trusted(path: Path, base: Path, *, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of a file of the owner's, if :func:`trusted_problem` passes.

    :raises FileNotFoundError: there is no such file (the caller decides what that means).
    :raises PrivateFileError: it could have been written by someone else.
    """
    my_uid = os.getuid()
    target, problem = _follow_trusted(path, base, my_uid)
    if problem is not None:
        raise PrivateFileError(problem.path, problem.problem, problem.fix)
    real = target if target is not None else path
    # O_NOFOLLOW: a link swapped in after the check is refused; O_NONBLOCK: a FIFO never hangs.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise PrivateFileError(path, f"cannot be read ({exc.strerror})", f"check {real}") from None
    try:
        st = os.fstat(fd)
        problem = mode_problem(
            path,
            mode=st.st_mode,
            uid=st.st_uid,
            my_uid=my_uid,
            trust=FileTrust.OWNED,
            target=target,
        )
        if problem is not None:
            raise PrivateFileError(problem.path, problem.problem, problem.fix)
        chunks = []
        size = 0
        while size <= limit and (chunk := os.read(fd, min(65536, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def create_owned_file(path: Path) -> None:
    """Make sure ``path`` exists as a file of ours that nobody else may write.

    A new file is created empty and 0600; an existing one is only checked (never loosened or
    tightened) against the :attr:`FileTrust.OWNED` rules, symlinks refused.

    :raises PrivateFileError: it exists and is not safe to use.
    """
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except OSError as exc:
        problem = owned_file_problem(path)
        if problem is not None:
            raise PrivateFileError(problem.path, problem.problem, problem.fix) from None
        raise PrivateFileError(path, f"cannot be created ({exc.strerror})", "check it") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    problem = mode_problem(
        path, mode=st.st_mode, uid=st.st_uid, my_uid=os.getuid(), trust=FileTrust.OWNED
    )
    if problem is not None:
        raise PrivateFileError(problem.path, problem.problem, problem.fix)


def owned_file_problem(path: Path) -> PrivateFileProblem | None:
    """What makes an existing ``path`` unsafe under :func:`create_owned_file`'s rules (None if
    it is fine or missing); symlinks are refused, not followed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return mode_problem(
        path, mode=st.st_mode, uid=st.st_uid, my_uid=os.getuid(), trust=FileTrust.OWNED
    )


# SQLite's side files: each holds (or will hold) database content, so each is the database.
_DATABASE_SIDE_FILES = ("-wal", "-shm", "-journal")


def database_directory_problem(
    directory: Path, *, mode: int, uid: int, my_uid: int
) -> PrivateFileProblem | None:
    """Whether the directory holding a database lets someone else swap its files. Pure.

    Whoever can write the directory can replace the database, or plant its -wal or -journal
    file before SQLite makes it, so it must be ours (or root's) and writable by nobody else.
    A sticky world-writable directory such as /tmp is refused too: others can still create
    the side files there first.
    """
    if not stat.S_ISDIR(mode):
        return PrivateFileProblem(directory, "is not a directory", f"move it away ({directory})")
    if uid not in (my_uid, 0):
        return PrivateFileProblem(
            directory,
            f"holds the database but is owned by uid {uid}, not by you (uid {my_uid}) or root",
            f"keep the database in a directory of your own, or run `sudo chown {my_uid} "
            f"{directory}`",
        )
    permissions = stat.S_IMODE(mode)
    if permissions & 0o022:
        return PrivateFileProblem(
            directory,
            f"holds the database but group or others can add files to it (mode {permissions:04o})",
            f"run `chmod go-w {directory}`, or keep the database in a directory of your own",
        )
    return None


def prepare_database_file(path: str | os.PathLike[str]) -> None:
    """Create a SQLite database file 0600 before SQLite does, or check the existing one.

    SQLite gives its -wal, -shm and -journal files the database file's own mode, so a 0600
    database keeps them 0600 too. An existing database (or side file) that group or others
    could write, that someone else owns, or that is a symlink is refused: whoever can write it
    can rewrite every member, token hash and invite in it. So is a directory that others can
    add files to (:func:`database_directory_problem`). ``:memory:`` is left alone.

    :raises PrivateFileError: naming the file and the command that fixes it.
    """
    name = os.fspath(path)
    if name in ("", ":memory:"):
        return
    database = Path(name)
    directory = Path(os.path.abspath(database)).parent
    st = os.stat(directory)
    problem = database_directory_problem(
        directory, mode=st.st_mode, uid=st.st_uid, my_uid=os.getuid()
    )
    if problem is not None:
        raise PrivateFileError(problem.path, problem.problem, problem.fix)
    create_owned_file(database)
    for suffix in _DATABASE_SIDE_FILES:
        problem = owned_file_problem(database.with_name(database.name + suffix))
        if problem is not None:
            raise PrivateFileError(problem.path, problem.problem, problem.fix)
