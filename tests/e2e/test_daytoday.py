"""Day to day through real processes: a setting changed with `agentcall config set` is what the
next call runs with, and `agentcall uninstall --yes` leaves no service and no keys.

A real relay, ann (admin, caller) and ken (a listener with the fake agent) on their own HOMEs.
systemd is a recording stand-in on ken's PATH (a test cannot own the machine's user manager),
reached exactly as the real one is: `systemctl --user …` found on PATH.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e.installs import two_people

pytestmark = pytest.mark.e2e

UNIT = "agentcall-listener.service"
# `systemctl --user ARGS…`: logs ARGS as one line; a user manager that answers, with no
# unit active (so setup always writes and starts the unit).
FAKE_SYSTEMCTL = """#!/bin/sh
printf '%s\\n' "$*" >> "{log}"
case "$2" in
  is-active) exit 3 ;;
esac
exit 0
"""


def test_a_changed_agent_and_workdir_are_used_after_the_restart_config_asks_for(
    tmp_path: Path,
) -> None:
    with two_people(tmp_path / "world") as world:
        ken = world.ken
        ken.start_listener()
        assert world.ann.cli("call", "@acme/ken", "hello").returncode == 0
        project = ken.home / "src" / "project"
        project.mkdir(parents=True)

        agent = ken.cli("config", "set", "agent", "codex")
        workdir = ken.cli("config", "set", "workdir", "~/src/project")
        assert agent.returncode == 0 and workdir.returncode == 0, agent.stderr + workdir.stderr
        assert "agent: codex (was claude)" in agent.stdout
        assert "until it is restarted" in agent.stdout
        settings = json.loads(ken.cli("config", "get", "--json").stdout)
        assert settings["agent"] == "codex" and settings["workdir"] == str(project)
        # As config said: the running listener still answers with the old settings.
        assert world.ann.cli("call", "@acme/ken", "still claude?").returncode == 0
        before = ken.agent_runs()[-1]
        assert (before["kind"], before["cwd"]) == ("claude", os.path.realpath(ken.home))

        ken.stop()
        ken.start_listener()
        answered = world.ann.cli("call", "@acme/ken", "and now?")
        assert answered.returncode == 0, answered.stderr
        after = ken.agent_runs()[-1]
        assert after["kind"] == "codex"
        assert after["cwd"] == os.path.realpath(project)

        # A bad value changes nothing, and the next call is as before.
        refused = ken.cli("config", "set", "workdir", str(ken.home / ".agentcall"))
        assert refused.returncode == 1 and "is inside" in refused.stderr
        assert json.loads(ken.cli("config", "get", "--json").stdout) == settings


def test_uninstall_yes_leaves_no_service_and_no_keys_and_the_admin_removes_the_rest(
    tmp_path: Path,
) -> None:
    with two_people(tmp_path / "world") as world:
        ken = world.ken
        log = tmp_path / "systemctl.log"
        bin_dir = tmp_path / "systemd-bin"
        bin_dir.mkdir()
        systemctl = bin_dir / "systemctl"
        systemctl.write_text(FAKE_SYSTEMCTL.format(log=log))
        systemctl.chmod(0o755)
        path = f"{bin_dir}{os.pathsep}{ken.env()['PATH']}"

        # The service as setup installs it, through `systemctl --user`.
        resumed = ken.cli("setup", "--resume", "--no-verify", PATH=path)
        assert resumed.returncode == 0, resumed.stderr
        unit = ken.home / ".config" / "systemd" / "user" / UNIT
        assert unit.exists()
        assert f"--user restart {UNIT}" in log.read_text()

        # Without a terminal and without --yes: refused, nothing touched.
        refused = ken.cli("uninstall", stdin="", PATH=path)
        assert refused.returncode == 2 and "--yes" in refused.stderr
        assert unit.exists() and (ken.state_dir / "keys.json").exists()

        # A listener running outside the service manager keeps the keys from being deleted
        # under it (the service part is done, and said).
        ken.start_listener()
        held = ken.cli("uninstall", "--yes", stdin="", PATH=path)
        assert held.returncode == 1 and "a listener still answers" in held.stderr
        assert (ken.state_dir / "keys.json").exists()
        ken.stop()

        done = ken.cli("uninstall", "--yes", stdin="", PATH=path)
        assert done.returncode == 0, done.stderr
        assert f"--user disable --now {UNIT}" in log.read_text()
        assert not unit.exists()
        assert "no listener service was installed" in done.stdout  # already removed above
        assert not ken.state_dir.exists()
        assert "agentcall members remove ken" in done.stdout
        assert ken.cli("doctor").returncode != 0  # nothing left to run with

        # What uninstall said stays on the relay is there, and the admin's command removes it.
        members = json.loads(world.ann.cli("members", "list", "--json").stdout)["members"]
        assert {m["handle"]: m["status"] for m in members}["ken"] == "active"
        assert world.ann.cli("members", "remove", "ken").returncode == 0
        gone = world.ann.cli("call", "@acme/ken", "anyone?")
        assert gone.returncode != 0 and "unknown" in gone.stderr.lower()
