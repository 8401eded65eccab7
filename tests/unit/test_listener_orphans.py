"""What a listener that died left running: the markers it kept, and the reap at the next start."""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agentcall.listener.orphans import LiveRuns
from agentcall.listener.runner import RUN_ID_ENV

A = "a" * 32
B = "b" * 32


def test_the_runs_going_are_kept_in_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.live"
    live = LiveRuns(path)
    live.started(A)
    live.started(B)
    live.ended(A)
    assert path.read_text() == f"{B}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_successor_kills_each_marked_run_once_and_forgets_them(tmp_path: Path) -> None:
    path = tmp_path / "runs.live"
    path.write_text(f"{A}\nnot a run id\n{B}\n../../etc\n")
    swept: list[str] = []

    def sweep(marker: str) -> set[int]:
        swept.append(marker)
        return {4242} if marker.endswith(A) else set()

    killed = LiveRuns(path).reap(sweep)
    assert swept == [f"{RUN_ID_ENV}={A}", f"{RUN_ID_ENV}={B}"]
    assert killed == {A: {4242}, B: set()}
    assert not path.exists()
    assert LiveRuns(path).reap(sweep) == {}  # nothing left: a second start kills nothing


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfd_open (Linux 5.3)")
@pytest.mark.slow
def test_a_detached_process_of_a_dead_listeners_run_is_killed_at_the_next_start(
    tmp_path: Path,
) -> None:
    """A run's shell tool that left the group (setsid) outlives the agent; the marker it
    carries finds it."""
    marker = "c" * 32
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={RUN_ID_ENV: marker, "PATH": "/usr/bin:/bin"},
        start_new_session=True,
    )
    watch = os.pidfd_open(orphan.pid)
    try:
        assert orphan.stdout is not None and orphan.stdout.readline() == b"up\n"
        (tmp_path / "runs.live").write_text(f"{marker}\n")
        killed = LiveRuns(tmp_path / "runs.live").reap()
        assert killed == {marker: {orphan.pid}}
        ended, _, _ = select.select([watch], [], [], 60)
        assert ended == [watch]
        assert orphan.wait(timeout=60) == -signal.SIGKILL
    finally:
        os.close(watch)
        if orphan.poll() is None:
            orphan.kill()
