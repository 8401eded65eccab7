"""Real processes for the end-to-end suite: a `twistd agentcall-relay` on loopback with TLS.

The relay is started exactly as an operator would (`agentcall relay bootstrap`, then
`twistd -n agentcall-relay ...`), with a throwaway CA. Readiness is read from the relay's own
log line, not guessed with a sleep.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from agentcall.relayurl import RelayUrl
from agentcall.testing.tlsca import CA, make_ca

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Bounds a wait for a readiness line, never a delay: generous, so a loaded machine is only slower.
START_TIMEOUT_S = 60.0


# The relay's "listening" line, as text or as a --log-format json object.
LISTENING = r'relay_listening port=|"event":"relay_listening"'


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # The checkout on sys.path is how twistd finds twisted/plugins/agentcall_plugins.py here.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def agentcall_cli(args: Sequence[str], *, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "agentcall", *args],
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"agentcall {args[0]} failed ({done.returncode}): {done.stderr}")
    return done.stdout


class LogFollower:
    """Drains a child's stdout on a thread (so it never blocks) and lets tests wait for a line."""

    def __init__(self, stream: object, path: Path) -> None:
        self.lines: list[str] = []
        self._ended = False
        self._changed = threading.Condition()
        self._path = path
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream: object) -> None:
        with self._path.open("a", encoding="utf-8") as copy:
            for line in stream:  # type: ignore[attr-defined]
                copy.write(line)
                copy.flush()
                with self._changed:
                    self.lines.append(line)
                    self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def mark(self) -> int:
        """A position in the log; ``wait_for(..., since=mark)`` ignores lines before it."""
        with self._changed:
            return len(self.lines)

    def wait_for(
        self, pattern: str, timeout: float = START_TIMEOUT_S, *, since: int = 0
    ) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        checked = since
        with self._changed:
            while True:
                for line in self.lines[checked:]:
                    if match := regex.search(line):
                        return match
                checked = len(self.lines)
                if self._ended:
                    raise RuntimeError(f"process exited before logging {pattern!r}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no log line matching {pattern!r} within {timeout}s")
                self._changed.wait(remaining)

    def text(self) -> str:
        with self._changed:
            return "".join(self.lines)


@attrs.define
class RelayProcess:
    url: RelayUrl
    database: Path
    ca_file: str
    process: subprocess.Popen[str]
    log: LogFollower
    args: tuple[str, ...]

    def bootstrap(self, org: str) -> str:
        out = agentcall_cli(
            [
                "relay",
                "bootstrap",
                "--database",
                str(self.database),
                "--org",
                org,
                "--url",
                str(self.url),
            ]
        )
        return out.strip()

    def restart(self) -> None:
        """Stop and start the same relay (same port, database and certificate)."""
        self.stop()
        self.process = subprocess.Popen(
            self.args,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.database.parent,
        )
        self.log = LogFollower(self.process.stdout, self.database.parent / "relay.log")
        self.log.wait_for(LISTENING)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return self.process.returncode


def start_relay(
    workdir: Path,
    *,
    extra_args: Sequence[str] = (),
    ca: CA | None = None,
    port: int | None = None,
    orgs: Sequence[str] = ("acme",),
    env: dict[str, str] | None = None,
    database: Path | None = None,
) -> tuple[RelayProcess, dict[str, str]]:
    """Bootstrap and start a TLS relay; returns it and the first admin invite of each org.
    ``env`` adds variables to the relay process's environment; ``database`` puts the relay's
    database there instead of beside everything else in ``workdir``.

    Without a ``port`` a free one is picked; the relay's URL (in every invite) names it, so it
    is chosen before the relay binds it. Another process (a parallel test worker) can take it in
    between; then the relay is started again on a fresh port, in a fresh directory.
    """
    if port is not None:
        return _start_relay(
            workdir,
            extra_args=extra_args,
            ca=ca,
            port=port,
            orgs=orgs,
            env=env or {},
            database=database,
        )
    for attempt in range(3):
        try:
            return _start_relay(
                workdir if attempt == 0 else workdir / f"retry-{attempt}",
                extra_args=extra_args,
                ca=ca,
                port=free_port(),
                orgs=orgs,
                env=env or {},
                database=database,
            )
        except PortTaken:
            continue
    raise RuntimeError("three free ports in a row were taken before the relay could bind one")


class PortTaken(Exception):
    """The relay could not bind its port: someone else has it."""


def _start_relay(
    workdir: Path,
    *,
    extra_args: Sequence[str],
    ca: CA | None,
    port: int,
    orgs: Sequence[str],
    env: dict[str, str],
    database: Path | None = None,
) -> tuple[RelayProcess, dict[str, str]]:
    workdir.mkdir(parents=True, exist_ok=True)
    ca = ca or make_ca(workdir / "ca")
    cert = ca.issue_server(workdir / "tls", hostnames=("localhost",), ips=("127.0.0.1",))
    url = RelayUrl.parse(f"https://localhost:{port}")
    database = database or workdir / "relay.sqlite"
    invites = {}
    for org in orgs:
        out = agentcall_cli(
            ["relay", "bootstrap", "--database", str(database), "--org", org, "--url", str(url)]
        )
        invites[org] = out.strip()
    args = (
        str(BIN / "twistd"),
        "-n",
        "--pidfile=",
        "--logfile=-",
        "agentcall-relay",
        "--database",
        str(database),
        "--listen",
        cert.endpoint_string(port),
        "--url",
        str(url),
        *extra_args,
    )
    process = subprocess.Popen(
        args,
        env=child_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=workdir,
    )
    log = LogFollower(process.stdout, workdir / "relay.log")
    relay = RelayProcess(url, database, str(cert.ca_cert_file), process, log, args)
    try:
        log.wait_for(LISTENING)
    except Exception:
        relay.stop()
        if "Address already in use" in log.text():
            raise PortTaken(port) from None
        raise
    return relay, invites
