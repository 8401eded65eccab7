"""The three Landlock system calls, through ctypes, and the probe of the kernel's ABI.

No binding on PyPI was both maintained and released as stable when this was written, and the
exec wrapper must start on the standard library alone, so this is our own, and small.
Structures and numbers are those of ``include/uapi/linux/landlock.h``; the system call numbers
are the same on every Linux architecture that has them (444, 445, 446).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

# The exec wrapper imports this module in front of every agent: functools and collections.abc
# (the collections package) were a third of its imports, and are needed for annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    # syscall(number, *args) -> (result, errno)
    Syscall = Callable[..., tuple[int, int]]

SYS_CREATE_RULESET = 444
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
RULE_NET_PORT = 2
PR_SET_NO_NEW_PRIVS = 38


class LandlockError(OSError):
    """A Landlock system call failed; the message says which and why."""


class _RulesetAttr(ctypes.Structure):
    # Only the first member: the kernel accepts a shorter structure from older callers (ABI
    # 1-3 know no other), and it is all a run that leaves the network alone needs.
    _fields_ = (("handled_access_fs", ctypes.c_uint64),)


class _NetRulesetAttr(ctypes.Structure):
    # For a kernel below ABI 6, which knows no scopes: the structure stops after the network.
    _fields_ = (("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64))


class _ScopedRulesetAttr(ctypes.Structure):
    # ABI 6: what the domain may not reach outside itself (abstract UNIX sockets, signals).
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _NetPortAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


def _libc_syscall(number: int, *args: object) -> tuple[int, int]:
    libc = ctypes.CDLL(None, use_errno=True)
    func = libc.syscall
    func.restype = ctypes.c_long
    result = func(ctypes.c_long(number), *args)
    return int(result), ctypes.get_errno()


def probe(syscall: Syscall | None = None, platform: str = sys.platform) -> tuple[int, str]:
    """``(abi, "")`` when the kernel enforces Landlock, else ``(0, why not)``."""
    if not platform.startswith("linux"):
        return 0, "Landlock exists only on Linux"
    call = syscall or _libc_syscall
    try:
        result, err = call(
            SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION)
        )
    except (OSError, AttributeError) as exc:
        return 0, f"the system call could not be made ({exc})"
    if result > 0:
        return result, ""
    if err == errno.ENOSYS:
        return 0, "this kernel has no Landlock (Linux 5.13 or later, built with it)"
    if err == errno.EOPNOTSUPP:
        return 0, "Landlock is built into this kernel but not enabled (the lsm= boot option)"
    if err == errno.EPERM:
        return 0, "a seccomp filter or container refuses the Landlock system calls"
    return 0, f"the Landlock probe failed ({os.strerror(err) if err else 'no reason given'})"


def abi_version() -> int:
    """The kernel's Landlock ABI, 0 when there is none (see :func:`probe` for why)."""
    return probe()[0]


_probed: list[int] = []


def cached_abi() -> int:
    """:func:`abi_version`, probed once per process (the kernel's answer does not change)."""
    if not _probed:
        _probed.append(abi_version())
    return _probed[0]


def _check(result: int, err: int, what: str) -> int:
    if result < 0:
        raise LandlockError(err, f"{what}: {os.strerror(err)}")
    return result


def restrict(
    handled: int,
    rules: Iterable[tuple[int, int]],
    syscall: Syscall | None = None,
    *,
    handled_net: int = 0,
    ports: Iterable[tuple[int, int]] = (),
    scoped: int = 0,
) -> None:
    """Confine this process (and every process it starts) for good.

    ``rules`` are ``(fd, allowed rights)`` of open ``O_PATH`` descriptors. ``handled_net``
    (ABI 4) are the network rights restricted, ``ports`` the ``(port, allowed rights)`` that
    lift them; with none handled, the network is left alone. ``scoped`` (ABI 6) are the scopes:
    abstract UNIX sockets and signals outside the domain. Sets ``no_new_privs`` first,
    which Landlock requires of an unprivileged process.
    """
    call = syscall or _libc_syscall
    attr: ctypes.Structure
    if scoped:
        attr = _ScopedRulesetAttr(
            handled_access_fs=handled, handled_access_net=handled_net, scoped=scoped
        )
    elif handled_net:
        attr = _NetRulesetAttr(handled_access_fs=handled, handled_access_net=handled_net)
    else:
        attr = _RulesetAttr(handled_access_fs=handled)
    ruleset = _check(
        *call(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0),
        "landlock_create_ruleset",
    )
    try:
        for fd, allowed in rules:
            beneath = _PathBeneathAttr(allowed_access=allowed, parent_fd=fd)
            _check(
                *call(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(beneath), 0),
                "landlock_add_rule",
            )
        for port, allowed in ports:
            net_port = _NetPortAttr(allowed_access=allowed, port=port)
            _check(
                *call(SYS_ADD_RULE, ruleset, RULE_NET_PORT, ctypes.byref(net_port), 0),
                "landlock_add_rule (network port)",
            )
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        _check(*call(SYS_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
