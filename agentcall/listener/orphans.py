"""Runs a listener that died (``kill -9``, a crash, the machine's OOM killer) left behind.

The kernel kills each run's agent with its listener (the exec wrapper's parent-death signal,
:func:`agentcall.confine.main.die_with_parent`), and under systemd the unit's control group
goes with the unit. What can survive is what the agent started that left its group: a shell
tool's ``setsid`` child, a detached server. Every process of a run carries the run's marker
(:data:`agentcall.listener.runner.RUN_ID_ENV`), so the listener keeps the markers of the runs
it has going in ``runs.live`` in the state directory, and a listener that starts finds that
file's markers still there, SIGKILLs every process that carries one, and only then takes
work. A mailbox job such a run was doing is then reported ``indeterminate_execution`` by the
journal when it comes back (:mod:`agentcall.listener.journal`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from pathlib import Path

from agentcall.atomicfile import replace_file
from agentcall.listener.runner import RUN_ID_ENV, sweep_marked
from agentcall.logevents import Logger

_log = Logger(namespace="agentcall.listener.orphans")
_RUN_ID = re.compile(r"[0-9a-f]{32}\Z")
MAX_FILE_BYTES = 64 * 1024


class LiveRuns:
    """The markers of the runs going now, kept in a file so a successor can find them."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._going: set[str] = set()

    def started(self, run_id: str) -> None:
        self._going.add(run_id)
        self._save()

    def ended(self, run_id: str) -> None:
        self._going.discard(run_id)
        self._save()

    def _save(self) -> None:
        try:
            data = "".join(f"{run_id}\n" for run_id in sorted(self._going)).encode("ascii")
            # Not durable: after a crash of the whole machine no run survives to be found.
            replace_file(self._path, data, durable=False)
        except OSError as exc:
            _log.warn("live_runs_unsaved", reason=str(exc))

    def reap(self, sweep: Callable[[str], set[int]] = sweep_marked) -> dict[str, set[int]]:
        """Kill whatever still carries a marker a predecessor left, then forget them all."""
        try:
            with open(self._path, "rb") as handle:
                raw = handle.read(MAX_FILE_BYTES)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            _log.warn("live_runs_unreadable", reason=str(exc))
            return {}
        killed: dict[str, set[int]] = {}
        for line in raw.decode("ascii", "replace").splitlines():
            if _RUN_ID.match(line):
                killed[line] = sweep(f"{RUN_ID_ENV}={line}")
                _log.warn("orphan_run_reaped", run_id=line, killed=len(killed[line]))
        with contextlib.suppress(OSError):
            os.unlink(self._path)
        return killed
