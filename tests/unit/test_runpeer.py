"""Whether a local client belongs to an answering agent's run (agentcall.local.runpeer): the
parsers on sample /proc text, the walk on a made-up process table, and one real child."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

import pytest

from agentcall.local import runpeer
from agentcall.local.runpeer import ProcessFacts, belongs_to_run, environ_marked, parse_stat

ME = 1000


class Table(ProcessFacts):
    """A process table: pid -> (ppid, session, uid, environ or None when unreadable); the
    pids in ``hidden_pids`` made themselves not dumpable."""

    def __init__(
        self,
        rows: Mapping[int, tuple[int, int, int, bytes | None]],
        hidden_pids: frozenset[int] = frozenset(),
    ) -> None:
        self.rows = rows
        self.hidden_pids = hidden_pids
        self.read: list[int] = []

    def hidden(self, pid: int) -> bool:
        return pid in self.hidden_pids

    def environ(self, pid: int) -> bytes | None:
        self.read.append(pid)
        row = self.rows.get(pid)
        return None if row is None else row[3]

    def stat(self, pid: int) -> tuple[int, int] | None:
        row = self.rows.get(pid)
        return None if row is None else (row[0], row[1])

    def uid(self, pid: int) -> int | None:
        row = self.rows.get(pid)
        return None if row is None else row[2]


PLAIN = b"PATH=/usr/bin\0HOME=/home/ken\0"
MARKED = b"PATH=/usr/bin\0AGENTCALL_RUN_ID=ab12\0"


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (b"1234 (bash) S 1200 1234 1100 34816 1234 4194304 ...", (1200, 1100)),
        (b"77 (a) b) (c) R 70 77 60 0 -1", (70, 60)),  # a name with ") " in it
        (b"5 (x)\n", None),
        (b"no parenthesis here", None),
        (b"9 (x) S one two three", None),
    ],
)
def test_stat_lines_are_read_from_the_last_parenthesis(
    raw: bytes, parsed: tuple[int, int] | None
) -> None:
    assert parse_stat(raw) == parsed


@pytest.mark.parametrize(
    ("environ", "marked"),
    [
        (MARKED, True),
        (b"AGENTCALL_CALL_ID=x\0", True),
        (PLAIN, False),
        (b"X=AGENTCALL_RUN_ID=ab\0", False),  # a value that mentions it is not the variable
        (b"", False),
    ],
)
def test_a_marker_is_a_variable_of_its_own(environ: bytes, marked: bool) -> None:
    assert environ_marked(environ) is marked


def test_a_clean_client_of_this_user_is_not_a_runs() -> None:
    table = Table({300: (200, 200, ME, PLAIN), 200: (1, 200, ME, PLAIN)})
    assert not belongs_to_run(300, facts=table, uid=ME)
    assert table.read == [300, 200]


def test_a_marked_client_or_ancestor_is_a_runs() -> None:
    rows = {300: (250, 250, ME, PLAIN), 250: (200, 200, ME, MARKED), 200: (1, 1, ME, PLAIN)}
    assert belongs_to_run(300, facts=Table(rows), uid=ME)
    assert belongs_to_run(250, facts=Table(rows), uid=ME)


def test_a_client_in_a_runs_session_or_below_its_leader_is_a_runs() -> None:
    """A scrubbed environment (env -i) does not hide a process that is still in the run's
    session, or whose parent chain reaches the run's leader."""
    in_session = {300: (1, 250, ME, b"")}
    assert belongs_to_run(300, run_leaders=lambda: {250}, facts=Table(in_session), uid=ME)
    below = {300: (260, 300, ME, b""), 260: (250, 260, ME, b""), 250: (1, 250, ME, b"")}
    assert belongs_to_run(300, run_leaders=lambda: {250}, facts=Table(below), uid=ME)
    assert not belongs_to_run(300, run_leaders=lambda: {999}, facts=Table(below), uid=ME)


def test_a_client_that_is_gone_or_hid_itself_is_counted_as_a_runs() -> None:
    """A peer gone before it could be looked at, or one that made itself not dumpable to
    hide its environment: the owner's own clients do neither."""
    assert belongs_to_run(300, facts=Table({}), uid=ME)
    hidden = {300: (1, 300, ME, None)}
    assert belongs_to_run(300, facts=Table(hidden, frozenset({300})), uid=ME)


def test_an_environment_unreadable_for_another_reason_is_no_evidence() -> None:
    """The owner's client under newgrp (another group: environ unreadable, not hidden), or
    below a hidden ancestor such as `ssh-agent bash`: the walk goes on and finds nothing."""
    regrouped = {300: (200, 300, ME, None), 200: (100, 200, ME, PLAIN), 100: (1, 1, ME, PLAIN)}
    assert not belongs_to_run(300, facts=Table(regrouped), uid=ME)
    under_agent = {300: (200, 300, ME, PLAIN), 200: (100, 200, ME, None)}
    assert not belongs_to_run(300, facts=Table(under_agent, frozenset({200})), uid=ME)
    # ... but a marked process further up is still found through it.
    marked_above = {**under_agent, 100: (1, 100, ME, MARKED)}
    assert belongs_to_run(300, facts=Table(marked_above, frozenset({200})), uid=ME)


def test_a_descendant_of_the_service_is_a_runs_whatever_its_environment() -> None:
    """A run's process that scrubbed its environment and hid its parent still descends from
    the listener (the service's own pid), unless it was re-parented away."""
    rows = {300: (250, 300, ME, b""), 250: (77, 250, ME, None), 77: (1, 77, ME, PLAIN)}
    table = Table(rows, frozenset({250}))
    assert belongs_to_run(300, facts=table, uid=ME, service_pid=77)
    assert not belongs_to_run(300, facts=table, uid=ME, service_pid=78)
    # The service itself is not "below the service".
    assert not belongs_to_run(77, facts=table, uid=ME, service_pid=77)


def test_the_walk_stops_at_another_users_process() -> None:
    rows = {300: (200, 300, ME, PLAIN), 200: (100, 200, 0, MARKED)}
    table = Table(rows)
    assert not belongs_to_run(300, facts=table, uid=ME)
    assert table.read == [300]


def test_the_walk_is_bounded() -> None:
    rows = {pid: (pid + 1, pid, ME, PLAIN) for pid in range(2, 2 + 2 * runpeer.MAX_ANCESTORS)}
    top = 2 + runpeer.MAX_ANCESTORS + 5
    rows[top] = (1, top, ME, MARKED)
    assert not belongs_to_run(2, facts=Table(rows), uid=ME)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_real_marked_child_is_found_and_an_unmarked_one_is_not() -> None:
    for env, expected in (({"AGENTCALL_RUN_ID": "ab"}, True), ({}, False)):
        child = subprocess.Popen(
            [sys.executable, "-I", "-c", "print('up', flush=True); import sys; sys.stdin.read()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", ""), **env},
        )
        try:
            # Once it runs (just after exec the kernel may not have set its environment yet).
            assert child.stdout is not None and child.stdout.readline() == b"up\n"
            # Not as the service: this test's process is the child's parent.
            assert belongs_to_run(child.pid, service_pid=0) is expected
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=60)
