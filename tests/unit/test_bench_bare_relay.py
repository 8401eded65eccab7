"""bench/bare_relay.py's pairing table: per-call and multiplexed routes, and what it drops."""

from __future__ import annotations

from bench.bare_relay import Switch


def test_per_call_frames_go_to_the_listener_and_answers_back() -> None:
    switch = Switch()
    ken: list[bytes] = []
    first: list[bytes] = []
    second: list[bytes] = []
    switch.add_listener(b"ken", ken.append)
    a = switch.open_call(first.append)
    b = switch.open_call(second.append)
    assert switch.from_call(a, b"ken", b"hello")
    assert switch.from_call(b, b"ken", b"there")
    assert ken == [b"%d hello" % a, b"%d there" % b]
    assert switch.from_listener(b"%d answer b" % b)
    assert switch.from_listener(b"%d answer a" % a)
    assert (first, second) == ([b"answer a"], [b"answer b"])
    switch.close_call(a)
    assert not switch.from_listener(b"%d late" % a)
    assert switch.dropped == 1


def test_multiplexed_calls_keep_their_correlation() -> None:
    switch = Switch()
    ken: list[bytes] = []
    mux: list[bytes] = []
    switch.add_listener(b"ken", ken.append)
    sid = switch.open_mux(mux.append)
    assert switch.from_mux(sid, b"ken c1 one")
    assert switch.from_mux(sid, b"ken c2 two words")
    assert ken == [b"%d.c1 one" % sid, b"%d.c2 two words" % sid]
    assert switch.from_listener(b"%d.c2 re two" % sid)
    assert switch.from_listener(b"%d.c1 re one" % sid)
    assert mux == [b"c2 re two", b"c1 re one"]


def test_unknown_routes_and_replaced_listeners_are_dropped() -> None:
    switch = Switch()
    old: list[bytes] = []
    new: list[bytes] = []
    switch.add_listener(b"ken", old.append)
    switch.add_listener(b"ken", new.append)
    switch.remove_listener(b"ken", old.append)  # the older socket closing keeps the newer
    key = switch.open_call(lambda _b: None)
    assert switch.from_call(key, b"ken", b"x")
    assert new == [b"%d x" % key] and old == []
    switch.remove_listener(b"ken", new.append)  # its own socket closing removes it
    assert b"ken" not in switch.listeners
    switch.add_listener(b"ken", new.append)
    assert not switch.from_call(key, b"nobody", b"x")
    assert not switch.from_mux(99, b"ken")  # no correlation and body
    assert not switch.from_listener(b"garbage")
    assert not switch.from_listener(b"7.c1 no such socket")
    assert switch.dropped == 4 and switch.forwarded == 1
