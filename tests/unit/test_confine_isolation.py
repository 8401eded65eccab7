"""What a confined run can no longer talk to: UNIX sockets of its own (the seccomp filter, read
here by a small BPF interpreter and then tried for real), abstract sockets and signals outside
the run (Landlock's ABI 6 scopes), other processes' /proc, and the owner's shared memory."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from agentcall.confine import landlock, prepare, rights, seccomp
from agentcall.confine.rules import Confinement

ABI, WHY_NOT = landlock.probe()
X86 = seccomp.ARCHES["x86_64"]
ARM = seccomp.ARCHES["aarch64"]
I386 = 0x40000003


def evaluate(code: list[seccomp.Instruction], nr: int, arch: int, args: tuple[int, ...]) -> int:
    """Run classic BPF as the kernel would on one struct seccomp_data."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    acc, pc = 0, 0
    for _step in range(len(code) + 1):
        op, jt, jf, k = code[pc]
        if op == seccomp.BPF_LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == seccomp.BPF_AND_K:
            acc &= k
        elif op in (seccomp.BPF_JEQ_K, seccomp.BPF_JGE_K):
            taken = acc == k if op == seccomp.BPF_JEQ_K else acc >= k
            pc += jt if taken else jf
        elif op == seccomp.BPF_RET_K:
            return k
        else:
            raise AssertionError(f"unknown instruction {op:#x}")
        pc += 1
    raise AssertionError("the program did not return")


DENY = seccomp.RET_ERRNO | errno.EACCES
ABSENT = seccomp.RET_ERRNO | errno.ENOSYS
ALLOW = seccomp.RET_ALLOW
KILL = seccomp.RET_KILL_PROCESS
CLOEXEC_NONBLOCK = 0o2000000 | 0o4000


# Each call by name: its number on each machine (what the filter must tell apart).
NUMBERS = {
    "socket": {"x86_64": 41, "aarch64": 198},
    "socketpair": {"x86_64": 53, "aarch64": 199},
    "io_uring_setup": {"x86_64": 425, "aarch64": 425},
    "shmget": {"x86_64": 29, "aarch64": 194},
    "msgget": {"x86_64": 68, "aarch64": 186},
    "semop": {"x86_64": 65, "aarch64": 193},
    "keyctl": {"x86_64": 250, "aarch64": 219},
    "prlimit64": {"x86_64": 302, "aarch64": 261},
    "sched_setscheduler": {"x86_64": 144, "aarch64": 119},
    "setpriority": {"x86_64": 141, "aarch64": 140},
    "ioprio_set": {"x86_64": 251, "aarch64": 30},
    "getpid": {"x86_64": 39, "aarch64": 172},
    "sched_setaffinity": {"x86_64": 203, "aarch64": 122},
}
EPERM = seccomp.RET_ERRNO | errno.EPERM
PRIO_PROCESS, PRIO_USER = 0, 2
IOPRIO_WHO_PROCESS, IOPRIO_WHO_USER = 1, 3


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
@pytest.mark.parametrize(
    ("call", "args", "verdict"),
    [
        ("socket", (socket.AF_UNIX, socket.SOCK_STREAM), DENY),
        ("socket", (socket.AF_UNIX, socket.SOCK_DGRAM | CLOEXEC_NONBLOCK), DENY),
        ("socket", (socket.AF_UNIX | (1 << 32), socket.SOCK_STREAM), DENY),  # high half ignored
        ("socket", (socket.AF_INET, socket.SOCK_STREAM), ALLOW),
        ("socket", (socket.AF_INET6, socket.SOCK_DGRAM), ALLOW),
        ("socket", (socket.AF_NETLINK, socket.SOCK_RAW), ALLOW),
        ("socketpair", (socket.AF_UNIX, socket.SOCK_STREAM), ALLOW),
        ("socketpair", (socket.AF_UNIX, socket.SOCK_STREAM | CLOEXEC_NONBLOCK), ALLOW),
        ("socketpair", (socket.AF_UNIX, socket.SOCK_DGRAM), DENY),
        ("socketpair", (socket.AF_UNIX, socket.SOCK_SEQPACKET), DENY),
        ("io_uring_setup", (8, 0), ABSENT),
        ("shmget", (0, 4096, 0o1600), ABSENT),
        ("msgget", (0, 0o1600), ABSENT),
        ("semop", (1, 0, 1), ABSENT),
        ("keyctl", (5, 0), ABSENT),
        ("prlimit64", (0, 0), ALLOW),  # its own limits: setrlimit and getrlimit
        ("prlimit64", (4242, 0), EPERM),  # another process's: RLIMIT_CPU kills it
        ("prlimit64", (1 << 32, 0), ALLOW),  # a pid_t is the low half: still the caller
        ("sched_setscheduler", (0, 5), ALLOW),
        ("sched_setscheduler", (4242, 5), EPERM),
        ("setpriority", (PRIO_PROCESS, 0, 10), ALLOW),  # nice(1)
        ("setpriority", (PRIO_PROCESS, 4242, 10), EPERM),
        ("setpriority", (PRIO_USER, 0, 19), EPERM),  # every process of the owner
        ("ioprio_set", (IOPRIO_WHO_PROCESS, 0, 7), ALLOW),
        ("ioprio_set", (IOPRIO_WHO_USER, 0, 7), EPERM),
        ("ioprio_set", (IOPRIO_WHO_PROCESS, 4242, 7), EPERM),
        ("getpid", (socket.AF_UNIX,), ALLOW),
        ("sched_setaffinity", (4242, 8, 0), ALLOW),  # left open: it pins, it does not stop
    ],
)
def test_the_filter_decides_each_call(
    machine: str, call: str, args: tuple[int, ...], verdict: int
) -> None:
    arch = seccomp.ARCHES[machine]
    nr = NUMBERS[call][machine]
    assert evaluate(seccomp.program(arch), nr, arch.audit, args) == verdict


