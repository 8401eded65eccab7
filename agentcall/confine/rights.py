"""The access kinds of a ruleset and the Landlock rights each grants on a given ABI.

Its own module, with nothing imported, because the exec wrapper (:mod:`agentcall.confine.main`)
needs it and starts in front of every confined agent: what it imports is paid on every call.
"""

from __future__ import annotations

# Access kinds, from least to most.
LIST = "list"  # list directories beneath (names only)
READ = "read"  # read files, list directories, execute
APPEND = "append"  # write to an existing file (no read, no truncate): the guard's tools.log
DEVICE = "device"  # /dev: read, write and ioctl on device files, no creating
WRITE = "write"  # everything: read, create, write, remove, rename
KINDS = (LIST, READ, APPEND, DEVICE, WRITE)
# Network rules, whose value is not a path. ``TCP`` (value ``TCP_VALUE``) makes the run's TCP
# handled: it binds no port and connects only to the ports of its ``CONNECT`` rules (value: a
# decimal port). A ruleset without it leaves the network alone.
TCP = "tcp"
TCP_VALUE = "bind-none"
CONNECT = "connect"
NET_KINDS = (TCP, CONNECT)
# The first ABI with TCP rules (Linux 6.7).
NET_ABI = 4


def is_port(text: str) -> bool:
    """Whether ``text`` is a TCP port written as plain decimal digits (``int()`` would also
    take ``+443``, `` 443`` or ``4_43``)."""
    return text.isascii() and text.isdigit() and len(text) <= 5 and 0 < int(text) < 65536


# Landlock scopes (ABI 6, Linux 6.12): a confined run may not connect to an abstract UNIX
# socket, nor signal a process, outside its own domain.
SCOPE_ABI = 6
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1
SCOPES = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL


def scopes_for(abi: int) -> int:
    """The scopes a ruleset restricts on this ABI: all it knows."""
    return SCOPES if abi >= SCOPE_ABI else 0


# Landlock filesystem rights (include/uapi/linux/landlock.h) and the ABI that brought each.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
_ABI1_ALL = (1 << 13) - 1
# Landlock network rights (ABI 4).
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
NET_RIGHTS = NET_BIND_TCP | NET_CONNECT_TCP
# The rights a rule on a file (not a directory) may carry.
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV


def handled_rights(abi: int) -> int:
    """Every filesystem right the kernel of this ABI knows: all of them are restricted."""
    if abi < 1:
        return 0
    rights = _ABI1_ALL
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def rights_for(kind: str, abi: int, *, is_dir: bool) -> int:
    """The rights one rule of ``kind`` grants on this ABI (a file rule: file rights only)."""
    if kind == LIST:
        rights = READ_DIR
    elif kind == READ:
        rights = READ_FILE | READ_DIR | EXECUTE
    elif kind == APPEND:
        rights = WRITE_FILE
    elif kind == DEVICE:
        rights = READ_FILE | READ_DIR | WRITE_FILE | TRUNCATE | IOCTL_DEV
    elif kind == WRITE:
        rights = (
            READ_FILE
            | READ_DIR
            | EXECUTE
            | WRITE_FILE
            | REMOVE_DIR
            | REMOVE_FILE
            | MAKE_DIR
            | MAKE_REG
            | MAKE_SOCK
            | MAKE_FIFO
            | MAKE_SYM
            | REFER
            | TRUNCATE
        )
    else:
        raise ValueError(f"unknown access kind {kind!r}")
    if not is_dir:
        rights &= FILE_RIGHTS
    return rights & handled_rights(abi)
