"""What the owner's policy and the admin ceiling share: strict JSON, field checks, assertions.

An assertion is a test the owner (in ``policy.json``) or the administrator (in the ceiling)
writes about the *effective* policy — after the ceiling, the tasks on disk and the grants::

    {"caller": "ana", "accept": ["review"]}              ana gets review
    {"caller": "bob", "deny": ["*"]}                     bob gets nothing at all
    {"caller": "cy", "groups": ["eng"], "accept": ["deploy-docs"], "deny": ["payroll"]}
                                                         cy, as a member of eng, gets
                                                         deploy-docs and not payroll

Rules: at least one of ``accept``/``deny``; ``"*"`` only in ``deny`` and alone there; no task in
both lists; at most :data:`MAX_ASSERTIONS`. ``groups`` names groups of the owner's policy, and
the caller is evaluated as if the relay had attested those rosters. Evaluation is
:func:`agentcall.listener.admission.check_assertions`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from agentcall import strictjson
from agentcall.ids import HANDLE_RE, TASK_RE

ALL_TASKS: Final = "*"
MAX_ASSERTIONS: Final = 100
MAX_ASSERTION_GROUPS: Final = 20
# Any one list of task ids in a policy file (an offer, grants, accept, deny).
MAX_TASK_IDS: Final = 200

_ASSERTION_KEYS: Final = frozenset({"caller", "groups", "accept", "deny"})


class SchemaProblem(Exception):
    """A validation finding that names its field; the loader adds the file's name."""


def decode_json(raw: bytes) -> Any:
    """Strict JSON from a file's bytes: UTF-8, no duplicate keys, no NaN or infinities,
    bounded nesting."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SchemaProblem("is not UTF-8 text") from None
    try:
        return strictjson.loads(text)
    except strictjson.DuplicateKey as duplicate:
        raise SchemaProblem(f"duplicate key {show(duplicate.key)}") from None
    except strictjson.NotJsonConstant as constant:
        raise SchemaProblem(f"is not valid JSON ({constant.name} is not a JSON number)") from None
    except json.JSONDecodeError as failure:
        where = f"line {failure.lineno}, column {failure.colno}"
        raise SchemaProblem(f"is not valid JSON ({failure.msg} at {where})") from None
    except ValueError:
        # Not a JSONDecodeError: Python refuses integers longer than sys.get_int_max_str_digits().
        raise SchemaProblem("has a number too long to read") from None
    except RecursionError:
        raise SchemaProblem("is nested too deeply") from None


def show(value: object) -> str:
    """Enough of a bad value to find it in the file, never a whole pasted blob."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_keys(item: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(item) - allowed)
    if unknown:
        names = ", ".join(show(key) for key in unknown)
        raise SchemaProblem(
            f"{where} has unknown key(s) {names}; allowed: {', '.join(sorted(allowed))}"
        )


def sorted_ids(ids: Iterable[str]) -> tuple[str, ...]:
    """A canonical id list: sorted, each once."""
    return tuple(sorted(set(ids)))


def parse_task_ids(
    value: Any, where: str, *, star: bool = False, limit: int = MAX_TASK_IDS
) -> tuple[str, ...]:
    """A JSON list of distinct task ids (and ``"*"`` when ``star``), canonically sorted."""
    if not isinstance(value, list):
        raise SchemaProblem(f"{where} must be a list of task ids, not {show(value)}")
    if len(value) > limit:
        raise SchemaProblem(f"{where} has more than {limit} entries")
    for item in value:
        if not isinstance(item, str) or not (TASK_RE.match(item) or (star and item == ALL_TASKS)):
            raise SchemaProblem(f"{where}: {show(item)} is not a task id")
    if len(set(value)) != len(value):
        raise SchemaProblem(f"{where} lists a task twice")
    return sorted_ids(value)


@attrs.frozen
class Assertion:
    """What one caller (optionally as a member of some groups) must and must not get."""

    caller: str
    groups: tuple[str, ...] = attrs.field(default=(), converter=sorted_ids)
    accept: tuple[str, ...] = attrs.field(default=(), converter=sorted_ids)
    deny: tuple[str, ...] = attrs.field(default=(), converter=sorted_ids)

    def __attrs_post_init__(self) -> None:
        problem = _assertion_problem(self)
        if problem is not None:
            raise ValueError(problem)

    @property
    def denies_everything(self) -> bool:
        return ALL_TASKS in self.deny

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"caller": self.caller}
        for key in ("groups", "accept", "deny"):
            if getattr(self, key):
                document[key] = list(getattr(self, key))
        return document

    def __str__(self) -> str:
        who = self.caller + (f" (in {', '.join(self.groups)})" if self.groups else "")
        said = []
        if self.accept:
            said.append(f"gets {', '.join(self.accept)}")
        if self.denies_everything:
            said.append("gets nothing")
        elif self.deny:
            said.append(f"does not get {', '.join(self.deny)}")
        return f"{who} {' and '.join(said)}"


def _assertion_problem(assertion: Assertion) -> str | None:
    if not HANDLE_RE.match(assertion.caller):
        return f"caller {show(assertion.caller)} is not a handle"
    for name in assertion.groups:
        if not TASK_RE.match(name):
            return f"groups: {show(name)} is not a group name"
    for task in assertion.accept:
        if not TASK_RE.match(task):
            return f"accept: {show(task)} is not a task id"
    for task in assertion.deny:
        if not (TASK_RE.match(task) or task == ALL_TASKS):
            return f"deny: {show(task)} is not a task id or *"
    if not assertion.accept and not assertion.deny:
        return "needs accept or deny (or both)"
    if assertion.denies_everything and (assertion.accept or len(assertion.deny) > 1):
        return 'deny "*" must stand alone, without accept or other denied tasks'
    both = sorted(set(assertion.accept) & set(assertion.deny))
    if both:
        return f"{', '.join(both)} is in both accept and deny"
    return None


def parse_assertion(entry: Any, where: str) -> Assertion:
    if not isinstance(entry, dict):
        raise SchemaProblem(f"{where} must be an object")
    check_keys(entry, _ASSERTION_KEYS, where)
    caller = entry.get("caller")
    if not isinstance(caller, str) or not HANDLE_RE.match(caller):
        raise SchemaProblem(f"{where}.caller must be a handle, not {show(caller)}")
    groups_raw = entry.get("groups", [])
    if not isinstance(groups_raw, list) or len(groups_raw) > MAX_ASSERTION_GROUPS:
        raise SchemaProblem(f"{where}.groups must be a list of at most {MAX_ASSERTION_GROUPS}")
    # Group names share the task id grammar.
    groups = parse_task_ids(groups_raw, f"{where}.groups")
    accept = parse_task_ids(entry.get("accept", []), f"{where}.accept")
    deny = parse_task_ids(entry.get("deny", []), f"{where}.deny", star=True)
    try:
        return Assertion(caller, groups, accept, deny)
    except ValueError as problem:
        raise SchemaProblem(f"{where}: {problem}") from None


def parse_assertions(value: Any, where: str) -> tuple[Assertion, ...]:
    if not isinstance(value, list):
        raise SchemaProblem(f'"{where}" must be a list')
    if len(value) > MAX_ASSERTIONS:
        raise SchemaProblem(f'"{where}" has more than {MAX_ASSERTIONS} assertions')
    return tuple(parse_assertion(entry, f"{where}[{index}]") for index, entry in enumerate(value))