@pytest.mark.parametrize(
    ("nr", "arch_number"),
    [(102, I386), (359, I386), (1, I386), (41 | seccomp.X32_SYSCALL_BIT, X86.audit)],
)
def test_a_foreign_call_convention_kills_the_process(nr: int, arch_number: int) -> None:
    """socketcall(2) of 32-bit x86, or x32's numbering, would bypass the numbers above."""
    assert evaluate(seccomp.program(X86), nr, arch_number, (socket.AF_UNIX,)) == KILL


def test_every_jump_lands_inside_the_program() -> None:
    code = seccomp.program(X86)
    for index, (op, jt, jf, _k) in enumerate(code):
        if op in (seccomp.BPF_JEQ_K, seccomp.BPF_JGE_K):
            assert index + 1 + max(jt, jf) < len(code)
    assert code[-1][0] == seccomp.BPF_RET_K
    assert len(seccomp.encode(code)) == 8 * len(code)


def test_the_machine_names_the_filter_knows() -> None:
    assert seccomp.current_arch("x86_64") is X86
    assert seccomp.current_arch("riscv64") is None


def test_the_scopes_come_with_abi_6() -> None:
    assert rights.scopes_for(5) == 0
    assert rights.scopes_for(6) == rights.scopes_for(7) == rights.SCOPES == 3


def test_a_scoped_ruleset_is_created_with_the_longer_structure() -> None:
    sizes: list[int] = []

    def record(number: int, *args: object) -> tuple[int, int]:
        if number == landlock.SYS_CREATE_RULESET:
            sizes.append(args[1].value)  # type: ignore[attr-defined]
            return -1, errno.EINVAL
        raise AssertionError(number)

    for scoped, handled_net in ((rights.SCOPES, 0), (0, rights.NET_RIGHTS), (0, 0)):
        with pytest.raises(landlock.LandlockError):
            landlock.restrict(1, [], record, handled_net=handled_net, scoped=scoped)
    assert sizes == [24, 16, 8]


# --- tried for real, from inside the boundary -----------------------------------------------

