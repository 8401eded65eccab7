"""The admin ceiling: missing is unmanaged, anything doubtful fails closed, the seam is shut."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentcall.listener.ceiling import (
    LINUX_PATH,
    MACOS_PATH,
    TEST_OVERRIDE_ENV,
    Ceiling,
    CeilingError,
    default_ceiling_path,
    load_ceiling,
    parse_ceiling,
)
from agentcall.listener.policyfile import Assertion

FULL = {
    "version": 1,
    "allowed_tasks": ["ask", "review"],
    "blocked_callers": ["mallory"],
    "max_tools": ["read", "fetch"],
    "assertions": [{"caller": "mallory", "deny": ["*"]}],
}
NOBODY = 65534


def write(tmp_path: Path, content: str | bytes | dict[str, object]) -> Path:
    path = tmp_path / "ceiling.json"
    if isinstance(content, dict):
        content = json.dumps(content)
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    path.chmod(0o644)
    return path


def via_override(path: Path) -> Ceiling | None:
    """Load as the tests do: the override is allowed and names ``path``."""
    return load_ceiling(environ={TEST_OVERRIDE_ENV: str(path)}, allow_test_override=True)


def give_away(path: Path) -> None:
    """Make ``path`` owned by someone else (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(path, NOBODY, NOBODY)


def test_a_missing_file_means_unmanaged(tmp_path: Path) -> None:
    """No file, by explicit path or by override, is None: no ceiling."""
    assert load_ceiling(tmp_path / "absent.json") is None
    assert via_override(tmp_path / "absent.json") is None


def test_every_field_is_read(tmp_path: Path) -> None:
    """Allowed tasks, blocked callers, the tool cap and assertions, with the path kept."""
    path = write(tmp_path, FULL)
    assert via_override(path) == Ceiling(
        path=str(path),
        allowed_tasks=frozenset({"ask", "review"}),
        blocked_callers=frozenset({"mallory"}),
        max_tools=frozenset({"read", "fetch"}),
        assertions=(Assertion("mallory", deny=("*",)),),
    )


def test_omitted_fields_do_not_constrain_and_empty_lists_do(tmp_path: Path) -> None:
    """Omitted allowed_tasks means every task; [] means none. Same for max_tools."""
    loose = via_override(write(tmp_path, {"version": 1}))
    assert loose == Ceiling(str(tmp_path / "ceiling.json"))
    assert loose.allows_task("anything") and loose.cap_tools(frozenset({"exec"})) == {"exec"}
    tight = via_override(write(tmp_path, {"version": 1, "allowed_tasks": [], "max_tools": []}))
    assert tight is not None
    assert not tight.allows_task("ask") and tight.cap_tools(frozenset({"read"})) == frozenset()


BAD = {
    "not an object": ([], "top level must be a JSON object"),
    "no version": ({}, '"version" must be 1'),
    "version 2": ({"version": 2}, '"version" must be 1'),
    "version text": ({"version": "1"}, '"version" must be 1'),
    "unknown key": ({"version": 1, "tests": []}, "unknown key(s) 'tests'"),
    "allowed not list": ({"version": 1, "allowed_tasks": "ask"}, "allowed_tasks must be a list"),
    "allowed bad id": ({"version": 1, "allowed_tasks": ["Ask"]}, "allowed_tasks: 'Ask'"),
    "blocked bad": ({"version": 1, "blocked_callers": ["@a/b"]}, "blocked_callers: '@a/b'"),
    "blocked twice": ({"version": 1, "blocked_callers": ["bob", "bob"]}, "a handle twice"),
    "blocked not list": ({"version": 1, "blocked_callers": "bob"}, "blocked_callers must be"),
    "tool unknown": ({"version": 1, "max_tools": ["sudo"]}, "max_tools: 'sudo' is not one"),
    "tools not list": ({"version": 1, "max_tools": "read"}, "max_tools must be a list"),
    "tool twice": ({"version": 1, "max_tools": ["read", "read"]}, "a tool twice"),
    "bad assertion": ({"version": 1, "assertions": [{"caller": "bob"}]}, "assertions[0]"),
    "boundary not bool": ({"version": 1, "require_kernel_boundary": 1}, "true or false"),
    "isolation not bool": ({"version": 1, "require_process_isolation": "yes"}, "true or false"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_every_malformation_fails_closed_naming_the_field(tmp_path: Path, name: str) -> None:
    """Each bad shape is a CeilingError with the file and the field."""
    data, problem = BAD[name]
    path = write(tmp_path, json.dumps(data))
    with pytest.raises(CeilingError) as caught:
        via_override(path)
    assert caught.value.path == str(path)
    assert problem in caught.value.problem, caught.value.problem


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{version: 1}", "not valid JSON"),
        (b"", "not valid JSON"),
        (b'{"version": 1, "version": 1}', "duplicate key"),
        (b'{"version": 1, "x": "\xff"}', "not UTF-8"),
        (b" " * (1024 * 1024 + 1), "larger than"),
    ],
)
def test_malformed_files_fail_closed(tmp_path: Path, content: bytes, problem: str) -> None:
    """Bad JSON, duplicates, bad encoding and oversize are all CeilingErrors."""
    with pytest.raises(CeilingError, match=problem):
        via_override(write(tmp_path, content))


def test_something_that_is_not_a_regular_file_fails_closed(tmp_path: Path) -> None:
    """A directory or a FIFO at the path is refused (and a FIFO does not hang the reader)."""
    directory = tmp_path / "dir"
    directory.mkdir()
    with pytest.raises(CeilingError, match="not a regular file"):
        via_override(directory)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(CeilingError, match="not a regular file"):
        via_override(fifo)


def test_unreadable_paths_fail_closed(tmp_path: Path) -> None:
    """A path that cannot be examined, or a symlink to nowhere, is not "missing"."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CeilingError, match="cannot be examined"):
        via_override(blocker / "policy.json")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(CeilingError, match="cannot be read"):
        via_override(dangling)


def test_a_file_without_read_permission_fails_closed(tmp_path: Path) -> None:
    """Mode 000 cannot be read by its owner (root reads anything, so this needs a user)."""
    if os.geteuid() == 0:
        pytest.skip("root can read a mode-000 file")
    path = write(tmp_path, FULL)
    path.chmod(0)
    with pytest.raises(CeilingError, match="cannot be read"):
        via_override(path)


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_file_others_can_change_fails_closed(tmp_path: Path, mode: int) -> None:
    """Group- or world-writable means someone besides the owner could change the limits."""
    path = write(tmp_path, FULL)
    path.chmod(mode)
    with pytest.raises(CeilingError, match="writable by group or others"):
        via_override(path)


def test_the_override_requires_the_current_user_as_owner(tmp_path: Path) -> None:
    """Under the test override, a file owned by someone else is refused."""
    path = write(tmp_path, FULL)
    if os.geteuid() == 0:
        give_away(path)
    else:
        path.unlink()
        path.symlink_to("/etc/hostname" if os.path.exists("/etc/hostname") else "/etc/passwd")
    with pytest.raises(CeilingError, match="is owned by uid"):
        via_override(path)


def test_production_loading_requires_root_ownership(tmp_path: Path) -> None:
    """Without the override, a file not owned by root is refused."""
    path = write(tmp_path, FULL)
    if os.geteuid() == 0:
        assert load_ceiling(path) is not None  # root-owned: accepted
        give_away(path)
    with pytest.raises(CeilingError, match="not root"):
        load_ceiling(path)


def test_production_loading_ignores_the_environment_variable(tmp_path: Path) -> None:
    """With allow_test_override False, AGENTCALL_TEST_CEILING_PATH changes nothing."""
    decoy = write(tmp_path, FULL)
    absent = tmp_path / "absent.json"
    environ = {TEST_OVERRIDE_ENV: str(decoy)}
    assert load_ceiling(absent, environ=environ) is None
    assert load_ceiling(absent, environ=environ, allow_test_override=False) is None
    # The override only works when both the flag and the variable are present.
    assert load_ceiling(absent, environ={}, allow_test_override=True) is None
    assert load_ceiling(absent, environ=environ, allow_test_override=True) is not None


def test_the_default_path_depends_on_the_platform() -> None:
    """Linux (and other Unix) use /etc; macOS uses /Library/Application Support."""
    assert default_ceiling_path("linux") == LINUX_PATH == "/etc/agentcall/policy.json"
    assert default_ceiling_path("darwin") == MACOS_PATH
    assert MACOS_PATH == "/Library/Application Support/agentcall/policy.json"
    assert default_ceiling_path("freebsd14") == LINUX_PATH


def test_the_kernel_boundary_can_be_required() -> None:
    """Omitted: not required; true: every agent must run inside the kernel boundary."""
    assert parse_ceiling({"version": 1}, source="x").require_kernel_boundary is False
    required = parse_ceiling({"version": 1, "require_kernel_boundary": True}, source="x")
    assert required.require_kernel_boundary is True
    assert parse_ceiling({"version": 1}, source="x").require_process_isolation is False
    isolated = parse_ceiling({"version": 1, "require_process_isolation": True}, source="x")
    assert isolated.require_process_isolation is True


def test_parse_ceiling_names_the_source() -> None:
    """The validator alone reports problems against the given source name."""
    assert parse_ceiling({"version": 1}, source="x") == Ceiling("x")
    with pytest.raises(CeilingError, match=r"^x: "):
        parse_ceiling({"version": 1, "max_tools": ["root"]}, source="x")
