"""``python -I -m agentcall.confine RULESET PROGRAM [ARGS...]``: confine, then exec the agent.

Twisted's ``spawnProcess`` has no hook that runs in the child before exec, so the listener's
runner starts this small program in front of the agent. It first makes the run a session and
process group of its own (the runner's kill timer signals the group) and has the kernel kill it
when the listener dies (``PR_SET_PDEATHSIG``, kept across the exec), then reads the ruleset
the runner wrote (a 0600 file of this user, deleted as soon as it is read), applies it with
Landlock (with the ABI 6 scopes where the kernel has them: no abstract UNIX socket and no
signal outside the run), installs the seccomp filter that leaves the run no UNIX sockets of
its own (:mod:`agentcall.confine.seccomp`), and execs the agent in place, which keeps the
pid. A ruleset that cannot be read or applied stops here (exit 126): an agent never starts
without the boundary it was planned with.

The runner starts it as ``python -I -S -c BOOT PACKAGE_ROOT RULESET PROGRAM...``
(:func:`agentcall.confine.prepare.wrapper_argv`): without ``site`` the interpreter starts in
about half the time, and the directory that holds this package is put after the standard
library on the module path, so nothing there can stand in for a standard module.

The file is NUL-separated: the header ``agentcall-ruleset-1``, then for each rule its kind and
its value, each ended by a NUL (a path never holds one). A filesystem rule's kind is one of
:data:`agentcall.confine.rights.KINDS` and its value an absolute path (one that no longer
exists is skipped); a network rule's kind is one of :data:`~agentcall.confine.rights.NET_KINDS`:
``tcp`` (value ``bind-none``) restricts TCP, each ``connect`` (value: a decimal port) lets the
run connect to one port. Network rules need Landlock ABI 4: on an older kernel a ruleset that
holds them is not applied at all. Not JSON: this program starts in front of every confined
agent, and the json module (with re) was a quarter of its start-up.
"""

from __future__ import annotations

import os
import stat
import sys

from agentcall.confine import landlock, rights, seccomp

HEADER = b"agentcall-ruleset-1"
FAILED_EXIT = 126
NOT_FOUND_EXIT = 127
MAX_RULESET_BYTES = 4 * 1024 * 1024
PREFIX = "agentcall: "

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


class RulesetError(Exception):
    """The ruleset file is missing, not private, or not the expected shape."""


