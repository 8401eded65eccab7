"""A relay whose database sits on a filesystem that fills up: a real tmpfs, a real twistd relay.

The caller is told in words (`storage_full`, its own exit status), the relay logs the episode
once and never a traceback, `/readyz` says not ready, and once space returns the relay finds
out by itself and queues calls again. Mounting a tmpfs needs root (CI runs as root); elsewhere
the test is skipped, saying so.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcall.cli.call import EXIT_RELAY_UNAVAILABLE
from tests.e2e.installs import Install
from tests.e2e.processes import RelayProcess, start_relay

pytestmark = pytest.mark.e2e

# Room for the relay's database and its WAL with some to spare; the test fills the rest.
TMPFS_SIZE = "16m"


@contextlib.contextmanager
def small_tmpfs(where: Path) -> Iterator[Path]:
    where.mkdir(parents=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill needs root (CI runs the e2e tier as root)")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem has no room left; the file, to remove later."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as out:
        while True:
            try:
                out.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
    # Whatever room a smaller write still finds is taken too.
    with open(filler, "ab", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 512)
    return filler


def readyz(relay: RelayProcess) -> tuple[int, dict[str, object]]:
    context = ssl.create_default_context(cafile=relay.ca_file)
    try:
        with urllib.request.urlopen(f"{relay.url}/readyz", context=context, timeout=30) as got:
            return got.status, json.loads(got.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_a_full_disk_refuses_calls_in_words_and_the_relay_recovers_by_itself(
    tmp_path: Path,
) -> None:
    with small_tmpfs(tmp_path / "disk") as disk:
        relay, invites = start_relay(tmp_path / "relay", database=disk / "relay.sqlite")
        try:
            ann = Install("ann", tmp_path / "ann", relay.ca_file)
            ann.setup(invites["acme"], "ann", "--caller-only")
            made = ann.cli("invite", "create")
            assert made.returncode == 0, made.stderr
            ken = Install("ken", tmp_path / "ken", relay.ca_file)
            ken.setup(made.stdout.strip(), "ken", "--agent", "claude")
            opted = ken.cli("access", "--offline", "enabled")
            assert opted.returncode == 0, opted.stderr
            assert readyz(relay) == (200, {"ok": True})

            # Marked first: a background write (last seen, audit) may fail before any call.
            mark = relay.log.mark()
            filler = fill(disk)
            refused = [ann.cli("call", "@acme/ken", f"question {n}", "--json") for n in range(3)]
            for done in refused:
                assert done.returncode == EXIT_RELAY_UNAVAILABLE, (done.stdout, done.stderr)
                body = json.loads(done.stdout)
                assert body["ok"] is False and body["code"] == "storage_full", body
                assert "storage" in body["message"] and "network" not in body["message"]
            relay.log.wait_for(r"storage_failing", since=mark)
            assert readyz(relay) == (503, {"ok": False, "problem": "storage_full"})
            # A write over HTTP is refused in words too, and nothing is queued meanwhile.
            again = ken.cli("access", "--offline", "disabled")
            assert again.returncode != 0 and "storage" in again.stderr, again.stderr
            listed = ann.cli("jobs", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            assert json.loads(listed.stdout) == []

            filler.unlink()
            relay.log.wait_for(r"storage_recovered", since=mark)
            assert readyz(relay) == (200, {"ok": True})
            queued = ann.cli("call", "@acme/ken", "now it fits", "--json")
            assert queued.returncode == 0, queued.stderr
            assert json.loads(queued.stdout)["queued"] is True

            log = relay.log.text().splitlines()[mark:]
            assert sum("storage_failing" in line for line in log) == 1, log
            assert not [line for line in log if "Traceback" in line], log
        finally:
            relay.stop()
