"""CLI start-up and call wall time, next to a bare interpreter start measured in the same run.

Measures, each N times as subprocesses (what a person or an agent pays per invocation):
- `python -c pass` (the floor: the interpreter itself),
- `agentcall --version` (the CLI's cold start),
- `agentcall call @bench/ken "..."` against a local relay and listener whose agent is an
  instant `command` (`sh -c 'cat >/dev/null; echo instant'`), so the figure is AgentCall's own
  overhead: process start, key load, relay round trips, sealing, the listener's spawn.
- with ``--via-service``, also `agentcall call` from ken's own installation, whose running
  listener service takes the call over its local socket (the thin path: no Twisted or crypto
  in the CLI process); ken calls himself, so the same instant agent answers.

Run: .venv/bin/python bench/cli_bench.py [--runs 20] [--via-service]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_for(home: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCALL_")}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env["PYTHONPATH"] = str(REPO)
    if home is not None:
        env["HOME"] = str(home)
    return env


def timed(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, check=False)
        samples.append((time.perf_counter() - start) * 1000)
        if done.returncode != 0:
            raise SystemExit(f"{argv[:3]} failed: {done.stderr.decode(errors='replace')}")
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "min_ms": round(ordered[0], 1),
    }


def wait_for(path: Path, needle: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise SystemExit(f"{path.name} never said {needle!r}")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--via-service",
        action="store_true",
        help="also time a call handed to the running listener service (the thin path)",
    )
    args = parser.parse_args()
    agentcall = [sys.executable, "-m", "agentcall"]
    results: dict[str, object] = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": sys.version.split()[0]},
        "runs": args.runs,
    }
    results["python_c_pass"] = summary(timed([sys.executable, "-c", "pass"], env_for(), args.runs))
    results["agentcall_version"] = summary(timed([*agentcall, "--version"], env_for(), args.runs))

    with tempfile.TemporaryDirectory(prefix="agentcall-bench-") as tmp:
        root = Path(tmp)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        ann, ken = root / "ann", root / "ken"
        ann.mkdir()
        ken.mkdir()

        def cli(home: Path, *argv: str) -> str:
            done = subprocess.run(
                [*agentcall, *argv], env=env_for(home), capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise SystemExit(f"agentcall {argv[0]} failed: {done.stderr}")
            return done.stdout.strip()

        invite = cli(
            ann,
            "relay",
            "bootstrap",
            "--database",
            str(root / "relay.sqlite"),
            "--org",
            "bench",
            "--url",
            url,
        )
        relay_log, listener_log = root / "relay.log", root / "listener.log"
        children = []
        try:
            with relay_log.open("wb") as out:
                children.append(
                    subprocess.Popen(
                        [
                            str(BIN / "twistd"),
                            "-n",
                            "--pidfile=",
                            "--logfile=-",
                            "agentcall-relay",
                            "--database",
                            str(root / "relay.sqlite"),
                            "--listen",
                            f"tcp:{port}:interface=127.0.0.1",
                            "--url",
                            url,
                            "--calls-per-hour",
                            "1000",
                        ],
                        env=env_for(),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
            wait_for(relay_log, "relay_listening")
            cli(
                ann,
                "setup",
                "--invite",
                invite,
                "--handle",
                "ann",
                "--caller-only",
                "--skip-service",
                "--no-verify",
            )
            instant = shlex.join(["sh", "-c", "cat >/dev/null; echo instant"])
            cli(
                ken,
                "setup",
                "--invite",
                cli(ann, "invite", "create"),
                "--handle",
                "ken",
                "--agent",
                "command",
                "--agent-command",
                instant,
                "--skip-service",
                "--no-verify",
            )
            with listener_log.open("wb") as out:
                children.append(
                    subprocess.Popen(
                        [
                            str(BIN / "twistd"),
                            "-n",
                            "--pidfile=",
                            "--logfile=-",
                            "agentcall-listen",
                        ],
                        env=env_for(ken),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=ken,
                    )
                )
            wait_for(listener_log, "relay_connected")
            call = [*agentcall, "call", "@bench/ken", "instant question"]
            timed(call, env_for(ann), 1)  # first contact pins keys; not part of the figure
            results["agentcall_call_instant_agent"] = summary(timed(call, env_for(ann), args.runs))
            if args.via_service:
                timed(call, env_for(ken), 1)  # ken pins his own keys
                results["agentcall_call_via_service"] = summary(
                    timed(call, env_for(ken), args.runs)
                )
        finally:
            for child in reversed(children):
                child.send_signal(signal.SIGTERM)
                child.wait(timeout=20)

    print(json.dumps(results, indent=2))
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    (out_dir / f"cli-{stamp}.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
