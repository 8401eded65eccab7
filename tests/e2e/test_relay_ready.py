"""A real relay tells its service manager when it is ready, and answers its probes."""

from __future__ import annotations

import http.client
import json
import socket
import sqlite3
import ssl
from pathlib import Path

import pytest

from tests.e2e.processes import RelayProcess, start_relay

pytestmark = pytest.mark.e2e

WAIT_S = 120.0  # bounds a wait for an event; a loaded machine only takes longer


def _get(relay: RelayProcess, path: str) -> tuple[int, dict[str, object]]:
    context = ssl.create_default_context(cafile=relay.ca_file)
    conn = http.client.HTTPSConnection("localhost", relay.url.port, context=context, timeout=60)
    conn.request("GET", path)
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    return response.status, body


def test_the_relay_says_ready_once_listening_and_answers_its_probes(tmp_path: Path) -> None:
    address = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(address))
        manager.settimeout(WAIT_S)
        relay, _ = start_relay(tmp_path / "relay", env={"NOTIFY_SOCKET": str(address)})
        try:
            ready = manager.recv(4096).decode()
            assert "READY=1\n" in ready and f"port {relay.url.port}" in ready
            assert _get(relay, "/healthz") == (200, {"ok": True})
            assert _get(relay, "/readyz") == (200, {"ok": True})
            status, body = _get(relay, "/readyz/more")
            assert status == 404 and body["ok"] is False
        finally:
            relay.stop()
        assert manager.recv(4096) == b"STOPPING=1\n"


def test_a_backup_taken_while_the_relay_runs_restores_into_a_working_relay(
    tmp_path: Path,
) -> None:
    from tests.e2e.processes import agentcall_cli

    relay, _ = start_relay(tmp_path / "relay", orgs=("acme", "beta"))
    backup = tmp_path / "relay-backup.sqlite"
    try:
        said = agentcall_cli(
            ["relay", "backup", "--database", str(relay.database), "--output", str(backup)]
        )
        assert f"to {backup}" in said
        assert _get(relay, "/readyz") == (200, {"ok": True})  # the relay never noticed
    finally:
        relay.stop()
    # Restore: the copy in place of the database, the same relay started on it.
    relay.database.unlink()
    for side in ("-wal", "-shm"):
        relay.database.with_name(relay.database.name + side).unlink(missing_ok=True)
    backup.rename(relay.database)
    relay.restart()
    try:
        assert _get(relay, "/readyz") == (200, {"ok": True})
        with sqlite3.connect(relay.database) as db:
            assert {row[0] for row in db.execute("SELECT org FROM orgs")} == {"acme", "beta"}
    finally:
        relay.stop()


def test_json_logs_are_one_object_per_line(tmp_path: Path) -> None:
    relay, _ = start_relay(tmp_path / "relay", extra_args=("--log-format", "json"))
    try:
        assert _get(relay, "/readyz")[0] == 200
    finally:
        relay.stop()
    lines = [line for line in relay.log.text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line, or this fails
    assert all(list(r)[:3] == ["ts", "level", "event"] for r in records)
    events = {r["event"] for r in records}
    assert {"relay_configured", "relay_listening"} <= events
    assert not [e for e in events if "Starting factory" in e or "Stopping factory" in e]
    assert "\x1e" not in relay.log.text()  # no RFC 7464 record separators


def test_metrics_are_served_on_their_own_endpoint(tmp_path: Path) -> None:
    from tests.e2e.processes import free_port

    port = free_port()
    relay, _ = start_relay(
        tmp_path / "relay", extra_args=("--metrics", f"tcp:{port}:interface=127.0.0.1")
    )
    try:
        _get(relay, "/v1/not-a-route")  # refused: counted by the front door
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        text = response.read().decode()
        conn.close()
    finally:
        relay.stop()
    assert response.status == 200
    assert "agentcall_listeners_connected 0.0" in text
    assert 'agentcall_front_door_total{reason="api_refused"} 1.0' in text
