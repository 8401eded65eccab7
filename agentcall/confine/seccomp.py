"""A seccomp filter that leaves the answering agent no UNIX sockets of its own.

Landlock (up to ABI 7) does not govern ``connect()`` to a pathname UNIX socket, and every
socket the owner's desktop offers is one: the SSH agent (sign as the owner), the D-Bus session
bus (systemd ``--user`` starts commands outside any boundary), X11 and Wayland (type into the
owner's session), Docker (root), the listener's own service socket. So the run may not create
a UNIX socket at all (``socket(AF_UNIX, …)`` fails with ``EACCES``). ``socketpair`` of the
stream kind stays allowed, since runtimes connect their children's pipes with it; a datagram
pair is refused, because a datagram socket can still ``sendto`` a path. ``io_uring_setup``
fails with ``ENOSYS`` (as on a kernel without it), since io_uring creates and connects sockets
without passing through these system calls, and runtimes fall back to plain calls. The same
``ENOSYS`` for System V IPC and the kernel keyrings, and calls that act on another process by
user id alone (``prlimit64``, ``setpriority``, the scheduler's) may name only the caller.

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

    def __init__(
        self,
        audit: int,
        *,
        socket: int,
        socketpair: int,
        absent: tuple[int, ...],
        self_only: tuple[int, ...],
        who_self: tuple[tuple[int, int], ...],
    ) -> None:
        self.audit = audit
        self.socket = socket
        self.socketpair = socketpair
        # Calls that fail with ENOSYS, as on a kernel built without them.
        self.absent = absent
        # Calls whose first argument names a process: allowed only on the caller itself (0).
        self.self_only = self_only
        # (call, which): allowed only as ``call(which, 0, ...)``, the caller itself.
        self.who_self = who_self


# uname's machine name -> its numbers (asm/unistd_64.h; asm-generic/unistd.h for aarch64).
# absent: io_uring_setup (it creates and connects sockets behind the filter's back), System V
# shared memory, semaphores and message queues (they outlive the run and are shared with the
# owner's processes), and the kernel keyrings (the owner's keys, Kerberos tickets).
# self_only: prlimit64 (RLIMIT_CPU on the listener kills it), sched_setparam,
# sched_setscheduler, sched_setattr. who_self: setpriority (PRIO_PROCESS) and ioprio_set
# (IOPRIO_WHO_PROCESS): the same-user checks of all these ignore Landlock's scopes.
ARCHES: dict[str, Arch] = {
    "x86_64": Arch(
        0xC000003E,
        socket=41,
        socketpair=53,
        absent=(425, 29, 30, 31, 67, 64, 65, 66, 220, 68, 69, 70, 71, 248, 249, 250),
        self_only=(302, 142, 144, 314),
        who_self=((141, 0), (251, 1)),
    ),
    "aarch64": Arch(
        0xC00000B7,
        socket=198,
        socketpair=199,
        absent=(425, *range(186, 198), 217, 218, 219),
        self_only=(261, 118, 119, 274),
        who_self=((140, 0), (30, 1)),
    ),
}


class SeccompError(OSError):
    """The filter could not be installed; the message says why."""


Instruction = tuple[int, int, int, int]  # code, jump if true, jump if false, k
# Before assembly a jump names a label (a string) or skips a number of instructions.
_Jump = int | str
_Item = tuple[int, _Jump, _Jump, int] | str


def _assemble(items: list[_Item]) -> list[Instruction]:
    """Resolve labels (the strings in ``items``) into relative jumps."""
    labels: dict[str, int] = {}
    code: list[tuple[int, _Jump, _Jump, int]] = []
    for item in items:
        if isinstance(item, str):
            labels[item] = len(code)
        else:
            code.append(item)

    def offset(pc: int, jump: _Jump) -> int:
        target = labels[jump] if isinstance(jump, str) else pc + 1 + jump
        skip = target - pc - 1
        if not 0 <= skip <= 255:
            raise ValueError("a jump of the filter does not fit")
        return skip

    return [(op, offset(pc, jt), offset(pc, jf), k) for pc, (op, jt, jf, k) in enumerate(code)]


def program(arch: Arch) -> list[Instruction]:
    """The filter, as classic BPF instructions."""
    items: list[_Item] = [
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARCH),
        (BPF_JEQ_K, 1, 0, arch.audit),
        (BPF_RET_K, 0, 0, RET_KILL_PROCESS),  # a foreign convention: another numbering
        (BPF_LD_W_ABS, 0, 0, OFFSET_NR),
        (BPF_JGE_K, 0, 1, X32_SYSCALL_BIT),
        (BPF_RET_K, 0, 0, RET_KILL_PROCESS),  # x32
        (BPF_JEQ_K, "socket", 0, arch.socket),
        (BPF_JEQ_K, "socketpair", 0, arch.socketpair),
    ]
    items += [(BPF_JEQ_K, "absent", 0, nr) for nr in arch.absent]
    items += [(BPF_JEQ_K, "arg0 is self", 0, nr) for nr in arch.self_only]
    items += [(BPF_JEQ_K, f"who {nr}", 0, nr) for nr, _which in arch.who_self]
    items += [
        (BPF_RET_K, 0, 0, RET_ALLOW),  # every other call
        "absent",
        (BPF_RET_K, 0, 0, RET_ERRNO | errno.ENOSYS),
        "socket",
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARG0_LOW),
        (BPF_JEQ_K, "refuse", "allow", AF_UNIX),
        "socketpair",
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARG0_LOW),
        (BPF_JEQ_K, 0, "allow", AF_UNIX),
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARG1_LOW),
        (BPF_AND_K, 0, 0, SOCK_TYPE_MASK),
        (BPF_JEQ_K, "allow", "refuse", SOCK_STREAM),
        "arg0 is self",
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARG0_LOW),
        (BPF_JEQ_K, "allow", "not yours", 0),
    ]
    for nr, which in arch.who_self:
        items += [
            f"who {nr}",
            (BPF_LD_W_ABS, 0, 0, OFFSET_ARG0_LOW),
            (BPF_JEQ_K, 0, "not yours", which),
            (BPF_LD_W_ABS, 0, 0, OFFSET_ARG1_LOW),
            (BPF_JEQ_K, "allow", "not yours", 0),
        ]
    items += [
        "refuse",
        (BPF_RET_K, 0, 0, RET_ERRNO | errno.EACCES),
        "not yours",
        (BPF_RET_K, 0, 0, RET_ERRNO | errno.EPERM),
        "allow",
        (BPF_RET_K, 0, 0, RET_ALLOW),
    ]
    return _assemble(items)


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
