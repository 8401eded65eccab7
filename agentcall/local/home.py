"""Where an installation keeps its state, and how its private files are written and read.

One installation (one identity) lives in a state directory: ``$AGENTCALL_HOME`` if set,
otherwise ``$HOME/.agentcall``. Authored tasks live outside it, in ``$HOME/AgentCall/tasks``,
because people edit them by hand. Everything is resolved from one environ mapping, so a test (or
a second identity on the same machine) only needs its own ``HOME``.

The state directory is 0700 and every file in it 0600. Reads refuse a file that someone else
could have written or read, rather than trusting it: a token or key that others can read is no
longer secret, and a file others can write is no longer ours. A state directory that group or
others can use is refused too (never silently tightened): anyone could have replaced or removed
a file in it. The rules themselves are in :mod:`agentcall.filetrust`.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path

from agentcall.atomicfile import replace_file
from agentcall.filetrust import (
    PRIVATE_FILE_MODE,
    FileTrust,
    LocalStateError,
    PrivateFileError,
    PrivateFileProblem,
    mode_problem,
    private_dir_problem,
)
from agentcall.frozen import Frozen

# The errors and the file mode live in agentcall.filetrust; most callers know them from here.
__all__ = [
    "PRIVATE_FILE_MODE",
    "STATE_DIR_MODE",
    "FileTrust",
    "Home",
    "HomeError",
    "LocalStateError",
    "PrivateFileError",
    "PrivateFileProblem",
]

STATE_DIR_MODE = 0o700


class HomeError(LocalStateError):
    """The environment does not name a usable state directory."""


def _absolute(name: str, value: str) -> Path:
    # A relative directory would depend on the working directory, which differs between the
    # CLI and the background service: the two would silently use different identities.
    if not os.path.isabs(value):
        raise HomeError(f"{name} must be an absolute path, not {value!r}")
    return Path(os.path.normpath(value))


def _user_home(environ: Mapping[str, str]) -> Path:
    value = environ.get("HOME", "")
    if value:
        return _absolute("HOME", value)
    # Services started without HOME (some init systems) still belong to a user.
    try:
        entry = pwd.getpwuid(os.getuid())
    except KeyError:
        raise HomeError("HOME is not set and this user has no home directory") from None
    return _absolute("the home directory of this user", entry.pw_dir)


def _file_problem(path: Path, st: os.stat_result) -> PrivateFileProblem | None:
    """What is wrong with an lstat/fstat result for a private (secret) file, if anything."""
    return mode_problem(
        path, mode=st.st_mode, uid=st.st_uid, my_uid=os.getuid(), trust=FileTrust.PRIVATE
    )


class Home(Frozen):
    """The paths of one installation, resolved once from an environ mapping.

    A :class:`~agentcall.frozen.Frozen` value rather than attrs: the thin ``agentcall call``
    resolves its service socket from here and does not import attrs."""

    _fields = ("state_dir", "user_home", "relay_override")
    __slots__ = _fields
    state_dir: Path
    user_home: Path
    # AGENTCALL_RELAY, when set: overrides the relay URL in config.json (see config.py). It is
    # captured here so that one environ mapping decides everything about an installation.
    relay_override: str | None

    def __init__(self, state_dir: Path, user_home: Path, relay_override: str | None = None) -> None:
        self._set(state_dir=state_dir, user_home=user_home, relay_override=relay_override)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Home:
        """``$AGENTCALL_HOME`` (else ``$HOME/.agentcall``); empty variables count as unset."""
        user_home = _user_home(environ)
        override = environ.get("AGENTCALL_HOME", "")
        state_dir = _absolute("AGENTCALL_HOME", override) if override else user_home / ".agentcall"
        relay = environ.get("AGENTCALL_RELAY", "") or None
        return cls(state_dir=state_dir, user_home=user_home, relay_override=relay)

    # --- paths -----------------------------------------------------------------------------

    @property
    def tasks_dir(self) -> Path:
        return self.user_home / "AgentCall" / "tasks"

    @property
    def config_path(self) -> Path:
        return self.state_dir / "config.json"

    @property
    def keys_path(self) -> Path:
        return self.state_dir / "keys.json"

    @property
    def recovery_marker_path(self) -> Path:
        """When this installation last issued a recovery code (never the code itself)."""
        return self.state_dir / "recovery.json"

    @property
    def pending_token_path(self) -> Path:
        """The next bearer token while ``agentcall token rotate`` is asking the relay to take
        it; gone once config.json holds it."""
        return self.state_dir / "token.next"

    @property
    def policy_path(self) -> Path:
        return self.state_dir / "policy.json"

    @property
    def contacts_path(self) -> Path:
        return self.state_dir / "contacts.json"

    @property
    def state_db_path(self) -> Path:
        return self.state_dir / "state.sqlite"

    @property
    def calls_log_path(self) -> Path:
        return self.state_dir / "calls.log"

    @property
    def tools_log_path(self) -> Path:
        return self.state_dir / "tools.log"

    @property
    def listener_log_path(self) -> Path:
        return self.state_dir / "listener.log"

    @property
    def service_socket_path(self) -> Path:
        """The running service's private UNIX socket (0600), where a thin ``agentcall call``
        hands its call over (:mod:`agentcall.listener.localsocket`). Its path may be longer than
        a socket address allows: reach it through :func:`agentcall.local.unixsocket.short_name`."""
        return self.state_dir / "service.sock"

    @property
    def live_runs_path(self) -> Path:
        """The markers of the agent runs going now (:mod:`agentcall.listener.orphans`)."""
        return self.state_dir / "runs.live"

    @property
    def service_key_path(self) -> Path:
        """The key a thin client shows the service first (:mod:`agentcall.local.servicekey`):
        written 0600 by the service at each start, denied to every answering agent's run."""
        return self.state_dir / "service.key"

    @property
    def a2a_token_path(self) -> Path:
        """The A2A bridge's bearer token (:mod:`agentcall.local.a2atoken`)."""
        return self.state_dir / "a2a.token"

    def private_paths(self) -> tuple[Path, ...]:
        """Every file in the state directory that must be 0600 when it exists.

        Not policy.json: it is the owner's, not a secret, so it only has to be safe from
        others' writes (0644 is accepted; see :func:`agentcall.listener.policy.load_policy`).
        """
        db = self.state_db_path
        return (
            self.config_path,
            self.keys_path,
            self.pending_token_path,
            self.recovery_marker_path,
            self.contacts_path,
            db,
            db.with_name(db.name + "-wal"),
            db.with_name(db.name + "-shm"),
            self.calls_log_path,
            self.tools_log_path,
            self.listener_log_path,
            self.service_key_path,
            self.a2a_token_path,
            self.live_runs_path,
        )

    # --- the directory ---------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the state directory 0700; an existing one must already be ours alone.

        A directory that group or others could use is refused, not silently tightened: while
        it was open, anyone could have replaced or removed a file in it (a removed policy.json
        means the default policy), so the owner has to look before trusting it again.
        """
        try:
            self.state_dir.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
            st = os.stat(self.state_dir)
        except OSError as exc:
            raise HomeError(f"cannot create {self.state_dir}: {exc.strerror}") from None
        problem = self._dir_problem(st)
        if problem is not None:
            raise PrivateFileError(problem.path, problem.problem, problem.fix)
        if stat.S_IMODE(st.st_mode) != STATE_DIR_MODE:
            # Only the owner's own bits can differ here (group and other bits were refused).
            os.chmod(self.state_dir, STATE_DIR_MODE)

    def check_state_dir(self) -> None:
        """Refuse a state directory that is not ours alone; a missing one is fine here."""
        try:
            problem = private_dir_problem(self.state_dir)
        except FileNotFoundError:
            return
        if problem is not None:
            raise PrivateFileError(problem.path, problem.problem, problem.fix)

    def _dir_problem(self, st: os.stat_result) -> PrivateFileProblem | None:
        return mode_problem(
            self.state_dir,
            mode=st.st_mode,
            uid=st.st_uid,
            my_uid=os.getuid(),
            trust=FileTrust.PRIVATE,
            directory=True,
        )

    # --- private files ---------------------------------------------------------------------

    def write_private(self, path: Path, data: bytes, *, exclusive: bool = False) -> None:
        """Replace ``path`` atomically with ``data``, mode 0600.

        Readers see the old file or the new one, never a torn write, even after a crash: the
        data reaches the disk before the rename, and the rename before this returns.
        With ``exclusive``, an existing file is never replaced (:class:`FileExistsError`).
        """
        self.ensure()
        replace_file(path, data, exclusive=exclusive)

    def read_private(self, path: Path) -> bytes:
        """The bytes of a private file, refused unless it is a regular 0600 file of ours.

        A missing file raises :class:`FileNotFoundError` for the caller to interpret. A state
        directory that group or others can use is refused first, like the file itself.
        """
        if path.parent == self.state_dir:
            self.check_state_dir()
        # O_NOFOLLOW refuses a symlink at open time; O_NONBLOCK keeps a FIFO from hanging us.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            raise
        except OSError as exc:
            # ELOOP (or EMLINK on some BSDs) is how O_NOFOLLOW reports a symlink.
            problem = _file_problem(path, os.lstat(path)) if os.path.lexists(path) else None
            if problem is not None:
                raise PrivateFileError(path, problem.problem, problem.fix) from None
            raise PrivateFileError(path, f"cannot be read ({exc.strerror})", "check it") from None
        try:
            # Checked on the open descriptor, so the file cannot be swapped after the check.
            problem = _file_problem(path, os.fstat(fd))
            if problem is not None:
                raise PrivateFileError(path, problem.problem, problem.fix)
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def create_private(self, path: Path) -> None:
        """Make sure ``path`` exists as an empty 0600 file of ours (for files others fill in)."""
        self.ensure()
        flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(path, flags, PRIVATE_FILE_MODE)
        except OSError as exc:
            problem = _file_problem(path, os.lstat(path)) if os.path.lexists(path) else None
            if problem is not None:
                raise PrivateFileError(path, problem.problem, problem.fix) from None
            raise PrivateFileError(
                path, f"cannot be created ({exc.strerror})", "check it"
            ) from None
        try:
            problem = _file_problem(path, os.fstat(fd))
        finally:
            os.close(fd)
        if problem is not None:
            raise PrivateFileError(path, problem.problem, problem.fix)

    def private_file_problems(self) -> list[PrivateFileProblem]:
        """Everything unsafe about the state directory and its private files (read-only)."""
        try:
            dir_st = os.stat(self.state_dir)
        except FileNotFoundError:
            return []
        except OSError as exc:
            return [PrivateFileProblem(self.state_dir, f"cannot be read ({exc.strerror})", "")]
        problems: list[PrivateFileProblem] = []
        dir_problem = self._dir_problem(dir_st)
        if dir_problem is not None:
            if not stat.S_ISDIR(dir_st.st_mode) or dir_st.st_uid != os.getuid():
                return [dir_problem]
            # A loose mode is reported, and the files in the directory are still looked at.
            problems.append(dir_problem)
        for path in self.private_paths():
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            problem = _file_problem(path, st)
            if problem is not None:
                problems.append(problem)
        return problems
