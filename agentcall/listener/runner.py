"""The one process runner: spawn an agent, feed it the prompt, read it, and always end it.

Every run gets its own session and process group, a kill timer (SIGTERM to the group, SIGKILL
``kill_grace_s`` later), capped reads of stdout and stderr that never stop draining, and a
sweep of escaped descendants once the main process has exited.

Descendants that leave the group (the agents' Bash tools call ``setsid``; a wrapper may spawn
its worker in another session) are found by a random marker in their environment,
``AGENTCALL_RUN_ID``, which every process of the run inherits. On Linux the sweep reads
``/proc/<pid>/environ`` of same-uid processes and SIGKILLs the marked ones. On systems without
``/proc`` (macOS) only the group kill applies, and a process that both left the group and
survived it is not found. A process that exec'd with a scrubbed environment escapes either way;
the result still fires (after a bounded drain of the pipes), it just outlives the run.

Exit detection relies on the reactor's SIGCHLD handling (the default for ``twistd`` and
``reactor.run()``): the result fires on the main process's exit plus at most ``drain_s``
of reading, so a grandchild holding the pipes open cannot hold the answer back.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import secrets
import signal
import stat
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import attrs
from twisted.internet import defer, error
from twisted.internet.interfaces import IDelayedCall, IProcessTransport, IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.confine.rules import Confinement
from agentcall.logevents import Logger

_log = Logger(namespace="agentcall.listener.runner")

RUN_ID_ENV = "AGENTCALL_RUN_ID"
# Twisted's spawnProcess cannot call setsid() in the child, so a small program does it and
# then execs the agent in place: setsid(1) where the system has a trusted one (below), else
# this tiny interpreter: the pid Twisted reports is the agent's pid and the group id.
# -I -S: no site, no user site, no PYTHON* variables, so nothing of the owner's Python setup
# runs before the exec.
TRAMPOLINE = (
    "import os,sys\n"
    "os.setsid()\n"
    "try:\n"
    " os.execvp(sys.argv[1],sys.argv[1:])\n"
    "except OSError as e:\n"
    " sys.stderr.write('agentcall: cannot execute the agent: %s\\n' % (e.strerror,))\n"
    " os._exit(127)\n"
)
# util-linux's (and BusyBox's) setsid(1) does the trampoline's work as a small C program: a
# process that does not lead a process group (a child of the listener never does) calls
# setsid() and execs the agent in place, so the pid is still the agent's. Starting it costs
# about a millisecond where the interpreter costs ten, on every call. Only a root-owned copy
# in a system directory that nobody else may write is used; elsewhere (macOS) the trampoline.
SETSID_PATHS = ("/usr/bin/setsid", "/bin/setsid")
_SWEEP_PASSES = 5


def trusted_setsid(paths: Iterable[str] = SETSID_PATHS, owner_uid: int = 0) -> str | None:
    """The first of ``paths`` that is an executable regular file owned by ``owner_uid``, in a
    directory owned by it, neither writable by group or others; None when there is none."""
    for path in paths:
        try:
            st = os.stat(path)
            parent = os.stat(os.path.dirname(path))
        except OSError:
            continue
        if (
            stat.S_ISREG(st.st_mode)
            and st.st_mode & 0o111
            and st.st_uid == owner_uid
            and parent.st_uid == owner_uid
            and not (st.st_mode | parent.st_mode) & 0o022
        ):
            return path
    return None


@functools.cache
def _system_setsid() -> str | None:
    return trusted_setsid()


def session_argv(
    argv: Iterable[str], find_setsid: Callable[[], str | None] | None = None
) -> list[str]:
    """What to spawn so that ``argv`` runs as the leader of a new session and process group,
    with the pid Twisted reports: setsid(1) where a trusted one exists, else the trampoline."""
    setsid = (find_setsid or _system_setsid)()
    if setsid is not None:
        # "--": an agent path that starts with "-" is still the program, not an option.
        return [setsid, "--", *argv]
    return [sys.executable, "-I", "-S", "-c", TRAMPOLINE, *argv]


class OutputParser(Protocol):
    """Reads stdout line by line; ``done`` means the answer is complete (e.g. a result line)."""

    def feed_line(self, line: bytes) -> None: ...

    @property
    def done(self) -> bool: ...


def _frozen_env(value: Mapping[str, str]) -> Mapping[str, str]:
    return dict(value)


def _to_argv(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class AgentRun:
    """One process to run: argv, cwd, the whole environment, stdin and its time and size caps."""

    argv: tuple[str, ...] = attrs.field(converter=_to_argv)
    cwd: str
    env: Mapping[str, str] = attrs.field(converter=_frozen_env, hash=False)
    stdin: bytes
    timeout_s: float
    kill_grace_s: float = limits.KILL_GRACE_S
    stdout_cap: int = limits.MAX_STDOUT_BYTES
    stderr_cap: int = limits.MAX_STDERR_BYTES
    finish_grace_s: float = 2.0
    # After the main process exits, read the pipes at most this long before giving up on them.
    drain_s: float = 0.5
    # The kernel boundary (Landlock) to apply in the child before the exec; None: none.
    confine: Confinement | None = None

    def __attrs_post_init__(self) -> None:
        if not self.argv:
            raise ValueError("argv must not be empty")
        for name in ("timeout_s", "kill_grace_s", "finish_grace_s", "drain_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must not be negative")
        if self.stdout_cap < 0 or self.stderr_cap < 0:
            raise ValueError("caps must not be negative")


@attrs.frozen
class RunResult:
    """How a run ended. ``stdout`` is the first ``stdout_cap`` bytes, ``stderr`` the last."""

    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    cancelled: bool
    early_finish: bool
    duration_s: float
    swept_pids: int


class StopReason(enum.Enum):
    """Why the runner ended a run itself (the first reason wins)."""

    TIMEOUT = "timeout"
    EARLY_FINISH = "early_finish"
    CANCELLED = "cancelled"


def kill_group(pgid: int, sig: int) -> bool:
    """Signal a whole process group; False when no such group exists (any more, or yet)."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_marked(marker: str) -> set[int]:
    """SIGKILL every same-uid process whose environment holds ``marker`` (``NAME=value``).

    Linux only: without ``/proc`` nothing is found. A few passes catch a process forked by a
    marked one between the scan and the kill.
    """
    proc = "/proc"
    if not os.path.isdir(proc):
        return set()
    needle = marker.encode()
    uid = os.getuid()
    me = os.getpid()
    killed: set[int] = set()
    for _ in range(_SWEEP_PASSES):
        found = False
        for name in os.listdir(proc):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid == me or pid in killed:
                continue
            try:
                if os.stat(f"{proc}/{name}").st_uid != uid:
                    continue
                with open(f"{proc}/{name}/environ", "rb") as fh:
                    environ = fh.read()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    continue
                killed.add(pid)
                found = True
        if not found:
            break
    return killed


