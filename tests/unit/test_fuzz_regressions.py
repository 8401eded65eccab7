"""Inputs that once escaped a parser's own error types (found while building fuzz/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcall.listener.ceiling import CeilingError, parse_ceiling
from agentcall.listener.policy import PolicyError, load_policy
from agentcall.listener.policyfile import SchemaProblem, decode_json
from agentcall.listener.tasks import TaskProblem, load_tasks

# Python refuses to turn more than 4300 decimal digits into an int (sys.int_info).
LONG_NUMBER = b"1" * 4301


def test_a_nul_in_workdir_is_a_task_problem_not_a_crash(tmp_path: Path) -> None:
    """realpath raises ValueError on NUL; load_tasks must report the task, not die."""
    root = tmp_path / "work"
    root.mkdir()
    skill = tmp_path / "tasks" / "review" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_bytes(b"---\ndescription: d\nworkdir: " + str(root).encode() + b"/a\x00b\n---\n")
    loaded = load_tasks(tmp_path / "tasks", [str(root)])
    assert "review" not in loaded.tasks
    assert loaded.problems == [TaskProblem(skill, 3, "workdir must not contain a NUL character")]


def test_a_number_too_long_for_python_is_a_schema_problem() -> None:
    """json.loads raises a plain ValueError (not JSONDecodeError) past the digit limit."""
    with pytest.raises(SchemaProblem, match="number too long"):
        decode_json(b'{"version": ' + LONG_NUMBER + b"}")


def test_policy_json_with_a_huge_number_is_a_policy_error(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_bytes(b'{"version": 2, "callers": {"ann": {"access": ' + LONG_NUMBER + b"}}}")
    path.chmod(0o600)
    with pytest.raises(PolicyError, match="number too long"):
        load_policy(path)


def test_a_ceiling_with_a_huge_number_is_refused_through_decode_json() -> None:
    """The ceiling's loader shares decode_json, so the same input is a SchemaProblem there."""
    with pytest.raises(SchemaProblem):
        parse_ceiling(decode_json(b'{"version": -' + LONG_NUMBER + b"}"), source="ceiling")
    with pytest.raises(CeilingError):
        parse_ceiling({"version": 10**20}, source="ceiling")
