"""Admission over every layer: blocks, default access, offers, grants, groups, the ceiling, disk."""

from __future__ import annotations

import inspect
import itertools
from typing import NamedTuple

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall.errors import CallErrorCode
from agentcall.limits import MAX_OFFERED_TASKS
from agentcall.listener.admission import (
    BLOCKED_DETAIL,
    CHOOSE_TASK_DETAIL,
    NO_TASKS_DETAIL,
    TASK_NOT_OFFERED_DETAIL,
    TASK_UNKNOWN_DETAIL,
    AdmissionDenied,
    Admitted,
    AssertionFailure,
    access_of,
    admit,
    check_assertions,
    menu_for,
    resolve,
)
from agentcall.listener.ceiling import Ceiling
from agentcall.listener.policy import (
    DEFAULT_POLICY,
    Access,
    CallerRule,
    GroupRule,
    Policy,
    with_caller_access,
    with_default_access,
)
from agentcall.listener.policyfile import Assertion
from agentcall.listener.tasks import BUILTIN_ASK, Task, TaskSet

CALLER = "ana"
ROSTER = "R0ster-id-0000001"
CEILING_PATH = "/etc/agentcall/policy.json"
REVIEW = Task(id="review", name="Review", description="d", tools=frozenset({"read", "fetch"}))
DEPLOY = Task(
    id="deploy", name="Deploy", description="d", tools=frozenset({"read", "write", "exec"})
)
ON_DISK = TaskSet({"ask": BUILTIN_ASK, "review": REVIEW, "deploy": DEPLOY})
ONLY_ASK = TaskSet()
BLOCKED = AdmissionDenied(CallErrorCode.BLOCKED, BLOCKED_DETAIL)

CEILINGS: dict[str, Ceiling | None] = {
    "unmanaged": None,
    "open": Ceiling(CEILING_PATH),
    "blocks caller": Ceiling(CEILING_PATH, blocked_callers=frozenset({CALLER})),
    "no review": Ceiling(CEILING_PATH, allowed_tasks=frozenset({"ask", "deploy"})),
    "read only": Ceiling(CEILING_PATH, max_tools=frozenset({"read"})),
    "no read": Ceiling(CEILING_PATH, max_tools=frozenset({"fetch", "write"})),
}


class Case(NamedTuple):
    individual: Access | None
    default: Access
    offer: tuple[str, ...]
    granted: bool  # ana has an individual grant of review
    attested: bool  # the relay attests ana shares the eng roster (which grants deploy)
    ceiling: str
    on_disk: bool  # review and deploy exist (ask always does)
    requested: str | None


def build(case: Case) -> tuple[Policy, Ceiling | None, TaskSet, frozenset[str]]:
    policy = Policy(
        default_access=case.default,
        default_offer=case.offer,
        callers=[
            CallerRule(CALLER, case.individual, ("review",) if case.granted else ()),
            # Another caller's rule must never affect this caller.
            CallerRule("bob", Access.BLOCKED, ("deploy",)),
        ],
        groups=[GroupRule("eng", ROSTER, ("deploy",))],
    )
    attested = frozenset({ROSTER}) if case.attested else frozenset()
    return policy, CEILINGS[case.ceiling], ON_DISK if case.on_disk else ONLY_ASK, attested


def expected(case: Case) -> Admitted | AdmissionDenied:
    """The rules of the design, written out independently of the implementation."""
    ceiling = CEILINGS[case.ceiling]
    if case.individual is Access.BLOCKED or case.ceiling == "blocks caller":
        return BLOCKED
    if case.default is Access.BLOCKED and case.individual is not Access.ALLOWED:
        return BLOCKED
    tools = {"ask": BUILTIN_ASK.tools, "review": REVIEW.tools, "deploy": DEPLOY.tools}
    disk = {"ask", "review", "deploy"} if case.on_disk else {"ask"}
    wanted = set(case.offer)
    if case.granted:
        wanted.add("review")
    if case.attested:
        wanted.add("deploy")

    def capped(task: str) -> frozenset[str]:
        if ceiling is None or ceiling.max_tools is None:
            return tools[task]
        return tools[task] & ceiling.max_tools

    menu = tuple(
        sorted(
            task
            for task in wanted & disk
            if (ceiling is None or ceiling.allowed_tasks is None or task in ceiling.allowed_tasks)
            and capped(task)
        )
    )
    task = case.requested
    if task is None:
        if "ask" in menu:
            task = "ask"
        elif len(menu) == 1:
            task = menu[0]
        else:
            detail = CHOOSE_TASK_DETAIL if menu else NO_TASKS_DETAIL
            return AdmissionDenied(CallErrorCode.TASK_NOT_OFFERED, detail, menu)
    elif task not in disk:
        return AdmissionDenied(CallErrorCode.TASK_UNKNOWN, TASK_UNKNOWN_DETAIL, menu)
    elif task not in menu:
        return AdmissionDenied(CallErrorCode.TASK_NOT_OFFERED, TASK_NOT_OFFERED_DETAIL, menu)
    return Admitted(ON_DISK.tasks[task], capped(task))


