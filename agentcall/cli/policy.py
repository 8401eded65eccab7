"""``agentcall policy|lint|offer|unoffer|allow|revoke``: which tasks each caller gets.

``offer``/``unoffer`` change the default offer (what every allowed caller gets), ``allow`` and
``revoke`` one caller's own grants. Each edit is checked before it is saved: the task must be
``ask`` or a valid task on disk, and every owner and admin assertion must still hold; otherwise
the command refuses with one line and the file is left alone. ``policy`` shows the result as
callers meet it; ``lint`` checks every layer and exits 1 on any problem.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentcall.cli.owner import Layers
    from agentcall.listener.ceiling import Ceiling
    from agentcall.listener.policy import Policy

_FORMS = {
    "policy": (
        "Show the effective policy as callers meet it: whether this machine is managed, the "
        "default access and menu, each named caller's access and menu, and for each task that "
        "can run its tools and working directory, plus what the agent itself bounds.",
        "agentcall policy --json",
    ),
    "lint": (
        "Check tasks (with file:line), policy.json, the admin ceiling and every assertion. "
        "Exits 1 if anything is wrong, 0 with a short summary otherwise.",
        "agentcall lint",
    ),
    "offer": (
        "Offer a task to every allowed caller (the default offer). The task must exist in "
        "~/AgentCall/tasks (or be the built-in `ask`).",
        "agentcall offer review",
    ),
    "unoffer": (
        "Stop offering a task to everyone by default; individual grants stay.",
        "agentcall unoffer review",
    ),
    "allow": (
        "Give one caller a task on top of the default offer. It does not unblock them.",
        "agentcall allow ana deploy-docs",
    ),
    "revoke": (
        "Take back a task given to one caller with `agentcall allow`.",
        "agentcall revoke ana deploy-docs",
    ),
}


def _task(text: str) -> str:
    from agentcall import ids

    if not ids.is_task_id(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a task id (e.g. review)")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One module serves six commands; the name they were registered under picks the form."""
    from agentcall.cli.access import _handle

    command = parser.prog.rsplit(" ", 1)[-1]
    description, example = _FORMS[command]
    parser.description = description
    parser.epilog = f"example:\n  {example}"
    parser.set_defaults(policy_command=command)
    if command == "policy":
        parser.add_argument("--json", action="store_true", help="print one JSON object")
    if command in ("allow", "revoke"):
        parser.add_argument("handle", metavar="HANDLE", type=_handle, help="the caller")
    if command in ("offer", "unoffer", "allow", "revoke"):
        parser.add_argument("task", metavar="TASK", type=_task, help="the task id")


def _show_policy(as_json: bool) -> int:
    from agentcall.cli import owner
    from agentcall.cli.policy_report import build_report, render_report
    from agentcall.cli.render import safe_json, safe_text

    home = owner.home_or_fail()
    policy = owner.policy_or_fail(home, "show the policy")
    layers = owner.load_layers(home)
    ceiling = owner.ceiling_or_fail("show the policy")
    report = build_report(policy, ceiling, layers)
    print(safe_json(report, indent=2) if as_json else safe_text(render_report(report)))
    return 0


def _lint() -> int:
    from agentcall.cli import owner
    from agentcall.cli.main import CommandError
    from agentcall.cli.policy_report import lint_notes, lint_problems
    from agentcall.cli.render import safe_text
    from agentcall.listener.ceiling import CeilingError
    from agentcall.listener.policy import DEFAULT_POLICY, PolicyError, load_policy

    home = owner.home_or_fail()
    problems: list[str] = []
    notes: list[str] = []
    try:
        layers = owner.load_layers(home)
    except CommandError as exc:
        print(safe_text(f"problem: {exc}"))
        return 1
    if layers.config is None:
        notes.append("not set up: read roots default to your home directory")
    try:
        policy = load_policy(home.policy_path)
    except PolicyError as exc:
        problems.append(str(exc))
        policy = DEFAULT_POLICY
    try:
        ceiling = owner.load_admin_ceiling()
    except CeilingError as exc:
        problems.append(f"{exc} (no call is answered until it is fixed)")
        ceiling = None
    problems += lint_problems(policy, ceiling, layers)
    notes += lint_notes(policy, ceiling, layers)
    for line in problems:
        print(safe_text(f"problem: {line}"))
    for line in notes:
        print(safe_text(f"note: {line}"))
    if problems:
        print(f"lint: {len(problems)} problem(s)")
        return 1
    count = len(policy.assertions) + (len(ceiling.assertions) if ceiling else 0)
    managed = "managed" if ceiling is not None else "unmanaged"
    print(f"lint: ok ({len(layers.tasks.tasks)} task(s), {count} assertion(s) hold, {managed})")
    return 0


def _edit(args: argparse.Namespace) -> None:
    from agentcall.cli import owner
    from agentcall.cli.access import _plain_handle
    from agentcall.listener import policy as rules
    from agentcall.listener.admission import is_blocked

    command, task = args.policy_command, args.task
    handle = _plain_handle(args.handle) if command in ("allow", "revoke") else ""
    said: list[str] = []

    def change(policy: Policy, layers: Layers, ceiling: Ceiling | None) -> Policy | None:
        if command in ("offer", "allow"):
            owner.require_task(layers, task)
            note = owner.ceiling_note(ceiling, layers, task)
            if note:
                said.append(note)
        if command == "offer":
            if task in policy.default_offer:
                said.insert(0, f"{task} is already offered to every allowed caller")
                return None
            said.insert(0, f"offered {task} to every allowed caller")
            return rules.with_offer(policy, task)
        if command == "unoffer":
            if task not in policy.default_offer:
                said.append(f"{task} is not in the default offer; nothing changed")
                return None
            said.append(f"{task} is no longer offered by default (individual grants stay)")
            return rules.without_offer(policy, task)
        rule = policy.rule_for(handle)
        granted = rule.grants if rule is not None else ()
        if command == "allow":
            if task in granted:
                said.insert(0, f"{handle} already has {task}")
                return None
            said.insert(0, f"{handle} now gets {task}")
            if is_blocked(policy, ceiling, handle):
                said.append(f"note: {handle} is blocked; the grant counts once they may call")
            return rules.with_grant(policy, handle, task)
        if task not in granted:
            said.append(f"{handle} has no grant of {task}; nothing changed")
            return None
        said.append(f"{handle} no longer gets {task} individually")
        if task in policy.default_offer:
            said.append(f"note: {task} is still offered to everyone (`agentcall unoffer {task}`)")
        return rules.without_grant(policy, handle, task)

    saved = owner.edit_policy(change)
    print("\n".join(said))
    if saved:
        print(owner.APPLIES)


def run(args: argparse.Namespace) -> int:
    command = args.policy_command
    if command == "policy":
        return _show_policy(args.json)
    if command == "lint":
        return _lint()
    _edit(args)
    return 0