def read_ruleset(path: str) -> list[tuple[str, str]]:
    """The rules in ``path`` (a private file of this user), which is removed once read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise RulesetError("the ruleset is not a private file of this user")
        raw = os.read(fd, MAX_RULESET_BYTES + 1)
    finally:
        os.close(fd)
        os.unlink(path)
    if len(raw) > MAX_RULESET_BYTES:
        raise RulesetError("the ruleset is too large")
    return parse_ruleset(raw)


def encode_ruleset(entries: Sequence[tuple[str, str]]) -> bytes:
    """The file :func:`read_ruleset` reads (what the listener's runner writes)."""
    fields = [HEADER]
    for path, kind in entries:
        fields += [kind.encode("ascii"), os.fsencode(path)]
    return b"".join(field + b"\0" for field in fields)


def _valid_rule(value: str, kind: str) -> bool:
    if kind in rights.KINDS:
        return os.path.isabs(value)
    if kind == rights.TCP:
        return value == rights.TCP_VALUE
    if kind == rights.CONNECT:
        return rights.is_port(value)
    return False


def parse_ruleset(raw: bytes) -> list[tuple[str, str]]:
    """``(value, kind)`` per rule, in the file's order; anything else is refused whole."""
    fields = raw.split(b"\0")
    if len(fields) < 2 or fields[0] != HEADER:
        raise RulesetError("the ruleset has an unknown format")
    if fields.pop() != b"" or len(fields) % 2 != 1:
        raise RulesetError("the ruleset holds a malformed rule")
    found: list[tuple[str, str]] = []
    for index in range(1, len(fields), 2):
        kind = fields[index].decode("ascii", "replace")
        value = os.fsdecode(fields[index + 1])
        if not _valid_rule(value, kind):
            raise RulesetError("the ruleset holds a malformed rule")
        found.append((value, kind))
    kinds = {kind for _value, kind in found}
    if rights.CONNECT in kinds and rights.TCP not in kinds:
        # A port allowed on a network that is not restricted would mean nothing: a ruleset
        # that says so was not written by the runner.
        raise RulesetError("the ruleset allows ports without restricting the network")
    return found


def apply(entries: Sequence[tuple[str, str]], abi: int) -> None:
    """Open each path, grant its rights, and restrict this process for good."""
    kinds = {kind for _value, kind in entries}
    handled_net = 0
    if rights.TCP in kinds:
        if abi < rights.NET_ABI:
            raise RulesetError(
                f"the run's network rules need Landlock ABI {rights.NET_ABI}, this kernel has {abi}"
            )
        handled_net = rights.NET_RIGHTS
    ports = [(int(v), rights.NET_CONNECT_TCP) for v, kind in entries if kind == rights.CONNECT]
    opened: list[tuple[int, int]] = []
    try:
        for path, kind in entries:
            if kind in rights.NET_KINDS:
                continue
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            opened.append((fd, 0))
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            opened[-1] = (fd, rights.rights_for(kind, abi, is_dir=is_dir))
        landlock.restrict(
            rights.handled_rights(abi),
            [(fd, r) for fd, r in opened if r],
            handled_net=handled_net,
            ports=ports,
            scoped=rights.scopes_for(abi),
        )
    finally:
        for fd, _rights in opened:
            os.close(fd)


def lead_a_session() -> None:
    """Make this process the leader of a new session and process group, as setsid(1) would.
    Already a group leader (started by a shell with job control): it keeps its group."""
    # Not contextlib.suppress: contextlib brings functools and collections into the wrapper.
    try:  # noqa: SIM105
        os.setsid()
    except PermissionError:
        pass


PARENT_ENV = "AGENTCALL_LISTENER_PID"
PR_SET_PDEATHSIG = 1
SIGKILL = 9


def die_with_parent(parent: int) -> bool:
    """Have the kernel SIGKILL this process (and so the agent it becomes: the setting survives
    ``execve``) when ``parent`` (the listener) dies, even by ``kill -9``. False when the
    parent is already gone, which the caller treats as a reason not to start."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    # Set after the fork: a parent that died before it would never send it.
    return os.getppid() == parent


def main(argv: Sequence[str] | None = None, *, new_session: bool = False) -> int:
    # The listener's pid, for this wrapper alone: it never reaches the agent.
    parent = os.environ.pop(PARENT_ENV, "")
    if new_session:
        # First: a kill the runner sends from here on reaches the whole run.
        lead_a_session()
    if parent.isdigit() and not die_with_parent(int(parent)):
        sys.stderr.write(PREFIX + "the listener that started this run is gone\n")
        return FAILED_EXIT
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        sys.stderr.write(PREFIX + "usage: python -I -m agentcall.confine RULESET PROGRAM...\n")
        return FAILED_EXIT
    try:
        entries = read_ruleset(args[0])
        abi, why = landlock.probe()
        if abi < 1:
            raise RulesetError(why)
        apply(entries, abi)
        arch = seccomp.current_arch()
        if arch is not None:
            seccomp.install(arch)
    except (OSError, RulesetError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        sys.stderr.write(
            f"{PREFIX}the kernel boundary could not be applied, so the agent was not started"
            f" ({detail})\n"
        )
        return FAILED_EXIT
    try:
        # The agent's argv as the listener built it, never through a shell.
        os.execvp(args[1], args[1:])  # noqa: S606
    except OSError as exc:
        sys.stderr.write(f"{PREFIX}cannot execute the agent: {exc.strerror}\n")
    return NOT_FOUND_EXIT
