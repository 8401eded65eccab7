"""Finding a client's complete text frames in the relay's read buffer (RFC 6455 5.2).

Nearly every frame a relay reads is one whole, final, masked text frame, often several in one
read. autobahn reads each through a dozen hooks (frame begin, data, end; message begin, frame,
end; an observer event), which for a relay's small frames costs more than routing the frame.
:func:`complete_text_frame` recognises exactly that common case, so the relay can hand such a
frame's payload straight on; it answers None for anything else (a control frame, a fragment,
a binary frame, reserved bits, an unmasked or oversize frame, a length not minimally encoded,
a frame not yet wholly read), and autobahn reads that as before, refusing what it must.

Pure: no I/O, no autobahn.
"""

from __future__ import annotations

# FIN set, RSV1-3 clear, opcode 1 (text).
_FINAL_TEXT = 0x81
_MASKED = 0x80
_MASK_BYTES = 4


def complete_text_frame(buffer: bytes, pos: int, max_payload: int) -> tuple[int, int] | None:
    """``(start, end)`` of the payload of the frame at ``buffer[pos:]``, its 4-byte mask being
    ``buffer[start - 4:start]``, when that frame is a complete, final, masked text frame with
    clear reserved bits, a minimally encoded length, and a payload of at most ``max_payload``
    bytes (0: no limit); otherwise None.
    """
    available = len(buffer) - pos
    if available < 2 + _MASK_BYTES:
        return None
    second = buffer[pos + 1]
    if buffer[pos] != _FINAL_TEXT or not second & _MASKED:
        return None
    size = second & 0x7F
    if size < 126:
        header = 2
    elif size == 126:
        header = 4
        if available < header + _MASK_BYTES:
            return None
        size = int.from_bytes(buffer[pos + 2 : pos + 4], "big")
        if size < 126:
            return None
    else:
        header = 10
        if available < header + _MASK_BYTES:
            return None
        size = int.from_bytes(buffer[pos + 2 : pos + 10], "big")
        if size <= 0xFFFF or size >> 63:
            return None
    if 0 < max_payload < size:
        return None
    start = pos + header + _MASK_BYTES
    end = start + size
    if end > len(buffer):
        return None
    return start, end
