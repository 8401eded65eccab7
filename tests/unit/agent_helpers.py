"""What the agent, runner, guard and client tests share: the reactor for async tests, the
fake agent executable, the real CLI captures, and a RunResult builder."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest_twisted  # type: ignore[import-untyped,unused-ignore]
from twisted.internet import reactor as _reactor

from agentcall.listener.runner import RunResult

reactor: Any = _reactor
F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, None]])

REPO = Path(__file__).resolve().parents[2]
FAKE_AGENT = REPO / "tests" / "fakes" / "fake_agent.py"


# Captured output of the real Claude Code and Codex CLIs, kept in the repository so every clone
# runs the parser and guard tests against it; a missing file is a test failure, never a skip.
SAMPLES = REPO / "tests" / "fixtures" / "agent-clis"


def twisted_test(f: F) -> F:
    """Run an async test on the reactor (pytest-twisted is untyped)."""
    result: F = pytest_twisted.ensureDeferred(f)
    return result


def run_result(**kw: Any) -> RunResult:
    """A finished run: a clean exit with no output unless ``kw`` says otherwise."""
    fields: dict[str, Any] = {
        "exit_code": 0,
        "signal": None,
        "stdout": b"",
        "stderr": b"",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "timed_out": False,
        "cancelled": False,
        "early_finish": False,
        "duration_s": 1.0,
        "swept_pids": 0,
    }
    fields.update(kw)
    return RunResult(**fields)
