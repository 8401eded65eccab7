"""Unmasking a client's WebSocket payload (RFC 6455 5.3) in one pass.

autobahn builds a native masker object per received frame; for the relay's small frames
(a few per call) building it cost more than the XOR itself, about a tenth of a frame's path.
The relay asks autobahn not to unmask (``applyMask=False``) and unmasks each chunk here, as
one XOR of two integers.
"""

from __future__ import annotations


def unmask(data: bytes, mask: bytes, offset: int) -> bytes:
    """``data`` XOR the repeating 4-byte ``mask``, ``data[0]`` being byte ``offset`` of the
    frame's payload (a frame may arrive in several chunks)."""
    size = len(data)
    if size == 0:
        return data
    if len(mask) != 4:
        raise ValueError("a WebSocket mask is 4 bytes")
    start = offset % 4
    key = (mask * (size // 4 + 2))[start : start + size]
    value = int.from_bytes(data, "little") ^ int.from_bytes(key, "little")
    return value.to_bytes(size, "little")
