"""Run the fuzz targets, each in its own atheris process, and report what they did.

    .venv/bin/python -m fuzz.run --target all --seconds 3          # the short run CI does
    .venv/bin/python -m fuzz.run --target policy --runs 100000     # a full run of one target
    .venv/bin/python -m fuzz.run --target skill --replay fuzz/crashes/skill-crash-...

A run fails (exit status 1) when any target raises an exception outside its own error types,
hangs past ``--timeout`` on one input, or does not run at all. The failing input is printed in
hex and saved under ``--crash-dir`` by libFuzzer. See fuzz/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent
TARGET_NAMES = ("frames", "local", "http", "payloads", "skill", "policy", "ceiling")
ATHERIS_MISSING = (
    "atheris is not installed in this environment. It is in the `test` extra for Linux x86_64 "
    "(the platform it publishes wheels for): run scripts/venv, or `.venv/bin/pip install atheris`."
)

_DONE = re.compile(r"^#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/", re.MULTILINE)
_PROGRESS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/", re.MULTILINE)
_EXECUTED = re.compile(r"^stat::number_of_executed_units: (\d+)", re.MULTILINE)


@attrs.frozen
class Stats:
    """What one target's libFuzzer run reported."""

    executed: int
    cov: int
    ft: int
    corpus: int
    findings: int


def parse_stats(output: str) -> Stats:
    """Read libFuzzer's final statistics (``-print_final_stats=1``) and our FINDING lines."""
    executed = _EXECUTED.findall(output)
    # The DONE line when the run ended normally, else the last progress line before a finding.
    lines = _DONE.findall(output) or _PROGRESS.findall(output)
    cov, ft, corpus = (int(x) for x in lines[-1][1:]) if lines else (0, 0, 0)
    return Stats(
        executed=int(executed[-1]) if executed else 0,
        cov=cov,
        ft=ft,
        corpus=corpus,
        findings=len(re.findall(r"^FINDING ", output, re.MULTILINE)),
    )


def libfuzzer_flags(
    *, runs: int, seconds: int, max_len: int, timeout: int, artifact_prefix: str
) -> list[str]:
    return [
        f"-runs={runs if runs > 0 else -1}",
        f"-max_total_time={seconds}",  # 0: no time limit
        f"-max_len={max_len}",
        f"-timeout={timeout}",  # one input running longer than this is a finding (a hang)
        f"-artifact_prefix={artifact_prefix}",
        "-print_final_stats=1",
    ]


def _quiet(output: str) -> str:
    """libFuzzer's output without atheris's per-module instrumentation notes."""
    return "\n".join(
        line for line in output.splitlines() if not line.startswith("INFO: Instrumenting ")
    )


def run_target(name: str, args: argparse.Namespace) -> tuple[Stats, float, bool]:
    crash_dir = Path(args.crash_dir).resolve()
    crash_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"agentcall-fuzz-{name}-") as scratch:
        workspace, corpus = Path(scratch, "workspace"), Path(scratch, "corpus")
        workspace.mkdir()
        command = [
            sys.executable,
            "-m",
            "fuzz.child",
            name,
            str(workspace),
            str(corpus),
            *libfuzzer_flags(
                runs=args.runs,
                seconds=args.seconds,
                max_len=args.max_len,
                timeout=args.timeout,
                artifact_prefix=f"{crash_dir}/{name}-",
            ),
        ]
        started = time.monotonic()
        done = subprocess.run(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            check=False,
        )
        elapsed = time.monotonic() - started
    stats = parse_stats(done.stdout)
    passed = done.returncode == 0 and stats.findings == 0 and stats.executed > 0
    if args.verbose or not passed:
        print(_quiet(done.stdout))
    if not passed:
        print(f"fuzz: target {name} FAILED (exit status {done.returncode}); see above", flush=True)
    return stats, elapsed, passed


def replay(name: str, path: Path) -> int:
    """Run one saved input through a target in this process, without atheris."""
    from fuzz import targets

    with tempfile.TemporaryDirectory(prefix="agentcall-fuzz-replay-") as scratch:
        target = targets.build_targets(Path(scratch))[name]
        try:
            targets.run_one(target, path.read_bytes())
        except Exception:
            traceback.print_exc()
            return 1
    print(f"fuzz: {path} is handled by target {name} (accepted or refused with its own error)")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fuzz.run",
        description="Coverage-guided fuzzing (atheris) of AgentCall's parsers.",
    )
    parser.add_argument("--target", default="all", choices=[*TARGET_NAMES, "all"])
    parser.add_argument("--runs", type=int, default=0, help="inputs per target (0: no limit)")
    parser.add_argument("--seconds", type=int, default=0, help="time per target (0: no limit)")
    parser.add_argument("--max-len", type=int, default=16384, help="largest input in bytes")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    parser.add_argument("--crash-dir", default=str(ROOT / "fuzz" / "crashes"))
    parser.add_argument("--verbose", action="store_true", help="show libFuzzer's whole output")
    parser.add_argument("--replay", metavar="FILE", help="run one saved input, no fuzzing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.replay:
        if args.target == "all":
            parser.error("--replay needs one --target")
        return replay(args.target, Path(args.replay))
    if args.runs < 0 or args.seconds < 0 or args.max_len < 1 or args.timeout < 1:
        parser.error("--runs and --seconds must be >= 0; --max-len and --timeout >= 1")
    if args.runs == 0 and args.seconds == 0:
        parser.error("give --runs or --seconds (or both): a run without either never ends")
    # Fail loudly, never skip: a CI without atheris must not pass as if it had fuzzed.
    if importlib.util.find_spec("atheris") is None:
        print(f"fuzz: {ATHERIS_MISSING}", file=sys.stderr)
        return 2
    names = TARGET_NAMES if args.target == "all" else (args.target,)
    results = [(name, *run_target(name, args)) for name in names]
    print(
        f"{'target':<10} {'inputs':>10} {'seconds':>8} {'cov':>5} {'ft':>6} {'corpus':>6}  result"
    )
    for name, stats, elapsed, passed in results:
        verdict = "ok" if passed else f"FAILED ({stats.findings} finding(s))"
        print(
            f"{name:<10} {stats.executed:>10} {elapsed:>8.1f} {stats.cov:>5} {stats.ft:>6}"
            f" {stats.corpus:>6}  {verdict}"
        )
    return 0 if all(passed for *_, passed in results) else 1


if __name__ == "__main__":
    sys.exit(main())
