"""One listener per identity: two real listener processes for @acme/ken, the newer one wins.

The first runs as `agentcall listen` (what the systemd unit runs), the second as
`twistd -n agentcall-listen` from a copy of the same ~/.agentcall. The relay replaces the first
with close code 4000; it logs one `listener_replaced` line and exits 78 (the status the unit
does not restart on) instead of reconnecting, and calls reach the second.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.e2e.installs import Install, ListenerProcess, World, two_people
from tests.e2e.processes import LogFollower

pytestmark = pytest.mark.e2e

EXIT_REPLACED = 78


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("exclusive")) as world:
        yield world


def start_agentcall_listen(install: Install) -> ListenerProcess:
    process = subprocess.Popen(
        [sys.executable, "-m", "agentcall", "listen"],
        env=install.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=install.root,
    )
    listener = ListenerProcess(process, LogFollower(process.stdout, install.root / "listen.log"))
    install.listener = listener  # stopped by two_people on the way out
    listener.log.wait_for(r"relay_connected")
    return listener


def test_the_newer_listener_keeps_the_identity_and_the_older_stops_for_good(
    world: World,
) -> None:
    first = start_agentcall_listen(world.ken)
    twin = Install("ken-twin", world.root / "ken-twin", world.relay.ca_file)
    # Not the running service's socket: a copy of a live UNIX socket means nothing.
    shutil.copytree(
        world.ken.home, twin.home, symlinks=True, ignore=shutil.ignore_patterns("service.sock")
    )
    twin.set_scenario("happy")
    twin.start_listener()
    try:
        assert first.process.wait(timeout=60) == EXIT_REPLACED
        [line] = [text for text in first.log.text().splitlines() if "listener_replaced" in text]
        assert "@acme/ken" in line and "another listener for this identity" in line
        assert "restart it" in line
        assert first.log.text().count("relay_connected") == 1  # never reconnected

        done = world.ann.cli("call", "@acme/ken", "who answers now?")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "FAKE-AGENT-ANSWER: who answers now?"
        assert len(twin.agent_runs()) == 1
        assert world.ken.agent_runs() == []
        assert twin.listener is not None and twin.listener.process.poll() is None
        assert "listener_replaced" not in twin.listener.log.text()
    finally:
        twin.stop()
