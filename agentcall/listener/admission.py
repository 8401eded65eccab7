"""Admission: may this caller run this task? The heart of the security model.

The decision is made from exactly four inputs: the owner's policy, the caller's handle as the
relay verified it (the ``from`` of an envelope that was opened and whose signature checked),
the task id the caller asked for, and the tasks that exist on this machine. **The caller's
message is not an input.** It is decided before the message is placed into any prompt, so
nothing the caller writes — however persuasive to a model — can widen what it is allowed to
run. A conversation id is not an input either: a follow-up can only narrow a call later, never
select a task.

:func:`admit` is pure and total: every input gives an :class:`Admitted` or a :class:`Refused`,
and every doubt (an unreadable handle, a malformed task id) ends in a refusal.
"""

from __future__ import annotations

from typing import Final

import attrs

from agentcall.errors import CallErrorCode
from agentcall.ids import HANDLE_RE, TASK_RE
from agentcall.limits import MAX_OFFERED_TASKS
from agentcall.listener.policy import Access, Policy

# The built-in task every admitted caller may use: a plain question, no owner instructions.
ASK_TASK: Final = "ask"

BLOCKED_DETAIL: Final = "The owner of this agent does not take calls from you."
TASK_UNKNOWN_DETAIL: Final = "The requested task is not available on this agent."


@attrs.frozen
class Admitted:
    task_id: str


@attrs.frozen
class Refused:
    code: CallErrorCode
    detail: str
    # The tasks this caller could ask for instead; empty when the caller is blocked.
    offered: tuple[str, ...] = ()


def access_of(policy: Policy, caller_handle: str) -> Access:
    """The caller's access: an individual rule wins over the default."""
    rule = policy.rule_for(caller_handle)
    if rule is not None and rule.access is not None:
        return rule.access
    return policy.default_access


def _usable_tasks(policy: Policy, caller_handle: str, available: frozenset[str]) -> list[str]:
    # Today every admitted caller may use every task on disk; per-caller and group grants will
    # narrow this list, and a requested task outside it will become task_not_offered.
    del policy, caller_handle
    return sorted(task for task in available if TASK_RE.match(task) and task != ASK_TASK)


def admit(
    policy: Policy,
    caller_handle: str,
    requested_task: str | None,
    available_tasks: frozenset[str],
) -> Admitted | Refused:
    """Decide one call from the policy, the verified caller and the tasks on disk only."""
    if not HANDLE_RE.match(caller_handle):
        # The envelope layer never passes such a handle; if one arrives, refuse, don't guess.
        return Refused(CallErrorCode.BLOCKED, BLOCKED_DETAIL)
    if access_of(policy, caller_handle) is Access.BLOCKED:
        return Refused(CallErrorCode.BLOCKED, BLOCKED_DETAIL)
    if requested_task is None or requested_task == ASK_TASK:
        return Admitted(ASK_TASK)
    usable = _usable_tasks(policy, caller_handle, available_tasks)
    if requested_task not in usable:
        return Refused(
            CallErrorCode.TASK_UNKNOWN, TASK_UNKNOWN_DETAIL, tuple(usable[:MAX_OFFERED_TASKS])
        )
    return Admitted(requested_task)
