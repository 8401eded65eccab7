"""The relay under test as a real ``twistd -n agentcall-relay`` process, and what /proc says.

The relay is started the way an operator would start it; readiness is its own
``relay_listening port=N`` log line, read from the log file its output goes to.
:meth:`Relay.stop` is idempotent and always ends in a reaped process.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
_READY_RE = re.compile(r"relay_listening port=(\d+)")
_PR_SET_PDEATHSIG = 1
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def raise_nofile_limit() -> tuple[int, int]:
    """Raise our soft RLIMIT_NOFILE to the hard limit (children inherit it); (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the bench is killed outright (SIGKILL), the
    # kernel sends the relay SIGTERM instead of leaving it running.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Relay:
    def __init__(
        self,
        args: Sequence[str],
        workdir: Path,
        extra_env: dict[str, str] | None = None,
        checkout: Path = REPO,
    ) -> None:
        env = dict(os.environ)
        env.update(extra_env or {})
        # The checkout on sys.path is how twistd finds twisted/plugins/agentcall_plugins.py, and
        # which agentcall it imports (another checkout measures another version of the relay).
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(checkout), env.get("PYTHONPATH", "")) if p
        )
        self.args = tuple(args)
        self.log_path = workdir / "relay.log"
        # The relay writes its log straight to a file: no thread in the bench competes with the
        # load generator for the GIL, and 10,000 listeners' 20,000 lines never sit in memory.
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.args,
                env=env,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the bench only; it stops the relay
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout_s: float) -> int:
        """The port from the relay's ``relay_listening port=N`` line; raises on timeout/exit."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if match := _READY_RE.search(self._read_log()):
                return int(match.group(1))
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(
            f"relay did not log relay_listening within {timeout_s:g} s:\n{self.tail()}"
        )

    def _read_log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self._read_log().splitlines()[-lines:])

    def log_lines(self) -> int:
        return self._read_log().count("\n")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after a grace period; always reaps the process."""
        if self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGTERM)
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return self.process.returncode


def proc_status_kib(pid: int, field: str = "VmRSS") -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM, RssAnon, ...), in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def proc_cpu_s(pid: int) -> float:
    """User plus system CPU seconds the process has used so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        stat = fh.read()
    # The command name may hold spaces; fields after it are fixed.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def proc_fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def checkout_facts(checkout: Path = REPO) -> dict[str, Any]:
    """The commit measured and which tracked files differ from it (read-only git queries)."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", "-C", str(checkout), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.rstrip("\n") if done.returncode == 0 else ""

    status = git("status", "--porcelain", "--untracked-files=no", "-z")
    changed = [entry[3:] for entry in status.split("\0") if len(entry) > 3]
    return {"commit": git("rev-parse", "HEAD") or None, "modified_files": changed}


def machine_facts() -> dict[str, Any]:
    import autobahn
    import cryptography
    import OpenSSL

    import twisted

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_total_kib = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_total_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "mem_total_mib": None if mem_total_kib is None else round(mem_total_kib / 1024),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_impl": platform.python_implementation(),
        "twisted": twisted.__version__,
        "autobahn": autobahn.__version__,
        "cryptography": cryptography.__version__,
        "pyopenssl": OpenSSL.__version__,
        "openssl": OpenSSL.SSL.OpenSSL_version(OpenSSL.SSL.OPENSSL_VERSION).decode(),
    }
