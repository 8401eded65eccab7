"""policy.json: strict loading that fails closed, round trips, atomic private saves."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall.listener.ceiling import Ceiling
from agentcall.listener.policy import (
    DEFAULT_POLICY,
    Access,
    CallerRule,
    GroupRule,
    Policy,
    PolicyError,
    load_policy,
    parse_policy,
    policy_to_json,
    with_caller_access,
    with_default_access,
    with_grant,
    with_offer,
    without_grant,
    without_offer,
)
from agentcall.listener.policyfile import Assertion
from agentcall.listener.policysave import save_policy
from agentcall.listener.tasks import BUILTIN_ASK, Task, TaskSet
from tests.unit import wire_strategies as ws


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "policy.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, "utf-8")
    return path


def test_missing_file_is_the_default_policy(tmp_path: Path) -> None:
    """No policy.json means the default: everyone allowed, `ask` offered, no individual rules."""
    policy = load_policy(tmp_path / "policy.json")
    assert policy == DEFAULT_POLICY
    assert policy.default_access is Access.ALLOWED
    assert policy.callers == ()
    assert policy.default_offer == ("ask",)


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
    "future version": ('{"version": 3}', "unsupported version 3"),
    "unknown top key": ('{"version": 2, "offers": ["ask"]}', "unknown key(s) 'offers'"),
    "v2 key in a v1 file": (
        '{"version": 1, "default_offer": ["ask"]}',
        "unknown key(s) 'default_offer'",
    ),
    "grants in a v1 file": (
        '{"version": 1, "callers": {"ana": {"grants": ["ask"]}}}',
        "callers.ana has unknown key(s) 'grants'",
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
    with pytest.raises(PolicyError, match="is not a regular file") as caught:
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
    """What save_policy writes, load_policy reads back as an equal policy, as version 2."""
    policy = Policy(
        default_access=Access.BLOCKED,
        callers=[CallerRule("zed", Access.ALLOWED), CallerRule("ana", Access.BLOCKED)],
    )
    path = tmp_path / "policy.json"
    save_policy(path, policy)
    assert load_policy(path) == policy
    assert json.loads(path.read_text()) == {
        "version": 2,
        "default_access": "blocked",
        "default_offer": ["ask"],
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


HANDLES = ws.handles
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


# --- version 2: offers, grants, groups, assertions ----------------------------------------------

ROSTER = "R0ster-id-0000001"
FULL_V2: dict[str, Any] = {
    "version": 2,
    "default_access": "allowed",
    "default_offer": ["review", "ask"],
    "callers": {
        "bob": {"access": "blocked"},
        "ana": {"grants": ["deploy-docs"]},
        "cy": {"access": "allowed", "grants": ["review", "ask"]},
    },
    "groups": {"eng": {"roster_id": ROSTER, "grants": ["deploy-docs"]}},
    "assertions": [
        {"caller": "ana", "accept": ["deploy-docs"]},
        {"caller": "bob", "deny": ["*"]},
        {"caller": "dan", "groups": ["eng"], "accept": ["review"], "deny": ["payroll"]},
    ],
}


def test_version_2_loads_every_field(tmp_path: Path) -> None:
    """Offers, grants, groups and assertions are read into canonical, sorted values."""
    policy = load_policy(write(tmp_path, json.dumps(FULL_V2)))
    assert policy.version == 2
    assert policy.default_offer == ("ask", "review")
    assert policy.rule_for("ana") == CallerRule("ana", None, ("deploy-docs",))
    assert policy.rule_for("cy") == CallerRule("cy", Access.ALLOWED, ("ask", "review"))
    assert policy.groups == (GroupRule("eng", ROSTER, ("deploy-docs",)),)
    assert policy.group("eng") is policy.groups[0] and policy.group("ops") is None
    assert policy.assertions == (
        Assertion("ana", accept=("deploy-docs",)),
        Assertion("bob", deny=("*",)),
        Assertion("dan", ("eng",), ("review",), ("payroll",)),
    )


def test_version_2_round_trips_through_a_file(tmp_path: Path) -> None:
    """Saving the loaded policy writes it back in its canonical JSON form."""
    policy = parse_policy(FULL_V2, source="mem")
    path = tmp_path / "policy.json"
    tasks = tasks_on_disk("review", "deploy-docs")
    save_policy(path, policy, tasks=tasks)
    assert load_policy(path) == policy
    saved = json.loads(path.read_text())
    assert saved["default_offer"] == ["ask", "review"]
    assert saved["callers"]["cy"] == {"access": "allowed", "grants": ["ask", "review"]}
    assert saved["assertions"][2] == FULL_V2["assertions"][2]


def test_a_version_1_file_is_upgraded_in_memory(tmp_path: Path) -> None:
    """Version 1 keeps its meaning, gains the default offer, and is saved as version 2."""
    path = write(tmp_path, '{"version": 1, "callers": {"bob": {"access": "blocked"}}}')
    policy = load_policy(path)
    assert policy == Policy(callers=[CallerRule("bob", Access.BLOCKED)])
    assert (policy.version, policy.default_offer) == (2, ("ask",))
    save_policy(path, policy)
    assert json.loads(path.read_text())["version"] == 2


def _v2(**fields: object) -> str:
    return json.dumps({"version": 2, **fields})


BAD_V2 = {
    "offer not a list": (_v2(default_offer="ask"), "default_offer must be a list"),
    "offer bad id": (_v2(default_offer=["Ask"]), "default_offer: 'Ask' is not a task id"),
    "offer twice": (_v2(default_offer=["ask", "ask"]), "default_offer lists a task twice"),
    "offer star": (_v2(default_offer=["*"]), "'*' is not a task id"),
    "grants bad id": (
        _v2(callers={"ana": {"grants": ["ok", 3]}}),
        "callers.ana.grants: 3 is not a task id",
    ),
    "grants not list": (_v2(callers={"ana": {"grants": "ok"}}), "callers.ana.grants must be"),
    "too many grants": (
        _v2(callers={"ana": {"grants": [f"t{n}" for n in range(201)]}}),
        "more than 200",
    ),
    "too many callers": (
        _v2(callers={f"c{n:04d}": {} for n in range(1001)}),
        "more than 1000",
    ),
    "groups not object": (_v2(groups=["eng"]), '"groups" must be an object'),
    "bad group name": (_v2(groups={"Eng": {"roster_id": ROSTER}}), "not a valid group name"),
    "group not object": (_v2(groups={"eng": ROSTER}), "groups.eng must be an object"),
    "no roster": (_v2(groups={"eng": {"grants": []}}), "groups.eng.roster_id must be"),
    "bad roster": (_v2(groups={"eng": {"roster_id": "short"}}), "groups.eng.roster_id must be"),
    "unknown group key": (
        _v2(groups={"eng": {"roster_id": ROSTER, "offer": []}}),
        "groups.eng has unknown key(s) 'offer'",
    ),
    "assertions not list": (_v2(assertions={}), '"assertions" must be a list'),
    "too many assertions": (
        _v2(assertions=[{"caller": "ana", "deny": ["*"]}] * 101),
        "more than 100 assertions",
    ),
    "assertion not object": (_v2(assertions=["ana"]), "assertions[0] must be an object"),
    "assertion unknown key": (
        _v2(assertions=[{"caller": "ana", "deny": ["*"], "expect": "x"}]),
        "assertions[0] has unknown key(s) 'expect'",
    ),
    "assertion bad caller": (
        _v2(assertions=[{"caller": "@acme/ana", "deny": ["*"]}]),
        "assertions[0].caller must be a handle",
    ),
    "assertion says nothing": (
        _v2(assertions=[{"caller": "ana"}]),
        "assertions[0]: needs accept or deny",
    ),
    "star with accept": (
        _v2(assertions=[{"caller": "ana", "accept": ["ask"], "deny": ["*"]}]),
        'deny "*" must stand alone',
    ),
    "star with others": (
        _v2(assertions=[{"caller": "ana", "deny": ["*", "ask"]}]),
        'deny "*" must stand alone',
    ),
    "star in accept": (
        _v2(assertions=[{"caller": "ana", "accept": ["*"]}]),
        "assertions[0].accept: '*' is not a task id",
    ),
    "overlap": (
        _v2(assertions=[{"caller": "ana", "accept": ["ask"], "deny": ["ask"]}]),
        "ask is in both accept and deny",
    ),
    "unknown group in assertion": (
        _v2(assertions=[{"caller": "ana", "groups": ["ops"], "deny": ["*"]}]),
        "assertions[0].groups: no group named 'ops'",
    ),
    "assertion groups not list": (
        _v2(assertions=[{"caller": "ana", "groups": "eng", "deny": ["*"]}]),
        "assertions[0].groups must be a list",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_V2))
def test_every_version_2_malformation_names_the_file_and_field(tmp_path: Path, name: str) -> None:
    """Each bad offer, grant, group or assertion is a PolicyError naming where it is."""
    text, problem = BAD_V2[name]
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.path == str(path)
    assert problem in caught.value.problem, caught.value.problem


def test_offer_and_grant_edits() -> None:
    """Offers and grants are added once, removed cleanly, and never touch access."""
    policy = with_offer(with_offer(DEFAULT_POLICY, "review"), "review")
    assert policy.default_offer == ("ask", "review")
    assert without_offer(policy, "ask").default_offer == ("review",)
    assert without_offer(policy, "missing") == policy
    policy = with_grant(with_caller_access(policy, "ana", Access.BLOCKED), "ana", "deploy")
    policy = with_grant(policy, "ana", "deploy")
    assert policy.rule_for("ana") == CallerRule("ana", Access.BLOCKED, ("deploy",))
    policy = with_caller_access(policy, "ana", None)
    assert policy.rule_for("ana") == CallerRule("ana", None, ("deploy",))
    assert without_grant(policy, "ana", "deploy").rule_for("ana") is None
    assert without_grant(policy, "zed", "deploy") == policy
    for edit in (
        lambda: with_offer(DEFAULT_POLICY, "Bad"),
        lambda: without_offer(DEFAULT_POLICY, "*"),
        lambda: with_grant(DEFAULT_POLICY, "ana", "a b"),
        lambda: with_grant(DEFAULT_POLICY, "@acme/ana", "ask"),
        lambda: without_grant(DEFAULT_POLICY, "ana", ""),
    ):
        with pytest.raises(ValueError):
            edit()


def tasks_on_disk(*ids: str) -> TaskSet:
    tasks = {"ask": BUILTIN_ASK}
    tasks.update({task: Task(id=task, name=task, description="d") for task in ids})
    return TaskSet(tasks)


def test_save_refuses_a_policy_that_breaks_an_assertion(tmp_path: Path) -> None:
    """Assertions are checked against the tasks on disk and the ceiling before writing."""
    path = tmp_path / "policy.json"
    path.write_text('{"version": 2}')
    claim = Assertion("ana", accept=("review",))
    policy = Policy(default_offer=("ask", "review"), assertions=[claim])
    with pytest.raises(PolicyError, match=r"policy assertion 1 .* ana does not get review"):
        save_policy(path, policy)  # without tasks only `ask` exists
    save_policy(path, policy, tasks=tasks_on_disk("review"))
    assert load_policy(path) == policy
    narrow = Ceiling("/etc/agentcall/policy.json", allowed_tasks=frozenset({"ask"}))
    with pytest.raises(PolicyError, match="refusing to save"):
        save_policy(path, with_default_access(policy, Access.BLOCKED), tasks=tasks_on_disk())
    with pytest.raises(PolicyError):
        save_policy(path, policy, tasks=tasks_on_disk("review"), ceiling=narrow)
    assert load_policy(path) == policy


def test_save_checks_the_administrators_assertions_too(tmp_path: Path) -> None:
    """A ceiling assertion that the owner's edit would break blocks the save."""
    ceiling = Ceiling("/etc/agentcall/policy.json", assertions=(Assertion("bob", deny=("*",)),))
    path = tmp_path / "policy.json"
    save_policy(path, with_caller_access(DEFAULT_POLICY, "bob", Access.BLOCKED), ceiling=ceiling)
    with pytest.raises(PolicyError, match=r"ceiling assertion 1 .* bob gets ask"):
        save_policy(path, DEFAULT_POLICY, ceiling=ceiling)


