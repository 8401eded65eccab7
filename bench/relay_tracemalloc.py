"""Run ``twistd`` with tracemalloc, for finding where a relay's memory goes (investigation only).

``relay_bench.py --tracemalloc FILE`` starts the relay through this wrapper instead of the
``twistd`` script. The first SIGUSR1 takes a baseline snapshot; the second writes to FILE the
Python allocations that grew since then, grouped by source line and by call stack. The wrapper
changes nothing else: the relay is ``twisted.scripts.twistd.run`` with the same arguments.
tracemalloc slows the relay several times over, so timings of such a run mean nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import tracemalloc
from types import FrameType

OUT_ENV = "AGENTCALL_BENCH_TRACEMALLOC_OUT"
TOP = 40

_baseline: list[tracemalloc.Snapshot] = []


def _snapshot() -> tracemalloc.Snapshot:
    return tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)]
    )


def _area(filename: str) -> str:
    """site-packages/twisted/web/http.py -> twisted/web; agentcall/relay/x.py -> agentcall/relay."""
    parts = filename.replace("\\", "/").split("/")
    for anchor in ("site-packages", "main"):
        if anchor in parts:
            rest = parts[parts.index(anchor) + 1 :]
            return "/".join(rest[:2]) if len(rest) > 2 else rest[0]
    return "stdlib/" + parts[-1]


def _on_usr1(_signum: int, _frame: FrameType | None) -> None:
    out = os.environ.get(OUT_ENV)
    if not out:
        return
    if not _baseline:
        _baseline.append(_snapshot())
        return
    now = _snapshot()
    before = _baseline[0]
    grown = sum(s.size_diff for s in now.compare_to(before, "filename"))
    lines = [f"traced Python memory grown since the baseline: {grown} bytes", ""]
    by_area: dict[str, int] = {}
    for stat in now.compare_to(before, "filename"):
        area = _area(stat.traceback[0].filename)
        by_area[area] = by_area.get(area, 0) + stat.size_diff
    lines.append("by area (bytes, where the allocating line is):")
    for area, size in sorted(by_area.items(), key=lambda item: -item[1]):
        if size:
            lines.append(f"  {size:>11}  {area}")
    lines.append("")
    lines.append(f"top {TOP} by source line (size_diff bytes, count_diff):")
    for stat in now.compare_to(before, "lineno")[:TOP]:
        frame = stat.traceback[0]
        lines.append(
            f"  {stat.size_diff:>11} {stat.count_diff:>8}  {frame.filename}:{frame.lineno}"
        )
    lines.append("")
    lines.append("top 12 by call stack:")
    for stat in now.compare_to(before, "traceback")[:12]:
        lines.append(f"  {stat.size_diff:>11} {stat.count_diff:>8}")
        lines.extend(f"      {line}" for line in stat.traceback.format(most_recent_first=True))
    with open(out, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


def main() -> None:
    if not tracemalloc.is_tracing():
        tracemalloc.start(6)
    signal.signal(signal.SIGUSR1, _on_usr1)
    from twisted.scripts.twistd import run

    sys.argv = ["twistd", *sys.argv[1:]]
    run()


if __name__ == "__main__":
    main()
