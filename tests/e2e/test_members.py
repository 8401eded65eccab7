"""Offboarding through real processes: an admin removes a member mid-call, then frees the handle.

A real relay, ann (admin, caller) and ken (a listener with the fake agent) on their own HOMEs;
everything through the `agentcall` command line.
"""

from __future__ import annotations

import http.client
import json
import sqlite3
import ssl
from pathlib import Path

import pytest

from tests.e2e.installs import AgentGate, Install, two_people
from tests.e2e.processes import RelayProcess

pytestmark = pytest.mark.e2e


def _me_status(relay: RelayProcess, token: str) -> int:
    """``GET /v1/me`` as @acme/ken with ``token``: the relay's verdict on it."""
    conn = http.client.HTTPSConnection(
        "localhost", relay.url.port, context=ssl.create_default_context(cafile=relay.ca_file)
    )
    headers = {
        "Authorization": f"Bearer {token}",
        "X-AgentCall-Org": "acme",
        "X-AgentCall-Handle": "ken",
    }
    conn.request("GET", "/v1/me", headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_removed_member_is_cut_off_mid_call_and_a_new_owner_is_a_changed_identity(
    tmp_path: Path,
) -> None:
    with two_people(tmp_path / "world") as world:
        ken = world.ken
        listener = ken.start_listener()
        assert world.ann.cli("call", "@acme/ken", "hello").returncode == 0  # ann pins ken
        gate = AgentGate.make(tmp_path / "gate")
        ken.set_scenario({"name": "happy", "hold": gate.scenario()})
        call = world.ann.cli_async("call", "@acme/ken", "a question ken never answers")
        try:
            gate.wait_started()
            removed = world.ann.cli("members", "remove", "ken")
        finally:
            gate.release()
        assert removed.returncode == 0, removed.stderr
        assert "stays reserved" in removed.stdout

        # The call in progress ends with a clear reason, not at its deadline.
        _out, err = call.communicate(timeout=120)
        assert call.returncode != 0
        assert "left the organisation" in err
        # Ken's listener was told, said so once, and stopped instead of redialling a dead token.
        listener.log.wait_for(r"listener_removed")
        assert listener.process.wait(timeout=60) is not None
        # A new call to ken is to nobody; ken's own token no longer works.
        again = world.ann.cli("call", "@acme/ken", "are you there?")
        assert again.returncode != 0 and "unknown" in again.stderr.lower()
        doctor = ken.cli("doctor")
        assert doctor.returncode != 0
        assert "an organisation admin removed you" in doctor.stdout
        listed = json.loads(world.ann.cli("members", "list", "--json").stdout)
        states = {m["handle"]: (m["status"], m.get("removed_by")) for m in listed["members"]}
        assert states == {"ann": ("active", None), "ken": ("removed", "ann")}

        # Nobody can take the reserved handle; once released, a newcomer can.
        newcomer = Install("ken2", tmp_path / "newcomer", world.relay.ca_file)
        with pytest.raises(RuntimeError, match="taken"):
            newcomer.setup(world.invite(), "ken", "--agent", "claude")
        released = world.ann.cli("members", "remove", "ken", "--release")
        assert released.returncode == 0 and "released the handle" in released.stdout
        newcomer.setup(world.invite(), "ken", "--agent", "claude")
        newcomer.set_scenario("happy")
        newcomer.start_listener()
        try:
            # Ann pinned the old ken: the new one has other keys, and she is told so.
            changed = world.ann.cli("call", "@acme/ken", "hello again")
            assert changed.returncode != 0
            assert "changed" in changed.stderr.lower()
            assert newcomer.agent_runs() == []
        finally:
            newcomer.stop()
        with sqlite3.connect(world.relay.database) as db:
            rows = db.execute(
                "SELECT event, actor, target FROM audit"
                " WHERE event IN ('member.remove', 'member.release') ORDER BY id"
            ).fetchall()
        assert rows == [("member.remove", "ann", "ken"), ("member.release", "ann", "ken")]


def test_a_rotated_token_is_picked_up_by_the_running_listener(tmp_path: Path) -> None:
    with two_people(tmp_path / "world") as world:
        ken = world.ken
        listener = ken.start_listener()
        old = json.loads((ken.state_dir / "config.json").read_text())["token"]
        mark = listener.log.mark()

        rotated = ken.cli("token", "rotate")

        assert rotated.returncode == 0, rotated.stderr
        new = json.loads((ken.state_dir / "config.json").read_text())["token"]
        assert new != old and new not in rotated.stdout + rotated.stderr
        # The relay closed the old socket; the listener came back with the new token, alone.
        listener.log.wait_for(r"listener_settings_reloaded", since=mark)
        listener.log.wait_for(r"relay_connected", since=mark)
        assert listener.process.poll() is None
        answered = world.ann.cli("call", "@acme/ken", "still there?")
        assert answered.returncode == 0, answered.stderr
        assert _me_status(world.relay, old) == 401 and _me_status(world.relay, new) == 200
        with sqlite3.connect(world.relay.database) as db:
            (count,) = db.execute(
                "SELECT COUNT(*) FROM audit WHERE event = 'member.token_rotate' AND actor = 'ken'"
            ).fetchone()
        assert count == 1
        assert old not in listener.log.text() and new not in listener.log.text()
