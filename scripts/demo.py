"""The README's first command: run AgentCall end to end on this machine.

Everything is real: `agentcall relay bootstrap`, a `twistd agentcall-relay` on 127.0.0.1 with a
SQLite file, `agentcall setup` for two identities (each with its own HOME under .demo/), a
`twistd agentcall-listen` for the callee, and `agentcall call`. The callee's agent is your
logged-in `claude` or `codex` if one is found, else scripts/demo_agent.py (and it says so).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEMO = REPO / ".demo"
QUESTION = "Why did CI fail on main?"


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_for(home: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCALL_")}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    if home is not None:
        env["HOME"] = str(home)
    return env


def agentcall(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    shown = " ".join(a if "#" not in a else a.split("#")[0] + "#…" for a in args)
    print(f"$ agentcall {shown}", flush=True)
    done = subprocess.run(
        [str(BIN / "agentcall"), *args],
        env=env_for(home),
        text=True,
        capture_output=True,
        check=False,
    )
    if done.stderr:
        sys.stderr.write(done.stderr)
    if check and done.returncode != 0:
        raise SystemExit(f"demo: `agentcall {args[0]}` failed (exit {done.returncode})")
    return done


def logged_in_agent() -> str | None:
    probes = {"claude": ["claude", "auth", "status"], "codex": ["codex", "login", "status"]}
    for kind, argv in probes.items():
        if shutil.which(kind) is None:
            continue
        try:
            if subprocess.run(argv, capture_output=True, timeout=20, check=False).returncode == 0:
                return kind
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def start(argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)


def wait_for_line(process: subprocess.Popen[bytes], needle: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.1)
    raise SystemExit(f"demo: {log.name} never said {needle!r}; see {log}")


def main() -> int:
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    db = DEMO / "relay.sqlite"
    ann, ken = DEMO / "ann", DEMO / "ken"
    ann.mkdir()
    ken.mkdir()
    children: list[subprocess.Popen[bytes]] = []
    try:
        step(f"Bootstrap a relay database for organisation 'demo' ({db.name})")
        admin_invite = agentcall(
            ann, "relay", "bootstrap", "--database", str(db), "--org", "demo", "--url", url
        ).stdout.strip()

        step(f"Start the relay on {url} (plain HTTP is allowed on loopback only)")
        relay = start(
            [
                str(BIN / "twistd"),
                "-n",
                "--pidfile=",
                "--logfile=-",
                "agentcall-relay",
                "--database",
                str(db),
                "--listen",
                f"tcp:{port}:interface=127.0.0.1",
                "--url",
                url,
            ],
            env_for(),
            DEMO / "relay.log",
            DEMO,
        )
        children.append(relay)
        wait_for_line(relay, "relay_listening", DEMO / "relay.log", 30)

        step("Enrol ann (admin, caller only) with the one-time admin invite")
        agentcall(
            ann,
            "setup",
            "--invite",
            admin_invite,
            "--handle",
            "ann",
            "--caller-only",
            "--skip-service",
            "--no-verify",
        )

        step("ann invites ken; ken enrols as a callable agent")
        ken_invite = agentcall(ann, "invite", "create", "--description", "ken").stdout.strip()
        kind = logged_in_agent()
        if kind is None:
            print("No logged-in `claude` or `codex` found: ken's agent is scripts/demo_agent.py.")
            agent_args = [
                "--agent",
                "command",
                "--agent-command",
                shlex.join([sys.executable, str(REPO / "scripts" / "demo_agent.py")]),
            ]
        else:
            print(f"Found a logged-in `{kind}`: ken's calls will be answered by it.")
            agent_args = ["--agent", kind]
        agentcall(
            ken,
            "setup",
            "--invite",
            ken_invite,
            "--handle",
            "ken",
            *agent_args,
            "--skip-service",
            "--no-verify",
        )

        step("Start ken's listener")
        listener = start(
            [str(BIN / "twistd"), "-n", "--pidfile=", "--logfile=-", "agentcall-listen"],
            env_for(ken),
            DEMO / "listener.log",
            ken,
        )
        children.append(listener)
        wait_for_line(listener, "relay_connected", DEMO / "listener.log", 30)

        step("ann calls ken's agent")
        done = agentcall(ann, "call", "@demo/ken", QUESTION, check=False)
        print(done.stdout, end="", flush=True)
        if done.returncode == 0:
            step("Done: the answer above travelled sealed and signed through the relay.")
            print(f"Logs and state are in {DEMO}/ (relay.log, listener.log, ken/.agentcall/).")
        return done.returncode
    finally:
        for child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    child.kill()


if __name__ == "__main__":
    sys.exit(main())
