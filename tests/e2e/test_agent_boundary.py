"""The answering agent, hostile, against everything on the owner's machine it could talk to.

ken's fake agent (`claude`, then `codex`) runs a probe through its shell, inside the boundary
the listener put it in, and reports what each attempt gave; the caller (ann) sees exactly that.
Every attempt is a real one against a real thing the test starts: ken's own service socket (to
place a call as ken), ken's A2A bridge over TCP, a real ``ssh-agent``, a real
``dbus-daemon --session``, an abstract UNIX socket, a decoy process and the listener itself
(signals, and /proc/PID/environ, where the listener holds a token), and /dev/shm, /tmp and the
run's TMPDIR (a note left there for the next caller's run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcall.confine import landlock, rights, seccomp
from tests.e2e.installs import World, a2a_bridge, two_people

pytestmark = pytest.mark.e2e

ABI, WHY_NOT = landlock.probe()
if ABI < 1:
    pytest.skip(f"no Landlock on this kernel: {WHY_NOT}", allow_module_level=True)
if seccomp.current_arch() is None:
    pytest.skip("no socket filter for this machine", allow_module_level=True)
for _tool in ("ssh-agent", "dbus-daemon"):
    if shutil.which(_tool) is None:
        pytest.skip(f"{_tool} is not installed (.ci/run installs it)", allow_module_level=True)

LISTENER_TOKEN = "ghp_LISTENER-ENVIRONMENT-TOKEN-5772"
TASK = """---
description: a shell
tools: [read, exec]
timeout_s: 60
workdir: {workdir}
---
Use the shell.
"""

PROBE = r"""
import json, os, signal, socket, sys, urllib.request, urllib.error
args = json.loads(sys.argv[1])
found = {}
def attempt(name, action):
    try:
        found[name] = "ok " + str(action() or "")
    except urllib.error.HTTPError as exc:
        found[name] = "http %d" % exc.code
    except urllib.error.URLError as exc:
        found[name] = "refused %s" % (getattr(exc.reason, "errno", None),)
    except OSError as exc:
        found[name] = "refused %s" % (exc.errno,)
def unix(path):
    def go():
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            if path == args["service"]:
                s.sendall(b'{"type":"call","target":"@acme/ann","message":"as ken"}\n')
                return s.recv(65536).decode()
    return go
def read(path):
    def go():
        with open(path, "rb") as f:
            return len(f.read())
    return go
def write(path):
    def go():
        with open(path, "w") as f:
            f.write("instructions for the next caller's run")
    return go
