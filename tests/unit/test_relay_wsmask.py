"""The relay's own unmasking of client frames (agentcall.relay.wsmask)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall.relay.wsmask import unmask


def _reference(data: bytes, mask: bytes, offset: int) -> bytes:
    # RFC 6455 5.3, byte by byte: octet i of the payload is XORed with mask[i % 4].
    return bytes(byte ^ mask[(offset + i) % 4] for i, byte in enumerate(data))


@given(
    data=st.binary(max_size=3000),
    mask=st.binary(min_size=4, max_size=4),
    offset=st.integers(0, 2**20),
)
def test_unmask_is_the_rfc_xor_from_any_offset(data: bytes, mask: bytes, offset: int) -> None:
    assert unmask(data, mask, offset) == _reference(data, mask, offset)


@given(
    data=st.binary(max_size=600),
    mask=st.binary(min_size=4, max_size=4),
    cuts=st.lists(st.integers(0, 600), max_size=5),
)
def test_a_frame_unmasked_in_chunks_is_the_frame_unmasked_whole(
    data: bytes, mask: bytes, cuts: list[int]
) -> None:
    """A frame arrives in as many reads as TCP likes; each chunk starts where the last ended."""
    bounds = sorted({0, len(data), *(min(cut, len(data)) for cut in cuts)})
    chunks = [unmask(data[start:end], mask, start) for start, end in itertools.pairwise(bounds)]
    assert b"".join(chunks) == _reference(data, mask, 0)


def test_leading_zero_bytes_survive() -> None:
    """An integer XOR drops nothing: a payload that unmasks to zero bytes keeps its length."""
    mask = b"\x01\x02\x03\x04"
    assert unmask(mask * 3, mask, 0) == bytes(12)
    assert unmask(b"", mask, 7) == b""


def test_a_mask_is_four_bytes() -> None:
    with pytest.raises(ValueError, match="4 bytes"):
        unmask(b"abc", b"\x00\x01\x02", 0)