TABLE = [
    Case(*values)
    for values in itertools.product(
        [None, Access.ALLOWED, Access.BLOCKED],
        [Access.ALLOWED, Access.BLOCKED],
        [("ask",), ()],
        [False, True],
        [False, True],
        list(CEILINGS),
        [True, False],
        [None, "ask", "review", "deploy", "missing"],
    )
]


@pytest.mark.parametrize("ceiling", list(CEILINGS))
def test_admission_table(ceiling: str) -> None:
    """Every combination of the layers gives exactly the decision the rules describe."""
    wrong = []
    for case in (case for case in TABLE if case.ceiling == ceiling):
        policy, admin, tasks, attested = build(case)
        got = resolve(policy, admin, tasks, CALLER, case.requested, attested)
        if got != expected(case):
            wrong.append(f"{case}: got {got}, expected {expected(case)}")
    assert wrong == [], "\n".join(wrong[:5])


def test_the_table_reaches_every_outcome() -> None:
    """The table is not vacuous: each kind of decision occurs many times."""
    outcomes = [expected(case) for case in TABLE]
    kinds: dict[str, int] = {
        "admitted": sum(isinstance(o, Admitted) for o in outcomes),
        "capped": sum(
            isinstance(o, Admitted) and o.effective_tools != o.task.tools for o in outcomes
        ),
        **{
            code: sum(isinstance(o, AdmissionDenied) and o.code is code for o in outcomes)
            for code in (
                CallErrorCode.BLOCKED,
                CallErrorCode.TASK_UNKNOWN,
                CallErrorCode.TASK_NOT_OFFERED,
            )
        },
    }
    assert len(TABLE) == 3 * 2 * 2 * 2 * 2 * 6 * 2 * 5
    assert all(count >= 20 for count in kinds.values()), kinds
    admitted_ids = {o.task_id for o in outcomes if isinstance(o, Admitted)}
    assert admitted_ids == {"ask", "review", "deploy"}


def test_the_examples_the_design_names() -> None:
    """A few decisions spelled out by hand, as the design states them."""
    policy = Policy(
        default_offer=("ask",),
        callers=[CallerRule(CALLER, None, ("review",))],
        groups=[GroupRule("eng", ROSTER, ("deploy",))],
    )
    # A grant puts review on the menu; deploy needs the attested roster.
    assert resolve(policy, None, ON_DISK, CALLER, "review") == Admitted(REVIEW, REVIEW.tools)
    assert resolve(policy, None, ON_DISK, CALLER, "deploy") == AdmissionDenied(
        CallErrorCode.TASK_NOT_OFFERED, TASK_NOT_OFFERED_DETAIL, ("ask", "review")
    )
    deploy = resolve(policy, None, ON_DISK, CALLER, "deploy", frozenset({ROSTER}))
    assert deploy == Admitted(DEPLOY, frozenset({"read", "write", "exec"}))
    # An unrelated attested roster grants nothing.
    assert isinstance(
        resolve(policy, None, ON_DISK, CALLER, "deploy", frozenset({"x" * 16})), AdmissionDenied
    )
    # The ceiling's cap removes tools; ask is chosen when nothing is named.
    capped = Ceiling(CEILING_PATH, max_tools=frozenset({"read"}))
    assert resolve(policy, capped, ON_DISK, CALLER, "review") == Admitted(
        REVIEW, frozenset({"read"})
    )
    assert resolve(policy, None, ON_DISK, CALLER, None) == Admitted("ask")
    # Without ask on the menu, the only task is chosen.
    only = Policy(default_offer=(), callers=[CallerRule(CALLER, None, ("review",))])
    assert resolve(only, None, ON_DISK, CALLER, None) == Admitted(REVIEW, REVIEW.tools)


def test_a_malformed_request_or_handle_is_refused() -> None:
    """A task id that is not well formed is unknown; a bad handle is blocked, never looked up."""
    refusal = resolve(DEFAULT_POLICY, None, ON_DISK, CALLER, "Review!")
    assert refusal == AdmissionDenied(CallErrorCode.TASK_UNKNOWN, TASK_UNKNOWN_DETAIL, ("ask",))
    for handle in ["", "Ana", "@acme/ana", "ana\n", "a"]:
        assert resolve(DEFAULT_POLICY, None, ON_DISK, handle, None) == BLOCKED


