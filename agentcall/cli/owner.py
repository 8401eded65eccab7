"""What the owner-control commands share: reading the local layers and saving a checked edit.

Every edit (``block``, ``offer``, ``allow``, …) goes through :func:`edit_policy`: the existing
``policy.json`` is read with the listener's own strict parser (a file it cannot read is
reported, never replaced, because replacing it would silently drop the owner's decisions), the
change is applied as a pure function, and :func:`agentcall.listener.policysave.save_policy` checks
it — including every owner and admin assertion against the tasks on disk and the ceiling —
before anything is written.

Imports are local to functions: these helpers serve commands that must start fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from agentcall.listener.ceiling import Ceiling
    from agentcall.listener.policy import Policy
    from agentcall.listener.tasks import TaskSet
    from agentcall.local.config import Config
    from agentcall.local.home import Home

APPLIES = "The listener reads policy.json for every call: this applies from the next call."


def load_admin_ceiling() -> Ceiling | None:
    """This machine's ceiling, read exactly as the listener reads it (no test override).

    Tests replace this function to exercise a managed machine; nothing else should.
    """
    from agentcall.listener.ceiling import load_ceiling

    return load_ceiling()


def ceiling_path() -> str:
    from agentcall.listener.ceiling import default_ceiling_path

    return default_ceiling_path()


@attrs.frozen
class Layers:
    """The local files admission reads, except the owner policy itself."""

    home: Home
    config: Config | None  # None: not set up (read roots default to HOME)
    read_roots: tuple[str, ...]
    tasks: TaskSet


def home_or_fail() -> Home:
    from agentcall.cli.main import CommandError
    from agentcall.local.home import Home, LocalStateError

    try:
        return Home.from_environ()
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None


def load_layers(home: Home) -> Layers:
    """Config (for the read roots) and the tasks on disk; a broken config is a CommandError."""
    from agentcall.cli.main import CommandError
    from agentcall.listener.policy import PolicyError
    from agentcall.listener.tasks import load_tasks
    from agentcall.local.config import NotSetUp, load_config
    from agentcall.local.home import LocalStateError

    config: Config | None
    try:
        config = load_config(home)
    except NotSetUp:
        config = None
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None
    roots = config.read_roots if config is not None else (str(home.user_home),)
    try:
        tasks = load_tasks(home.tasks_dir, roots)
    except PolicyError as exc:
        # A task file someone else could have written: no call is answered until it is fixed.
        raise CommandError(f"{exc}; until then no call is answered") from None
    return Layers(home, config, roots, tasks)


def ceiling_or_fail(action: str) -> Ceiling | None:
    from agentcall.cli.main import CommandError
    from agentcall.listener.ceiling import CeilingError

    try:
        return load_admin_ceiling()
    except CeilingError as exc:
        raise CommandError(
            f"cannot {action}: the admin ceiling is unusable ({exc}); no call is answered "
            "until your administrator fixes it"
        ) from None


def policy_or_fail(home: Home, action: str) -> Policy:
    from agentcall.cli.main import CommandError
    from agentcall.listener.policy import PolicyError, load_policy

    try:
        return load_policy(home.policy_path)
    except PolicyError as exc:
        raise CommandError(
            f"cannot {action}: {exc}; fix the file by hand (it is never overwritten)"
        ) from None


def edit_policy(change: Callable[[Policy, Layers, Ceiling | None], Policy | None]) -> bool:
    """Load every layer, apply ``change`` and save the result after checking it.

    ``change`` returns None when there is nothing to change; then nothing is written and the
    result is False.
    """
    from agentcall.cli.main import CommandError
    from agentcall.listener.policy import PolicyError
    from agentcall.listener.policysave import save_policy
    from agentcall.local.home import LocalStateError

    home = home_or_fail()
    policy = policy_or_fail(home, "change the policy")
    layers = load_layers(home)
    ceiling = ceiling_or_fail("change the policy")
    changed = change(policy, layers, ceiling)
    if changed is None:
        return False
    try:
        home.ensure()
        save_policy(home.policy_path, changed, tasks=layers.tasks, ceiling=ceiling)
    except (PolicyError, LocalStateError) as exc:
        raise CommandError(f"cannot save the policy: {exc}") from None
    except OSError as exc:
        raise CommandError(f"cannot save {home.policy_path}: {exc.strerror or exc}") from None
    return True


def require_task(layers: Layers, task_id: str) -> None:
    """Refuse a task that is neither ``ask`` nor a valid task on disk, saying what to do."""
    from agentcall.cli.main import CommandError

    if task_id in layers.tasks.tasks:
        return
    directory = layers.home.tasks_dir / task_id
    for problem in layers.tasks.problems:
        if directory in (problem.path, problem.path.parent):
            raise CommandError(f"task {task_id} is not valid: {problem}; run `agentcall lint`")
    raise CommandError(
        f"there is no task {task_id} in {layers.home.tasks_dir}; "
        f"create it with `agentcall task new {task_id}`"
    )


def ceiling_note(ceiling: Ceiling | None, layers: Layers, task_id: str) -> str | None:
    """A warning when the ceiling keeps ``task_id`` from running at all."""
    from agentcall.listener.admission import runnable_tools

    if ceiling is None or task_id in runnable_tools(ceiling, layers.tasks):
        return None
    return f"note: the admin ceiling does not let {task_id} run, so no caller will get it"
