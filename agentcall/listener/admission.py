"""Admission: may this caller run this task, and with which tools? The heart of the security model.

:func:`resolve` decides from exactly these inputs: the owner's policy, the admin ceiling, the
tasks on this machine, the caller's handle as the relay verified it (the ``from`` of an envelope
that was opened and whose signature checked), the task id the caller asked for, and the roster
ids the relay attests the caller shares with this owner. **The caller's message is not an
input** and never can be: admission is decided before the message is placed into any prompt, so
nothing a caller writes — however persuasive to a model — can widen what it may run. A
conversation id is not an input either: a follow-up can only narrow a call later, never select
a task.

The layers compose one way, each only narrowing:

1. a ceiling block or an individual block always wins (``blocked``, no menu);
2. with ``default_access`` blocked, only individually allowed callers get further;
3. the caller's menu is the default offer, their grants and the grants of attested groups,
   kept only where the task is on disk, allowed by the ceiling, and left with at least one tool
   by ``max_tools``;
4. the task runs with its tools capped by ``max_tools``.

Everything here is pure and total: every input gives an :class:`Admitted` or a
:class:`AdmissionDenied`, and every doubt (an unreadable handle, a malformed task id) is a refusal.
"""

from __future__ import annotations

from typing import Final

import attrs

from agentcall.errors import CallErrorCode
from agentcall.ids import HANDLE_RE, TASK_RE
from agentcall.limits import MAX_OFFERED_TASKS
from agentcall.listener.ceiling import Ceiling
from agentcall.listener.policy import Access, Policy
from agentcall.listener.policyfile import Assertion
from agentcall.listener.tasks import ASK_ID, BUILTIN_ASK, Task, TaskSet

# The built-in task: a plain question, read-only, no owner instructions.
ASK_TASK: Final = ASK_ID

BLOCKED_DETAIL: Final = "The owner of this agent does not take calls from you."
TASK_UNKNOWN_DETAIL: Final = "The requested task is not available on this agent."
TASK_NOT_OFFERED_DETAIL: Final = "The requested task is not offered to you."
CHOOSE_TASK_DETAIL: Final = "This agent offers you several tasks; name one of them."
NO_TASKS_DETAIL: Final = "This agent offers you no tasks."


def _as_task(value: Task | str) -> Task:
    # The built-in task may be named by its id; every other task must be the loaded object.
    if isinstance(value, Task):
        return value
    if value == ASK_TASK:
        return BUILTIN_ASK
    raise ValueError(f"only the built-in task can be named by id, not {value!r}")


@attrs.frozen
class Admitted:
    """The call may run ``task`` with ``effective_tools`` (its tools under the ceiling's cap)."""

    task: Task = attrs.field(converter=_as_task)
    effective_tools: frozenset[str] = attrs.field(
        default=attrs.Factory(lambda self: self.task.tools, takes_self=True)
    )

    @property
    def task_id(self) -> str:
        return self.task.id


@attrs.frozen
class AdmissionDenied:
    """Admission's verdict against a call: the peer error code and the detail the caller sees."""

    code: CallErrorCode
    detail: str
    # The tasks this caller could ask for instead; empty when the caller is blocked.
    offered: tuple[str, ...] = ()


def access_of(policy: Policy, caller_handle: str) -> Access:
    """The owner's decision for the caller: an individual rule wins over the default."""
    rule = policy.rule_for(caller_handle)
    if rule is not None and rule.access is not None:
        return rule.access
    return policy.default_access


def is_blocked(policy: Policy, ceiling: Ceiling | None, caller_handle: str) -> bool:
    """Whether every call from this caller is refused, whatever the task."""
    if not HANDLE_RE.match(caller_handle):
        return True
    if ceiling is not None and caller_handle in ceiling.blocked_callers:
        return True
    return access_of(policy, caller_handle) is Access.BLOCKED


def runnable_tools(ceiling: Ceiling | None, tasks: TaskSet) -> dict[str, frozenset[str]]:
    """Each task on disk that the ceiling lets run, with the tools it keeps under the cap."""
    runnable: dict[str, frozenset[str]] = {}
    for task_id, task in tasks.tasks.items():
        if ceiling is not None and not ceiling.allows_task(task_id):
            continue
        tools = ceiling.cap_tools(task.tools) if ceiling is not None else task.tools
        if tools:
            runnable[task_id] = tools
    return runnable


def menu_for(
    policy: Policy,
    ceiling: Ceiling | None,
    tasks: TaskSet,
    caller_handle: str,
    attested_groups: frozenset[str] = frozenset(),
) -> tuple[str, ...]:
    """The tasks this caller may run, sorted — blocks aside (see :func:`is_blocked`)."""
    offered = set(policy.default_offer)
    rule = policy.rule_for(caller_handle)
    if rule is not None:
        offered.update(rule.grants)
    for group in policy.groups:
        # Honoured only for a roster the relay attests both sides share.
        if group.roster_id in attested_groups:
            offered.update(group.grants)
    return tuple(sorted(offered & set(runnable_tools(ceiling, tasks))))