def test_value_classes_refuse_bad_groups_and_assertions() -> None:
    """The attrs classes validate on their own, whoever builds them."""
    with pytest.raises(ValueError):
        GroupRule("Eng", ROSTER)
    with pytest.raises(ValueError):
        GroupRule("eng", "short")
    with pytest.raises(ValueError):
        Policy(groups=[GroupRule("eng", ROSTER), GroupRule("eng", ROSTER + "x")])
    with pytest.raises(ValueError):
        Policy(default_offer=["Bad"])
    with pytest.raises(ValueError):
        CallerRule("ana", grants=["*"])
    bad_assertions: list[dict[str, Any]] = [
        {"caller": "A", "deny": ("*",)},
        {"caller": "ana"},
        {"caller": "ana", "accept": ("x",), "deny": ("x",)},
        {"caller": "ana", "groups": ("Bad",), "deny": ("*",)},
        {"caller": "ana", "accept": ("*",)},
        {"caller": "ana", "accept": ("Bad",)},
        {"caller": "ana", "deny": ("Bad",)},
    ]
    for bad in bad_assertions:
        with pytest.raises(ValueError):
            Assertion(**bad)


TASK_IDS = st.from_regex(r"^[a-z0-9][a-z0-9-]{0,8}\Z", fullmatch=True)


