"""``agentcall task new ID``: scaffold a task for this agent.

Creating a task does not offer it: until the owner runs ``agentcall offer ID`` (everyone) or
``agentcall allow HANDLE ID`` (one person), no caller can run it. Create is not publish.
"""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Create ~/AgentCall/tasks/ID/SKILL.md from a commented template: a frontmatter saying what
callers see and which tools the task may use, then your instructions to the agent. An existing
SKILL.md is never overwritten. The new task is offered to no one until you run `agentcall
offer ID` or `agentcall allow HANDLE ID`. `ask` is built in and cannot be created."""


def _task(text: str) -> str:
    from agentcall import ids

    if not ids.is_task_id(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a task id (lowercase letters, digits and -, e.g. release-notes)"
        )
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = "example:\n  agentcall task new release-notes"
    sub = parser.add_subparsers(dest="task_command", metavar="ACTION", required=True)
    new = sub.add_parser(
        "new",
        help="create a task from a template",
        description=DESCRIPTION,
        epilog="example:\n  agentcall task new release-notes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    new.add_argument("task_id", metavar="ID", type=_task, help="the new task's id")


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.main import CommandError
    from agentcall.cli.owner import home_or_fail
    from agentcall.cli.render import safe_text
    from agentcall.listener.tasks import TaskIdError, scaffold_task

    home = home_or_fail()
    task_id = args.task_id
    try:
        path = scaffold_task(home.tasks_dir, task_id)
    except TaskIdError as exc:
        raise CommandError(str(exc)) from None
    except FileExistsError:
        raise CommandError(
            f"{home.tasks_dir / task_id / 'SKILL.md'} already exists; it was left as it is"
        ) from None
    except OSError as exc:
        raise CommandError(f"cannot create the task: {exc.strerror or exc}") from None
    print(safe_text(f"created {path}"))
    print("Edit it: the frontmatter says what callers see, the body is your instructions.")
    print(
        f"No caller can run it yet: `agentcall offer {task_id}` offers it to everyone, "
        f"`agentcall allow HANDLE {task_id}` to one person. `agentcall lint` checks it."
    )
    return 0