def test_the_offered_menu_is_sorted_and_capped() -> None:
    """A long menu is cut to the cap, in order."""
    many: dict[str, Task] = {
        f"t{n:03d}": Task(id=f"t{n:03d}", name="t", description="d") for n in range(60)
    }
    tasks = TaskSet({"ask": BUILTIN_ASK} | many)
    policy = Policy(default_offer=sorted(many))
    refusal = resolve(policy, None, tasks, CALLER, None)
    assert isinstance(refusal, AdmissionDenied)
    assert refusal.offered == tuple(sorted(many))[:MAX_OFFERED_TASKS]
    assert menu_for(policy, None, tasks, CALLER) == tuple(sorted(many))


def test_the_message_is_not_an_input() -> None:
    """resolve sees the layers, the verified caller, the task id and attested rosters only."""
    assert list(inspect.signature(resolve).parameters) == [
        "policy",
        "ceiling",
        "tasks",
        "caller_handle",
        "requested_task",
        "attested_groups",
    ]
    assert list(inspect.signature(admit).parameters) == [
        "policy",
        "caller_handle",
        "requested_task",
        "available_tasks",
    ]


def test_access_of_prefers_the_individual_rule() -> None:
    """access_of returns the individual rule when there is one, else the default."""
    policy = with_caller_access(
        with_default_access(DEFAULT_POLICY, Access.BLOCKED), CALLER, Access.ALLOWED
    )
    assert access_of(policy, CALLER) is Access.ALLOWED
    assert access_of(policy, "bob") is Access.BLOCKED


def test_admitted_names_the_builtin_by_id_only() -> None:
    """Admitted("ask") is the built-in task; any other task must be the loaded object."""
    assert Admitted("ask") == Admitted(BUILTIN_ASK, frozenset({"read"}))
    assert Admitted(REVIEW).effective_tools == REVIEW.tools
    assert Admitted(REVIEW).task_id == "review"
    with pytest.raises(ValueError):
        Admitted("review")


def test_the_compatibility_admit_uses_the_same_rules() -> None:
    """admit() is resolve() with ids on disk: ask by default, unknown and not offered apart."""
    on_disk = frozenset({"review", "ask", "Bad Id"})
    assert admit(DEFAULT_POLICY, CALLER, None, on_disk) == Admitted("ask")
    assert admit(DEFAULT_POLICY, CALLER, "ask", frozenset()) == Admitted("ask")
    missing = admit(DEFAULT_POLICY, CALLER, "deploy", on_disk)
    assert missing == AdmissionDenied(CallErrorCode.TASK_UNKNOWN, TASK_UNKNOWN_DETAIL, ("ask",))
    assert isinstance(refused := admit(DEFAULT_POLICY, CALLER, "review", on_disk), AdmissionDenied)
    assert refused.code is CallErrorCode.TASK_NOT_OFFERED
    granted = Policy(callers=[CallerRule(CALLER, None, ("review",))])
    admitted = admit(granted, CALLER, "review", on_disk)
    assert isinstance(admitted, Admitted) and admitted.task_id == "review"
    assert (
        admit(with_caller_access(DEFAULT_POLICY, CALLER, Access.BLOCKED), CALLER, None, on_disk)
        == BLOCKED
    )


# --- assertions ------------------------------------------------------------------------------

OWNER = Policy(
    default_offer=("ask",),
    callers=[
        CallerRule("ana", None, ("review",)),
        CallerRule("bob", Access.BLOCKED),
    ],
    groups=[GroupRule("eng", ROSTER, ("deploy",))],
)


def failures(
    claims: list[Assertion], ceiling: Ceiling | None = None, tasks: TaskSet = ON_DISK
) -> list[AssertionFailure]:
    return check_assertions(attrs.evolve(OWNER, assertions=claims), ceiling, tasks)


@pytest.mark.parametrize(
    ("claim", "holds"),
    [
        (Assertion("ana", accept=("ask", "review")), True),
        (Assertion("ana", accept=("deploy",)), False),
        (Assertion("ana", groups=("eng",), accept=("deploy", "review")), True),
        (Assertion("ana", deny=("deploy",)), True),
        (Assertion("ana", deny=("review",)), False),
        (Assertion("ana", deny=("*",)), False),
        (Assertion("bob", deny=("*",)), True),
        (Assertion("bob", accept=("ask",)), False),
        (Assertion("cy", accept=("ask",), deny=("review",)), True),
        (Assertion("cy", groups=("eng",), deny=("deploy",)), False),
    ],
)
def test_assertions_hold_or_fail(claim: Assertion, holds: bool) -> None:
    """Accept means on the effective menu; deny "*" means blocked or an empty menu."""
    assert (failures([claim]) == []) is holds


