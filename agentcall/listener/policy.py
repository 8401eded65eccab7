"""The owner's ``policy.json``: who may call this agent.

Format, version 1::

    {
      "version": 1,
      "default_access": "allowed",            # or "blocked"; optional, default "allowed"
      "callers": {"bob": {"access": "blocked"}} # optional; "access" optional inside
    }

A missing file is the default policy (everyone in the org allowed). Anything else that is not
exactly this shape — bad JSON, a duplicate or unknown key, a bad handle, a bad value, an
unsupported version — raises :class:`PolicyError` naming the file and the problem, and the
listener must then refuse every call and spawn nothing: a policy it cannot read is never
guessed at.

Growth path: ``parse_policy`` is the one validator and ``policy_to_json`` its inverse; later
fields (``default_offer``, per-caller grants, group grants, assertions) are added to both and to
the attrs classes with defaults, so a version-1 file keeps its meaning. An incompatible change
bumps ``version``.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any, Final

import attrs

from agentcall.errors import AgentCallError
from agentcall.ids import HANDLE_RE

POLICY_VERSION: Final = 1
# policy.json is written by a person; anything this big is not one.
MAX_POLICY_BYTES: Final = 1024 * 1024

_TOP_KEYS: Final = frozenset({"version", "default_access", "callers"})
_CALLER_KEYS: Final = frozenset({"access"})


class PolicyError(AgentCallError):
    """``policy.json`` exists but cannot be used; the message names the file and the problem."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class Access(enum.StrEnum):
    ALLOWED = "allowed"
    BLOCKED = "blocked"


def _check_handle(_instance: object, _attribute: attrs.Attribute[str], handle: str) -> None:
    if not HANDLE_RE.match(handle):
        raise ValueError(f"not a valid handle: {_show(handle)}")


@attrs.frozen
class CallerRule:
    """What the owner decided for one caller; ``access=None`` means: follow the default."""

    handle: str = attrs.field(validator=_check_handle)
    access: Access | None = attrs.field(default=None, converter=attrs.converters.optional(Access))


def _sorted_rules(rules: Any) -> tuple[CallerRule, ...]:
    return tuple(sorted(rules, key=lambda rule: rule.handle))


def _unique_handles(
    _instance: object, _attribute: attrs.Attribute[Any], rules: tuple[CallerRule, ...]
) -> None:
    handles = [rule.handle for rule in rules]
    if len(set(handles)) != len(handles):
        raise ValueError("a caller appears twice")


@attrs.frozen
class Policy:
    version: int = POLICY_VERSION
    default_access: Access = attrs.field(default=Access.ALLOWED, converter=Access)
    # Sorted by handle, one rule per handle: equal policies compare equal and save identically.
    callers: tuple[CallerRule, ...] = attrs.field(
        default=(), converter=_sorted_rules, validator=_unique_handles
    )

    def rule_for(self, handle: str) -> CallerRule | None:
        for rule in self.callers:
            if rule.handle == handle:
                return rule
        return None


DEFAULT_POLICY: Final = Policy()


def _show(value: object) -> str:
    # Enough of a bad value to find it in the file, never a whole pasted blob.
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Problem(f"duplicate key {_show(key)}")
        result[key] = value
    return result


class _Problem(Exception):
    """A validation finding; turned into a PolicyError that names the file."""


def _parse_access(value: Any, where: str) -> Access:
    if not isinstance(value, str) or value not in {a.value for a in Access}:
        raise _Problem(f'{where} must be "allowed" or "blocked", not {_show(value)}')
    return Access(value)


def _check_keys(item: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(item) - allowed)
    if unknown:
        names = ", ".join(_show(key) for key in unknown)
        raise _Problem(f"{where} has unknown key(s) {names}; allowed: {', '.join(sorted(allowed))}")


def _parse_caller(handle: Any, entry: Any) -> CallerRule:
    if not isinstance(handle, str) or not HANDLE_RE.match(handle):
        raise _Problem(f"callers: {_show(handle)} is not a valid handle")
    where = f"callers.{handle}"
    if not isinstance(entry, dict):
        raise _Problem(f"{where} must be an object")
    _check_keys(entry, _CALLER_KEYS, where)
    access = _parse_access(entry["access"], f"{where}.access") if "access" in entry else None
    return CallerRule(handle, access)


