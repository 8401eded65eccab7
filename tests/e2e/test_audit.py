"""The audit trail through real processes: a 100,000-row export with flat memory in the relay
and the CLI, legal holds, retention pruning at start, presence of others refused and recorded.

Rows are generated straight into the relay's SQLite file while the relay is stopped; each
export then runs against a freshly started relay, so the relay's peak RSS (VmHWM) is that
export's, and the CLI's comes from wait4 on its process.
"""

from __future__ import annotations

import json
import os
import sqlite3
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.installs import Install
from tests.e2e.processes import RelayProcess, start_relay

pytestmark = pytest.mark.e2e

SMALL, BIG = 10_000, 100_000
# Holding 90,000 more rows at once (rows, wire objects, their JSON) costs far more than this in
# either process; paging and streaming cost nothing per row.
FLAT_MB = 12.0
DAY = 86_400


def generate(database: Path, count: int, *, org: str = "acme", start: float, step: float) -> None:
    """``count`` audit rows of realistic size, written in one transaction."""
    db = sqlite3.connect(database)
    try:
        with db:
            db.executemany(
                "INSERT INTO audit (at, org, event, actor, target, call_id, detail)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    (
                        start + i * step,
                        org,
                        "call.complete",
                        f"user{i % 97}",
                        f"user{(i * 7) % 89}",
                        f"{i:08x}-0000-4000-8000-{i:012x}",
                        f"ms={i % 5000} bytes={i % 65536}",
                    )
                    for i in range(count)
                ),
            )
    finally:
        db.close()


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


def export_measured(ann: Install, output: Path, *extra: str) -> tuple[float, str]:
    """Run `agentcall audit export` to ``output``; its peak RSS in MB and its stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "agentcall", "audit", "export", "--output", str(output), *extra],
        env=ann.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ann.root,
    )
    deadline = time.monotonic() + 600
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("the export did not finish within 600 s")
        time.sleep(0.05)
    assert process.stderr is not None
    err = process.stderr.read().decode()
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 0, err
    return usage.ru_maxrss / 1024, err


def exported_ids(path: Path) -> list[int]:
    with path.open() as lines:
        return [json.loads(line)["id"] for line in lines]


def with_admin(root: Path, *extra_args: str) -> tuple[RelayProcess, Install]:
    relay, invites = start_relay(root / "relay", extra_args=extra_args)
    ann = Install("ann", root / "ann", relay.ca_file)
    try:
        ann.setup(invites["acme"], "ann", "--caller-only")
    except Exception:
        relay.stop()
        raise
    return relay, ann


def test_an_export_of_100000_rows_streams_with_flat_memory(tmp_path: Path) -> None:
    relay, ann = with_admin(tmp_path)
    try:
        now = time.time()
        relay.stop()
        generate(relay.database, SMALL, start=now - 20 * DAY, step=1.0)
        relay.restart()
        small_cli, _ = export_measured(ann, tmp_path / "small.ndjson")
        small_relay = peak_rss_mb(relay.process.pid)

        relay.stop()
        generate(relay.database, BIG - SMALL, start=now - 10 * DAY, step=1.0)
        relay.restart()
        big_file = tmp_path / "big.csv"
        csv_cli, _ = export_measured(ann, big_file, "--format", "csv")
        big_cli, err = export_measured(ann, tmp_path / "big.ndjson")
        big_relay = peak_rss_mb(relay.process.pid)
    finally:
        relay.stop()

    ids = exported_ids(tmp_path / "big.ndjson")
    # Ann's enrolment rows, the generated rows, and one audit.export row per export so far.
    assert len(ids) >= BIG and ids == sorted(ids) and len(set(ids)) == len(ids)
    last = json.loads((tmp_path / "big.ndjson").read_text().splitlines()[-1])
    assert (last["event"], last["actor"]) == ("audit.export", "ann")
    assert sum(1 for _ in big_file.open()) == len(ids)  # a header, and the rows before this one
    assert f"exported {len(ids)} events" in err
    growth = {"relay": big_relay - small_relay, "cli": big_cli - small_cli}
    print(f"peak RSS MB: relay {small_relay:.1f} -> {big_relay:.1f}, "
          f"cli {small_cli:.1f} -> {big_cli:.1f} (csv {csv_cli:.1f})")  # fmt: skip
    assert growth["relay"] < FLAT_MB, growth
    assert growth["cli"] < FLAT_MB, growth
    assert csv_cli - small_cli < FLAT_MB


def test_retention_prunes_at_start_except_what_a_hold_keeps(tmp_path: Path) -> None:
    relay, ann = with_admin(tmp_path, "--audit-retention-days", "30")
    try:
        held = ann.cli("audit", "hold", "set", "user1", "--note", "case 14")
        assert held.returncode == 0, held.stderr
        assert "legal hold on @acme/user1" in held.stdout
        # Asking the relay whether someone else is online is refused, and recorded.
        assert presence_of(relay, ann, "?handle=ken") == 403
        assert presence_of(relay, ann, "") == 200
        relay.stop()
        now = time.time()
        # 200 rows 40..41 days old: user1 is the actor of 3 of them (i % 97 == 1).
        generate(relay.database, 200, start=now - 41 * DAY, step=60.0)
        generate(relay.database, 10, start=now - DAY, step=60.0)
        relay.restart()
        relay.log.wait_for(r"retention_pruned")
        listed = ann.cli("audit", "hold", "list", "--json")
        assert [h["handle"] for h in json.loads(listed.stdout)["holds"]] == ["user1"]
        out = tmp_path / "after.ndjson"
        export_measured(ann, out)
    finally:
        relay.stop()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    old = [
        r for r in rows if r["event"] == "call.complete" and r["at_ms"] < (now - 30 * DAY) * 1000
    ]
    assert old and all("user1" in (r["actor"], r["target"]) for r in old)
    assert sum(r["event"] == "call.complete" for r in rows) == len(old) + 10
    (pruned,) = [r for r in rows if r["event"] == "audit.prune"]
    assert pruned["detail"].startswith(f"events={200 - len(old)} ")
    assert [r["target"] for r in rows if r["event"] == "audit.hold.set"] == ["user1"]
    assert [(r["actor"], r["target"]) for r in rows if r["event"] == "presence.refused"] == [
        ("ann", "ken")
    ]


def presence_of(relay: RelayProcess, who: Install, query: str) -> int:
    """The status of ``GET /v1/presence<query>`` asked with ``who``'s credentials."""
    config = json.loads((who.state_dir / "config.json").read_text())
    request = urllib.request.Request(
        relay.url.http("/v1/presence") + query,
        headers={
            "Authorization": f"Bearer {config['token']}",
            "X-AgentCall-Org": config["org"],
            "X-AgentCall-Handle": config["handle"],
        },
    )
    context = ssl.create_default_context(cafile=relay.ca_file)
    try:
        with urllib.request.urlopen(request, context=context, timeout=60) as answer:
            status: int = answer.status
    except urllib.error.HTTPError as refused:
        status = refused.code
    return status
