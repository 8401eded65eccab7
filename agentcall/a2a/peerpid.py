"""Which local processes hold the client end of a loopback TCP connection (Linux ``/proc``).

The bridge refuses a client that belongs to an answering agent's run even when it shows the
token (:func:`agentcall.local.runpeer.belongs_to_run` decides that of a pid). TCP carries no
peer credentials, so the pid is found the long way: the kernel's socket tables
(``/proc/net/tcp`` and ``tcp6``) give the inode of the socket whose local end is the client's
address and whose remote end is the bridge's, and ``/proc/PID/fd`` shows which processes hold
that inode. Only sockets and processes of this user are looked at: an answering agent runs as
this user, and another user's descriptors cannot be read anyway.

The parsing is pure (:func:`parse_table`, :func:`matching_inodes`, :func:`socket_inode`) and
tested on sample text; :func:`peer_pids` is the thin I/O around it. Finding nothing (no
``/proc``, a process already gone) is an empty answer, never an error: the token is the
control, this is a second line.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Final, Literal

import attrs

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Endpoint = tuple[Address, int]
ByteOrder = Literal["little", "big"]

TABLES: Final = ("tcp", "tcp6")
# Columns of a row of /proc/net/tcp{,6}: "sl local rem st tx:rx tr:when retrnsmt uid timeout
# inode ...".
_LOCAL, _REMOTE, _UID, _INODE = 1, 2, 7, 9
_SOCKET_PREFIX: Final = "socket:["


@attrs.frozen
class SocketRow:
    """One socket of the kernel's TCP table."""

    local: Endpoint
    remote: Endpoint
    uid: int
    inode: int


def _unmapped(address: Address) -> Address:
    # A dual-stack socket shows an IPv4 peer as ::ffff:a.b.c.d; compare it as the IPv4 it is.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_endpoint(text: str, byteorder: ByteOrder = sys.byteorder) -> Endpoint:
    """``0100007F:1F90`` (as the kernel prints it on a ``byteorder`` machine) → 127.0.0.1:8080.

    The address is printed as 32-bit words in the machine's own byte order, the port as a
    number. :raises ValueError: not such an endpoint.
    """
    hex_address, _colon, hex_port = text.partition(":")
    if len(hex_address) not in (8, 32) or not hex_port:
        raise ValueError(f"not an endpoint: {text!r}")
    packed = b"".join(
        int(hex_address[i : i + 8], 16).to_bytes(4, byteorder)
        for i in range(0, len(hex_address), 8)
    )
    port = int(hex_port, 16)
    if not 0 <= port <= 65535:
        raise ValueError(f"not a port: {hex_port!r}")
    return _unmapped(ipaddress.ip_address(packed)), port


def parse_table(text: str, byteorder: ByteOrder = sys.byteorder) -> list[SocketRow]:
    """The rows of a ``/proc/net/tcp`` or ``tcp6`` text; a line that is not a row is skipped."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) <= _INODE:
            continue
        try:
            rows.append(
                SocketRow(
                    local=parse_endpoint(fields[_LOCAL], byteorder),
                    remote=parse_endpoint(fields[_REMOTE], byteorder),
                    uid=int(fields[_UID]),
                    inode=int(fields[_INODE]),
                )
            )
        except ValueError:
            continue
    return rows


def endpoint(host: str, port: int) -> Endpoint:
    """An endpoint from a host and port as Twisted reports them (``::ffff:…`` unmapped).

    :raises ValueError: ``host`` is not an IP address.
    """
    return _unmapped(ipaddress.ip_address(host.split("%", 1)[0])), port


def matching_inodes(
    rows: Iterable[SocketRow], client: Endpoint, server: Endpoint, uid: int
) -> frozenset[int]:
    """The inodes of ``uid``'s sockets whose local end is ``client`` and remote ``server``:
    the client's end of the connection the bridge accepted."""
    return frozenset(
        row.inode
        for row in rows
        # Inode 0: a socket no process holds any more (TIME_WAIT, orphaned).
        if row.local == client and row.remote == server and row.uid == uid and row.inode
    )


def socket_inode(link: str) -> int | None:
    """The inode of a ``/proc/PID/fd/N`` link that names a socket (``socket:[123]``)."""
    if not (link.startswith(_SOCKET_PREFIX) and link.endswith("]")):
        return None
    digits = link[len(_SOCKET_PREFIX) : -1]
    return int(digits) if digits.isdigit() else None


# --- the I/O -----------------------------------------------------------------------------------


def _own_pids(proc: Path, uid: int) -> Iterator[int]:
    try:
        entries = list(os.scandir(proc))
    except OSError:
        return
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue  # gone meanwhile
        yield int(entry.name)


def _holds(proc: Path, pid: int, inodes: Collection[int]) -> bool:
    try:
        descriptors = list(os.scandir(proc / str(pid) / "fd"))
    except OSError:
        return False
    for descriptor in descriptors:
        try:
            inode = socket_inode(os.readlink(descriptor.path))
        except OSError:
            continue
        if inode is not None and inode in inodes:
            return True
    return False


def peer_pids(
    client: Endpoint,
    server: Endpoint,
    *,
    proc: Path = Path("/proc"),
    uid: int | None = None,
    byteorder: ByteOrder = sys.byteorder,
) -> frozenset[int]:
    """The pids of this user's processes that hold the client end of the TCP connection from
    ``client`` to ``server``; empty when there is no ``/proc`` or nothing is found."""
    me = os.getuid() if uid is None else uid
    rows: list[SocketRow] = []
    for table in TABLES:
        try:
            text = (proc / "net" / table).read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        rows.extend(parse_table(text, byteorder))
    inodes = matching_inodes(rows, client, server, me)
    if not inodes:
        return frozenset()
    return frozenset(pid for pid in _own_pids(proc, me) if _holds(proc, pid, inodes))


def run_pid(
    client: Endpoint,
    server: Endpoint,
    belongs: Callable[[int], bool],
    *,
    proc: Path = Path("/proc"),
    uid: int | None = None,
) -> int | None:
    """A pid holding the client end that ``belongs`` to an answering agent's run, if any."""
    for pid in sorted(peer_pids(client, server, proc=proc, uid=uid)):
        if belongs(pid):
            return pid
    return None