@given(
    offer=st.lists(TASK_IDS, max_size=4),
    grants=st.dictionaries(HANDLES, st.tuples(ACCESS, st.lists(TASK_IDS, max_size=3)), max_size=5),
)
def test_version_2_json_form_round_trips(
    offer: list[str], grants: dict[str, tuple[Access | None, list[str]]]
) -> None:
    """Any offer and set of grants survives policy_to_json and the validator unchanged."""
    policy = Policy(
        default_offer=offer,
        callers=[CallerRule(h, access, ids) for h, (access, ids) in grants.items()],
    )
    text = json.dumps(policy_to_json(policy))
    assert parse_policy(json.loads(text), source="mem") == policy


# --- the file must be the owner's own (issue 7 item 3) -------------------------------------------


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    return directory


GRANT_EXEC = json.dumps({"version": 2, "callers": {"eve": {"grants": ["shell"]}}})


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602, 0o646])
def test_a_policy_others_can_write_is_a_policy_error(state_dir: Path, mode: int) -> None:
    """World- or group-writable: refused, naming the file and the exact chmod."""
    path = state_dir / "policy.json"
    path.write_text(GRANT_EXEC)
    path.chmod(mode)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.path == str(path)
    assert caught.value.fix == f"run `chmod go-w {path}`"
    assert str(caught.value).endswith(f"run `chmod go-w {path}`")


