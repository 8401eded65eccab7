"""Finding the processes behind a loopback TCP client: /proc text parsed, then a fake /proc."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest

from agentcall.a2a import peerpid

ME = os.getuid()
LOOPBACK = ipaddress.IPv4Address("127.0.0.1")
BRIDGE = (LOOPBACK, 8470)
CLIENT = (LOOPBACK, 51000)

# As a little-endian kernel prints it: the bridge listening on 127.0.0.1:8470 (0x2116), the
# accepted connection from 51000 (0xC738), the client's end of it (inode 7001, our uid), a
# client of another user on 51001, and a closed socket with inode 0.
TCP = f"""\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2116 00000000:0000 0A 00000000:00000000 00:00000000 00000000 {ME:5d} 0 7000 1 0
   1: 0100007F:2116 0100007F:C738 01 00000000:00000000 00:00000000 00000000 {ME:5d} 0 7002 1 0
   2: 0100007F:C738 0100007F:2116 01 00000000:00000000 00:00000000 00000000 {ME:5d} 0 7001 1 0
   3: 0100007F:C739 0100007F:2116 01 00000000:00000000 00:00000000 00000000 {ME + 1:5d} 0 7003 1 0
   4: 0100007F:C73A 0100007F:2116 06 00000000:00000000 03:00000337 00000000 {ME:5d} 0 0 3 0
