"""The e2e harness itself: what lets the suite run on parallel workers."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.e2e import processes

pytestmark = pytest.mark.e2e


def test_a_relay_whose_port_was_taken_meanwhile_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between picking a free port and the relay binding it, another worker may take it."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        picks = iter([taken])
        real_free_port = processes.free_port
        monkeypatch.setattr(processes, "free_port", lambda: next(picks, None) or real_free_port())
        relay, invites = processes.start_relay(tmp_path)
        try:
            assert relay.url.port != taken
            assert f":{relay.url.port}/" in invites["acme"]
        finally:
            relay.stop()


def test_a_relay_that_cannot_listen_exits_1(tmp_path: Path) -> None:
    """It says why and exits non-zero at once, so a supervisor sees the failure."""
    database = tmp_path / "relay.sqlite"
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        processes.agentcall_cli(
            ["relay", "bootstrap", "--database", str(database), "--org", "acme", "--url", url]
        )
        done = subprocess.run(
            [
                str(processes.BIN / "twistd"),
                "-n",
                "--pidfile=",
                "--logfile=-",
                "agentcall-relay",
                "--database",
                str(database),
                "--listen",
                f"tcp:{port}:interface=127.0.0.1",
                "--url",
                url,
            ],
            env=processes.child_env(),
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,  # bounds the wait for its exit; it exits within a second or two
        )
    assert done.returncode == 1, done.stdout[-2000:]
    assert "relay_listen_failed" in done.stdout
    assert "Address already in use" in done.stdout
