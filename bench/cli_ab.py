"""`agentcall call` wall time of two or more checkouts, measured in turn in one run.

On a machine shared with other work the same command can take 340 ms one minute and 500 ms
the next, so two checkouts measured one after the other say more about the machine than about
the change. This bench gives each checkout a world of its own (relay, ann and ken, set up by
that checkout's ``bench/callpath_bench.World``, so the callee side runs that checkout's code
too), then times, round after round, the floor (``python -c pass``) and one direct call from
each checkout, in turn: every round sees the same machine. One thing is shared: a process
started with ``python -I`` ignores ``PYTHONPATH`` and loads the package the venv has installed
(the confinement wrapper of a checkout that starts it with ``-I -m``; later ones name their
own directory).

Run: .venv/bin/python bench/cli_ab.py --checkout /tmp/main --checkout . [--rounds 30]
(``git worktree add --detach /tmp/main main`` makes the first; compile each checkout's
``agentcall`` first, ``python -m compileall -q agentcall``, since the environment here sets
``PYTHONDONTWRITEBYTECODE``.) Results: ``bench/results/cli-ab-*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))  # cli_bench, relayproc

# Run in a child process per checkout, from that checkout's bench directory: builds the world,
# says where ann lives, and keeps it up until stdin closes.
_WORLD = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/bench")
import callpath_bench
Path(sys.argv[2]).mkdir()
world = callpath_bench.World(Path(sys.argv[2]), proxy=False)
try:
    world.start()
    world.stop_ann_service()
    print(world.homes["ann"], flush=True)
    sys.stdin.read()
finally:
    world.stop()
"""


def call_env(checkout: Path, home: Path) -> dict[str, str]:
    """cli_bench's environment for ``home``, with ``checkout`` on the module path instead."""
    from cli_bench import env_for

    env = env_for(home)
    env["PYTHONPATH"] = str(checkout)
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkout", action="append", type=Path, required=True, help="repeat for each"
    )
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    if not 1 <= args.rounds <= 500:
        parser.error("--rounds 1..500")
    checkouts = [c.resolve() for c in args.checkout]
    for checkout in checkouts:
        if not (checkout / "bench" / "callpath_bench.py").is_file():
            parser.error(f"{checkout} is not a checkout with bench/callpath_bench.py")
    import relayproc
    from cli_bench import summary

    floor = [sys.executable, "-c", "pass"]
    call = [sys.executable, "-m", "agentcall", "call", "@bench/ken", "instant question"]
    worlds: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="agentcall-bench-ab-") as tmp:
        try:
            cases: dict[str, tuple[list[str], dict[str, str], Path]] = {
                "floor": (floor, call_env(REPO, Path(tmp)), Path(tmp))
            }
            for n, checkout in enumerate(checkouts):
                world = subprocess.Popen(
                    [sys.executable, "-c", _WORLD, str(checkout), f"{tmp}/world{n}"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    cwd=checkout,
                )
                worlds.append(world)
                assert world.stdout is not None
                home = world.stdout.readline().strip()
                if not home:
                    raise SystemExit(f"the world of {checkout} did not start")
                cases[f"{n}:{checkout}"] = (call, call_env(checkout, Path(home)), checkout)
            samples: dict[str, list[float]] = {name: [] for name in cases}
            for argv, env, cwd in cases.values():  # warm: pins keys, fills the page cache
                subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=True)
            load_start = os.getloadavg()
            for _ in range(args.rounds):
                for name, (argv, env, cwd) in cases.items():
                    start = time.perf_counter()
                    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=False)
                    samples[name].append((time.perf_counter() - start) * 1000)
                    if done.returncode != 0:
                        raise SystemExit(f"{name}: {done.stderr.decode(errors='replace')[-800:]}")
        finally:
            for world in worlds:
                if world.stdin is not None:
                    world.stdin.close()
            for world in worlds:
                world.wait(timeout=60)
    results: dict[str, Any] = {
        "kind": "cli-ab",
        "machine": relayproc.machine_facts(),
        "checkout": relayproc.checkout_facts(),
        "rounds": args.rounds,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "figures": {name: summary(values) for name, values in samples.items()},
    }
    print(json.dumps(results, indent=2))
    for name, figure in results["figures"].items():
        print(
            f"{name}: median {figure['median_ms']} ms (min {figure['min_ms']},"
            f" p90 {figure['p90_ms']})"
        )
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / f"cli-ab-{time.strftime('%Y%m%dT%H%M%S')}.json").write_text(
        json.dumps(results, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
