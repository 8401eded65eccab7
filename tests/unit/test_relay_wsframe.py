"""Whole text frames read straight from the relay's buffer (agentcall.relay.wsframe), and the
relay's read path that uses it: the same messages, counters, replies and refusals as autobahn's
reader, however the bytes are split."""

from __future__ import annotations

import itertools
import random
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall.relay.wsframe import complete_text_frame
from tests.unit.test_relay_protocol import Switch, _server_socket, relay_switch


def frame(
    payload: bytes,
    *,
    opcode: int = 1,
    fin: bool = True,
    rsv: int = 0,
    mask: bytes | None = b"\x11\x22\x33\x44",
    length_bytes: int | None = None,
) -> bytes:
    """One frame as RFC 6455 5.2 lays it out; ``length_bytes`` forces a length encoding
    (0, 2 or 8 extra bytes), minimal or not."""
    size = len(payload)
    if length_bytes is None:
        length_bytes = 0 if size < 126 else 2 if size <= 0xFFFF else 8
    first = (0x80 if fin else 0) | (rsv << 4) | opcode
    masked = 0x80 if mask is not None else 0
    if length_bytes == 0:
        header = bytes((first, masked | size))
    elif length_bytes == 2:
        header = bytes((first, masked | 126)) + struct.pack("!H", size)
    else:
        header = bytes((first, masked | 127)) + struct.pack("!Q", size)
    if mask is None:
        return header + payload
    body = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
    return header + mask + body


def _payload_of(buffer: bytes, found: tuple[int, int]) -> bytes:
    start, end = found
    mask = buffer[start - 4 : start]
    return bytes(byte ^ mask[i % 4] for i, byte in enumerate(buffer[start:end]))


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_a_whole_final_masked_text_frame_is_found_at_any_size(size: int) -> None:
    payload = bytes(random.Random(size).randrange(256) for _ in range(size))
    data = b"junk" + frame(payload) + b"next"
    found = complete_text_frame(data, 4, 0)
    assert found is not None and found[1] == len(data) - 4
    assert _payload_of(data, found) == payload


@pytest.mark.parametrize(
    "odd",
    [
        {"opcode": 2},  # binary
        {"opcode": 0},  # a continuation
        {"opcode": 9},  # ping
        {"opcode": 8},  # close
        {"fin": False},  # the first fragment of a message
        {"rsv": 4},  # compressed, never negotiated
        {"rsv": 1},
        {"mask": None},  # a client's frame must be masked
        {"length_bytes": 2},  # 10 bytes said in 2 extra length bytes: not minimal
        {"length_bytes": 8},
    ],
)
def test_anything_but_the_common_frame_is_left_to_autobahn(odd: dict[str, Any]) -> None:
    assert complete_text_frame(frame(b"0123456789", **odd), 0, 0) is None


def test_a_16_bit_length_said_in_64_bits_is_not_taken() -> None:
    assert complete_text_frame(frame(b"x" * 300, length_bytes=8), 0, 0) is None


def test_a_length_with_the_top_bit_set_is_not_taken() -> None:
    data = bytes((0x81, 0x80 | 127)) + struct.pack("!Q", 1 << 63) + b"mask" + b"x" * 8
    assert complete_text_frame(data, 0, 0) is None


def test_a_payload_over_the_limit_is_not_taken() -> None:
    data = frame(b"x" * 200)
    assert complete_text_frame(data, 0, 200) == (len(data) - 200, len(data))
    assert complete_text_frame(data, 0, 199) is None


@given(payload=st.binary(max_size=70000))
def test_no_prefix_of_a_frame_is_taken(payload: bytes) -> None:
    data = frame(payload)
    for cut in {0, 1, 2, 3, 5, 6, 7, 8, 13, 14, len(data) - 1}:
        if 0 <= cut < len(data):
            assert complete_text_frame(data[:cut], 0, 0) is None
    assert complete_text_frame(data, 0, 0) == (len(data) - len(payload), len(data))


# --- the relay's read path ----------------------------------------------------------------------


@pytest.fixture
def switch(tmp_path: Path) -> Iterator[Switch]:
    with relay_switch(tmp_path) as switched:
        yield switched


class Reading:
    """A relay-side socket whose reads are recorded: every message, every byte it writes."""

    def __init__(self, switch: Switch, handle: str, *, fast: bool) -> None:
        switch.connect("role=listen", handle)
        self.reactor = switch.relay.reactor
        self.side: Any = _server_socket(switch, handle)
        self.messages: list[bytes] = []
        self.written: list[bytes] = []
        self.side.onMessage = lambda payload, _binary: self.messages.append(payload)
        self.side.transport.write = self.written.append
        if not fast:
            self.side._read_fast = lambda: False

    def read(self, data: bytes, cuts: list[int]) -> None:
        bounds = sorted({0, len(data), *(cut for cut in cuts if 0 < cut < len(data))})
        for start, end in itertools.pairwise(bounds):
            self.side.dataReceived(data[start:end])
        self.reactor.advance(0)  # autobahn writes control frames on the next turn

    def counters(self) -> dict[str, int]:
        stats = self.side.trafficStats
        names = (
            "incomingOctetsWireLevel",
            "incomingOctetsWebSocketLevel",
            "incomingOctetsAppLevel",
            "incomingWebSocketFrames",
            "incomingWebSocketMessages",
        )
        return {name: getattr(stats, name) for name in names}


