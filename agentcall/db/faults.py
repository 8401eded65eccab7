"""Which store errors are the storage failing, and what the asker is told about them.

A store raises many errors: a refusal of bad data, a bug, a constraint. Some say instead that
the storage under it cannot do its job right now: the disk is full, the filesystem went
read-only, an I/O error, a database file another process has locked. Those are not the asker's
fault and not a bug, they pass, and the asker should be told so in words (``storage_full`` or
``unavailable``) instead of seeing a dropped connection. This module tells them apart; it does
no I/O.
"""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Iterator

from agentcall.errors import CallErrorCode, StorageFault

__all__ = ["storage_fault"]

# SQLite's primary result codes (the low byte of an extended code) that mean the storage.
_SQLITE_FULL = 13
_SQLITE_UNAVAILABLE = frozenset(
    {
        5,  # SQLITE_BUSY: another process holds the write lock past the busy timeout
        6,  # SQLITE_LOCKED
        7,  # SQLITE_NOMEM
        8,  # SQLITE_READONLY: a read-only filesystem, or a file made read-only under us
        10,  # SQLITE_IOERR
        11,  # SQLITE_CORRUPT
        14,  # SQLITE_CANTOPEN: the file or its directory went away
        15,  # SQLITE_PROTOCOL: a lock race of the WAL
        26,  # SQLITE_NOTADB
    }
)
# Older SQLite builds name the error in the message only.
_FULL_WORDS = ("database or disk is full",)
_UNAVAILABLE_WORDS = (
    "disk i/o error",
    "readonly database",
    "database is locked",
    "unable to open database",
    "malformed",
)
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_UNAVAILABLE_ERRNOS = frozenset({errno.EIO, errno.EROFS})

_SAID = {
    CallErrorCode.STORAGE_FULL: "the relay's storage is full",
    CallErrorCode.UNAVAILABLE: "the relay's storage is failing",
}


def storage_fault(exc: BaseException) -> StorageFault | None:
    """The fault ``exc`` (or an error it was raised from) reports, or None when it is not the
    storage failing (a refusal, a bug: those stay what they are)."""
    for link in _chain(exc):
        if isinstance(link, StorageFault):
            return link
        code = _code_of(link)
        if code is not None:
            return StorageFault(code, f"{_SAID[code]}: {_first_line(link)}")
    return None


def _code_of(exc: BaseException) -> CallErrorCode | None:
    if isinstance(exc, sqlite3.Error):
        number = getattr(exc, "sqlite_errorcode", None)
        if isinstance(number, int):
            primary = number & 0xFF
            if primary == _SQLITE_FULL:
                return CallErrorCode.STORAGE_FULL
            if primary in _SQLITE_UNAVAILABLE:
                return CallErrorCode.UNAVAILABLE
            return None
        text = str(exc).lower()
        if any(words in text for words in _FULL_WORDS):
            return CallErrorCode.STORAGE_FULL
        if any(words in text for words in _UNAVAILABLE_WORDS):
            return CallErrorCode.UNAVAILABLE
        return None
    if isinstance(exc, OSError):
        if exc.errno in _FULL_ERRNOS:
            return CallErrorCode.STORAGE_FULL
        if exc.errno in _UNAVAILABLE_ERRNOS:
            return CallErrorCode.UNAVAILABLE
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from or during, each once (a cycle ends the walk)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
