"""The effective policy as callers meet it (``agentcall policy``) and its checks (``lint``).

Both read the same layers the listener reads — the admin ceiling, ``policy.json``, the tasks on
disk, the read roots in ``config.json`` — and evaluate them with the listener's own admission
code, so what they print is what a call would get, not a restatement of the files.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Final

from agentcall.cli.owner import Layers
from agentcall.listener.admission import access_of, check_assertions, menu_for, runnable_tools
from agentcall.listener.policy import Access
from agentcall.wire.http import AgentKind

if TYPE_CHECKING:
    from agentcall.listener.ceiling import Ceiling
    from agentcall.listener.policy import Policy

# What AgentCall can and cannot bound for each agent where the kernel offers no boundary
# (no Landlock: an older kernel, macOS), said plainly.
LIMITS: Final[dict[AgentKind | None, tuple[str, ...]]] = {
    AgentKind.CLAUDE: (
        "reads outside the working directory and read roots are refused by Claude itself",
        "the tool guard refuses credential paths inside them",
        "Bash is recorded, not bounded",
    ),
    AgentKind.CODEX: (
        "Codex's read-only sandbox does not restrict reads (no read floor)",
        "tool calls are logged where Codex runs the hook",
    ),
    AgentKind.COMMAND: (
        "a custom agent command: AgentCall does not bound what it reads, writes or runs",
    ),
    None: ("this installation is caller-only: it answers no calls",),
}


# The same where the kernel boundary holds (Landlock): what it still leaves open.
BOUNDED_LIMITS: Final[dict[AgentKind | None, tuple[str, ...]]] = {
    AgentKind.CLAUDE: (
        "the kernel bounds every read and write, Bash included, to the task's roots and workdir",
        "Bash keeps the network (it may connect to any host and port)",
    ),
    AgentKind.CODEX: (
        "the kernel bounds every read and write to the task's roots and workdir",
        "without fetch, Codex may connect only to the ports of its model and proxy",
    ),
    AgentKind.COMMAND: (
        "the kernel bounds every read and write of the agent command to the task's roots"
        " and workdir",
        "its network is not bounded",
    ),
    None: LIMITS[None],
}


def limits_for(kind: AgentKind | None, abi: int) -> tuple[str, ...]:
    """What is bounded and what stays open for ``kind`` on a kernel of Landlock ABI ``abi``
    (0: no kernel boundary)."""
    if abi < 1 or kind is None:
        return LIMITS[kind]
    from agentcall.confine.support import isolation_gaps, isolation_held

    return (*BOUNDED_LIMITS[kind], *isolation_held(abi), *isolation_gaps(abi))


def kernel_abi() -> int:
    """This kernel's Landlock ABI (0: none), as the listener will find it."""
    from agentcall.confine.landlock import cached_abi

    return cached_abi()


def _default_workdir(roots: tuple[str, ...]) -> str | None:
    # The listener runs in the first read root that exists, symlinks resolved.
    for root in roots:
        if os.path.isdir(root):
            return os.path.realpath(root)
    return None


def _caller_entry(policy: Policy, ceiling: Ceiling | None, layers: Layers, handle: str) -> Any:
    if ceiling is not None and handle in ceiling.blocked_callers:
        return {"access": "blocked", "why": "blocked by the admin ceiling", "menu": []}
    rule = policy.rule_for(handle)
    individual = rule is not None and rule.access is not None
    access = access_of(policy, handle)
    why = f"{access} ({'individually' if individual else 'by default'})"
    if access is Access.BLOCKED:
        return {"access": "blocked", "why": why, "menu": []}
    menu = menu_for(policy, ceiling, layers.tasks, handle)
    return {"access": "allowed", "why": why, "menu": list(menu)}


