"""Which paths an answering agent may use, and with which Landlock access rights.

Landlock only allows: everything the ruleset handles and no rule grants is refused, and a rule
on a directory covers everything beneath it. So a read root that holds a denied directory (the
owner's home holds ``~/.ssh``) cannot be granted whole; it is opened child by child instead:
every entry of it except the denied ones (and except entries whose *name* is a credential name,
``.env`` or ``id_rsa``), recursing only into the entries that are themselves ancestors of a
denied path. Each directory on that way gets the right to list it (``LIST``), which lists
everything beneath it too: names in ``~/.ssh`` can be listed, their contents not read.

The denylist is the guard's own (:data:`agentcall.guard.scope.DENIED_UNDER_HOME`), so there is
one list. The agent's own configuration directory (``~/.claude``, ``~/.codex``) is on it for
the file tools, but the agent cannot run without it: :class:`Confinement` names it separately
and it is granted as it is.

Pure: the file system is seen through a :class:`FileView` (listing, real paths), which tests
give as plain values. Standard library only. The kinds and rights live in
:mod:`agentcall.confine.rights`, which the exec wrapper imports instead of this module.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Protocol

from agentcall.confine.rights import APPEND, CONNECT, DEVICE, LIST, READ, TCP, TCP_VALUE, WRITE
from agentcall.guard.scope import DENIED_UNDER_HOME, is_denied_name, within

# System directories every agent needs read (and execute) access to, where they exist.
SYSTEM_READ: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/nix/store",
    "/snap",
    "/sys",
)
# Of /proc, the run's own process (``/proc/self`` is opened by the exec wrapper, so it is the
# agent's pid, never the listener's) and the machine-wide files runtimes read (CPUs, memory,
# kernel settings): no other process's directory, whatever the kernel's ptrace rules allow.
# The agent's children cannot read their own /proc/PID either: ``ps`` or Node's
# ``process.memoryUsage()`` fail in them.
PROC_READ: tuple[str, ...] = (
    "/proc/self",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/loadavg",
    "/proc/uptime",
    "/proc/version",
    "/proc/filesystems",
    "/proc/swaps",
    "/proc/cgroups",
    "/proc/pressure",
    "/proc/sys",
)
# /run is read entry by entry, less these: ``user`` holds the owner's session (its bus,
# keyring and credential files), ``host`` a toolbox's view of the host's whole disk, ``media``
# the owner's mounted drives, ``secrets`` and ``credentials`` service and container credentials.
RUN_LEFT_OUT: tuple[str, ...] = ("user", "host", "media", "secrets", "credentials")
# Of /dev (listed), only the devices every program uses: not /dev/shm or /dev/mqueue, shared
# with every process of the owner and outliving the run (one caller's run could leave
# instructions there for the next; the run has its own TMPDIR instead), and none of the devices
# the owner's groups may open (a camera, a microphone, a GPU, USB), nor /dev/pts, where the
# owner's terminals are (a run could read what is typed there, or type into them).
SYSTEM_DEVICES: tuple[str, ...] = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
)
# How deep a read root is opened child by child before the rest of that branch is left out.
MAX_DEPTH = 16


class FileView(Protocol):
    """What the planner needs to see of the file system."""

    def realpath(self, path: str) -> str: ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]:
        """The names in a directory; empty for a file or anything that cannot be listed."""
        ...


class Confinement(NamedTuple):
    """What one agent run may use, as the call's task and the installation say.

    All paths absolute. ``agent_state`` are the agent's own configuration and session
    directories (granted ``WRITE`` as they are, denylisted or not; made when missing, since
    the agent could not make them), ``agent_files`` its files beside them (the same, when
    they exist); ``append_files`` existing files it may
    only append to (the guard's log); ``extra`` more places the owner lets it write (subject to
    the denylist like the roots); ``runtime`` what the agent's programs are made of (read,
    subject to the denylist), ``runtime_list`` directories only listed. ``required``: the
    admin ceiling demands the boundary. ``connect_ports``: None leaves the network alone;
    a tuple restricts TCP (Landlock ABI 4) to connecting to those ports, binding none.
    """

    read_roots: tuple[str, ...]
    write_roots: tuple[str, ...]
    home: str
    agent_state: tuple[str, ...] = ()
    agent_files: tuple[str, ...] = ()
    append_files: tuple[str, ...] = ()
    runtime: tuple[str, ...] = ()
    runtime_list: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    required: bool = False
    # More denied roots for the read and write roots and the extras (the guard's own: its code
    # and the owner's tasks directory); the agent's runtime may still read them.
    denied_extra: tuple[str, ...] = ()
    connect_ports: tuple[int, ...] | None = None
    # CA files and directories the agent's environment names (``NODE_EXTRA_CA_CERTS``...):
    # read, outside the denied directories, whatever their name (``corp-ca.pem`` is a
    # certificate the owner chose, though ``*.pem`` is a credential name elsewhere).
    trust: tuple[str, ...] = ()


def denied_paths(home: str, view: FileView) -> tuple[str, ...]:
    """The denylisted paths under ``home``, each as written and as its real path."""
    forms: dict[str, None] = {}
    for entry in DENIED_UNDER_HOME:
        path = os.path.normpath(os.path.join(home, entry))
        forms[path] = None
        forms[view.realpath(path)] = None
    return tuple(forms)


class _Planner:
    def __init__(
        self, denied: tuple[str, ...], view: FileView, rules: dict[str, set[str]] | None = None
    ) -> None:
        self._denied = tuple(d.casefold() for d in denied)
        self._view = view
        self.rules: dict[str, set[str]] = {} if rules is None else rules

    def add(self, path: str, kind: str) -> None:
        self.rules.setdefault(path, set()).add(kind)

    def is_denied(self, path: str) -> bool:
        folded = path.casefold()
        return any(within(folded, d) for d in self._denied)

    def holds_denied(self, path: str) -> bool:
        folded = path.casefold()
        return any(within(d, folded) for d in self._denied)

    def grant(
        self, path: str, kind: str, depth: int = 0, seen: frozenset[str] = frozenset()
    ) -> None:
        """Grant ``path`` less the denylist: whole, or child by child."""
        real = self._view.realpath(path)
        if real in seen or not self._view.exists(real) or self.is_denied(real):
            return
        if any(is_denied_name(part) for part in real.split(os.sep) if part):
            return
        if not self.holds_denied(real):
            self.add(real, kind)
            return
        if depth >= MAX_DEPTH:
            return
        self.add(real, LIST)
        for name in sorted(self._view.listdir(real)):
            if is_denied_name(name):
                continue
            self.grant(os.path.join(real, name), kind, depth + 1, seen | {real})


def _grant_entries(
    planner: _Planner, view: FileView, path: str, kind: str, left_out: tuple[str, ...]
) -> None:
    """List ``path`` and grant each entry in it, except ``left_out`` and symbolic links (a
    link is reached through its target, which is granted or not on its own)."""
    if not view.exists(path) or view.realpath(path) != path:
        return
    planner.add(path, LIST)
    for name in view.listdir(path):
        entry = os.path.join(path, name)
        if name not in left_out and view.realpath(entry) == entry:
            planner.add(entry, kind)


def plan(
    conf: Confinement, view: FileView, *, private_tmp: str | None = None
) -> list[tuple[str, str]]:
    """The rules of one run as ``(path, kind)`` pairs, sorted, one pair per path and kind,
    then its network rules (``(value, kind)``, see :mod:`agentcall.confine.main`), if any.

    A path with several kinds keeps each (Landlock ORs them). Missing paths are left out.
    """
    denied = denied_paths(conf.home, view)
    planner = _Planner(denied, view)
    extra_denied = tuple(
        form for p in conf.denied_extra for form in (os.path.normpath(p), view.realpath(p))
    )
    # The task's roots and the owner's extras: the guard's extra denied roots apply too.
    strict = _Planner(denied + extra_denied, view, planner.rules)
    for path in SYSTEM_READ:
        if view.exists(path):
            planner.add(path, READ)
    for path in PROC_READ:
        if view.exists(path):
            # As written: the wrapper resolves /proc/self in the run, not here.
            planner.add(path, READ)
    _grant_entries(planner, view, "/run", READ, RUN_LEFT_OUT)
    if view.exists("/dev"):
        planner.add("/dev", LIST)
    for path in SYSTEM_DEVICES:
        if view.exists(path) and view.realpath(path) == path:
            planner.add(path, DEVICE)
    for path in conf.runtime:
        # The agent's installation, its interpreter, the guard's Python.
        planner.grant(path, READ)
    for path in conf.runtime_list:
        # A directory on the module search path, which Python lists to find a package in it.
        if view.exists(path) and not planner.is_denied(view.realpath(path)):
            planner.add(view.realpath(path), LIST)
    for path in conf.trust:
        if view.exists(path) and not planner.is_denied(view.realpath(path)):
            planner.add(view.realpath(path), READ)
    for path in conf.read_roots:
        strict.grant(path, READ)
    for path in (*conf.write_roots, *conf.extra):
        strict.grant(path, WRITE)
    for path in (*conf.agent_state, *conf.agent_files):
        if view.exists(path):
            planner.add(view.realpath(path), WRITE)
    for path in conf.append_files:
        if view.exists(path):
            planner.add(view.realpath(path), APPEND)
    if private_tmp is not None:
        planner.add(private_tmp, WRITE)
    planned = sorted((path, kind) for path, kinds in planner.rules.items() for kind in kinds)
    if conf.connect_ports is not None:
        planned.append((TCP_VALUE, TCP))
        planned += [(str(port), CONNECT) for port in sorted(set(conf.connect_ports))]
    return planned
