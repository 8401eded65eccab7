"""UNIX socket plumbing for the service's local socket and the thin CLI (standard library only).

A socket's path must fit ``sun_path`` (108 bytes on Linux, with the terminating NUL), and a
state directory can be deeper than that (``AGENTCALL_HOME`` in a long temporary directory).
:func:`short_name` then reaches the same file through an open descriptor of its directory,
``/proc/self/fd/N/NAME``, which the kernel resolves like any path; the file itself stays in the
state directory. Without ``/proc`` such a path is refused with :class:`SocketPathError`.

:func:`peer_credentials` reads who is at the other end of a connected socket (``SO_PEERCRED``);
both sides use it: the service refuses every other user, and the CLI talks only to a service of
its own user.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

from agentcall.frozen import Frozen

# typing is imported for the type checker only: the thin `agentcall call` imports this module,
# and typing costs that process milliseconds (tests/unit/test_cli_call_thin.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

# sun_path is 108 bytes on Linux; one of them is the terminating NUL.
MAX_SOCKET_PATH_BYTES: Final = 107
_PROC_FD: Final = "/proc/self/fd"


class SocketPathError(OSError):
    """The socket's path is too long for the kernel and cannot be shortened here."""


class PeerCredentials(Frozen):
    _fields = ("pid", "uid", "gid")
    __slots__ = _fields
    pid: int
    uid: int
    gid: int

    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self._set(pid=pid, uid=uid, gid=gid)


@contextlib.contextmanager
def short_name(path: Path) -> Iterator[str]:
    """A name for ``path`` that fits ``sun_path``, valid inside the ``with`` block only."""
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES:
        yield str(path)
        return
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_PATH", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path.parent, flags)
    try:
        alias = f"{_PROC_FD}/{fd}/{path.name}"
        if len(os.fsencode(alias)) > MAX_SOCKET_PATH_BYTES or not os.path.isdir(f"{_PROC_FD}/{fd}"):
            raise SocketPathError(f"the socket path {path} is too long for this system")
        yield alias
    finally:
        os.close(fd)


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """The process, user and group at the other end of a connected UNIX socket.

    :raises OSError: where the system cannot say (no ``SO_PEERCRED``): callers refuse then.
    """
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        raise OSError("this system cannot tell who is at the other end of a local socket")
    size = struct.calcsize("3i")
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, size))
    return PeerCredentials(pid, uid, gid)


def connect(path: Path, *, timeout_s: float) -> socket.socket:
    """A connected stream socket to ``path``; OSError when nothing accepts there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        with short_name(path) as name:
            sock.connect(name)
    except BaseException:
        sock.close()
        raise
    return sock


def bind_listening(path: Path, *, backlog: int = 16) -> tuple[socket.socket, tuple[int, int]]:
    """A listening socket at ``path`` (mode 0600), replacing whatever file was there.

    It is bound under a temporary name in the same directory, made 0600, and renamed over
    ``path`` in one step, so a client never finds a socket with a wider mode and a stale file
    left by a killed service never stops a start. Returns the socket and the (device, inode) of
    the file, so that :func:`remove_if_ours` removes it only while it is still this one.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with short_name(temporary) as name:
            sock.bind(name)
        try:
            os.chmod(temporary, 0o600)
            sock.listen(backlog)
            st = os.lstat(temporary)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except BaseException:
        sock.close()
        raise
    return sock, (st.st_dev, st.st_ino)


def remove_if_ours(path: Path, identity: tuple[int, int]) -> None:
    """Remove the socket file at ``path`` unless another service has replaced it since."""
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == identity:
            os.unlink(path)
