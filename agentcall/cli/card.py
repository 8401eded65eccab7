"""``agentcall card``: what callers see of this installation — its address, agent and menu.

Computed locally from the same layers the listener admits calls with (policy.json, the tasks
on disk, the admin ceiling), through :func:`agentcall.cli.policy_report.build_report`, so the
menu shown is the one an ordinary allowed caller gets. Nothing is published: the relay has no
card endpoint yet.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentcall.listener.tasks import Task

DESCRIPTION = """\
Show what callers see of this installation: its address, the agent that answers, and the
tasks on offer to every allowed caller (the default menu: id, name, description, keywords
and examples). Callers you gave tasks individually (`agentcall allow`) get more, and blocked
callers get nothing; `agentcall policy` shows each one.

The card is computed here from policy.json, ~/AgentCall/tasks and the admin ceiling, as the
listener would admit a call right now. It is not published anywhere: the relay has no card
endpoint yet, so callers learn a task's id from you and use `agentcall call --task ID`."""

EPILOG = """\
examples:
  agentcall card
  agentcall card --json | jq -r '.tasks[].id'"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _task_json(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "name": task.name,
        "description": task.description,
        "keywords": list(task.keywords),
        "examples": list(task.examples),
    }


def build_card() -> dict[str, Any]:
    """The card as one JSON-ready value, or a CommandError saying what to fix."""
    from agentcall.cli import owner
    from agentcall.cli.main import CommandError
    from agentcall.cli.policy_report import build_report
    from agentcall.local.config import NotSetUp

    home = owner.home_or_fail()
    layers = owner.load_layers(home)
    if layers.config is None:
        raise CommandError(str(NotSetUp(home)))
    config = layers.config
    policy = owner.policy_or_fail(home, "show the card")
    ceiling = owner.ceiling_or_fail("show the card")
    report = build_report(policy, ceiling, layers)
    menu = [] if config.caller_only else report["default_menu"]
    return {
        "address": config.address,
        "agent_kind": None if config.agent_kind is None else str(config.agent_kind),
        "answers_calls": not config.caller_only,
        "default_access": report["default_access"],
        "tasks": [_task_json(layers.tasks.tasks[task_id]) for task_id in menu],
        "published": False,
    }


def render(card: dict[str, Any]) -> str:
    from agentcall.cli.render import safe_cell

    lines = [f"address: {card['address']}"]
    if not card["answers_calls"]:
        lines.append("agent: none (caller-only: this installation answers no calls)")
        return "\n".join(lines)
    lines.append(f"agent: {card['agent_kind']}")
    if card["default_access"] != "allowed":
        lines.append("default access: blocked (only callers you allowed individually get in)")
    lines.append("tasks on offer to every allowed caller:" if card["tasks"] else "tasks: none")
    for task in card["tasks"]:
        lines.append(f"  {safe_cell(task['id'])} — {safe_cell(task['name'])}")
        lines.append(f"    {safe_cell(task['description'])}")
        if task["keywords"]:
            lines.append(f"    keywords: {safe_cell(', '.join(task['keywords']))}")
        lines.extend(f"    example: {safe_cell(example)}" for example in task["examples"])
    lines.append("(computed locally; not published — the relay has no card endpoint yet)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.render import safe_json

    card = build_card()
    print(safe_json(card) if args.json else render(card))
    return 0
