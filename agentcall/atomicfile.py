"""Replacing a file so that readers see the old contents or the new, never a torn write.

Every file the project rewrites in place (config, keys, contacts, policy, the service unit, the
relay's ready file) goes through :func:`replace_file`: write a temporary file next to the
target, then rename it over the target, which the file system does in one step.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def replace_file(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    mode: int = 0o600,
    exclusive: bool = False,
    durable: bool = True,
) -> None:
    """Replace ``path`` with ``data`` in one step; the file ends with ``mode``.

    ``exclusive``: an existing file is never replaced (:class:`FileExistsError`).
    ``durable``: the data reaches the disk before the rename, and the rename before this
    returns, so even a crash leaves one whole version; without it, only other processes are
    guaranteed a whole file.
    """
    # Imported here: the thin `agentcall call` imports this module (through local.home) but
    # never writes a file, and tempfile costs it milliseconds to import.
    import tempfile

    target = Path(path)
    directory = target.parent
    # mkstemp creates the file 0600, so a secret is never readable by others, even briefly.
    fd, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        if mode != 0o600:
            os.chmod(temp, mode)
        if exclusive:
            # link() fails when the target exists, where replace() would overwrite it.
            os.link(temp, target)
            temp.unlink()
        else:
            os.replace(temp, target)
    except BaseException:
        # Leave no half-written temporary behind; the old file, if any, is still in place.
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    if durable:
        fsync_directory(directory)


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make a rename in ``directory`` durable, where the platform lets a directory be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
