"""A seccomp filter that leaves the answering agent no UNIX sockets of its own.

Landlock (up to ABI 7) does not govern ``connect()`` to a pathname UNIX socket, and every
socket the owner's desktop offers is one: the SSH agent (sign as the owner), the D-Bus session
bus (systemd ``--user`` starts commands outside any boundary), X11 and Wayland (type into the
owner's session), Docker (root), the listener's own service socket. So the run may not create
a UNIX socket at all (``socket(AF_UNIX, …)`` fails with ``EACCES``). ``socketpair`` of the
stream kind stays allowed, since runtimes connect their children's pipes with it; a datagram
pair is refused, because a datagram socket can still ``sendto`` a path. ``io_uring_setup``
fails with ``ENOSYS`` (as on a kernel without it), since io_uring creates and connects sockets
without passing through these system calls, and runtimes fall back to plain calls.

Only the machine's own system call convention is allowed: a 32-bit or x32 call (another
numbering, where ``socket`` is reached through ``socketcall``) kills the process. Abstract
UNIX sockets and signals are Landlock's (ABI 6 scopes), applied beside this.

Standard library only: the exec wrapper imports it in front of every confined agent.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_SET_NO_NEW_PRIVS = 38

# Classic BPF, as <linux/filter.h> and <linux/seccomp.h> define it.
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
BPF_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];
OFFSET_NR = 0
OFFSET_ARCH = 4
OFFSET_ARG0_LOW = 16  # little-endian: the low half of each argument comes first
OFFSET_ARG1_LOW = 24

AF_UNIX = 1
SOCK_STREAM = 1
SOCK_TYPE_MASK = 0xF  # the type without SOCK_NONBLOCK and SOCK_CLOEXEC
X32_SYSCALL_BIT = 0x40000000


class Arch:
    """One architecture's audit number and the system call numbers the filter names."""

    def __init__(self, audit: int, socket: int, socketpair: int, io_uring_setup: int) -> None:
        self.audit = audit
        self.socket = socket
        self.socketpair = socketpair
        self.io_uring_setup = io_uring_setup


# uname's machine name -> its numbers (asm/unistd_64.h; asm-generic/unistd.h for aarch64).
ARCHES: dict[str, Arch] = {
    "x86_64": Arch(0xC000003E, socket=41, socketpair=53, io_uring_setup=425),
    "aarch64": Arch(0xC00000B7, socket=198, socketpair=199, io_uring_setup=425),
}


class SeccompError(OSError):
    """The filter could not be installed; the message says why."""


Instruction = tuple[int, int, int, int]  # code, jump if true, jump if false, k


def program(arch: Arch) -> list[Instruction]:
    """The filter, as classic BPF instructions."""
    deny = RET_ERRNO | errno.EACCES
    absent = RET_ERRNO | errno.ENOSYS
    # A jump skips that many instructions (to pc + 1 + n); the numbers on the right are each
    # instruction's index, and where its jumps land.
    code: list[Instruction] = [
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARCH),  # 0
        (BPF_JEQ_K, 1, 0, arch.audit),  # 1: native -> 3
        (BPF_RET_K, 0, 0, RET_KILL_PROCESS),  # 2: a foreign convention
        (BPF_LD_W_ABS, 0, 0, OFFSET_NR),  # 3
        (BPF_JGE_K, 0, 1, X32_SYSCALL_BIT),  # 4: below the x32 bit -> 6
        (BPF_RET_K, 0, 0, RET_KILL_PROCESS),  # 5: x32
        (BPF_JEQ_K, 4, 0, arch.socket),  # 6: -> 11
        (BPF_JEQ_K, 6, 0, arch.socketpair),  # 7: -> 14
        (BPF_JEQ_K, 1, 0, arch.io_uring_setup),  # 8: -> 10
        (BPF_RET_K, 0, 0, RET_ALLOW),  # 9: every other call
        (BPF_RET_K, 0, 0, absent),  # 10
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARG0_LOW),  # 11: socket's domain
        (BPF_JEQ_K, 6, 0, AF_UNIX),  # 12: UNIX -> 19
        (BPF_RET_K, 0, 0, RET_ALLOW),  # 13
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARG0_LOW),  # 14: socketpair's domain
        (BPF_JEQ_K, 0, 4, AF_UNIX),  # 15: not UNIX -> 20
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARG1_LOW),  # 16: its type
        (BPF_AND_K, 0, 0, SOCK_TYPE_MASK),  # 17
        (BPF_JEQ_K, 1, 0, SOCK_STREAM),  # 18: a stream pair -> 20
        (BPF_RET_K, 0, 0, deny),  # 19
        (BPF_RET_K, 0, 0, RET_ALLOW),  # 20
    ]
    return code


def encode(code: Sequence[Instruction]) -> bytes:
    """The instructions as ``struct sock_filter`` array bytes."""
    return b"".join(struct.pack("=HBBI", op, jt, jf, k) for op, jt, jf, k in code)


def current_arch(machine: str | None = None) -> Arch | None:
    """This machine's numbers, or None where the filter does not know them."""
    return ARCHES.get(machine or os.uname().machine)


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def install(arch: Arch) -> None:
    """Install the filter on this process (kept across exec, inherited by children)."""
    raw = encode(program(arch))
    buffer = ctypes.create_string_buffer(raw, len(raw))
    prog = _SockFprog(len(raw) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SeccompError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise SeccompError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
