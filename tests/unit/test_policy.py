"""policy.json: strict loading that fails closed, round trips, atomic private saves."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall.listener.policy import (
    DEFAULT_POLICY,
    Access,
    CallerRule,
    Policy,
    PolicyError,
    load_policy,
    parse_policy,
    policy_to_json,
    save_policy,
    with_caller_access,
    with_default_access,
)


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "policy.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, "utf-8")
    return path


def test_missing_file_is_the_default_policy(tmp_path: Path) -> None:
    """No policy.json means version 1, everyone allowed, no individual rules."""
    policy = load_policy(tmp_path / "policy.json")
    assert policy == DEFAULT_POLICY
    assert policy.default_access is Access.ALLOWED
    assert policy.callers == ()


def test_full_policy_loads(tmp_path: Path) -> None:
    """Every field of the version-1 format is read."""
    path = write(
        tmp_path,
        json.dumps(
            {
                "version": 1,
                "default_access": "blocked",
                "callers": {"ana": {"access": "allowed"}, "bob": {"access": "blocked"}, "cy": {}},
            }
        ),
    )
    policy = load_policy(path)
    assert policy.default_access is Access.BLOCKED
    assert policy.callers == (
        CallerRule("ana", Access.ALLOWED),
        CallerRule("bob", Access.BLOCKED),
        CallerRule("cy", None),
    )
    assert policy.rule_for("bob") == CallerRule("bob", Access.BLOCKED)
    assert policy.rule_for("dan") is None


def test_version_alone_is_enough(tmp_path: Path) -> None:
    """default_access and callers are optional."""
    assert load_policy(write(tmp_path, '{"version": 1}')) == DEFAULT_POLICY


BAD = {
    "not json": ("{version: 1}", "not valid JSON"),
    "truncated": ('{"version": 1', "not valid JSON"),
    "empty": ("", "not valid JSON"),
    "top level list": ("[1]", "top level must be a JSON object"),
    "top level string": ('"x"', "top level must be a JSON object"),
    "no version": ('{"default_access": "allowed"}', '"version" is missing'),
    "version string": ('{"version": "1"}', '"version" must be an integer'),
    "version bool": ('{"version": true}', '"version" must be an integer'),
    "version float": ('{"version": 1.0}', '"version" must be an integer'),
    "future version": ('{"version": 2}', "unsupported version 2"),
    "unknown top key": (
        '{"version": 1, "default_offer": ["ask"]}',
        "unknown key(s) 'default_offer'",
    ),
    "duplicate key": ('{"version": 1, "version": 1}', "duplicate key 'version'"),
    "duplicate handle": (
        '{"version": 1, "callers": {"ana": {}, "ana": {}}}',
        "duplicate key 'ana'",
    ),
    "bad default": ('{"version": 1, "default_access": "maybe"}', "default_access must be"),
    "default not string": ('{"version": 1, "default_access": false}', "default_access must be"),
    "callers list": ('{"version": 1, "callers": ["ana"]}', '"callers" must be an object'),
    "bad handle": ('{"version": 1, "callers": {"Ana!": {}}}', "'Ana!' is not a valid handle"),
    "address not handle": ('{"version": 1, "callers": {"@acme/ana": {}}}', "not a valid handle"),
    "handle with newline": ('{"version": 1, "callers": {"ana\\n": {}}}', "not a valid handle"),
    "caller not object": ('{"version": 1, "callers": {"ana": "blocked"}}', "must be an object"),
    "bad access": (
        '{"version": 1, "callers": {"ana": {"access": "deny"}}}',
        "callers.ana.access must be",
    ),
    "unknown caller key": (
        '{"version": 1, "callers": {"ana": {"block": true}}}',
        "callers.ana has unknown key(s) 'block'",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_every_malformation_is_a_policy_error_naming_the_file(tmp_path: Path, name: str) -> None:
    """Each way of getting policy.json wrong raises PolicyError with the path and the problem."""
    text, problem = BAD[name]
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.path == str(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert problem in caught.value.problem


def test_not_utf8_is_a_policy_error(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 are refused."""
    with pytest.raises(PolicyError, match="not UTF-8"):
        load_policy(write(tmp_path, b'{"version": 1, "x": "\xff"}'))


def test_oversized_file_is_a_policy_error(tmp_path: Path) -> None:
    """A policy larger than 1 MiB is refused before parsing."""
    with pytest.raises(PolicyError, match="larger than"):
        load_policy(write(tmp_path, " " * (1024 * 1024 + 1)))


def test_deep_nesting_is_a_policy_error(tmp_path: Path) -> None:
    """Absurd nesting is refused rather than crashing the listener."""
    with pytest.raises(PolicyError):
        load_policy(write(tmp_path, "[" * 100_000 + "]" * 100_000))