PROBE = r"""
import ctypes, os, resource, signal, socket, sys
path, abstract, decoy = sys.argv[1], sys.argv[2], int(sys.argv[3])
def attempt(name, action):
    try:
        action()
        print(name, "ok")
    except OSError as exc:
        print(name, "refused", exc.errno)
def pathname():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
def abstract_socket():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect("\0" + abstract)
def pair():
    a, b = socket.socketpair()
    a.sendall(b"x"); assert b.recv(1) == b"x"
def own_proc():
    with open("/proc/self/status") as f:
        f.read()
def other_environ():
    with open(f"/proc/{decoy}/environ", "rb") as f:
        f.read()
def other_cmdline():
    with open(f"/proc/{decoy}/cmdline", "rb") as f:
        f.read()
def shm():
    with open("/dev/shm/agentcall-left-behind", "w") as f:
        f.write("instructions for the next run")
def signal_decoy():
    os.kill(decoy, 0)
def limit_decoy():
    resource.prlimit(decoy, resource.RLIMIT_CPU, (1, 1))
def message_queue():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.msgget(0, 0o1600) < 0:
        raise OSError(ctypes.get_errno(), "msgget")
for name, action in [("pathname", pathname), ("abstract", abstract_socket), ("pair", pair),
                     ("own_proc", own_proc), ("environ", other_environ),
                     ("cmdline", other_cmdline), ("shm", shm), ("signal", signal_decoy),
                     ("prlimit", limit_decoy), ("msgget", message_queue)]:
    attempt(name, action)
"""


def _results(output: str) -> dict[str, str]:
    found = {}
    for line in output.splitlines():
        name, _, verdict = line.partition(" ")
        found[name] = verdict
    return found