def resolve(
    policy: Policy,
    ceiling: Ceiling | None,
    tasks: TaskSet,
    caller_handle: str,
    requested_task: str | None,
    attested_groups: frozenset[str] = frozenset(),
) -> Admitted | AdmissionDenied:
    """Decide one call from local files and the verified caller only (never the message)."""
    if is_blocked(policy, ceiling, caller_handle):
        return AdmissionDenied(CallErrorCode.BLOCKED, BLOCKED_DETAIL)
    menu = menu_for(policy, ceiling, tasks, caller_handle, attested_groups)
    shown = menu[:MAX_OFFERED_TASKS]
    if requested_task is None:
        if ASK_TASK in menu:
            chosen = ASK_TASK
        elif len(menu) == 1:
            chosen = menu[0]
        else:
            detail = CHOOSE_TASK_DETAIL if menu else NO_TASKS_DETAIL
            return AdmissionDenied(CallErrorCode.TASK_NOT_OFFERED, detail, shown)
    elif not TASK_RE.match(requested_task) or requested_task not in tasks.tasks:
        return AdmissionDenied(CallErrorCode.TASK_UNKNOWN, TASK_UNKNOWN_DETAIL, shown)
    elif requested_task not in menu:
        return AdmissionDenied(CallErrorCode.TASK_NOT_OFFERED, TASK_NOT_OFFERED_DETAIL, shown)
    else:
        chosen = requested_task
    task = tasks.tasks[chosen]
    tools = ceiling.cap_tools(task.tools) if ceiling is not None else task.tools
    return Admitted(task, tools)


def admit(
    policy: Policy,
    caller_handle: str,
    requested_task: str | None,
    available_tasks: frozenset[str],
) -> Admitted | AdmissionDenied:
    """Compatibility form of :func:`resolve` for callers that only know task ids on disk.

    Unmanaged (no ceiling), no attested groups; each id stands for a read-only task with no
    instructions. New code calls :func:`resolve` with the loaded :class:`TaskSet`.
    """
    tasks = {ASK_TASK: BUILTIN_ASK}
    for task_id in sorted(available_tasks):
        if TASK_RE.match(task_id) and task_id != ASK_TASK:
            tasks[task_id] = Task(id=task_id, name=task_id, description=task_id)
    return resolve(policy, None, TaskSet(tasks), caller_handle, requested_task)


# --- assertions ------------------------------------------------------------------------------


@attrs.frozen
class AssertionFailure:
    """One assertion that the effective policy does not satisfy, and how."""

    source: str  # "policy" (the owner's) or "ceiling" (the administrator's)
    index: int  # 0-based position in its list
    assertion: Assertion
    missing: tuple[str, ...] = ()  # accepted tasks the caller does not get
    unexpected: tuple[str, ...] = ()  # denied tasks the caller does get
    problem: str | None = None  # why it could not be evaluated at all

    def __str__(self) -> str:
        said = f"{self.source} assertion {self.index + 1} ({self.assertion}) fails: "
        who = self.assertion.caller
        reasons = []
        if self.problem:
            reasons.append(self.problem)
        if self.missing:
            reasons.append(f"{who} does not get {', '.join(self.missing)}")
        if self.unexpected:
            reasons.append(f"{who} gets {', '.join(self.unexpected)}")
        return said + "; ".join(reasons)


def _evaluate(
    policy: Policy,
    ceiling: Ceiling | None,
    tasks: TaskSet,
    source: str,
    index: int,
    claim: Assertion,
) -> AssertionFailure | None:
    rosters = set()
    for name in claim.groups:
        group = policy.group(name)
        if group is None:
            unknown = f"the owner's policy has no group named {name!r}"
            return AssertionFailure(source, index, claim, problem=unknown)
        rosters.add(group.roster_id)
    blocked = is_blocked(policy, ceiling, claim.caller)
    menu = () if blocked else menu_for(policy, ceiling, tasks, claim.caller, frozenset(rosters))
    missing = tuple(task for task in claim.accept if task not in menu)
    denied = menu if claim.denies_everything else claim.deny
    unexpected = tuple(task for task in denied if task in menu)
    problem = f"{claim.caller} is blocked" if blocked and missing else None
    if not missing and not unexpected:
        return None
    return AssertionFailure(source, index, claim, missing, unexpected, problem)


def check_assertions(
    policy: Policy, ceiling: Ceiling | None, tasks: TaskSet
) -> list[AssertionFailure]:
    """Every owner and admin assertion that the effective policy breaks; empty means all hold.

    "Gets" means: not blocked, and the task is on the caller's effective menu (so it exists on
    disk and the ceiling lets it run). ``deny ["*"]`` holds when the caller is blocked or their
    menu is empty.
    """
    claims = [("policy", index, claim) for index, claim in enumerate(policy.assertions)]
    if ceiling is not None:
        claims += [("ceiling", index, claim) for index, claim in enumerate(ceiling.assertions)]
    failures = []
    for source, index, claim in claims:
        failure = _evaluate(policy, ceiling, tasks, source, index, claim)
        if failure is not None:
            failures.append(failure)
    return failures
