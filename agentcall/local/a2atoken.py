"""The A2A bridge's bearer token: ``a2a.token`` in the state directory.

The bridge places calls as its owner, and an answering agent runs as that same user, so it can
connect to the bridge's loopback port like any local client. What the agent cannot do is read
the state directory (the kernel boundary and the guard deny it to every run), so a token kept
there tells the owner's own clients from the agent. The file is 0600 in the 0700 state
directory, made on first use (:func:`ensure`) and replaced whole by :func:`rotate`, both
through a write-then-rename, so a reader never sees half a token.

Anything wrong with the file (another owner, a mode others could read, a symlink, not a regular
file, empty, not a token) fails closed: :class:`~agentcall.filetrust.PrivateFileError` names the
file and says to rotate, since a token others could have read is no longer a secret and a
``chmod`` would not make it one again. :class:`TokenFile` is how a running bridge reads it: once,
and again only when the file's ``lstat`` changes, so a rotation takes effect at the next request
without a restart, and an unchanged file costs two ``lstat`` calls per request.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Final

from agentcall.filetrust import PrivateFileError
from agentcall.local.home import Home

# 32 random bytes, URL-safe base64 without padding: 43 characters.
TOKEN_BYTES: Final = 32
# What a token may look like: the alphabet of token_urlsafe, long enough to be a real secret.
_TOKEN_RE: Final = re.compile(r"[A-Za-z0-9_-]{32,256}\Z")
ROTATE: Final = "agentcall a2a token --rotate"
ROTATE_FIX: Final = f"run `{ROTATE}` to replace it with a new token"


def token_path(home: Home) -> Path:
    return home.a2a_token_path


def is_token(text: str) -> bool:
    """Whether ``text`` has the form of a bridge token."""
    return _TOKEN_RE.match(text) is not None


def mint() -> str:
    """A new random token."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def read(home: Home) -> str:
    """The token in the file; :class:`FileNotFoundError` when there is none.

    :raises PrivateFileError: the file (or the state directory) is not safe, or holds no token.
    """
    path = token_path(home)
    try:
        raw = home.read_private(path)
    except PrivateFileError as exc:
        if exc.path != path:
            raise  # the state directory: its own fix (chmod 700) is the right one
        raise PrivateFileError(path, exc.problem, _fix_for(path)) from None
    if not raw.strip():
        raise PrivateFileError(path, "is empty", ROTATE_FIX)
    # One trailing newline is what an editor adds; anything else is not ours.
    text = raw.decode("ascii", "replace").removesuffix("\n")
    if not is_token(text):
        raise PrivateFileError(path, "does not hold a bridge token", ROTATE_FIX)
    return text


def _fix_for(path: Path) -> str:
    try:
        is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        is_dir = False
    if is_dir:
        # rotate renames a file over the path, which a directory refuses.
        return f"move it away (rm -r {path}), then run `{ROTATE}`"
    return ROTATE_FIX


def _write(home: Home, token: str, *, exclusive: bool) -> None:
    path = token_path(home)
    try:
        home.write_private(path, token.encode("ascii") + b"\n", exclusive=exclusive)
    except IsADirectoryError:
        raise PrivateFileError(path, "is a directory", _fix_for(path)) from None
    except FileExistsError:
        raise
    except OSError as exc:
        raise PrivateFileError(
            path, f"cannot be written ({exc.strerror})", "check the state directory"
        ) from None


def ensure(home: Home) -> str:
    """The token, made (0600, atomically) when there is none yet."""
    try:
        return read(home)
    except FileNotFoundError:
        pass
    # Another process may have made it meanwhile: then theirs is the token.
    with contextlib.suppress(FileExistsError):
        _write(home, mint(), exclusive=True)
    return read(home)


def rotate(home: Home) -> str:
    """Replace the token (or whatever is in its place) with a new one, and return it."""
    token = mint()
    _write(home, token, exclusive=False)
    return token


Stamp = tuple[int, ...]


def _stamp(home: Home) -> Stamp:
    """What changes whenever the token, or whether it may be trusted, could have changed.

    The file's inode changes with every rotation (a rename); its mode, owner, size and times
    with any edit in place. The directory's mode and owner decide whether the file is still
    ours alone. :raises FileNotFoundError: no token file.
    """
    directory = os.lstat(home.state_dir)
    file = os.lstat(token_path(home))
    return (
        directory.st_ino,
        directory.st_mode,
        directory.st_uid,
        file.st_dev,
        file.st_ino,
        file.st_mode,
        file.st_uid,
        file.st_size,
        file.st_mtime_ns,
        file.st_ctime_ns,
    )


class TokenFile:
    """The token as a running bridge sees it: re-read only when the file changed.

    A file that cannot be used is remembered too, so a broken file refused once is not read
    again for every request until it changes.
    """

    def __init__(self, home: Home) -> None:
        self._home = home
        self._seen: Stamp | None = None
        self._token: str | None = None
        self._error: PrivateFileError | None = None

    @property
    def path(self) -> Path:
        return token_path(self._home)

    def current(self) -> str:
        """The token now in the file.

        :raises PrivateFileError: there is none, or the file cannot be trusted.
        """
        try:
            seen = _stamp(self._home)
        except FileNotFoundError:
            self._seen = self._token = self._error = None
            raise PrivateFileError(self.path, "is missing", ROTATE_FIX) from None
        if seen == self._seen:
            if self._error is not None:
                # A fresh exception each time: re-raising one object grows its traceback.
                raise PrivateFileError(self._error.path, self._error.problem, self._error.fix)
            if self._token is not None:
                return self._token
        self._seen, self._token, self._error = seen, None, None
        try:
            self._token = read(self._home)
        except FileNotFoundError:
            self._seen = None
            raise PrivateFileError(self.path, "is missing", ROTATE_FIX) from None
        except PrivateFileError as exc:
            self._error = exc
            raise
        return self._token