@pytest.mark.skipif(ABI < 1, reason=f"no Landlock on this kernel: {WHY_NOT}")
@pytest.mark.skipif(seccomp.current_arch() is None, reason="no filter for this machine")
@pytest.mark.slow
def test_a_confined_run_reaches_no_socket_process_or_shared_memory_outside_it(
    tmp_path: Path,
) -> None:
    """The owner's pathname and abstract sockets, a decoy process's environment and its
    signals, and /dev/shm are all out of reach; the run's own socketpair and /proc work."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    path = tmp_path / "owner.sock"
    abstract = f"agentcall-test-{os.getpid()}"
    decoy = subprocess.Popen(
        [sys.executable, "-I", "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        env={"SECRET_TOKEN": "decoy-secret"},
    )
    shm_file = Path("/dev/shm/agentcall-left-behind")
    with socket.socket(socket.AF_UNIX) as owner, socket.socket(socket.AF_UNIX) as hidden:
        owner.bind(str(path))
        owner.listen(1)
        hidden.bind("\0" + abstract)
        hidden.listen(1)
        python = os.path.realpath(sys.executable)
        conf = Confinement(
            (str(tmp_path),), (), str(tmp_path), runtime=(sys.prefix, sys.base_prefix, python)
        )
        prepared = prepare.prepare(
            conf, [python, "-I", str(probe), str(path), abstract, str(decoy.pid)], {}
        )
        try:
            done = subprocess.run(
                list(prepared.argv),
                env=prepared.env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            prepare.cleanup(prepared.private_tmp)
            assert decoy.stdin is not None
            decoy.stdin.close()
            decoy.wait(timeout=60)
    found = _results(done.stdout)
    assert found.get("pathname") == f"refused {errno.EACCES}", done.stdout + done.stderr
    assert found["pair"] == "ok"
    assert found["own_proc"] == "ok"
    assert found["environ"].startswith("refused")
    assert found["cmdline"].startswith("refused")
    assert found["shm"].startswith("refused")
    assert not shm_file.exists()
    # No UNIX socket can be made at all, so the abstract one is refused by the filter first
    # (the scope alone: the test below).
    assert found["abstract"] == f"refused {errno.EACCES}"
    # Same-user calls the scopes do not cover: no limit on another process, no System V queue.
    assert found["prlimit"] == f"refused {errno.EPERM}"
    assert found["msgget"] == f"refused {errno.ENOSYS}"
    if ABI >= rights.SCOPE_ABI:
        assert found["signal"] == f"refused {errno.EPERM}"


@pytest.mark.skipif(ABI < rights.SCOPE_ABI, reason=f"no Landlock scopes here (ABI {ABI})")
@pytest.mark.slow
def test_the_scopes_alone_refuse_an_abstract_socket_and_a_signal(tmp_path: Path) -> None:
    """Without the filter (which refuses every UNIX socket first): Landlock's scope refuses
    the abstract socket by itself."""
    abstract = f"agentcall-scope-{os.getpid()}"
    script = (
        "import os, socket, sys\n"
        "from agentcall.confine import landlock, rights\n"
        "landlock.restrict(rights.handled_rights(landlock.abi_version()), [],"
        " scoped=rights.SCOPES)\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect('\\0' + sys.argv[1]); print('connected')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
        "try:\n"
        "    os.kill(int(sys.argv[2]), 0); print('signalled')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(landlock.__file__)))
    with socket.socket(socket.AF_UNIX) as hidden:
        hidden.bind("\0" + abstract)
        hidden.listen(1)
        done = subprocess.run(
            [sys.executable, "-c", script, abstract, str(os.getpid())],
            env={"PYTHONPATH": root},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.stdout.split("\n")[:2] == [f"refused {errno.EPERM}"] * 2, done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_process_made_undumpable_hides_its_proc_files_from_its_own_user() -> None:
    """What the listener does first: afterwards /proc/PID/environ belongs to root, so the
    owner's other processes (an answering agent among them) cannot open it."""
    script = (
        "import os, sys\n"
        "from agentcall.confine.undumpable import is_dumpable, make_undumpable\n"
        "before = is_dumpable()\n"
        "assert make_undumpable()\n"
        "print(before, is_dumpable(), os.stat(f'/proc/{os.getpid()}/environ').st_uid)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(landlock.__file__)))
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": root},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.split() == ["True", "False", "0"], done.stderr


def test_no_undumpable_switch_off_linux() -> None:
    from agentcall.confine.undumpable import make_undumpable

    assert make_undumpable(platform="darwin") is False


DIES_WITH_LISTENER = """
import subprocess, sys
from agentcall.confine import prepare
from agentcall.confine.rules import Confinement
conf = Confinement((sys.argv[1],), (), sys.argv[1])
agent = ["/bin/sh", "-c", "echo running; exec sleep 600"]
prepared = prepare.prepare(conf, agent, {"PATH": "/usr/bin:/bin"})
child = subprocess.Popen(list(prepared.argv), env=prepared.env)
print(child.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(ABI < 1, reason=f"no Landlock on this kernel: {WHY_NOT}")
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfd_open (Linux 5.3)")
@pytest.mark.slow
def test_a_run_dies_with_its_listener_even_by_kill_9(tmp_path: Path) -> None:
    """A process standing for the listener starts a confined `sleep 600` and is SIGKILLed:
    the kernel kills the run at once (its parent-death signal), no orphan is left."""
    import select

    root = os.path.dirname(os.path.dirname(os.path.abspath(landlock.__file__)))
    listener = subprocess.Popen(
        [sys.executable, "-c", DIES_WITH_LISTENER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"},
    )
    assert listener.stdout is not None
    run = int(listener.stdout.readline())
    watch = os.pidfd_open(run)
    # Past the wrapper: the agent itself runs (not a wrapper that found its listener gone).
    assert listener.stdout.readline() == b"running\n"
    try:
        listener.kill()
        listener.wait(timeout=60)
        # Readable once the run has ended: an event, bounded for a loaded machine.
        ended, _, _ = select.select([watch], [], [], 60)
        assert ended == [watch], f"the run {run} outlived its listener"
    finally:
        os.close(watch)
        with contextlib.suppress(ProcessLookupError):
            os.kill(run, signal.SIGKILL)


def test_the_listener_pid_is_the_wrappers_alone(tmp_path: Path) -> None:
    """The wrapper takes the listener's pid from its environment and the agent never sees it;
    a wrapper whose listener is already gone does not start the agent."""
    conf = Confinement((str(tmp_path),), (), str(tmp_path))
    prepared = prepare.prepare(conf, ["/usr/bin/env"], {"PATH": "/usr/bin:/bin"})
    try:
        assert prepared.env["AGENTCALL_LISTENER_PID"] == str(os.getpid())
        shown = subprocess.run(
            list(prepared.argv), env=prepared.env, capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0, shown.stderr
        assert "AGENTCALL_LISTENER_PID" not in shown.stdout and "PATH=" in shown.stdout
    finally:
        prepare.cleanup(prepared.private_tmp)
    prepared = prepare.prepare(conf, ["/usr/bin/env"], {"PATH": "/usr/bin:/bin"})
    try:
        gone = subprocess.run(
            list(prepared.argv),
            env={**prepared.env, "AGENTCALL_LISTENER_PID": "1"},  # not its parent
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert gone.returncode == 126 and "is gone" in gone.stderr and "PATH=" not in gone.stdout
    finally:
        prepare.cleanup(prepared.private_tmp)