garbage line
"""
# A dual-stack bridge on [::]:8470: the end of an IPv4 client on 51003 (0xC73B) shows as
# ::ffff:127.0.0.1, and an IPv6 client is on [::1]:51004 (0xC73C).
_ANY6 = "0" * 32
_MAPPED = "0000000000000000FFFF00000100007F"  # ::ffff:127.0.0.1
_ONE6 = "00000000000000000000000001000000"  # ::1
TCP6 = "\n".join(
    [
        "  sl  local_address remote_address st tx_queue rx_queue tr tm->when retrnsmt uid ...",
        f"   0: {_ANY6}:2116 {_ANY6}:0000 0A 0:0 0:0 0 {ME} 0 8000 1",
        f"   1: {_MAPPED}:C73B {_MAPPED}:2116 01 0:0 0:0 0 {ME} 0 8001 1",
        f"   2: {_ONE6}:C73C {_ONE6}:2116 01 0:0 0:0 0 {ME} 0 8002 1",
    ]
)


def test_endpoints_as_a_little_endian_kernel_prints_them() -> None:
    assert peerpid.parse_endpoint("0100007F:2116", "little") == (LOOPBACK, 8470)
    assert peerpid.parse_endpoint("0200007F:0050", "little") == (
        ipaddress.IPv4Address("127.0.0.2"),
        80,
    )
    v6 = "00000000000000000000000001000000:C73C"
    assert peerpid.parse_endpoint(v6, "little") == (ipaddress.IPv6Address("::1"), 51004)


def test_endpoints_as_a_big_endian_kernel_prints_them() -> None:
    assert peerpid.parse_endpoint("7F000001:2116", "big") == (LOOPBACK, 8470)
    v6 = "00000000000000000000000000000001:0050"
    assert peerpid.parse_endpoint(v6, "big") == (ipaddress.IPv6Address("::1"), 80)


def test_an_ipv4_mapped_address_is_its_ipv4() -> None:
    mapped = "0000000000000000FFFF00000100007F:C73B"
    assert peerpid.parse_endpoint(mapped, "little") == (LOOPBACK, 51003)
    assert peerpid.endpoint("::ffff:127.0.0.1", 51003) == (LOOPBACK, 51003)
    assert peerpid.endpoint("::1", 1) == (ipaddress.IPv6Address("::1"), 1)


@pytest.mark.parametrize("text", ["", "0100007F", "0100007F:", "01007F:0050", "XX00007F:0050"])
def test_what_is_not_an_endpoint(text: str) -> None:
    with pytest.raises(ValueError):
        peerpid.parse_endpoint(text, "little")


def test_a_table_is_parsed_and_its_junk_skipped() -> None:
    rows = peerpid.parse_table(TCP, "little")
    assert [row.inode for row in rows] == [7000, 7002, 7001, 7003, 0]
    assert rows[2] == peerpid.SocketRow(local=CLIENT, remote=BRIDGE, uid=ME, inode=7001)


def test_the_client_end_is_found_by_both_ends_and_the_uid() -> None:
    rows = peerpid.parse_table(TCP, "little") + peerpid.parse_table(TCP6, "little")
    assert peerpid.matching_inodes(rows, CLIENT, BRIDGE, ME) == {7001}
    # Not the bridge's own end of the same connection, whose ends are the other way round.
    assert peerpid.matching_inodes(rows, BRIDGE, CLIENT, ME) == {7002}
    # Another user's socket, and a socket no process holds, are never found.
    assert peerpid.matching_inodes(rows, (LOOPBACK, 51001), BRIDGE, ME) == frozenset()
    assert peerpid.matching_inodes(rows, (LOOPBACK, 51002), BRIDGE, ME) == frozenset()
    # A dual-stack bridge: the IPv4 client, and the IPv6 one.
    assert peerpid.matching_inodes(rows, (LOOPBACK, 51003), BRIDGE, ME) == {8001}
    v6 = ipaddress.IPv6Address("::1")
    assert peerpid.matching_inodes(rows, (v6, 51004), (v6, 8470), ME) == {8002}


@pytest.mark.parametrize(
    ("link", "inode"),
    [
        ("socket:[7001]", 7001),
        ("socket:[]", None),
        ("socket:[12x]", None),
        ("pipe:[7001]", None),
        ("/home/ken/socket:[7001]", None),
        ("anon_inode:[eventfd]", None),
    ],
)
def test_socket_links(link: str, inode: int | None) -> None:
    assert peerpid.socket_inode(link) == inode


def _fake_proc(root: Path, holders: dict[int, list[str]]) -> Path:
    """A /proc with the tables above and processes whose descriptors link to ``holders``."""
    (root / "net").mkdir(parents=True)
    (root / "net" / "tcp").write_text(TCP)
    (root / "net" / "tcp6").write_text(TCP6)
    (root / "self").mkdir()
    for pid, links in holders.items():
        fd = root / str(pid) / "fd"
        fd.mkdir(parents=True)
        for number, link in enumerate(links):
            os.symlink(link, fd / str(number))
    return root


def test_the_pids_holding_the_client_end(tmp_path: Path) -> None:
    proc = _fake_proc(
        tmp_path,
        {
            100: ["/dev/null", "socket:[7001]"],  # the client
            101: ["socket:[7001]"],  # a child that inherited it
            102: ["socket:[7002]"],  # the bridge, holding its own end
            103: [],
        },
    )
    found = peerpid.peer_pids(CLIENT, BRIDGE, proc=proc, uid=ME, byteorder="little")
    assert found == {100, 101}


def test_nothing_found_is_an_empty_answer(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {100: ["socket:[9999]"]})
    assert peerpid.peer_pids(CLIENT, BRIDGE, proc=proc, uid=ME, byteorder="little") == set()
    # Another user's socket is not looked for, even if one of our processes held it.
    proc2 = _fake_proc(tmp_path / "two", {100: ["socket:[7003]"]})
    other = (LOOPBACK, 51001)
    assert peerpid.peer_pids(other, BRIDGE, proc=proc2, uid=ME, byteorder="little") == set()
    # No /proc at all.
    nowhere = tmp_path / "nowhere"
    assert peerpid.peer_pids(CLIENT, BRIDGE, proc=nowhere, uid=ME) == set()


def test_only_the_users_own_processes_are_searched(tmp_path: Path) -> None:
    """Looking for uid ME+1's socket, a process of uid ME that holds it is not looked at:
    only processes of the socket's own user are searched."""
    proc = _fake_proc(tmp_path, {100: ["socket:[7003]"]})
    other = (LOOPBACK, 51001)
    assert peerpid.peer_pids(other, BRIDGE, proc=proc, uid=ME + 1, byteorder="little") == set()


def test_run_pid_asks_about_each_holder(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {100: ["socket:[7001]"], 101: ["socket:[7001]"]})
    asked: list[int] = []

    def belongs(pid: int) -> bool:
        asked.append(pid)
        return pid == 101

    assert peerpid.run_pid(CLIENT, BRIDGE, belongs, proc=proc, uid=ME) == 101
    assert asked == [100, 101]
    assert peerpid.run_pid(CLIENT, BRIDGE, lambda pid: False, proc=proc, uid=ME) is None


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_a_real_connection_leads_to_this_process(family: socket.AddressFamily) -> None:
    """On this machine's own /proc: a loopback connection's client end is held by us."""
    listener = socket.socket(family)
    try:
        # A dual-stack listener sees the IPv4 client as ::ffff:127.0.0.1.
        listener.bind(("::" if family == socket.AF_INET6 else "127.0.0.1", 0))
    except OSError:
        listener.close()
        pytest.skip("no IPv6 here")
    with listener:
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, peer = listener.accept()
            with accepted:
                host = accepted.getsockname()
                found = peerpid.peer_pids(
                    peerpid.endpoint(peer[0], peer[1]), peerpid.endpoint(host[0], host[1])
                )
    assert found == {os.getpid()}