def test_a_policy_readable_by_others_is_still_used(state_dir: Path) -> None:
    """0644 (as an editor or `cat >` leaves it) is not a risk inside the 0700 state dir."""
    path = state_dir / "policy.json"
    path.write_text(GRANT_EXEC)
    path.chmod(0o644)
    assert load_policy(path).rule_for("eve") is not None


def test_a_policy_linked_out_of_the_state_dir_is_a_policy_error(
    state_dir: Path, tmp_path: Path
) -> None:
    """The reported attack: policy.json a symlink to a file in a place others control."""
    outside = tmp_path / "shared" / "policy.json"
    outside.parent.mkdir()
    outside.write_text(GRANT_EXEC)
    outside.chmod(0o600)
    (state_dir / "policy.json").symlink_to(outside)
    with pytest.raises(PolicyError, match=r"is a symbolic link to .* outside") as caught:
        load_policy(state_dir / "policy.json")
    assert caught.value.fix is not None and "rm " in caught.value.fix


def test_a_policy_linked_inside_the_state_dir_is_used(state_dir: Path) -> None:
    """A link that stays in the state directory is followed."""
    (state_dir / "policies").mkdir(mode=0o700)
    target = state_dir / "policies" / "work.json"
    target.write_text(GRANT_EXEC)
    (state_dir / "policy.json").symlink_to(target)
    assert load_policy(state_dir / "policy.json").rule_for("eve") is not None


@pytest.mark.skipif(os.getuid() != 0, reason="making a file of another user needs root")
def test_a_policy_of_another_user_is_a_policy_error(state_dir: Path) -> None:
    """Owned by nobody (65534): refused with the chown."""
    path = state_dir / "policy.json"
    path.write_text(GRANT_EXEC)
    path.chmod(0o644)
    os.chown(path, 65534, -1)
    with pytest.raises(PolicyError, match="owned by uid 65534") as caught:
        load_policy(path)
    assert caught.value.fix is not None and f"chown {os.getuid()} {path}" in caught.value.fix


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o777])
def test_a_state_dir_others_can_use_is_a_policy_error(state_dir: Path, mode: int) -> None:
    """Others could have replaced policy.json, or removed it to get the default policy."""
    state_dir.chmod(mode)
    with pytest.raises(PolicyError, match=f"run `chmod 700 {state_dir}`") as caught:
        load_policy(state_dir / "policy.json")
    assert caught.value.path == str(state_dir)