def _parse(data: Any) -> Policy:
    if not isinstance(data, dict):
        raise _Problem("the top level must be a JSON object")
    _check_keys(data, _TOP_KEYS, "the policy")
    if "version" not in data:
        raise _Problem(f'"version" is missing (use {POLICY_VERSION})')
    version = data["version"]
    if type(version) is not int:
        raise _Problem(f'"version" must be an integer, not {_show(version)}')
    if version != POLICY_VERSION:
        raise _Problem(f"unsupported version {version} (this AgentCall reads {POLICY_VERSION})")
    default_access = Access.ALLOWED
    if "default_access" in data:
        default_access = _parse_access(data["default_access"], "default_access")
    callers = data.get("callers", {})
    if not isinstance(callers, dict):
        raise _Problem('"callers" must be an object keyed by handle')
    rules = [_parse_caller(handle, entry) for handle, entry in callers.items()]
    return Policy(version, default_access, rules)


def parse_policy(data: Any, *, source: str) -> Policy:
    """Validate already-decoded JSON; ``source`` names the file in any :class:`PolicyError`."""
    try:
        return _parse(data)
    except _Problem as problem:
        raise PolicyError(source, str(problem)) from None


def policy_to_json(policy: Policy) -> dict[str, Any]:
    """The JSON form of ``policy``; :func:`parse_policy` reads it back to an equal policy."""
    callers: dict[str, Any] = {}
    for rule in policy.callers:
        entry: dict[str, Any] = {}
        if rule.access is not None:
            entry["access"] = str(rule.access)
        callers[rule.handle] = entry
    return {
        "version": policy.version,
        "default_access": str(policy.default_access),
        "callers": callers,
    }


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read ``policy.json``; missing means :data:`DEFAULT_POLICY`, anything wrong raises."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as policy_file:
            raw = policy_file.read(MAX_POLICY_BYTES + 1)
    except FileNotFoundError:
        return DEFAULT_POLICY
    except OSError as failure:
        reason = failure.strerror or type(failure).__name__
        raise PolicyError(name, f"cannot be read ({reason})") from None
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(name, f"is larger than {MAX_POLICY_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(name, "is not UTF-8 text") from None
    try:
        data = json.loads(text, object_pairs_hook=_reject_duplicates)
    except _Problem as problem:
        raise PolicyError(name, str(problem)) from None
    except json.JSONDecodeError as failure:
        where = f"line {failure.lineno}, column {failure.colno}"
        raise PolicyError(name, f"is not valid JSON ({failure.msg} at {where})") from None
    except RecursionError:
        raise PolicyError(name, "is nested too deeply") from None
    return parse_policy(data, source=name)


def save_policy(path: str | os.PathLike[str], policy: Policy) -> None:
    """Validate, then atomically replace ``policy.json`` with a 0600 file."""
    name = os.fspath(path)
    document = policy_to_json(policy)
    # The same validator as load_policy: nothing is saved that could not be loaded again.
    if parse_policy(document, source=name) != policy:
        raise PolicyError(name, "does not survive a round trip; refusing to save it")
    data = (json.dumps(document, indent=2, sort_keys=False) + "\n").encode("utf-8")
    directory = os.path.dirname(os.path.abspath(name))
    # mkstemp creates the file 0600, so the policy is never readable by others, even briefly.
    fd, temporary = tempfile.mkstemp(prefix=".policy-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, name)
    except BaseException:
        # Leave no half-written temporary behind; the old policy is still in place.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    # Makes the rename itself durable; not every platform lets a directory be opened.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def with_caller_access(policy: Policy, handle: str, access: Access | None) -> Policy:
    """``policy`` with ``handle``'s access set; ``None`` removes the individual rule."""
    if not HANDLE_RE.match(handle):
        raise ValueError(f"not a valid handle: {_show(handle)}")
    others = [rule for rule in policy.callers if rule.handle != handle]
    current = policy.rule_for(handle)
    if access is None:
        # Today a rule holds only access; later fields would keep the rule alive here.
        return attrs.evolve(policy, callers=others)
    rule = attrs.evolve(current, access=access) if current else CallerRule(handle, access)
    return attrs.evolve(policy, callers=[*others, rule])


def with_default_access(policy: Policy, access: Access) -> Policy:
    """``policy`` with a new default for callers who have no individual rule."""
    return attrs.evolve(policy, default_access=access)
