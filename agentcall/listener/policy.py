"""The owner's ``policy.json``: who may call this agent, and which tasks each caller gets.

Format, version 2 (every field but ``version`` is optional)::

    {
      "version": 2,
      "default_access": "allowed",          # or "blocked": only individually allowed callers
      "default_offer": ["ask"],             # tasks every allowed caller gets; default ["ask"]
      "callers": {"bob": {"access": "blocked"}, "ana": {"grants": ["review"]}},
      "groups": {"eng": {"roster_id": "R0ster-id-0000001", "grants": ["deploy-docs"]}},
      "assertions": [{"caller": "ana", "accept": ["review"]}, {"caller": "bob", "deny": ["*"]}]
    }

A group grant counts only for a caller the relay attests shares that roster with this owner.
An assertion is the owner's own test of the effective policy (see
:mod:`agentcall.listener.policyfile`): edits that would break one are refused.

Version-1 files (``default_access`` and ``callers.*.access`` only) are still read and upgraded
in memory: they keep their meaning, with ``default_offer`` at its default. A missing file is the
default policy. Anything else that is not exactly this shape — bad JSON, a duplicate or unknown
key, a bad handle, task id or value, an unsupported version — raises :class:`PolicyError`
naming the file and the field, and the listener must then refuse every call and spawn nothing:
a policy it cannot read is never guessed at.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import attrs

from agentcall.errors import AgentCallError
from agentcall.filetrust import PrivateFileError, private_dir_problem, read_trusted
from agentcall.ids import HANDLE_RE, ROSTER_ID_RE, TASK_RE
from agentcall.listener.policyfile import (
    Assertion,
    SchemaProblem,
    check_keys,
    decode_json,
    parse_assertions,
    parse_task_ids,
    show,
    sorted_ids,
)

POLICY_VERSION: Final = 2
# policy.json is written by a person; anything this big is not one.
MAX_POLICY_BYTES: Final = 1024 * 1024
MAX_CALLERS: Final = 1000
MAX_GROUPS: Final = 100
DEFAULT_OFFER: Final = ("ask",)

_V1_KEYS: Final = frozenset({"version", "default_access", "callers"})
_V2_KEYS: Final = _V1_KEYS | {"default_offer", "groups", "assertions"}
_V1_CALLER_KEYS: Final = frozenset({"access"})
_V2_CALLER_KEYS: Final = frozenset({"access", "grants"})
_GROUP_KEYS: Final = frozenset({"roster_id", "grants"})


class PolicyError(AgentCallError):
    """The owner's policy or tasks cannot be used; the message names the file and the problem.

    ``fix``, when known, is the exact command that repairs it (for a file someone else could
    have changed); it is also the end of the message.
    """

    def __init__(self, path: str, problem: str, fix: str | None = None) -> None:
        super().__init__(f"{path}: {problem}" + (f"; {fix}" if fix else ""))
        self.path = path
        self.problem = problem
        self.fix = fix

    @classmethod
    def untrusted(cls, failure: PrivateFileError) -> PolicyError:
        """The policy error for a file or directory that someone else could have changed."""
        return cls(str(failure.path), failure.problem, failure.fix)


class Access(enum.StrEnum):
    ALLOWED = "allowed"
    BLOCKED = "blocked"


def _check_handle(_instance: object, _attribute: attrs.Attribute[str], handle: str) -> None:
    if not HANDLE_RE.match(handle):
        raise ValueError(f"not a valid handle: {show(handle)}")


def _check_task_ids(
    _instance: object, _attribute: attrs.Attribute[Any], ids: tuple[str, ...]
) -> None:
    for task in ids:
        if not TASK_RE.match(task):
            raise ValueError(f"not a valid task id: {show(task)}")


@attrs.frozen
class CallerRule:
    """What the owner decided for one caller; ``access=None`` means: follow the default."""

    handle: str = attrs.field(validator=_check_handle)
    access: Access | None = attrs.field(default=None, converter=attrs.converters.optional(Access))
    # Tasks this caller gets on top of the default offer; sorted, each once.
    grants: tuple[str, ...] = attrs.field(
        default=(), converter=sorted_ids, validator=_check_task_ids
    )


@attrs.frozen
class GroupRule:
    """Grants for the members of a roster, under a name local to this policy."""

    name: str = attrs.field()
    roster_id: str = attrs.field()
    grants: tuple[str, ...] = attrs.field(
        default=(), converter=sorted_ids, validator=_check_task_ids
    )

    @name.validator
    def _check_name(self, _attribute: attrs.Attribute[str], name: str) -> None:
        if not TASK_RE.match(name):
            raise ValueError(f"not a valid group name: {show(name)}")

    @roster_id.validator
    def _check_roster(self, _attribute: attrs.Attribute[str], roster_id: str) -> None:
        if not ROSTER_ID_RE.match(roster_id):
            raise ValueError(f"not a valid roster id: {show(roster_id)}")


def _by_handle(rules: Iterable[CallerRule]) -> tuple[CallerRule, ...]:
    return tuple(sorted(rules, key=lambda rule: rule.handle))


def _by_name(groups: Iterable[GroupRule]) -> tuple[GroupRule, ...]:
    return tuple(sorted(groups, key=lambda group: group.name))


def _in_order(assertions: Iterable[Assertion]) -> tuple[Assertion, ...]:
    return tuple(assertions)


def _unique(key: str) -> Any:
    def check(_instance: object, attribute: attrs.Attribute[Any], items: tuple[Any, ...]) -> None:
        keys = [getattr(item, key) for item in items]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{attribute.name}: a {key} appears twice")

    return check


@attrs.frozen
class Policy:
    version: int = POLICY_VERSION
    default_access: Access = attrs.field(default=Access.ALLOWED, converter=Access)
    # Sorted, one entry per key: equal policies compare equal and save identically.
    callers: tuple[CallerRule, ...] = attrs.field(
        default=(), converter=_by_handle, validator=_unique("handle")
    )
    default_offer: tuple[str, ...] = attrs.field(
        default=DEFAULT_OFFER, converter=sorted_ids, validator=_check_task_ids
    )
    groups: tuple[GroupRule, ...] = attrs.field(
        default=(), converter=_by_name, validator=_unique("name")
    )
    # In the owner's order: a failure names an assertion by its position.
    assertions: tuple[Assertion, ...] = attrs.field(default=(), converter=_in_order)

    def rule_for(self, handle: str) -> CallerRule | None:
        for rule in self.callers:
            if rule.handle == handle:
                return rule
        return None

    def group(self, name: str) -> GroupRule | None:
        for group in self.groups:
            if group.name == name:
                return group
        return None


DEFAULT_POLICY: Final = Policy()


def _parse_access(value: Any, where: str) -> Access:
    if not isinstance(value, str) or value not in {a.value for a in Access}:
        raise SchemaProblem(f'{where} must be "allowed" or "blocked", not {show(value)}')
    return Access(value)


def _object(value: Any, where: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SchemaProblem(f'"{where}" must be an object {what}')
    return value


def _parse_caller(handle: Any, entry: Any, version: int) -> CallerRule:
    if not isinstance(handle, str) or not HANDLE_RE.match(handle):
        raise SchemaProblem(f"callers: {show(handle)} is not a valid handle")
    where = f"callers.{handle}"
    if not isinstance(entry, dict):
        raise SchemaProblem(f"{where} must be an object")
    check_keys(entry, _V1_CALLER_KEYS if version == 1 else _V2_CALLER_KEYS, where)
    access = _parse_access(entry["access"], f"{where}.access") if "access" in entry else None
    grants = parse_task_ids(entry.get("grants", []), f"{where}.grants")
    return CallerRule(handle, access, grants)


def _parse_group(name: Any, entry: Any) -> GroupRule:
    if not isinstance(name, str) or not TASK_RE.match(name):
        raise SchemaProblem(f"groups: {show(name)} is not a valid group name")
    where = f"groups.{name}"
    if not isinstance(entry, dict):
        raise SchemaProblem(f"{where} must be an object")
    check_keys(entry, _GROUP_KEYS, where)
    roster_id = entry.get("roster_id")
    if not isinstance(roster_id, str) or not ROSTER_ID_RE.match(roster_id):
        raise SchemaProblem(f"{where}.roster_id must be a roster id, not {show(roster_id)}")
    return GroupRule(name, roster_id, parse_task_ids(entry.get("grants", []), f"{where}.grants"))


def _parse(data: Any) -> Policy:
    if not isinstance(data, dict):
        raise SchemaProblem("the top level must be a JSON object")
    if "version" not in data:
        raise SchemaProblem(f'"version" is missing (use {POLICY_VERSION})')
    version = data["version"]
    if type(version) is not int:
        raise SchemaProblem(f'"version" must be an integer, not {show(version)}')
    if version not in (1, POLICY_VERSION):
        raise SchemaProblem(f"unsupported version {version} (this AgentCall reads 1 and 2)")
    check_keys(data, _V1_KEYS if version == 1 else _V2_KEYS, "the policy")
    default_access = Access.ALLOWED
    if "default_access" in data:
        default_access = _parse_access(data["default_access"], "default_access")
    callers = _object(data.get("callers", {}), "callers", "keyed by handle")
    if len(callers) > MAX_CALLERS:
        raise SchemaProblem(f'"callers" has more than {MAX_CALLERS} entries')
    rules = [_parse_caller(handle, entry, version) for handle, entry in callers.items()]
    offer: tuple[str, ...] = DEFAULT_OFFER
    if "default_offer" in data:
        offer = parse_task_ids(data["default_offer"], "default_offer")
    groups_raw = _object(data.get("groups", {}), "groups", "keyed by a local group name")
    if len(groups_raw) > MAX_GROUPS:
        raise SchemaProblem(f'"groups" has more than {MAX_GROUPS} entries')
    groups = [_parse_group(name, entry) for name, entry in groups_raw.items()]
    assertions = parse_assertions(data.get("assertions", []), "assertions")
    known = {group.name for group in groups}
    for index, assertion in enumerate(assertions):
        for name in assertion.groups:
            if name not in known:
                raise SchemaProblem(f"assertions[{index}].groups: no group named {show(name)}")
    # A version-1 file is upgraded in memory; saving it writes version 2.
    return Policy(POLICY_VERSION, default_access, rules, offer, groups, assertions)


def parse_policy(data: Any, *, source: str) -> Policy:
    """Validate already-decoded JSON; ``source`` names the file in any :class:`PolicyError`."""
    try:
        return _parse(data)
    except SchemaProblem as problem:
        raise PolicyError(source, str(problem)) from None


def policy_to_json(policy: Policy) -> dict[str, Any]:
    """The JSON form of ``policy``; :func:`parse_policy` reads it back to an equal policy."""
    callers: dict[str, Any] = {}
    for rule in policy.callers:
        entry: dict[str, Any] = {}
        if rule.access is not None:
            entry["access"] = str(rule.access)
        if rule.grants:
            entry["grants"] = list(rule.grants)
        callers[rule.handle] = entry
    document: dict[str, Any] = {
        "version": policy.version,
        "default_access": str(policy.default_access),
        "default_offer": list(policy.default_offer),
        "callers": callers,
    }
    if policy.groups:
        document["groups"] = {
            group.name: {"roster_id": group.roster_id, "grants": list(group.grants)}
            for group in policy.groups
        }
    if policy.assertions:
        document["assertions"] = [assertion.to_json() for assertion in policy.assertions]
    return document


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read ``policy.json``; missing means :data:`DEFAULT_POLICY`, anything wrong raises.

    Like config.json, it is used only when nobody else could have changed it: its directory
    (the state directory) must be ours alone, the file ours and not writable by group or
    others, and a symlink may only lead elsewhere inside that directory. Otherwise another
    local account could have granted itself a task, or removed the file to get the default.
    """
    name = os.fspath(path)
    policy_path = Path(os.path.abspath(name))
    try:
        problem = private_dir_problem(policy_path.parent)
        if problem is not None:
            raise PolicyError(str(problem.path), problem.problem, problem.fix)
        raw = read_trusted(policy_path, policy_path.parent, limit=MAX_POLICY_BYTES)
    except FileNotFoundError:
        return DEFAULT_POLICY
    except PrivateFileError as failure:
        raise PolicyError.untrusted(failure) from None
    except OSError as failure:
        reason = failure.strerror or type(failure).__name__
        raise PolicyError(name, f"cannot be read ({reason})") from None
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(name, f"is larger than {MAX_POLICY_BYTES} bytes")
    try:
        data = decode_json(raw)
    except SchemaProblem as problem:
        raise PolicyError(name, str(problem)) from None
    return parse_policy(data, source=name)