def test_assertions_see_the_disk_and_the_ceiling() -> None:
    """A task missing on disk or kept out by the ceiling is not "got"; a ceiling block is."""
    gets_review = Assertion("ana", accept=("review",))
    assert failures([gets_review], tasks=ONLY_ASK)[0].missing == ("review",)
    assert failures([gets_review], ceiling=CEILINGS["no review"])[0].missing == ("review",)
    exec_only = Ceiling(CEILING_PATH, max_tools=frozenset({"exec"}))
    assert failures([gets_review], ceiling=exec_only)[0].missing == ("review",)
    nothing = Assertion("ana", deny=("*",))
    assert failures([nothing], ceiling=CEILINGS["blocks caller"]) == []
    assert failures([nothing], ceiling=Ceiling(CEILING_PATH, allowed_tasks=frozenset())) == []
    failure = failures([nothing])[0]
    assert failure.unexpected == ("ask", "review")
    assert str(failure) == "policy assertion 1 (ana gets nothing) fails: ana gets ask, review"


def test_admin_assertions_are_checked_and_named() -> None:
    """Ceiling assertions run against the owner's policy; a blocked caller says so."""
    ceiling = Ceiling(
        CEILING_PATH,
        assertions=(
            Assertion("bob", deny=("*",)),
            Assertion("bob", accept=("ask",)),
            Assertion("ana", groups=("ops",), deny=("*",)),
        ),
    )
    found = failures([Assertion("ana", accept=("review",))], ceiling=ceiling)
    assert [(f.source, f.index) for f in found] == [("ceiling", 1), ("ceiling", 2)]
    assert str(found[0]) == (
        "ceiling assertion 2 (bob gets ask) fails: bob is blocked; bob does not get ask"
    )
    assert found[1].problem == "the owner's policy has no group named 'ops'"


TASK_IDS = st.sampled_from(["ask", "review", "deploy", "t1"])
HANDLES = st.sampled_from(["ana", "bob", "cy"])
TOOLSETS = st.frozensets(st.sampled_from(["read", "write", "fetch", "exec"]))


@given(
    default=st.sampled_from(list(Access)),
    rules=st.dictionaries(
        HANDLES, st.tuples(st.sampled_from([None, *Access]), st.lists(TASK_IDS, max_size=3))
    ),
    offer=st.lists(TASK_IDS, max_size=3),
    disk=st.frozensets(st.sampled_from(["review", "deploy", "t1"])),
    allowed=st.none() | st.frozensets(TASK_IDS),
    blocked=st.frozensets(HANDLES, max_size=1),
    max_tools=st.none() | TOOLSETS,
    caller=HANDLES,
    requested=st.none() | TASK_IDS,
)
def test_admission_properties(
    default: Access,
    rules: dict[str, tuple[Access | None, list[str]]],
    offer: list[str],
    disk: frozenset[str],
    allowed: frozenset[str] | None,
    blocked: frozenset[str],
    max_tools: frozenset[str] | None,
    caller: str,
    requested: str | None,
) -> None:
    """Whatever the layers: blocks win, admitted tasks are on the menu, tools only shrink."""
    policy = Policy(
        default_access=default,
        default_offer=offer,
        callers=[CallerRule(h, a, g) for h, (a, g) in rules.items()],
    )
    ceiling = Ceiling(CEILING_PATH, allowed, blocked, max_tools)
    extra = Task(id="t1", name="t1", description="d", tools=frozenset({"read", "write"}))
    tasks = TaskSet({"ask": BUILTIN_ASK} | {t: ON_DISK.tasks.get(t, extra) for t in disk})
    result = resolve(policy, ceiling, tasks, caller, requested)
    if caller in blocked or access_of(policy, caller) is Access.BLOCKED:
        assert result == BLOCKED
        return
    menu = menu_for(policy, ceiling, tasks, caller)
    if isinstance(result, Admitted):
        assert result.task_id in menu
        assert result.effective_tools and result.effective_tools <= result.task.tools
        assert max_tools is None or result.effective_tools <= max_tools
        assert requested in (None, result.task_id)
    else:
        assert result.offered == menu[:MAX_OFFERED_TASKS]
        assert result.code in {CallErrorCode.TASK_UNKNOWN, CallErrorCode.TASK_NOT_OFFERED}