class AgentProcess(ProcessProtocol):
    """The ProcessProtocol of one run; :func:`run_agent` is the way to use it."""

    def __init__(
        self,
        clock: IReactorTime,
        run: AgentRun,
        parser: OutputParser | None,
        run_id: str,
        signal_group: Callable[[int, int], bool] = kill_group,
        sweep: Callable[[str], set[int]] = sweep_marked,
    ) -> None:
        self._clock = clock
        self._run = run
        self._parser = parser
        self.run_id = run_id
        self._signal_group = signal_group
        self._sweep = sweep
        self.result: defer.Deferred[RunResult] = defer.Deferred()
        self.pid: int | None = None
        self._proc: IProcessTransport | None = None
        self._started = clock.seconds()
        self._stdout = bytearray()
        self._stderr = bytearray()
        self._stdout_truncated = False
        self._stderr_truncated = False
        self._line = bytearray()
        self._parser_failed = False
        self._stop: StopReason | None = None
        self._exited = False
        self._fired = False
        self._exit_code: int | None = None
        self._signal: int | None = None
        self._swept: set[int] = set()
        self._swept_after_exit = False
        self._timers: dict[str, IDelayedCall] = {}

    # --- timers -----------------------------------------------------------------------------

    def _later(self, name: str, delay: float, fn: Callable[[], None]) -> None:
        self._cancel_timer(name)
        self._timers[name] = self._clock.callLater(delay, self._fire_timer, name, fn)

    def _fire_timer(self, name: str, fn: Callable[[], None]) -> None:
        self._timers.pop(name, None)
        fn()

    def _cancel_timer(self, name: str) -> None:
        call = self._timers.pop(name, None)
        if call is not None and call.active():
            call.cancel()

    def _cancel_timers(self) -> None:
        for name in list(self._timers):
            self._cancel_timer(name)

    # --- ProcessProtocol --------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._proc = self.transport
        self.pid = getattr(self.transport, "pid", None)
        _log.debug(
            "agent_spawned",
            run_id=self.run_id,
            pid=self.pid,
            program=os.path.basename(self._run.argv[0]),
            argc=len(self._run.argv),
            stdin_bytes=len(self._run.stdin),
        )
        if self._proc is not None:
            if self._run.stdin:
                self._proc.write(self._run.stdin)
            # Codex blocks until stdin reaches EOF; nothing else is ever written.
            self._proc.closeStdin()
        self._later("deadline", self._run.timeout_s, self._deadline)

    def outReceived(self, data: bytes) -> None:
        if self._fired:
            return
        room = self._run.stdout_cap - len(self._stdout)
        if len(data) > room:
            self._stdout_truncated = True
            data = data[: max(room, 0)]
        if not data:
            return
        self._stdout += data
        self._split_lines(data)

    def errReceived(self, data: bytes) -> None:
        if self._fired:
            return
        self._stderr += data
        excess = len(self._stderr) - self._run.stderr_cap
        if excess > 0:
            # Keep the tail: the last lines say why an agent failed.
            del self._stderr[:excess]
            self._stderr_truncated = True

    def processExited(self, reason: Failure) -> None:
        self._exited = True
        value = reason.value
        if isinstance(value, error.ProcessTerminated):
            self._exit_code = value.exitCode
            self._signal = value.signal
        elif isinstance(value, error.ProcessDone):
            self._exit_code = 0
        self._cancel_timers()
        if self.pid is not None:
            # Whatever is left in the group is an orphan of this one-shot run. The group id
            # cannot have been reused yet: this runs in the same reactor turn as the reap.
            self._signal_group(self.pid, signal.SIGKILL)
        self._do_sweep()
        self._swept_after_exit = True
        _log.debug(
            "agent_exited",
            run_id=self.run_id,
            exit_code=self._exit_code,
            signal=self._signal,
            stop=None if self._stop is None else self._stop.value,
        )
        if not self._fired:
            self._later("drain", self._run.drain_s, self._abandon_pipes)

    def processEnded(self, reason: Failure) -> None:
        if not self._exited:
            self.processExited(reason)
        self._finish()

    # --- stopping ---------------------------------------------------------------------------

    def cancel(self) -> None:
        """End the run now (listener shutdown, or the caller cancelled)."""
        self._terminate(StopReason.CANCELLED)

    def _deadline(self) -> None:
        # An agent that already answered and is lingering is finishing, not timing out.
        parser_done = self._parser is not None and self._safe_done()
        self._terminate(StopReason.EARLY_FINISH if parser_done else StopReason.TIMEOUT)

    def _terminate(self, reason: StopReason) -> None:
        if self._exited or self._stop is not None:
            return
        self._stop = reason
        self._cancel_timer("deadline")
        self._cancel_timer("finish")
        _log.info("agent_stopping", run_id=self.run_id, reason=reason.value)
        self._send(signal.SIGTERM)
        self._later("kill", self._run.kill_grace_s, self._kill)

    def _kill(self) -> None:
        if self._exited:
            return
        self._send(signal.SIGKILL)
        # SIGKILL cannot be ignored, but a process in uninterruptible sleep can take its time;
        # the answer must not wait for it forever.
        self._later("abandon", self._run.kill_grace_s, self._abandon)

    def _send(self, sig: int) -> None:
        if self.pid is None or self._exited:
            return
        _log.info("agent_signal", run_id=self.run_id, signal=sig)
        if not self._signal_group(self.pid, sig) and self._proc is not None:
            # No group yet: the trampoline has not reached setsid(). Signal the process alone.
            with contextlib.suppress(error.ProcessExitedAlready):
                self._proc.signalProcess(sig)

    def _abandon(self) -> None:
        _log.warn("agent_unkillable", run_id=self.run_id, pid=self.pid)
        self._do_sweep()
        self._abandon_pipes()

    def _abandon_pipes(self) -> None:
        if self._fired:
            return
        _log.info("agent_pipes_abandoned", run_id=self.run_id)
        if self._proc is not None:
            self._proc.loseConnection()
        self._finish()

    def _do_sweep(self) -> None:
        try:
            found = self._sweep(f"{RUN_ID_ENV}={self.run_id}")
        except Exception:
            _log.failure("agent_sweep_failed", run_id=self.run_id)
            return
        new = found - self._swept
        if new:
            self._swept |= new
            _log.info("agent_swept", run_id=self.run_id, count=len(new))

    # --- output -----------------------------------------------------------------------------

    def _split_lines(self, data: bytes) -> None:
        if self._parser is None or self._parser_failed:
            return
        start = 0
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                self._line += data[start:]
                return
            self._line += data[start:newline]
            line = bytes(self._line)
            self._line.clear()
            self._feed(line)
            start = newline + 1

    def _feed(self, line: bytes) -> None:
        if self._parser is None or self._parser_failed:
            return
        was_done = self._safe_done()
        try:
            self._parser.feed_line(line)
        except Exception:
            self._parser_broke()
            return
        if not was_done and self._safe_done() and not self._exited and not self._fired:
            _log.debug("agent_answer_seen", run_id=self.run_id)
            early = StopReason.EARLY_FINISH
            self._later("finish", self._run.finish_grace_s, lambda: self._terminate(early))

    def _safe_done(self) -> bool:
        if self._parser is None or self._parser_failed:
            return False
        try:
            return bool(self._parser.done)
        except Exception:
            self._parser_broke()
            return False

    def _parser_broke(self) -> None:
        # A parser bug must not leave the process unread or unkilled: drop the parser.
        self._parser_failed = True
        _log.failure("agent_parser_failed", run_id=self.run_id)

    def _finish(self) -> None:
        if self._fired:
            return
        self._fired = True
        self._cancel_timers()
        if self._line:
            # The last line had no newline (a process killed mid-line, or a plain answer).
            line = bytes(self._line)
            self._line.clear()
            self._feed(line)
        if not self._swept_after_exit:
            # Once the exit's sweep has killed every marked process, no marked one is left to
            # start another (a scan of /proc is a millisecond or more before every answer).
            self._do_sweep()
        result = RunResult(
            exit_code=self._exit_code,
            signal=self._signal,
            stdout=bytes(self._stdout),
            stderr=bytes(self._stderr),
            stdout_truncated=self._stdout_truncated,
            stderr_truncated=self._stderr_truncated,
            timed_out=self._stop is StopReason.TIMEOUT,
            cancelled=self._stop is StopReason.CANCELLED,
            early_finish=self._stop is StopReason.EARLY_FINISH,
            duration_s=self._clock.seconds() - self._started,
            swept_pids=len(self._swept),
        )
        # Sizes and flags only: output text never goes into logs.
        fields = attrs.asdict(result, filter=lambda a, _v: a.name not in ("stdout", "stderr"))
        fields["duration_s"] = round(result.duration_s, 3)
        _log.debug(
            "agent_run_finished",
            run_id=self.run_id,
            stdout_bytes=len(result.stdout),
            stderr_bytes=len(result.stderr),
            **fields,
        )
        self.result.callback(result)


