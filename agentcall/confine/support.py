"""What this machine's kernel lets the boundary hold, said for people (doctor, policy) and
checked against an administrator's ceiling before an agent is started.

Pure but for the machine's type, which the caller may pass in.
"""

from __future__ import annotations

from agentcall.confine import seccomp
from agentcall.confine.rights import SCOPE_ABI

NO_SCOPES = (
    "signals and abstract UNIX sockets outside the run are not bounded"
    f" (that needs Landlock ABI {SCOPE_ABI}, Linux 6.12)"
)
NO_FILTER = "UNIX sockets are not filtered on this type of machine"


def isolation_gaps(abi: int, machine: str | None = None) -> tuple[str, ...]:
    """What a confined run could still reach outside itself on this kernel; empty when the
    run is fully isolated (files, UNIX sockets, abstract sockets, signals)."""
    gaps: list[str] = []
    if abi < 1:
        gaps.append("there is no kernel boundary at all (Landlock)")
    elif abi < SCOPE_ABI:
        gaps.append(NO_SCOPES)
    if seccomp.current_arch(machine) is None:
        gaps.append(NO_FILTER)
    return tuple(gaps)


def isolation_held(abi: int, machine: str | None = None) -> tuple[str, ...]:
    """What, besides files, the kernel keeps every confined run from (``abi`` >= 1)."""
    held: list[str] = []
    if seccomp.current_arch(machine) is not None:
        held.append(
            "no UNIX socket of its own (no SSH agent, session bus, display or service),"
            " no System V IPC or keyring, no limit or priority set on another process"
        )
    if abi >= SCOPE_ABI:
        held.append("no signal and no abstract socket outside the run")
    return tuple(held)
