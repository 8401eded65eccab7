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

from agentcall.filetrust import PrivateFileError

# typing is imported for the type checker only: the thin `agentcall call` imports this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from agentcall.local.home import Home

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


def read(home: Home) -> str:
    """The running service's key; an OSError (:class:`ServiceKeyError`, or
    :class:`FileNotFoundError` when there is no key) unless it is a private file of this user
    in a private state directory (:meth:`~agentcall.local.home.Home.read_private`) holding
    exactly one key."""
    path = home.service_key_path
    try:
        raw = home.read_private(path)
    except PrivateFileError as exc:
        raise ServiceKeyError(str(exc)) from None
    text = raw.decode("ascii", "replace").removesuffix("\n")
    if not is_key(text):
        raise ServiceKeyError(f"{path} does not hold a service key")
    return text
