"""CLI start-up and call wall time, next to a bare interpreter start measured in the same run.

Measures, each N times as subprocesses (what a person or an agent pays per invocation):
- `python -c pass` (the floor: the interpreter itself),
- `agentcall --version` (the CLI's cold start),
- `agentcall call @bench/ken "..."` against a local relay and listener whose agent is an
  instant `command` (`sh -c 'cat >/dev/null; echo instant'`), so the figure is AgentCall's own
  overhead: process start, key load, relay round trips, sealing, the listener's spawn. Two
  modes: ``direct`` (no service on the caller's side: the CLI dials the relay; target <= 300 ms)
  and ``thin`` (the caller's `twistd agentcall-listen` runs and the CLI hands the call to it;
  target <= 100 ms). One extra, untimed run per mode with ``-X importtime`` tells whether the
  CLI imported Twisted, i.e. which path it really took.

The relay, ann and ken are set up by bench/callpath_bench.py's ``World`` (no proxy here).

Run: .venv/bin/python bench/cli_bench.py [--runs 20] [--mode direct|thin|both]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


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


def summary(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "min_ms": round(ordered[0], 1),
    }


TARGET_MS = {"direct": 300.0, "thin": 100.0}


def imports_twisted(world: Any, argv: list[str]) -> bool:
    """Whether one (untimed) run of ``argv`` as ann imports Twisted (``-X importtime``)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "agentcall", *argv],
        env=env_for(world.homes["ann"]),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=world.homes["ann"],
    )
    if done.returncode != 0:
        raise SystemExit(f"agentcall {argv[0]} failed: {done.stderr[-800:]}")
    return any(line.rstrip().endswith(" twisted") for line in done.stderr.splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--mode",
        choices=("direct", "thin", "both"),
        default="both",
        help="direct: no service on the caller's side; thin: through the caller's running"
        " service (the CLI hands the call over its local socket); both (default)",
    )
    args = parser.parse_args()
    if not 1 <= args.runs <= 500:
        parser.error("--runs 1..500")
    sys.path.insert(0, str(REPO / "bench"))
    import callpath_bench
    import relayproc

    signal.signal(signal.SIGTERM, callpath_bench._sigterm)
    agentcall = [sys.executable, "-m", "agentcall"]
    results: dict[str, Any] = {
        "kind": "cli",
        "machine": relayproc.machine_facts(),
        "checkout": relayproc.checkout_facts(),
        "load_avg_start": os.getloadavg(),
        "runs": args.runs,
    }
    results["python_c_pass"] = summary(timed([sys.executable, "-c", "pass"], env_for(), args.runs))
    results["agentcall_version"] = summary(timed([*agentcall, "--version"], env_for(), args.runs))
    modes = ("direct", "thin") if args.mode == "both" else (args.mode,)
    call = ["call", "@bench/ken", "instant question"]
    with tempfile.TemporaryDirectory(prefix="agentcall-bench-") as tmp:
        world = callpath_bench.World(Path(tmp), proxy=False)
        try:
            world.start()
            for mode in modes:
                if mode == "thin":
                    world.start_ann_service()
                else:
                    world.stop_ann_service()
                argv = [*agentcall, *call]
                timed(argv, env_for(world.homes["ann"]), 1)  # warm: pins keys; not counted
                figure = summary(timed(argv, env_for(world.homes["ann"]), args.runs))
                figure["imports_twisted"] = imports_twisted(world, call)
                figure["target_ms"] = TARGET_MS[mode]
                figure["met"] = figure["median_ms"] <= TARGET_MS[mode]
                if mode == "thin" and figure["imports_twisted"]:
                    figure["note"] = (
                        "the CLI imported Twisted with the service running: it did not take the"
                        " thin path (not in this checkout yet?); the figure is the direct path"
                    )
                results[f"agentcall_call_{mode}"] = figure
        finally:
            world.stop()
    results["load_avg_end"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    floor = results["python_c_pass"]["median_ms"]
    print(f"\nfloor: python -c pass {floor} ms (median of {args.runs})")
    for mode in modes:
        f = results[f"agentcall_call_{mode}"]
        print(
            f"agentcall call, {mode}: median {f['median_ms']} ms (p90 {f['p90_ms']}), target"
            f" <= {f['target_ms']:g} ms: {'MET' if f['met'] else 'MISSED'};"
            f" {f['median_ms'] - floor:.1f} ms over the bare interpreter;"
            f" imports Twisted: {f['imports_twisted']}"
            + (f" -- {f['note']}" if "note" in f else "")
        )
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    (out_dir / f"cli-{stamp}.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
