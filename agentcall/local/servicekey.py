"""The secret a thin client shows the running service before it may act as the owner.

``SO_PEERCRED`` only proves that a client runs as this user, and so does the answering agent.
What the agent cannot do is read the state directory: the kernel boundary and the guard deny it
to every run. So the service writes a fresh random key there each time it starts
(:attr:`~agentcall.local.home.Home.service_key_path`, 0600), and a client must send it first
(:func:`agentcall.wire.local.encode_key_line`); the service compares it in constant time.

Standard library only, and light: the thin ``agentcall call`` imports it.
"""

from __future__ import annotations

import os
import stat

# 32 random bytes, written as 64 lowercase hex digits.
KEY_BYTES = 32
KEY_CHARS = KEY_BYTES * 2
_HEX = frozenset("0123456789abcdef")


class ServiceKeyError(OSError):
    """The key file is not a private file of this user holding one key."""


def is_key(text: str) -> bool:
    """Whether ``text`` has the form of a service key."""
    return len(text) == KEY_CHARS and set(text) <= _HEX


def make(path: os.PathLike[str] | str) -> str:
    """Write a new key to ``path`` (0600, replacing any old one in one step) and return it."""
    from agentcall.atomicfile import replace_file

    key = os.urandom(KEY_BYTES).hex()
    # Not durable: a key lost to a crash is replaced at the next start anyway.
    replace_file(path, key.encode("ascii") + b"\n", mode=0o600, durable=False)
    return key


def read(path: os.PathLike[str] | str) -> str:
    """The key in ``path``; :class:`ServiceKeyError` (an OSError) unless the file is a regular
    file of this user that nobody else may read or write, holding exactly one key."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise ServiceKeyError(f"{path} is not a file of this user")
        if info.st_mode & 0o077:
            raise ServiceKeyError(f"{path} may be read or written by others")
        raw = os.read(fd, KEY_CHARS + 2)
    finally:
        os.close(fd)
    text = raw.decode("ascii", "replace").removesuffix("\n")
    if not is_key(text):
        raise ServiceKeyError(f"{path} does not hold a service key")
    return text
