"""Installations as a person has them: a HOME each, `agentcall` as a subprocess, and a real
`twistd agentcall-listen` whose agent is the fake `claude`/`codex` from tests/fakes on PATH."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from tests.e2e.processes import BIN, REPO, LogFollower, RelayProcess, child_env, start_relay

FAKE_AGENT = REPO / "tests" / "fakes" / "fake_agent.py"


def fake_bin(directory: Path) -> Path:
    """A directory holding the fake agent as both `claude` and `codex`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("claude", "codex"):
        link = directory / name
        if not link.exists():
            link.symlink_to(FAKE_AGENT)
    return directory


EVENT_WAIT_S = 120.0
POLL_S = 0.05


@attrs.define(frozen=True)
class AgentGate:
    """Where the fake agent stops (scenario option ``hold``): it creates ``started`` once it
    runs and then waits until :meth:`release` writes to the ``release`` FIFO. Tests act on
    these events, never on how long an agent is guessed to take."""

    started: Path
    release_fifo: Path

    @classmethod
    def make(cls, directory: Path) -> AgentGate:
        directory.mkdir(parents=True, exist_ok=True)
        gate = cls(directory / "agent-started", directory / "agent-release.fifo")
        os.mkfifo(gate.release_fifo, 0o600)
        return gate

    def scenario(self) -> dict[str, str]:
        return {"started": str(self.started), "release": str(self.release_fifo)}

    def wait_started(self, timeout: float = EVENT_WAIT_S) -> None:
        # The deadline only bounds a wait for the event; a loaded machine just takes longer.
        deadline = time.monotonic() + timeout
        while not self.started.exists():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the fake agent did not reach its hold within {timeout:g} s")
            time.sleep(POLL_S)

    def release(self) -> bool:
        """Let a held agent go on; False when no agent is waiting (it never came, or died)."""
        try:
            fd = os.open(self.release_fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader has the FIFO open
                return False
            raise
        try:
            os.write(fd, b"go")
        finally:
            os.close(fd)
        return True


@attrs.define
class ListenerProcess:
    process: subprocess.Popen[str]
    log: LogFollower

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return self.process.returncode


@attrs.define
class Install:
    """One person's machine: its own HOME, a fake agent on PATH, scenario and run log files."""

    name: str
    root: Path
    ca_file: str
    listener: ListenerProcess | None = None

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def agent_log(self) -> Path:
        return self.root / "agent-runs.jsonl"

    @property
    def scenario_file(self) -> Path:
        return self.root / "scenario.json"

    @property
    def state_dir(self) -> Path:
        return self.home / ".agentcall"

    def env(self, **extra: str) -> dict[str, str]:
        bin_dir = fake_bin(self.root / "bin")
        # Made up front: the directory holding it also holds HOME, which the kernel boundary
        # opens child by child, so the confined fake agent may write the file, not create it.
        self.agent_log.touch()
        base = child_env()
        for key in [k for k in base if k.startswith(("AGENTCALL_", "FAKE_AGENT_"))]:
            del base[key]
        base.update(
            HOME=str(self.home),
            PATH=os.pathsep.join([str(bin_dir), str(BIN), base.get("PATH", "")]),
            SSL_CERT_FILE=self.ca_file,
            FAKE_AGENT_LOG=str(self.agent_log),
            FAKE_AGENT_SCENARIO_FILE=str(self.scenario_file),
            # The fake agent runs inside the kernel boundary: let it reach its scenario, its
            # log and the tests' gate files, all under the session's temporary directory
            # (the denylist still keeps it out of ~/.ssh and the rest).
            AGENTCALL_CONFINE_EXTRA=str(self.root.parents[1]),
        )
        base.update(extra)
        return base

    def cli(
        self, *args: str, stdin: str | None = None, timeout: float = 120, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agentcall", *args],
            env=self.env(**env),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
        )

    def cli_async(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "agentcall", *args],
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.root,
        )

    def setup(self, invite_url: str, handle: str, *extra: str) -> subprocess.CompletedProcess[str]:
        self.home.mkdir(parents=True, exist_ok=True)
        done = self.cli(
            "setup",
            "--invite",
            invite_url,
            "--handle",
            handle,
            "--skip-service",
            "--no-verify",
            *extra,
        )
        if done.returncode != 0:
            raise RuntimeError(f"setup of {handle} failed: {done.stderr}")
        return done

    def set_scenario(self, scenario: str | dict[str, Any]) -> None:
        text = scenario if isinstance(scenario, str) else json.dumps(scenario)
        self.scenario_file.write_text(text)

    def edit_config(self, **changes: Any) -> None:
        """Change config.json the way an owner editing it by hand would (kept 0600)."""
        path = self.state_dir / "config.json"
        data = json.loads(path.read_text())
        data.update(changes)
        path.write_text(json.dumps(data))
        path.chmod(0o600)

    def _agent_log(self) -> list[dict[str, Any]]:
        if not self.agent_log.exists():
            return []
        return [json.loads(line) for line in self.agent_log.read_text().splitlines() if line]

    def agent_runs(self) -> list[dict[str, Any]]:
        """One record per agent process the listener started (argv, cwd, env, prompt, pid)."""
        return [entry for entry in self._agent_log() if "argv" in entry]

    def agent_children(self, pid: int) -> list[int]:
        """Detached children the fake agent with this pid reported spawning."""
        return [
            child
            for entry in self._agent_log()
            if entry.get("pid") == pid and "children" in entry
            for child in entry["children"]
        ]

    def start_listener(self, **env: str) -> ListenerProcess:
        process = subprocess.Popen(
            [str(BIN / "twistd"), "-n", "--pidfile=", "--logfile=-", "agentcall-listen"],
            env=self.env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.root,
        )
        log = LogFollower(process.stdout, self.root / "listener.log")
        self.listener = ListenerProcess(process, log)
        try:
            log.wait_for(r"relay_connected")
        except Exception:
            self.listener.stop()
            raise
        return self.listener

    def stop(self) -> None:
        if self.listener is not None:
            self.listener.stop()


