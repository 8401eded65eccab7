"""Keep the test processes off the network: only loopback and UNIX sockets may be dialled.

Issue 12 asks that nothing reaches the network during build or test unless a tier says so. A
test marked ``network`` may dial anywhere (the real-agent and package tiers fetch from the
registries in their own subprocesses, which this does not police). Any other test that dials a
host beyond loopback gets ``OSError(ENETUNREACH)`` at the dial, as an offline machine would give
it, and fails at teardown naming the address, even if the code under test swallowed the error.
The guard is a function-scoped fixture, so a module- or session-scoped fixture set up before it
is not policed: one that dials out belongs to a module marked ``network`` (the package tier's
skip check dials the mirror and PyPI, and its module is marked).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_local(family: int, address: Any) -> bool:
    """Whether dialling ``address`` (as ``socket.connect`` takes it) stays on this machine."""
    if family == getattr(socket, "AF_UNIX", None):
        return True
    if family not in (socket.AF_INET, socket.AF_INET6):
        return False
    if not isinstance(address, tuple) or not address:
        return False
    host = address[0]
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False  # a name other than localhost would need DNS: the network
    return ip.is_loopback or ip.is_unspecified


@contextmanager
def loopback_only(attempts: list[str]) -> Iterator[None]:
    """While inside, a dial beyond loopback raises and is appended to ``attempts``."""
    originals = (socket.socket.connect, socket.socket.connect_ex)

    def refuse(sock: socket.socket, address: Any) -> None:
        attempts.append(repr(address))
        raise OSError(errno.ENETUNREACH, f"tests stay off the network (dialled {address!r})")

    def connect(sock: socket.socket, address: Any) -> None:
        if not is_local(sock.family, address):
            refuse(sock, address)
        originals[0](sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        if not is_local(sock.family, address):
            attempts.append(repr(address))
            return errno.ENETUNREACH
        return originals[1](sock, address)

    socket.socket.connect = connect  # type: ignore[method-assign, assignment]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex = originals  # type: ignore[method-assign]