def _stream(rng: random.Random) -> bytes:
    """Frames a client may send, in a random order: whole text frames of every length
    encoding, pings, and a text message in fragments (with a ping between them)."""
    parts = [frame(b'{"first":true}')]
    for _ in range(rng.randrange(1, 12)):
        kind = rng.randrange(5)
        size = rng.choice([0, 3, 125, 126, 200, 70000])
        payload = bytes(rng.randrange(32, 127) for _ in range(size))
        mask = bytes(rng.randrange(256) for _ in range(4))
        if kind <= 2:
            parts.append(frame(payload, mask=mask))
        elif kind == 3:
            parts.append(frame(payload[:20], opcode=9, mask=mask))
        else:
            half = len(payload) // 2
            parts.append(frame(payload[:half], fin=False, mask=mask))
            parts.append(frame(b"ping", opcode=9, mask=mask))
            parts.append(frame(payload[half:], opcode=0, mask=mask))
    return b"".join(parts)


@pytest.mark.parametrize("seed", range(40))
def test_the_fast_read_gives_what_autobahn_gives_however_the_bytes_are_split(
    switch: Switch, seed: int
) -> None:
    rng = random.Random(seed)
    data = _stream(rng)
    cuts = [rng.randrange(len(data) + 1) for _ in range(rng.randrange(0, 8))]
    if seed % 4 == 0:
        cuts = list(range(0, len(data), max(1, len(data) // 300)))  # many small reads
    fast, slow = Reading(switch, "ann", fast=True), Reading(switch, "ken", fast=False)
    fast.read(data, cuts)
    slow.read(data, cuts)
    assert slow.messages, "the stream held at least one message"
    assert fast.messages == slow.messages
    assert fast.written == slow.written  # the pongs, byte for byte
    assert fast.counters() == slow.counters()


@pytest.mark.parametrize(
    "bad",
    [
        frame(b'{"type":"x"}', mask=None),  # unmasked
        frame(b'{"type":"x"}', rsv=4),  # compressed without the extension
        frame(b"x" * 300, length_bytes=8),  # length not minimally encoded
    ],
)
def test_a_bad_frame_after_good_ones_is_refused_as_autobahn_refuses_it(
    switch: Switch, bad: bytes
) -> None:
    fast, slow = Reading(switch, "ann", fast=True), Reading(switch, "ken", fast=False)
    data = frame(b"first") + bad + frame(b"never read")
    fast.read(data, [])
    slow.read(data, [])
    assert fast.messages == slow.messages == [b"first"]
    # autobahn fails the connection (it drops it, sending nothing), whichever path read it.
    assert fast.side.failedByMe and slow.side.failedByMe
    assert fast.written == slow.written
    assert fast.side.state == slow.side.state


def test_an_oversize_frame_is_refused_as_autobahn_refuses_it(switch: Switch) -> None:
    fast, slow = Reading(switch, "ann", fast=True), Reading(switch, "ken", fast=False)
    cap = fast.side.maxFramePayloadSize
    data = frame(b"ok") + frame(b"x" * (cap + 1))
    fast.read(data, [])
    slow.read(data, [])
    assert fast.messages == slow.messages == [b"ok"]
    assert fast.written == slow.written
    for side in (fast.side, slow.side):
        assert side.wasMaxMessagePayloadSizeExceeded or side.wasMaxFramePayloadSizeExceeded
    assert fast.side.state == slow.side.state


def test_a_frame_read_fast_counts_as_traffic_for_the_keepalive(switch: Switch) -> None:
    """autobahn cancels a pending ping's timeout when a data frame arrives; so does the fast
    read, or a busy listener whose pong is queued behind its frames would be dropped."""
    reading = Reading(switch, "ann", fast=True)
    side = reading.side
    side.autoPingTimeoutCall = switch.relay.reactor.callLater(30, lambda: None)
    timeout = side.autoPingTimeoutCall
    reading.read(frame(b"{}"), [])
    assert reading.messages == [b"{}"]
    assert side.autoPingTimeoutCall is None and not timeout.active()


def test_a_message_that_closes_the_socket_leaves_the_rest_to_autobahn(switch: Switch) -> None:
    """What follows a message whose handling began the closing handshake is read as autobahn
    reads it in that state."""
    fast, slow = Reading(switch, "ann", fast=True), Reading(switch, "ken", fast=False)
    for reading in (fast, slow):

        def closing(payload: bytes, _binary: bool, reading: Reading = reading) -> None:
            reading.messages.append(payload)
            reading.side.sendClose(1000, "done")

        reading.side.onMessage = closing
        reading.read(frame(b"one") + frame(b"two") + frame(b"ping", opcode=9), [])
    assert fast.messages == slow.messages and fast.messages[0] == b"one"
    assert fast.written == slow.written and fast.written
    assert fast.side.state == slow.side.state