def test_unreadable_path_is_a_policy_error(tmp_path: Path) -> None:
    """A policy.json that cannot be read (here a directory) fails closed."""
    path = tmp_path / "policy.json"
    path.mkdir()
    with pytest.raises(PolicyError, match="cannot be read") as caught:
        load_policy(path)
    assert caught.value.path == str(path)


def test_long_bad_values_are_shortened_in_messages(tmp_path: Path) -> None:
    """A pasted blob in the wrong place is not echoed whole into the error."""
    blob = "q" * 500
    path = write(tmp_path, json.dumps({"version": 1, "default_access": blob}))
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert blob not in str(caught.value)
    assert len(caught.value.problem) < 120


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    """What save_policy writes, load_policy reads back as an equal policy."""
    policy = Policy(
        default_access=Access.BLOCKED,
        callers=[CallerRule("zed", Access.ALLOWED), CallerRule("ana", Access.BLOCKED)],
    )
    path = tmp_path / "policy.json"
    save_policy(path, policy)
    assert load_policy(path) == policy
    assert json.loads(path.read_text()) == {
        "version": 1,
        "default_access": "blocked",
        "callers": {"ana": {"access": "blocked"}, "zed": {"access": "allowed"}},
    }


def test_save_is_private_and_replaces_atomically(tmp_path: Path) -> None:
    """The saved file is 0600, a new inode replaces the old one, and no temporary is left."""
    path = tmp_path / "policy.json"
    path.write_text('{"version": 1}')
    path.chmod(0o644)
    before = path.stat().st_ino
    old = os.umask(0)
    try:
        save_policy(path, with_default_access(DEFAULT_POLICY, Access.BLOCKED))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_ino != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.json"]


def test_save_refuses_an_invalid_policy_and_keeps_the_old_file(tmp_path: Path) -> None:
    """A policy that would not load again is not saved; the old file stays as it was."""
    path = tmp_path / "policy.json"
    path.write_text('{"version": 1}')
    with pytest.raises(PolicyError, match="unsupported version 7"):
        save_policy(path, Policy(version=7))
    assert path.read_text() == '{"version": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.json"]


def test_save_into_missing_directory_leaves_nothing(tmp_path: Path) -> None:
    """Saving where the directory does not exist raises OSError and creates nothing."""
    with pytest.raises(OSError):
        save_policy(tmp_path / "nope" / "policy.json", DEFAULT_POLICY)
    assert list(tmp_path.iterdir()) == []


def test_with_caller_access_sets_replaces_and_removes() -> None:
    """Setting, changing and clearing one caller's access leaves the others alone."""
    policy = with_caller_access(DEFAULT_POLICY, "bob", Access.BLOCKED)
    policy = with_caller_access(policy, "ana", Access.ALLOWED)
    assert policy.callers == (CallerRule("ana", Access.ALLOWED), CallerRule("bob", Access.BLOCKED))
    policy = with_caller_access(policy, "bob", Access.ALLOWED)
    assert policy.rule_for("bob") == CallerRule("bob", Access.ALLOWED)
    policy = with_caller_access(policy, "bob", None)
    assert policy.callers == (CallerRule("ana", Access.ALLOWED),)
    assert DEFAULT_POLICY.callers == ()


def test_with_caller_access_refuses_a_bad_handle() -> None:
    """Edits validate the handle just like the loader does."""
    with pytest.raises(ValueError):
        with_caller_access(DEFAULT_POLICY, "@acme/bob", Access.BLOCKED)


def test_with_default_access() -> None:
    """The default changes; individual rules are kept."""
    base = with_caller_access(DEFAULT_POLICY, "ana", Access.ALLOWED)
    policy = with_default_access(base, Access.BLOCKED)
    assert policy.default_access is Access.BLOCKED
    assert policy.callers == base.callers


def test_policy_objects_refuse_bad_values() -> None:
    """The value classes themselves reject bad handles, bad access values and duplicates."""
    with pytest.raises(ValueError):
        CallerRule("Bad Handle")
    with pytest.raises(ValueError):
        CallerRule("ana", "deny")
    with pytest.raises(ValueError):
        Policy(callers=[CallerRule("ana"), CallerRule("ana", Access.BLOCKED)])


HANDLES = st.from_regex(r"^[a-z0-9][a-z0-9-]{1,30}\Z", fullmatch=True)
ACCESS = st.sampled_from([Access.ALLOWED, Access.BLOCKED, None])


@given(st.sampled_from(list(Access)), st.dictionaries(HANDLES, ACCESS, max_size=8))
def test_json_form_round_trips(default: Access, rules: dict[str, Access | None]) -> None:
    """Any policy survives policy_to_json and the strict validator unchanged."""
    policy = Policy(
        default_access=default,
        callers=[CallerRule(handle, access) for handle, access in rules.items()],
    )
    text = json.dumps(policy_to_json(policy))
    assert parse_policy(json.loads(text), source="mem") == policy