@attrs.define
class World:
    """A relay with ann (admin, caller only) and ken (a callable claude), each with a HOME."""

    relay: RelayProcess
    root: Path
    ann: Install
    ken: Install

    def invite(self) -> str:
        """A fresh member invite, created by ann through the CLI."""
        made = self.ann.cli("invite", "create")
        if made.returncode != 0:
            raise RuntimeError(f"invite create failed: {made.stderr}")
        return made.stdout.strip()


@contextlib.contextmanager
def two_people(root: Path) -> Iterator[World]:
    """Start a relay and enrol ann and ken; ken's listener is left to the caller to start
    (after any set-up of its own). Everything is stopped on the way out."""
    relay, invites = start_relay(root / "relay")
    world = World(
        relay,
        root,
        Install("ann", root / "ann", relay.ca_file),
        Install("ken", root / "ken", relay.ca_file),
    )
    try:
        world.ann.setup(invites["acme"], "ann", "--caller-only")
        world.ken.setup(world.invite(), "ken", "--agent", "claude")
        world.ken.set_scenario("happy")
        yield world
    finally:
        world.ken.stop()
        relay.stop()


@contextlib.contextmanager
def a2a_bridge(install: Install) -> Iterator[tuple[str, LogFollower]]:
    """``install``'s bridge on a free loopback port: its base URL (from its first line) and
    its log."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentcall",
            "a2a",
            "serve",
            "--listen",
            "tcp:0:interface=127.0.0.1",
        ],
        env=install.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=install.root,
    )
    log = LogFollower(process.stdout, install.root / "bridge.log")
    try:
        url = log.wait_for(r"a2a_listening url=(\S+)").group(1)
        yield url, log
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
