"""Admission: every combination of default access, individual access, task and availability."""

from __future__ import annotations

import inspect
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall.errors import CallErrorCode
from agentcall.limits import MAX_OFFERED_TASKS
from agentcall.listener.admission import ASK_TASK, Admitted, Refused, access_of, admit
from agentcall.listener.policy import (
    DEFAULT_POLICY,
    Access,
    Policy,
    with_caller_access,
    with_default_access,
)

CALLER = "ana"
ON_DISK = frozenset({"review", "deploy-docs"})
OFFERED = ("deploy-docs", "review")
BLOCKED = Refused(CallErrorCode.BLOCKED, "The owner of this agent does not take calls from you.")
UNKNOWN = Refused(
    CallErrorCode.TASK_UNKNOWN, "The requested task is not available on this agent.", OFFERED
)
UNKNOWN_NONE_ON_DISK = Refused(UNKNOWN.code, UNKNOWN.detail, ())


def policy_for(default: Access, individual: Access | None) -> Policy:
    policy = with_default_access(DEFAULT_POLICY, default)
    # Another caller's rule must never affect this caller.
    policy = with_caller_access(policy, "bob", Access.BLOCKED)
    if individual is None:
        return policy
    return with_caller_access(policy, CALLER, individual)


def admitted(default: Access, individual: Access | None) -> bool:
    """The expected access decision: an individual rule, else the default."""
    return (individual or default) is Access.ALLOWED


# (requested task, tasks on disk) -> expected outcome for an admitted caller.
REQUESTS = {
    (None, ON_DISK): Admitted(ASK_TASK),
    (None, frozenset()): Admitted(ASK_TASK),
    ("ask", ON_DISK): Admitted(ASK_TASK),
    ("ask", frozenset()): Admitted(ASK_TASK),
    ("review", ON_DISK): Admitted("review"),
    ("review", frozenset()): UNKNOWN_NONE_ON_DISK,
    ("missing", ON_DISK): UNKNOWN,
    ("missing", frozenset()): UNKNOWN_NONE_ON_DISK,
    ("Review!", ON_DISK): UNKNOWN,
}

TABLE = [
    (
        default,
        individual,
        requested,
        available,
        expected if admitted(default, individual) else BLOCKED,
    )
    for default, individual in itertools.product(
        [Access.ALLOWED, Access.BLOCKED], [None, Access.ALLOWED, Access.BLOCKED]
    )
    for (requested, available), expected in REQUESTS.items()
]


@pytest.mark.parametrize("default, individual, requested, available, expected", TABLE)
def test_admission_table(
    default: Access,
    individual: Access | None,
    requested: str | None,
    available: frozenset[str],
    expected: Admitted | Refused,
) -> None:
    """Each (default, individual, request, availability) gives exactly the expected decision."""
    assert admit(policy_for(default, individual), CALLER, requested, available) == expected


def test_table_covers_every_access_combination() -> None:
    """The table has all six access combinations, each with every request shape."""
    assert len(TABLE) == 6 * len(REQUESTS)
    assert sum(1 for row in TABLE if row[-1] == BLOCKED) == 3 * len(REQUESTS)


def test_individual_block_beats_allowed_default_and_existing_task() -> None:
    """A blocked caller gets blocked, with no menu, even for a task that exists."""
    policy = with_caller_access(DEFAULT_POLICY, CALLER, Access.BLOCKED)
    assert admit(policy, CALLER, "review", ON_DISK) == BLOCKED
    assert BLOCKED.offered == ()


def test_other_callers_rules_do_not_leak() -> None:
    """Bob's block does not block Ana, and Ana's allow does not admit Bob."""
    policy = with_caller_access(
        with_default_access(DEFAULT_POLICY, Access.BLOCKED), CALLER, Access.ALLOWED
    )
    assert admit(policy, CALLER, None, ON_DISK) == Admitted(ASK_TASK)
    assert admit(policy, "bob", None, ON_DISK) == BLOCKED


def test_invalid_caller_handle_is_refused() -> None:
    """A handle that is not well formed is refused rather than looked up."""
    for handle in ["", "Ana", "@acme/ana", "ana\n", "a"]:
        assert admit(DEFAULT_POLICY, handle, None, ON_DISK) == BLOCKED


def test_offered_menu_is_sorted_valid_and_capped() -> None:
    """The task_unknown menu lists valid task ids on disk, sorted, at most the cap, never ask."""
    many = frozenset({f"t{n:03d}" for n in range(MAX_OFFERED_TASKS + 10)} | {"ask", "Bad Id"})
    refusal = admit(DEFAULT_POLICY, CALLER, "missing", many)
    assert isinstance(refusal, Refused)
    assert refusal.offered == tuple(sorted(many - {"ask", "Bad Id"}))[:MAX_OFFERED_TASKS]


def test_access_of_prefers_the_individual_rule() -> None:
    """access_of returns the individual rule when there is one, else the default."""
    policy = with_caller_access(
        with_default_access(DEFAULT_POLICY, Access.BLOCKED), CALLER, Access.ALLOWED
    )
    assert access_of(policy, CALLER) is Access.ALLOWED
    assert access_of(policy, "bob") is Access.BLOCKED


def test_the_message_is_not_an_input() -> None:
    """admit takes the policy, the verified handle, the requested task and what is on disk."""
    params = list(inspect.signature(admit).parameters)
    assert params == ["policy", "caller_handle", "requested_task", "available_tasks"]


TASK_IDS = st.from_regex(r"^[a-z0-9][a-z0-9-]{0,10}\Z", fullmatch=True)
HANDLES = st.sampled_from(["ana", "bob", "cy", "dan"])
MAYBE_ACCESS = st.sampled_from([None, Access.ALLOWED, Access.BLOCKED])


@given(
    default=st.sampled_from(list(Access)),
    rules=st.dictionaries(HANDLES, MAYBE_ACCESS),
    caller=HANDLES,
    requested=st.none() | TASK_IDS,
    available=st.frozensets(TASK_IDS, max_size=6),
)
def test_admission_properties(
    default: Access,
    rules: dict[str, Access | None],
    caller: str,
    requested: str | None,
    available: frozenset[str],
) -> None:
    """Blocked callers are always refused; an admitted task is ask or exists on disk."""
    policy = with_default_access(DEFAULT_POLICY, default)
    for handle, access in rules.items():
        policy = with_caller_access(policy, handle, access)
    result = admit(policy, caller, requested, available)
    if access_of(policy, caller) is Access.BLOCKED:
        assert result == BLOCKED
    elif isinstance(result, Admitted):
        assert result.task_id == ASK_TASK or result.task_id in available
        assert result.task_id == (requested or ASK_TASK)
    else:
        assert result.code is CallErrorCode.TASK_UNKNOWN
        assert requested not in available
        assert set(result.offered) <= available
