"""`agentcall task new ID`: a template that loads, never overwrites, and is not offered."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcall.cli.main import main
from agentcall.listener.tasks import load_tasks
from tests.unit.cli_helpers import isolate


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    return isolate(monkeypatch, tmp_path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_new_task_is_created_and_explained(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The SKILL.md is written, loads cleanly, and the output says how to offer it."""
    code, out, err = run(capsys, "task", "new", "release-notes")
    path = home / "AgentCall" / "tasks" / "release-notes" / "SKILL.md"
    assert (code, err) == (0, "")
    assert f"created {path}" in out
    assert "agentcall offer release-notes" in out
    assert "agentcall allow HANDLE release-notes" in out
    loaded = load_tasks(home / "AgentCall" / "tasks", [str(home)])
    assert "release-notes" in loaded.tasks and loaded.problems == []
    # Creating is not offering: the policy is not touched.
    assert not (home / ".agentcall" / "policy.json").exists()


def test_an_existing_task_is_never_overwritten(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second `task new` fails with one line and leaves the owner's edits alone."""
    run(capsys, "task", "new", "review")
    path = home / "AgentCall" / "tasks" / "review" / "SKILL.md"
    path.write_text("---\ndescription: mine\n---\nmy words\n")
    code, out, err = run(capsys, "task", "new", "review")
    assert code == 1 and out == ""
    assert "already exists" in err and err.count("\n") == 1
    assert path.read_text() == "---\ndescription: mine\n---\nmy words\n"


def test_ask_is_reserved(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The built-in task cannot be scaffolded."""
    code, _out, err = run(capsys, "task", "new", "ask")
    assert code == 1 and "built in" in err
    assert not (home / "AgentCall" / "tasks" / "ask").exists()


@pytest.mark.parametrize("argv", [["task"], ["task", "new"], ["task", "new", "Bad_Id"]])
def test_usage_errors_exit_two(home: Path, argv: list[str]) -> None:
    """A missing action or id, or a malformed id, is a usage error."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert not (home / "AgentCall").exists()


def test_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    """`task new --help` explains with a runnable example."""
    with pytest.raises(SystemExit):
        main(["task", "new", "--help"])
    assert "agentcall task new release-notes" in capsys.readouterr().out
