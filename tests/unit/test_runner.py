"""The process runner: real children on the real reactor, and its timers on a Clock.

The real-process tests drive tiny inline scripts and the fake agent
(``tests/fakes/fake_agent.py``), with short timers set in ``AgentRun``; they wait on the
result Deferred, never on time.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar, cast

import attrs
import pytest
import pytest_twisted  # type: ignore[import-untyped,unused-ignore]
from twisted.internet import error
from twisted.internet import reactor as _reactor
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.listener.agents.claude import ClaudeParser
from agentcall.listener.runner import (
    RUN_ID_ENV,
    TRAMPOLINE,
    AgentProcess,
    AgentRun,
    RunHandle,
    RunResult,
    run_agent,
    session_argv,
    sweep_marked,
    trusted_setsid,
)

reactor: Any = _reactor
F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, None]])
FAKE_AGENT = Path(__file__).resolve().parent.parent / "fakes" / "fake_agent.py"


def twisted_test(f: F) -> F:
    """Run an async test on the reactor (pytest-twisted is untyped)."""
    result: F = pytest_twisted.ensureDeferred(f)
    return result


# --- helpers --------------------------------------------------------------------------------------


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """A directory holding the fake agent as ``claude`` and ``codex``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("claude", "codex"):
        (bin_dir / name).symlink_to(FAKE_AGENT)
    return bin_dir


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def base_env(fake_bin: Path | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    if fake_bin is not None:
        env["PATH"] = f"{fake_bin}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def script_run(code: str, cwd: Path, **kw: Any) -> AgentRun:
    kw.setdefault("timeout_s", 10.0)
    kw.setdefault("stdin", b"")
    return AgentRun(argv=(sys.executable, "-c", code), cwd=str(cwd), env=base_env(), **kw)


def claude_argv(fake_bin: Path) -> tuple[str, ...]:
    return (
        str(fake_bin / "claude"),
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--permission-mode",
        "dontAsk",
    )


def codex_argv(fake_bin: Path, workdir: Path) -> tuple[str, ...]:
    return (str(fake_bin / "codex"), "exec", "--json", "--skip-git-repo-check", "-C", str(workdir))


def fake_run(
    argv: tuple[str, ...], fake_bin: Path, workdir: Path, scenario: object, log: Path, **kw: Any
) -> AgentRun:
    kw.setdefault("timeout_s", 10.0)
    env = base_env(fake_bin, FAKE_AGENT_SCENARIO=json.dumps(scenario), FAKE_AGENT_LOG=str(log))
    prompt = b"You are a test agent.\n<<CALLER-MESSAGE>>\nWhat do the notes say?\n"
    return AgentRun(argv=argv, cwd=str(workdir), env=env, stdin=prompt, **kw)


def logged(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def children(log: Path) -> list[int]:
    return [pid for entry in logged(log) for pid in entry.get("children", [])]


def gone(pid: int, within_s: float = 60.0) -> bool:
    """True once the process has exited (waiting for that event at most ``within_s``).

    A killed process closes its pipes a moment before it turns into a zombie, so a run may
    finish just before a swept grandchild is seen to have exited; a pidfd reports the exit.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], within_s)
        return bool(readable)
    finally:
        os.close(fd)


class StopOnLine:
    """A parser that stops the run (as a cancel does) once a stdout line contains ``marker``.

    Tests that need the child to have reached some point before it is stopped wait for the
    child to say so, instead of betting on a timer that a loaded machine could beat.
    """

    done = False

    def __init__(self, marker: bytes) -> None:
        self._marker = marker
        self.handle: RunHandle | None = None

    def feed_line(self, line: bytes) -> None:
        if self._marker in line and self.handle is not None:
            self.handle.cancel()


async def run_until_line(run: AgentRun, marker: bytes) -> RunResult:
    parser = StopOnLine(marker)
    d, parser.handle = run_agent(reactor, run, parser)
    return await d


needs_proc = pytest.mark.skipif(
    not os.path.isdir("/proc") or not hasattr(os, "pidfd_open"),
    reason="the sweep needs /proc (Linux)",
)


# --- real processes -------------------------------------------------------------------------------


@pytest.mark.slow
@twisted_test
async def test_normal_exit_reports_code_and_output(workdir: Path) -> None:
    """A child that prints and exits non-zero: its code, stdout and stderr come back whole."""
    code = "import sys; print('out'); print('warn', file=sys.stderr); sys.exit(3)"
    d, _ = run_agent(reactor, script_run(code, workdir))
    result: RunResult = await d
    assert (result.exit_code, result.signal) == (3, None)
    assert result.stdout == b"out\n"
    assert result.stderr == b"warn\n"
    assert not (result.timed_out or result.cancelled or result.early_finish)
    assert not (result.stdout_truncated or result.stderr_truncated)


@pytest.mark.slow
@twisted_test
async def test_prompt_is_written_to_stdin_and_closed(workdir: Path) -> None:
    """A child reading stdin to EOF finishes: the prompt arrives whole and stdin is closed."""
    prompt = ("line one\n" + "é" * 100_000).encode()
    code = "import sys; data = sys.stdin.buffer.read(); sys.stdout.buffer.write(data[::-1])"
    d, _ = run_agent(reactor, script_run(code, workdir, stdin=prompt))
    result = await d
    assert result.exit_code == 0
    assert result.stdout == prompt[::-1]


@pytest.mark.slow
@twisted_test
async def test_child_leads_its_own_session_and_carries_the_marker(workdir: Path) -> None:
    """The pid the handle reports is the agent's, and it leads a new session and group."""
    code = (
        "import json, os; print(json.dumps([os.getpid(), os.getpgid(0), os.getsid(0), "
        f"os.environ.get({RUN_ID_ENV!r}), os.getcwd()]))"
    )
    d, handle = run_agent(reactor, script_run(code, workdir))
    result = await d
    pid, pgid, sid, marker, cwd = json.loads(result.stdout)
    assert pid == pgid == sid == handle.pid
    assert sid != os.getsid(0)
    assert marker == handle.run_id
    assert cwd == str(workdir)


@pytest.mark.slow
@twisted_test
async def test_kill_timer_terminates_a_hanging_child(workdir: Path) -> None:
    """A child that never answers gets SIGTERM when timeout_s runs out."""
    run = script_run("import time; time.sleep(60)", workdir, timeout_s=0.5)
    result = await run_agent(reactor, run)[0]
    assert result.timed_out
    assert result.signal == signal.SIGTERM
    # Not before the timer; long before the child's own 60 s.
    assert 0.4 < result.duration_s < 45


@pytest.mark.slow
@twisted_test
async def test_child_ignoring_sigterm_is_sigkilled_after_the_grace(
    fake_bin: Path, workdir: Path, tmp_path: Path
) -> None:
    """The fake agent traps SIGTERM and keeps printing; SIGKILL follows kill_grace_s later.

    The stop comes once the fake says it has its trap (its first line), not on a timer that a
    loaded machine could beat; a stop and the kill timer end a run the same way.
    """
    run = fake_run(
        claude_argv(fake_bin),
        fake_bin,
        workdir,
        {"name": "ignore_term"},
        tmp_path / "log",
        timeout_s=300,
        kill_grace_s=0.3,
    )
    result = await run_until_line(run, b"still thinking")
    assert result.cancelled and not result.timed_out
    assert result.signal == signal.SIGKILL
    assert b"still thinking" in result.stdout


@pytest.mark.slow
@needs_proc
@twisted_test
async def test_detached_grandchildren_are_swept(
    fake_bin: Path, workdir: Path, tmp_path: Path
) -> None:
    """Children in their own session holding stdout are killed; the run ends at once."""
    log = tmp_path / "log"
    run = fake_run(claude_argv(fake_bin), fake_bin, workdir, {"name": "orphans"}, log, drain_s=300)
    result = await run_agent(reactor, run)[0]
    pids = children(log)
    assert len(pids) == 2
    assert result.exit_code == 0
    assert b'"type": "result"' in result.stdout
    # The nohup child shares the group and may die by the group kill before the sweep looks.
    assert result.swept_pids >= 1
    # The sweep ended it, not the 300 s drain.
    assert result.duration_s < 120
    assert all(gone(pid) for pid in pids)


@pytest.mark.slow
@needs_proc
@twisted_test
async def test_unmarked_grandchild_holding_stdout_does_not_hang_the_run(
    fake_bin: Path, workdir: Path, tmp_path: Path
) -> None:
    """A grandchild that escaped the sweep keeps stdout open; the result still fires."""
    log = tmp_path / "log"
    scenario = {"name": "orphans", "scrub_env": True, "seconds": 600}
    run = fake_run(claude_argv(fake_bin), fake_bin, workdir, scenario, log, drain_s=0.3)
    try:
        result = await run_agent(reactor, run)[0]
        (pid,) = children(log)
        assert not gone(pid, within_s=0)
        assert result.exit_code == 0
        assert b'"type": "result"' in result.stdout
        # The drain gave up on the pipe; the grandchild holds it for 600 s.
        assert result.duration_s < 120
    finally:
        for pid in children(log):
            if not gone(pid, within_s=0):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@needs_proc
@twisted_test
async def test_wrapper_and_worker_die_together_on_a_stop(
    fake_bin: Path, workdir: Path, tmp_path: Path
) -> None:
    """A wrapper whose worker does the writing: the group kill ends both.

    The stop comes once the worker writes (so it surely exists), not on a timer.
    """
    log = tmp_path / "log"
    argv = (*codex_argv(fake_bin, workdir), "-")
    run = fake_run(argv, fake_bin, workdir, {"name": "wrapper"}, log, timeout_s=300, drain_s=5)
    result = await run_until_line(run, b"worker busy")
    (worker,) = children(log)
    assert result.cancelled
    assert b"worker busy" in result.stdout
    assert gone(worker)


@pytest.mark.slow
@needs_proc
@twisted_test
async def test_worker_left_behind_by_an_exited_wrapper_is_swept(
    fake_bin: Path, workdir: Path, tmp_path: Path
) -> None:
    """The wrapper exits at once leaving a worker in another session: the sweep ends it."""
    log = tmp_path / "log"
    argv = (*codex_argv(fake_bin, workdir), "-")
    scenario = {"name": "wrapper", "detach": True}
    run = fake_run(argv, fake_bin, workdir, scenario, log, drain_s=5)
    result = await run_agent(reactor, run)[0]
    (worker,) = children(log)
    assert result.exit_code == 0
    assert not result.timed_out
    assert result.swept_pids >= 1
    assert gone(worker)


@pytest.mark.slow
@twisted_test
async def test_stdout_beyond_the_cap_is_drained_not_stored(workdir: Path) -> None:
    """Twelve MiB of stdout: the first 10 MiB are kept, the child is never blocked."""
    code = "import sys\nfor _ in range(12 * 16): sys.stdout.buffer.write(b'x' * 65536)\n"
    result = await run_agent(reactor, script_run(code, workdir))[0]
    assert result.exit_code == 0
    assert not result.timed_out
    assert len(result.stdout) == limits.MAX_STDOUT_BYTES
    assert result.stdout_truncated


@pytest.mark.slow
@twisted_test
async def test_stderr_keeps_its_tail(workdir: Path) -> None:
    """Three MiB of stderr then an exit: the last MiB is kept, ending with the final line."""
    code = (
        "import sys\n"
        "for i in range(3 * 1024): sys.stderr.write(f'{i:06d}' + '.' * 1017 + chr(10))\n"
        "sys.stderr.write('END' + chr(10))\n"
    )
    result = await run_agent(reactor, script_run(code, workdir))[0]
    assert result.exit_code == 0
    assert len(result.stderr) == limits.MAX_STDERR_BYTES
    assert result.stderr_truncated
    assert result.stderr.endswith(b"END\n")


@pytest.mark.slow
@twisted_test
async def test_a_stderr_flood_is_capped(fake_bin: Path, workdir: Path, tmp_path: Path) -> None:
    """An agent flooding stderr (2 MB here) keeps only stderr_cap bytes of it, and answers."""
    argv = (*codex_argv(fake_bin, workdir), "-")
    scenario = {"name": "endless_stderr", "bytes": 2_000_000}
    run = fake_run(argv, fake_bin, workdir, scenario, tmp_path / "log", timeout_s=300)
    run = attrs.evolve(run, stderr_cap=4096)
    result = await run_agent(reactor, run)[0]
    assert result.exit_code == 0 and not result.timed_out
    assert len(result.stderr) == 4096
    assert result.stderr_truncated


@pytest.mark.slow
@twisted_test
async def test_early_finish_after_the_parser_is_done(
    fake_bin: Path, workdir: Path, tmp_path: Path
) -> None:
    """Claude prints its result then lingers: the run ends finish_grace_s after the result."""
    scenario = {"name": "linger", "seconds": 30}
    run = fake_run(
        claude_argv(fake_bin), fake_bin, workdir, scenario, tmp_path / "log", finish_grace_s=0.2
    )
    parser = ClaudeParser()
    result = await run_agent(reactor, run, parser)[0]
    assert result.early_finish
    assert not result.timed_out
    assert result.exit_code == 143
    assert parser.results_seen == 1
    assert result.duration_s < 10


@pytest.mark.slow
@twisted_test
async def test_cancel_ends_a_running_child(workdir: Path) -> None:
    """cancel() once the child is running: SIGTERM, and the result says cancelled."""
    code = "import time; print('ready', flush=True); time.sleep(60)"
    handles: list[RunHandle] = []

    class CancelOnFirstLine:
        done = False

        def feed_line(self, line: bytes) -> None:
            handles[0].cancel()

    d, handle = run_agent(reactor, script_run(code, workdir), CancelOnFirstLine())
    handles.append(handle)
    result = await d
    assert result.cancelled
    assert not result.timed_out
    assert result.signal == signal.SIGTERM


@pytest.mark.slow
@twisted_test
async def test_logs_carry_sizes_and_ids_never_text(workdir: Path) -> None:
    """Run events are structured; neither the prompt nor any output appears in them."""
    code = (
        "import sys; sys.stdin.read(); print('ANSWER-TEXT-77'); "
        "print('ERR-TEXT-88', file=sys.stderr)"
    )
    with capturedLogs() as captured:
        result = await run_agent(reactor, script_run(code, workdir, stdin=b"PROMPT-TEXT-66"))[0]
        events = [e for e in captured if e.get("log_namespace") == "agentcall.listener.runner"]
    names = [e["event"] for e in events]
    assert names[0] == "agent_spawned" and names[-1] == "agent_run_finished"
    assert "agent_exited" in names
    finished = events[-1]
    assert (finished["stdout_bytes"], finished["exit_code"]) == (len(result.stdout), 0)
    text = repr(events) + "".join(formatEvent(e) for e in events)
    for secret in ("PROMPT-TEXT-66", "ANSWER-TEXT-77", "ERR-TEXT-88"):
        assert secret not in text


@pytest.mark.slow
@twisted_test
async def test_missing_binary_exits_127(workdir: Path) -> None:
    """An agent binary that does not exist: exit 127 with a short reason on stderr (the
    trampoline's words, or setsid(1)'s, which name the program)."""
    run = AgentRun(
        argv=(str(workdir / "no-such-agent"),),
        cwd=str(workdir),
        env=base_env(),
        stdin=b"x",
        timeout_s=10,
    )
    result = await run_agent(reactor, run)[0]
    assert result.exit_code == 127
    assert b"cannot execute the agent" in result.stderr or (
        b"no-such-agent" in result.stderr and b"setsid" in result.stderr
    )


@pytest.mark.slow
@twisted_test
async def test_a_failing_parser_does_not_break_the_run(workdir: Path) -> None:
    """A parser that raises is dropped; the run still completes with all of stdout."""

    class Broken:
        done = False

        def feed_line(self, line: bytes) -> None:
            raise RuntimeError("parser bug")

    result = await run_agent(reactor, script_run("print('a'); print('b')", workdir), Broken())[0]
    assert result.exit_code == 0
    assert result.stdout == b"a\nb\n"


@pytest.mark.slow
@needs_proc
def test_sweep_kills_only_marked_processes() -> None:
    """sweep_marked SIGKILLs a process carrying the marker and leaves an unmarked one."""
    marker = f"{RUN_ID_ENV}=sweep-test-{os.getpid()}"
    marked = subprocess.Popen(["sleep", "30"], env={**os.environ, RUN_ID_ENV: marker.split("=")[1]})
    unmarked = subprocess.Popen(["sleep", "30"])
    try:
        killed = sweep_marked(marker)
        assert killed == {marked.pid}
        assert marked.wait(timeout=5) == -signal.SIGKILL
        assert unmarked.poll() is None
    finally:
        for proc in (marked, unmarked):
            proc.kill()
            proc.wait()


# --- timers on a Clock ----------------------------------------------------------------------------


class FakeTransport:
    """What AgentProcess uses of a process transport, recording every call."""

    def __init__(self, pid: int = 4242) -> None:
        self.pid = pid
        self.written = b""
        self.calls: list[str] = []
        self.signals: list[int] = []

    def write(self, data: bytes) -> None:
        self.written += data

    def closeStdin(self) -> None:
        self.calls.append("closeStdin")

    def signalProcess(self, sig: int) -> None:
        self.signals.append(sig)

    def loseConnection(self) -> None:
        self.calls.append("loseConnection")


class Rig:
    """An AgentProcess on a Clock with a fake transport, group signaller and sweep."""

    def __init__(self, parser: Any = None, group_exists: bool = True, **run: Any) -> None:
        run.setdefault("timeout_s", 10.0)
        run.setdefault("kill_grace_s", 3.0)
        self.clock = Clock()
        self.group: list[tuple[int, int]] = []
        self.sweeps: list[str] = []
        self.group_exists = group_exists
        self.transport = FakeTransport()
        self.results: list[RunResult] = []
        agent_run = AgentRun(argv=("agent",), cwd="/", env={}, stdin=b"prompt", **run)
        self.proto = AgentProcess(
            self.clock, agent_run, parser, "run-1", self._signal_group, self._sweep
        )
        self.proto.result.addCallback(self.results.append)
        self.proto.makeConnection(cast(Any, self.transport))

    def _signal_group(self, pgid: int, sig: int) -> bool:
        self.group.append((pgid, sig))
        return self.group_exists

    def _sweep(self, marker: str) -> set[int]:
        self.sweeps.append(marker)
        return {99} if len(self.sweeps) == 1 else set()

    def exit(self, code: int | None = 0, sig: int | None = None) -> None:
        if code == 0 and sig is None:
            self.proto.processExited(Failure(error.ProcessDone(0)))
        else:
            self.proto.processExited(Failure(error.ProcessTerminated(code, sig)))

    def end(self) -> None:
        self.proto.processEnded(Failure(error.ProcessDone(0)))

    @property
    def sent(self) -> list[int]:
        return [sig for _, sig in self.group]


class LineDone:
    """A parser that is done once it has seen the line ``DONE``."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    @property
    def done(self) -> bool:
        return b"DONE" in self.lines

    def feed_line(self, line: bytes) -> None:
        self.lines.append(line)


def test_prompt_written_then_stdin_closed() -> None:
    """On connection the prompt is written and stdin closed straight away."""
    rig = Rig()
    assert rig.transport.written == b"prompt"
    assert rig.transport.calls == ["closeStdin"]


def test_term_then_kill_on_the_clock() -> None:
    """At timeout_s: SIGTERM to the group; kill_grace_s later: SIGKILL; exit fires timed_out."""
    rig = Rig(timeout_s=5.0, kill_grace_s=2.0)
    rig.clock.advance(4.9)
    assert rig.sent == []
    rig.clock.advance(0.1)
    assert rig.sent == [signal.SIGTERM]
    rig.clock.advance(1.9)
    assert rig.sent == [signal.SIGTERM]
    rig.clock.advance(0.1)
    assert rig.sent == [signal.SIGTERM, signal.SIGKILL]
    rig.exit(None, signal.SIGKILL)
    rig.end()
    (result,) = rig.results
    assert result.timed_out and result.signal == signal.SIGKILL
    assert result.duration_s == pytest.approx(7.0)
    assert all(pgid == 4242 for pgid, _ in rig.group)


def test_exit_within_the_grace_cancels_the_sigkill() -> None:
    """A child that obeys SIGTERM gets no SIGKILL later; leftovers in its group do, once."""
    rig = Rig(timeout_s=1.0, kill_grace_s=2.0)
    rig.clock.advance(1.0)
    rig.exit(None, signal.SIGTERM)
    rig.end()
    rig.clock.advance(100)
    assert rig.sent == [signal.SIGTERM, signal.SIGKILL]
    assert rig.results[0].swept_pids == 1
    assert not rig.clock.getDelayedCalls()


def test_one_sweep_after_the_exit_and_none_more_before_the_answer() -> None:
    """The exit's sweep kills every marked process; the end of the output scans no more."""
    rig = Rig()
    rig.exit(0)
    assert len(rig.sweeps) == 1
    rig.end()
    assert len(rig.sweeps) == 1
    assert rig.results[0].swept_pids == 1


def test_output_that_ends_without_an_exit_is_swept_at_the_end() -> None:
    """Pipes abandoned while the process never reported its exit: the end sweeps."""
    rig = Rig(timeout_s=1.0, kill_grace_s=1.0)
    for _ in range(3):  # SIGTERM, SIGKILL, then abandoned: a sweep there and one at the end
        rig.clock.advance(1.0)
    assert rig.sent == [signal.SIGTERM, signal.SIGKILL]
    assert len(rig.sweeps) == 2
    assert rig.results[0].swept_pids == 1


def test_no_group_yet_falls_back_to_the_process() -> None:
    """Before the trampoline's setsid() there is no group: the process itself is signalled."""
    rig = Rig(group_exists=False)
    rig.proto.cancel()
    assert rig.transport.signals == [signal.SIGTERM]


def test_parser_done_starts_the_finish_grace() -> None:
    """Once the parser is done, the group is terminated finish_grace_s later: early_finish."""
    rig = Rig(parser=LineDone(), finish_grace_s=2.0)
    rig.proto.childDataReceived(1, b"partial")
    rig.proto.childDataReceived(1, b" line\nDONE\nafter")
    rig.clock.advance(1.9)
    assert rig.sent == []
    rig.clock.advance(0.1)
    assert rig.sent == [signal.SIGTERM]
    rig.exit(143)
    rig.end()
    (result,) = rig.results
    assert result.early_finish and not result.timed_out
    assert result.stdout == b"partial line\nDONE\nafter"


def test_deadline_after_the_answer_counts_as_early_finish() -> None:
    """If the kill timer fires while a finished agent lingers, it is not a timeout."""
    rig = Rig(parser=LineDone(), timeout_s=1.0, finish_grace_s=5.0)
    rig.proto.childDataReceived(1, b"DONE\n")
    rig.clock.advance(1.0)
    rig.exit(143)
    rig.end()
    assert rig.results[0].early_finish and not rig.results[0].timed_out


def test_last_line_without_newline_reaches_the_parser() -> None:
    """The final unterminated line is fed at the end (a plain answer, or a killed writer)."""
    parser = LineDone()
    rig = Rig(parser=parser)
    rig.proto.childDataReceived(1, b"one\ntwo")
    rig.exit()
    rig.end()
    assert parser.lines == [b"one", b"two"]


def test_pipes_held_open_are_abandoned_after_the_drain() -> None:
    """Exit without pipe close: drain_s later the pipes are dropped and the result fires."""
    rig = Rig(drain_s=0.5)
    rig.proto.childDataReceived(1, b"answer")
    rig.exit()
    rig.clock.advance(0.4)
    assert rig.results == []
    rig.clock.advance(0.1)
    assert rig.transport.calls[-1] == "loseConnection"
    assert rig.results[0].stdout == b"answer"
    rig.end()
    assert len(rig.results) == 1


def test_unkillable_child_does_not_hold_the_result_forever() -> None:
    """No exit even after SIGKILL: one more grace, then the result fires without a code."""
    rig = Rig(timeout_s=1.0, kill_grace_s=2.0)
    for step in (1.0, 2.0, 1.9):
        rig.clock.advance(step)
    assert rig.results == []
    rig.clock.advance(0.1)
    (result,) = rig.results
    assert result.timed_out and result.exit_code is None
    assert "loseConnection" in rig.transport.calls


def test_caps_on_the_clock() -> None:
    """stdout keeps its head up to stdout_cap; stderr keeps its tail up to stderr_cap."""
    rig = Rig(stdout_cap=5, stderr_cap=4)
    rig.proto.childDataReceived(1, b"abc")
    rig.proto.childDataReceived(1, b"defg")
    rig.proto.childDataReceived(1, b"hij")
    rig.proto.childDataReceived(2, b"12345")
    rig.proto.childDataReceived(2, b"67")
    rig.exit()
    rig.end()
    result = rig.results[0]
    assert (result.stdout, result.stdout_truncated) == (b"abcde", True)
    assert (result.stderr, result.stderr_truncated) == (b"4567", True)


# --- how a run gets its own session: setsid(1) when trusted, else the trampoline ----------------


def _executable(path: Path, mode: int = 0o755) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def test_a_trusted_setsid_is_found(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    good = _executable(tmp_path / "setsid")
    missing = str(tmp_path / "absent")
    assert trusted_setsid([missing, str(good)], owner_uid=os.getuid()) == str(good)


@pytest.mark.parametrize(
    "problem",
    ["group-writable", "other-writable", "not-executable", "directory", "other-owner", "dir-open"],
)
def test_an_untrusted_setsid_is_not_used(tmp_path: Path, problem: str) -> None:
    tmp_path.chmod(0o777 if problem == "dir-open" else 0o755)
    path = tmp_path / "setsid"
    owner = os.getuid()
    if problem == "directory":
        path.mkdir()
    else:
        mode = {"group-writable": 0o775, "other-writable": 0o757, "not-executable": 0o644}
        _executable(path, mode.get(problem, 0o755))
    if problem == "other-owner":
        owner += 1
    assert trusted_setsid([str(path)], owner_uid=owner) is None


def test_the_run_is_spawned_through_setsid_when_there_is_one() -> None:
    argv = session_argv(["/usr/bin/agent", "-p"], find_setsid=lambda: "/usr/bin/setsid")
    assert argv == ["/usr/bin/setsid", "--", "/usr/bin/agent", "-p"]


def test_without_setsid_the_trampoline_starts_the_run() -> None:
    argv = session_argv(["/usr/bin/agent", "-p"], find_setsid=lambda: None)
    assert argv == [sys.executable, "-I", "-S", "-c", TRAMPOLINE, "/usr/bin/agent", "-p"]


class SpawnRecorder(Clock):
    """A reactor that records what it was asked to spawn and starts nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[tuple[str, list[str]]] = []

    def spawnProcess(self, _proto: object, executable: str, args: list[str], **_kw: Any) -> None:
        self.spawned.append((executable, list(args)))


def test_a_confined_run_is_spawned_through_the_wrapper_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The confinement wrapper leads the run's session itself: no setsid(1) in front of it."""
    from agentcall.confine import prepare
    from agentcall.confine.rules import Confinement
    from agentcall.listener import runner

    monkeypatch.setattr(runner, "_system_setsid", lambda: "/opt/test/setsid")
    recorder = SpawnRecorder()
    conf = Confinement((str(tmp_path),), (), str(tmp_path))
    run_agent(
        recorder,
        AgentRun(argv=("/bin/agent",), cwd="/", env={}, stdin=b"", timeout_s=5, confine=conf),
    )
    ((executable, args),) = recorder.spawned
    prepare.cleanup(os.path.dirname(args[-2]))  # the run never ends here: its temp dir goes now
    assert executable == args[0] == os.path.abspath(sys.executable)
    assert args[1:5] == ["-I", "-S", "-c", prepare.BOOT]
    assert args[-1] == "/bin/agent"
    assert "/opt/test/setsid" not in args


def test_run_agent_spawns_what_session_argv_says(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentcall.listener import runner

    monkeypatch.setattr(runner, "_system_setsid", lambda: "/opt/test/setsid")
    recorder = SpawnRecorder()
    run_agent(recorder, AgentRun(argv=("/bin/agent",), cwd="/", env={}, stdin=b"", timeout_s=5))
    assert recorder.spawned == [("/opt/test/setsid", ["/opt/test/setsid", "--", "/bin/agent"])]
    monkeypatch.setattr(runner, "_system_setsid", lambda: None)
    run_agent(recorder, AgentRun(argv=("/bin/agent",), cwd="/", env={}, stdin=b"", timeout_s=5))
    assert recorder.spawned[1] == (sys.executable, session_argv(["/bin/agent"], lambda: None))