# --- pure edits: each returns a new policy; policysave.save_policy validates it -------------


def _with_rule(policy: Policy, handle: str, **changes: Any) -> Policy:
    if not HANDLE_RE.match(handle):
        raise ValueError(f"not a valid handle: {show(handle)}")
    current = policy.rule_for(handle) or CallerRule(handle)
    rule = attrs.evolve(current, **changes)
    others = [other for other in policy.callers if other.handle != handle]
    # A rule that says nothing (follows the default, grants nothing) is dropped.
    keep = rule.access is not None or rule.grants
    return attrs.evolve(policy, callers=[*others, rule] if keep else others)


def with_caller_access(policy: Policy, handle: str, access: Access | None) -> Policy:
    """``policy`` with ``handle``'s access set; ``None``: follow the default again."""
    return _with_rule(policy, handle, access=access)


def with_default_access(policy: Policy, access: Access) -> Policy:
    """``policy`` with a new default for callers who have no individual rule."""
    return attrs.evolve(policy, default_access=access)


def _task_id(task: str) -> str:
    if not TASK_RE.match(task):
        raise ValueError(f"not a valid task id: {show(task)}")
    return task


def with_offer(policy: Policy, task: str) -> Policy:
    """``policy`` offering ``task`` to every allowed caller."""
    return attrs.evolve(policy, default_offer=(*policy.default_offer, _task_id(task)))


def without_offer(policy: Policy, task: str) -> Policy:
    """``policy`` no longer offering ``task`` by default (individual grants stay)."""
    task = _task_id(task)
    kept = [offered for offered in policy.default_offer if offered != task]
    return attrs.evolve(policy, default_offer=kept)


def with_grant(policy: Policy, handle: str, task: str) -> Policy:
    """``policy`` granting ``task`` to ``handle`` (their access is unchanged)."""
    current = policy.rule_for(handle)
    grants = current.grants if current else ()
    return _with_rule(policy, handle, grants=(*grants, _task_id(task)))


def without_grant(policy: Policy, handle: str, task: str) -> Policy:
    """``policy`` with ``handle``'s individual grant of ``task`` taken back."""
    task = _task_id(task)
    current = policy.rule_for(handle)
    grants = current.grants if current else ()
    return _with_rule(policy, handle, grants=[g for g in grants if g != task])
