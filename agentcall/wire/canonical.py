"""Canonical encoding: the only place where signed or bound byte strings are built.

A canonical byte string is a concatenation of tagged, length-prefixed items:

- string: ``0x01``, its UTF-8 length as u32 big-endian, the UTF-8 bytes;
- integer: ``0x02``, the value as i64 big-endian (bools are refused: they are not integers here);
- null: ``0x03``.

Every item is self-delimiting, so two different sequences never encode to the same bytes.
Each transcript starts with a domain string (``agentcall/<what>/v1``) so a signature made for
one purpose can never be replayed as another.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

Item = str | int | None

_TAG_STR = b"\x01"
_TAG_INT = b"\x02"
_TAG_NULL = b"\x03"
_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
_U32_MAX = 2**32 - 1


class CanonicalError(ValueError):
    """A value cannot be canonically encoded."""


def encode(items: Sequence[Item]) -> bytes:
    out = bytearray()
    for item in items:
        if item is None:
            out += _TAG_NULL
        elif isinstance(item, bool):
            raise CanonicalError("booleans have no canonical encoding")
        elif isinstance(item, int):
            if not _I64_MIN <= item <= _I64_MAX:
                raise CanonicalError(f"integer out of i64 range: {item}")
            out += _TAG_INT + struct.pack(">q", item)
        elif isinstance(item, str):
            try:
                data = item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise CanonicalError("string is not well-formed Unicode") from exc
            if len(data) > _U32_MAX:
                raise CanonicalError("string too long")
            out += _TAG_STR + struct.pack(">I", len(data)) + data
        else:
            raise CanonicalError(f"cannot encode {type(item).__name__}")
    return bytes(out)


def decode(data: bytes) -> list[Item]:
    """The inverse of :func:`encode` (used by tests and diagnostics)."""
    items: list[Item] = []
    pos = 0
    while pos < len(data):
        tag = data[pos : pos + 1]
        pos += 1
        if tag == _TAG_NULL:
            items.append(None)
        elif tag == _TAG_INT:
            if pos + 8 > len(data):
                raise CanonicalError("truncated integer")
            items.append(struct.unpack(">q", data[pos : pos + 8])[0])
            pos += 8
        elif tag == _TAG_STR:
            if pos + 4 > len(data):
                raise CanonicalError("truncated string length")
            (length,) = struct.unpack(">I", data[pos : pos + 4])
            pos += 4
            if pos + length > len(data):
                raise CanonicalError("truncated string")
            try:
                items.append(data[pos : pos + length].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise CanonicalError("string is not UTF-8") from exc
            pos += length
        else:
            raise CanonicalError(f"unknown tag {tag!r}")
    return items


def digest(items: Sequence[Item]) -> bytes:
    """SHA-256 of the canonical encoding."""
    return hashlib.sha256(encode(items)).digest()


def hexdigest(items: Sequence[Item]) -> str:
    return hashlib.sha256(encode(items)).hexdigest()