@attrs.define
class RunHandle:
    """Control over a running agent: its ids, and :meth:`cancel`."""

    _process: AgentProcess

    @property
    def run_id(self) -> str:
        return self._process.run_id

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def cancel(self) -> None:
        """SIGTERM the group, SIGKILL it after the grace; the result reports ``cancelled``."""
        self._process.cancel()


def run_agent(
    reactor: Any, run: AgentRun, parser: OutputParser | None = None
) -> tuple[defer.Deferred[RunResult], RunHandle]:
    """Start ``run`` in a new session and process group; the Deferred fires when it has ended.

    ``reactor`` provides ``IReactorProcess`` and ``IReactorTime``. The Deferred never fails
    for anything the child does; an ``OSError`` from spawning itself is raised here.
    """
    run_id = secrets.token_hex(16)
    env = dict(run.env)
    env[RUN_ID_ENV] = run_id
    private_tmp = None
    if run.confine is not None:
        # Imported here: only a confined run pays for it.
        from agentcall.confine import prepare

        prepared = prepare.prepare(run.confine, run.argv, env)
        # The confinement wrapper leads the run's session itself: no setsid(1) in front.
        args, env, private_tmp = list(prepared.argv), prepared.env, prepared.private_tmp
    else:
        args = session_argv(run.argv)
    process = AgentProcess(reactor, run, parser, run_id)
    try:
        reactor.spawnProcess(process, args[0], args, env=env, path=run.cwd)
    except BaseException:
        if private_tmp is not None:
            prepare.cleanup(private_tmp)
        raise
    if private_tmp is not None:
        tmp = private_tmp

        def _cleanup(result: RunResult) -> RunResult:
            prepare.cleanup(tmp)
            return result

        process.result.addCallback(_cleanup)
    return process.result, RunHandle(process)