def bridge(token):
    def go():
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}})
        request = urllib.request.Request(args["bridge"], data=body.encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        if token:
            request.add_header("Authorization", "Bearer " + token)
        return urllib.request.urlopen(request, timeout=30).status
    return go
attempt("service_key", read(args["key"]))
attempt("service_socket", unix(args["service"]))
attempt("bridge", bridge(""))
attempt("bridge_guess", bridge("x" * 43))
attempt("ssh_agent", unix(args["ssh"]))
attempt("dbus", unix(args["dbus"]))
attempt("abstract", unix("\0" + args["abstract"]))
attempt("signal_decoy", lambda: os.kill(int(args["decoy"]), signal.SIGTERM))
attempt("signal_listener", lambda: os.kill(int(args["listener"]), signal.SIGTERM))
attempt("listener_environ", read("/proc/%s/environ" % args["listener"]))
attempt("listener_cmdline", read("/proc/%s/cmdline" % args["listener"]))
for name in ("/dev/shm", "/tmp", os.environ["TMPDIR"]):
    attempt("leave " + name, write(os.path.join(name, args["note"])))
    attempt("find " + name, read(os.path.join(name, args["previous"])))
found["env"] = sorted(k for k in os.environ if k in (
    "SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "DISPLAY", "WAYLAND_DISPLAY", "GITHUB_TOKEN"))
print("PROBE " + json.dumps(found))
"""


@contextlib.contextmanager
def _owners_desktop(base: Path) -> Iterator[dict[str, str]]:
    """A real ssh-agent and session bus, as a desktop session has them; both stopped after."""
    base.mkdir(mode=0o700)
    ssh_sock = base / "ssh-agent.sock"
    started = subprocess.run(
        ["ssh-agent", "-s", "-a", str(ssh_sock)], capture_output=True, text=True, check=True
    )
    ssh_pid = int(started.stdout.split("SSH_AGENT_PID=")[1].split(";")[0])
    bus = subprocess.run(
        [
            "dbus-daemon",
            "--session",
            f"--address=unix:path={base / 'bus'}",
            "--fork",
            "--print-address=1",
            "--print-pid=1",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    address, bus_pid = bus.stdout.split()
    try:
        yield {
            "SSH_AUTH_SOCK": str(ssh_sock),
            "DBUS_SESSION_BUS_ADDRESS": address,
            "bus": str(base / "bus"),
            "DISPLAY": ":97",
            "WAYLAND_DISPLAY": "wayland-97",
        }
    finally:
        for pid in (ssh_pid, int(bus_pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


@pytest.fixture(scope="module", params=["claude", "codex"])
def setting(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[World, dict[str, str], subprocess.Popen[bytes], str]]:
    root = tmp_path_factory.mktemp("hostile")
    with two_people(root) as world, _owners_desktop(root / "desktop") as desktop:
        ken = world.ken
        chosen = ken.cli("config", "set", "agent", request.param)
        assert chosen.returncode == 0, chosen.stderr
        project = ken.home / "project"
        project.mkdir()
        assert ken.cli("task", "new", "shell").returncode == 0
        task = ken.home / "AgentCall" / "tasks" / "shell" / "SKILL.md"
        task.write_text(TASK.format(workdir=project))
        assert ken.cli("allow", "ann", "shell").returncode == 0
        (root / "probe.py").write_text(PROBE)
        listener_env = {k: v for k, v in desktop.items() if k != "bus"}
        ken.start_listener(GITHUB_TOKEN=LISTENER_TOKEN, **listener_env)
        decoy = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
        try:
            with a2a_bridge(world.ken) as (bridge, _log):
                yield world, desktop, decoy, bridge
        finally:
            decoy.kill()
            decoy.wait(timeout=30)


def _probe(
    setting: tuple[World, dict[str, str], subprocess.Popen[bytes], str], note: str, previous: str
) -> dict[str, object]:
    world, desktop, decoy, bridge = setting
    ken = world.ken
    assert ken.listener is not None
    args = {
        "key": str(ken.state_dir / "service.key"),
        "service": str(ken.state_dir / "service.sock"),
        "bridge": bridge,
        "ssh": desktop["SSH_AUTH_SOCK"],
        "dbus": desktop["bus"],
        "abstract": f"agentcall-owner-{uuid.uuid4().hex}",
        "decoy": str(decoy.pid),
        "listener": str(ken.listener.process.pid),
        "note": note,
        "previous": previous,
    }
    command = f"{sys.executable} -I {world.root / 'probe.py'} '{json.dumps(args)}'"
    ken.set_scenario(
        {
            "name": "happy",
            "perform": True,
            "report": True,
            "tools": [{"tool_name": "Bash", "tool_input": {"command": command}}],
        }
    )
    import socket

    with socket.socket(socket.AF_UNIX) as abstract:
        abstract.bind("\0" + args["abstract"])
        abstract.listen(1)
        done = world.ann.cli("call", "ken", "--task", "shell", "probe")
    assert done.returncode == 0, done.stderr
    assert LISTENER_TOKEN not in done.stdout
    line = next(x for x in done.stdout.splitlines() if x.startswith("PROBE "))
    found: dict[str, object] = json.loads(line.removeprefix("PROBE "))
    return found


def test_the_agent_reaches_nothing_that_acts_as_the_owner(
    setting: tuple[World, dict[str, str], subprocess.Popen[bytes], str],
) -> None:
    world, _desktop, decoy, _bridge_url = setting
    ken = world.ken
    found = _probe(setting, f"note-{uuid.uuid4().hex}", "none")
    unix_refused = f"refused {13}"  # EACCES: the socket filter
    # The service: its key is in the denied state directory, its socket cannot be dialled.
    assert found["service_key"] == unix_refused, found
    assert found["service_socket"] == unix_refused
    # The bridge over TCP: refused without the token (Claude may dial it; Codex's ports
    # exclude it, so the kernel refuses the connection itself).
    for attempt in ("bridge", "bridge_guess"):
        assert found[attempt] in ("http 401", unix_refused), found[attempt]
    # The owner's desktop: no SSH agent, no session bus, no abstract socket.
    assert found["ssh_agent"] == found["dbus"] == found["abstract"] == unix_refused
    # Other processes: no signal (ABI 6 scopes), and no environment of the listener.
    assert str(found["listener_environ"]).startswith("refused")
    assert str(found["listener_cmdline"]).startswith("refused")
    if ABI >= rights.SCOPE_ABI:
        assert found["signal_decoy"] == found["signal_listener"] == "refused 1"  # EPERM
        assert decoy.poll() is None
    assert ken.listener is not None and ken.listener.process.poll() is None
    # The listener is not dumpable: its /proc files are root's, not the owner's (which tells
    # only where the owner is not root: the unprivileged tier).
    assert os.stat(f"/proc/{ken.listener.process.pid}/environ").st_uid == 0
    # None of the owner's session variables reached the agent.
    assert found["env"] == []
    run_env = ken.agent_runs()[-1]["env"]
    for name in ("SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "DISPLAY", "WAYLAND_DISPLAY"):
        assert name not in run_env
    # Nothing reached the service, and ann got no call from ken.
    assert "local_call" not in ken.listener.log.text()


def test_one_run_leaves_nothing_for_the_next(
    setting: tuple[World, dict[str, str], subprocess.Popen[bytes], str],
) -> None:
    """/dev/shm and /tmp are not writable; the run's TMPDIR is its own, and gone after it."""
    note = f"note-{uuid.uuid4().hex}"
    first = _probe(setting, note, "none")
    assert str(first["leave /dev/shm"]).startswith("refused")
    assert str(first["leave /tmp"]).startswith("refused")
    assert str(first[f"leave {'/tmp'}"]).startswith("refused")
    tmpdir_key = next(k for k in first if k.startswith("leave ") and "agentcall-run-" in k)
    assert str(first[tmpdir_key]).startswith("ok")
    second = _probe(setting, "unused", note)
    for key in second:
        if key.startswith("find "):
            assert str(second[key]).startswith("refused 2"), (key, second[key])  # ENOENT
    assert not Path("/dev/shm", note).exists() and not Path("/tmp", note).exists()