def build_report(policy: Policy, ceiling: Ceiling | None, layers: Layers) -> dict[str, Any]:
    """The effective policy as one JSON-ready value (its limits for this kernel)."""
    from agentcall.cli.owner import ceiling_path

    runnable = runnable_tools(ceiling, layers.tasks)
    handles = {rule.handle for rule in policy.callers}
    if ceiling is not None:
        handles |= ceiling.blocked_callers
    default_workdir = _default_workdir(layers.read_roots)
    tasks: dict[str, Any] = {}
    not_runnable: dict[str, str] = {}
    for task_id, task in sorted(layers.tasks.tasks.items()):
        if task_id not in runnable:
            not_runnable[task_id] = (
                "not allowed by the admin ceiling"
                if ceiling is not None and not ceiling.allows_task(task_id)
                else "the admin ceiling's max_tools leaves it no tools"
            )
            continue
        workdir = str(task.workdir) if task.workdir is not None else default_workdir
        tasks[task_id] = {
            "name": task.name,
            "tools": sorted(runnable[task_id]),
            "workdir": workdir,
            "timeout_s": task.timeout_s,
            "threadable": task.threadable,
            "connectors": list(task.connectors),
        }
    kind = layers.config.agent_kind if layers.config is not None else None
    default_menu = sorted(set(policy.default_offer) & set(runnable))
    return {
        "managed": ceiling is not None,
        "ceiling_path": ceiling.path if ceiling is not None else ceiling_path(),
        "default_access": str(policy.default_access),
        "default_menu": default_menu if policy.default_access is Access.ALLOWED else [],
        "callers": {h: _caller_entry(policy, ceiling, layers, h) for h in sorted(handles)},
        "groups": {
            group.name: {"roster_id": group.roster_id, "grants": list(group.grants)}
            for group in policy.groups
        },
        "tasks": tasks,
        "not_runnable": not_runnable,
        "read_roots": list(layers.read_roots),
        "agent_kind": str(kind) if kind is not None else None,
        "set_up": layers.config is not None,
        "limits": list(limits_for(kind, kernel_abi())) if layers.config is not None else [],
    }


def _names(items: list[str]) -> str:
    return ", ".join(items) if items else "nothing"


def render_report(report: dict[str, Any]) -> str:
    """The report as text for a person (to be made terminal-safe by the caller)."""
    path = report["ceiling_path"]
    lines = [f"managed: yes ({path})" if report["managed"] else f"managed: no (no {path})"]
    lines.append(f"default access: {report['default_access']}")
    if report["default_access"] == "allowed":
        lines.append(f"default menu: {_names(report['default_menu'])}")
    else:
        lines.append("default menu: none (callers without an individual allow are refused)")
    if report["callers"]:
        lines.append("callers:")
    for handle, entry in report["callers"].items():
        menu = f"; gets {_names(entry['menu'])}" if entry["access"] == "allowed" else ""
        lines.append(f"  {handle}: {entry['why']}{menu}")
    if report["groups"]:
        lines.append("groups (honoured only for rosters the relay attests; none are attested yet):")
    for name, group in report["groups"].items():
        lines.append(f"  {name} (roster {group['roster_id']}): grants {_names(group['grants'])}")
    lines.append("tasks callers can run:")
    for task_id, task in report["tasks"].items():
        workdir = task["workdir"] or "none (no read root exists)"
        extra = f"; timeout {task['timeout_s']} s" if task["timeout_s"] else ""
        lines.append(f"  {task_id}: tools {', '.join(task['tools'])}; workdir {workdir}{extra}")
    for task_id, why in report["not_runnable"].items():
        lines.append(f"  {task_id}: cannot run: {why}")
    if not report["set_up"]:
        lines.append("agent: not set up (run `agentcall setup`); read roots default to HOME")
    else:
        lines.append(f"agent: {report['agent_kind'] or 'none'}")
        lines.extend(f"  {limit}" for limit in report["limits"])
    return "\n".join(lines)


def lint_notes(policy: Policy, ceiling: Ceiling | None, layers: Layers) -> list[str]:
    """Things worth knowing that are not errors: dangling grants, unoffered or capped tasks."""
    notes: list[str] = []
    on_disk = layers.tasks.tasks
    named = [("default_offer", policy.default_offer)]
    named += [(f"callers.{rule.handle}.grants", rule.grants) for rule in policy.callers]
    named += [(f"groups.{group.name}.grants", group.grants) for group in policy.groups]
    offered: set[str] = set()
    for where, ids in named:
        offered.update(ids)
        notes.extend(
            f"{where} names {task}, which is not a task on disk"
            for task in ids
            if task not in on_disk
        )
    runnable = runnable_tools(ceiling, layers.tasks)
    for task_id in sorted(on_disk):
        if task_id not in offered:
            notes.append(f"task {task_id} is offered to no one")
        elif task_id not in runnable:
            notes.append(f"task {task_id} is offered but the admin ceiling does not let it run")
    return notes


def lint_problems(policy: Policy, ceiling: Ceiling | None, layers: Layers) -> list[str]:
    """Task problems (file:line) and broken assertions; empty means clean."""
    problems = [str(problem) for problem in layers.tasks.problems]
    problems.extend(str(failure) for failure in check_assertions(policy, ceiling, layers.tasks))
    return problems
