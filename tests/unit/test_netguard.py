"""The guard that keeps tests off the network (tests/netguard.py)."""

from __future__ import annotations

import errno
import socket

import pytest

from tests.netguard import is_local, loopback_only


@pytest.mark.parametrize(
    ("family", "address", "local"),
    [
        (socket.AF_INET, ("127.0.0.1", 80), True),
        (socket.AF_INET, ("127.8.9.10", 80), True),
        (socket.AF_INET, ("0.0.0.0", 80), True),
        (socket.AF_INET, ("localhost", 80), True),
        (socket.AF_INET6, ("::1", 80, 0, 0), True),
        (socket.AF_INET6, ("::1%lo", 80, 0, 0), True),
        (socket.AF_UNIX, "/tmp/x.sock", True),
        (socket.AF_INET, ("192.0.2.1", 443), False),
        (socket.AF_INET, ("10.0.0.1", 443), False),
        (socket.AF_INET, ("pypi.org", 443), False),
        (socket.AF_INET6, ("2001:db8::1", 443, 0, 0), False),
        (socket.AF_INET, (b"127.0.0.1", 80), True),
        (socket.AF_INET, (), False),
        (socket.AF_INET, "127.0.0.1", False),
    ],
)
def test_only_loopback_and_unix_sockets_are_local(
    family: int, address: object, local: bool
) -> None:
    assert is_local(family, address) is local


def test_a_dial_beyond_loopback_is_refused_and_recorded() -> None:
    attempts: list[str] = []
    with loopback_only(attempts), socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        with pytest.raises(OSError) as raised:
            sock.connect(("192.0.2.1", 9))
        assert raised.value.errno == errno.ENETUNREACH
        assert sock.connect_ex(("192.0.2.1", 9)) == errno.ENETUNREACH
    assert attempts == ["('192.0.2.1', 9)", "('192.0.2.1', 9)"]


def test_loopback_dials_go_through_and_the_guard_comes_off() -> None:
    attempts: list[str] = []
    before = socket.socket.connect
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with loopback_only(attempts), socket.create_connection(server.getsockname()):
            pass
    assert attempts == []
    assert socket.socket.connect is before
