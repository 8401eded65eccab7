"""`agentcall call` over a simulated network: wall time and round trips on each leg, direct and
through the caller's running service, against the floor (the agent's own time + one round trip
per leg).

Real processes, all on loopback: a relay (`twistd -n agentcall-relay`, SQLite, plain HTTP) on a
private port; bench/delayproxy.py on the relay's public port (the URL in every invite and
config), delaying each chunk by ``--delay-ms`` one way (25 ms = 50 ms round trip) and sorting
connections into legs by their ``X-AgentCall-Handle``: ``caller`` (ann) and ``listener`` (ken).
ken runs `twistd -n agentcall-listen` with an instant agent (`--agent command`, a shell line that
reads its prompt and prints an answer). ann is enrolled with the same kind of agent so that she
can run a service too.

Paths measured, each with the delay off (0 ms) and on:

- ``direct``: no service on ann's side; `agentcall call` dials the relay itself.
- ``service``: ann's `twistd -n agentcall-listen` runs; `agentcall call` hands the call to it
  over its local socket when the CLI supports that (the thin client), with warm keys (one call
  first, not counted). Which path a call really took is read from the proxy: a new caller-leg
  connection during the call means the CLI dialled the relay itself.

Run: ``.venv/bin/python bench/callpath_bench.py --quick`` (3 calls per point, ~1 min) or without
``--quick`` (10 calls). See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for _path in (str(REPO), str(BENCH)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import delayproxy  # noqa: E402
import relayproc  # noqa: E402

BIN = Path(sys.executable).parent
ORG = "bench"
INSTANT = shlex.join(["sh", "-c", "cat >/dev/null; echo instant"])
WAIT_S = 60.0  # bounds every wait for a process's readiness line
CALL_TIMEOUT_S = 60.0


class BenchError(Exception):
    pass


def child_env(home: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCALL_")}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env["PYTHONPATH"] = str(REPO)
    if home is not None:
        env["HOME"] = str(home)
    return env


class Child:
    """A process of the bench: its output in a log file; stopped by :meth:`stop`, always."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, **popen: Any) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=relayproc._die_with_parent,
                **popen,
            )

    def text(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def wait_for(self, pattern: str, timeout_s: float = WAIT_S, since: int = 0) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if match := regex.search(self.text()[since:]):
                return match
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        tail = "\n".join(self.text().splitlines()[-15:])
        raise BenchError(f"{self.name} did not log {pattern!r} within {timeout_s:g} s:\n{tail}")

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return self.process.returncode


class World:
    """The relay, the proxy (optional), ann and ken, and every process started for them."""

    def __init__(self, root: Path, *, proxy: bool) -> None:
        self.root = root
        self.children: list[Child] = []
        self.relay_port = relayproc.free_port()
        self.public_port = relayproc.free_port() if proxy else self.relay_port
        self.url = f"http://127.0.0.1:{self.public_port}"
        self.events = root / "proxy-events.jsonl"
        self.control = root / "proxy-control.json"
        self.proxy: Child | None = None
        self.with_proxy = proxy
        self.ann_service: Child | None = None
        self.homes = {"ann": root / "ann", "ken": root / "ken"}

    def start(self, listener_service: str = "twistd") -> None:
        root = self.root
        for home in self.homes.values():
            home.mkdir()
        invite = self.cli(
            "ann",
            "relay",
            "bootstrap",
            "--database",
            str(root / "relay.sqlite"),
            "--org",
            ORG,
            "--url",
            self.url,
        )
        relay = self.spawn(
            "relay",
            [
                str(BIN / "twistd"),
                "-n",
                "--pidfile=",
                "--logfile=-",
                "agentcall-relay",
                "--database",
                str(root / "relay.sqlite"),
                "--listen",
                f"tcp:{self.relay_port}:interface=127.0.0.1",
                "--url",
                self.url,
                "--calls-per-hour",
                "1000",
            ],
            child_env(),
        )
        relay.wait_for(r"relay_listening port=")
        self.relay = relay
        if self.with_proxy:
            self.set_delay(0.0)
            self.proxy = self.spawn(
                "proxy",
                [
                    sys.executable,
                    str(BENCH / "delayproxy.py"),
                    "--listen",
                    f"127.0.0.1:{self.public_port}",
                    "--target",
                    f"127.0.0.1:{self.relay_port}",
                    "--delay-ms",
                    "0",
                    "--leg",
                    "ken=listener",
                    "--leg",
                    "ann=caller",
                    "--default-leg",
                    "caller",
                    "--events",
                    str(self.events),
                    "--control",
                    str(self.control),
                    "--max-seconds",
                    "1800",
                ],
                child_env(),
            )
            self.proxy.wait_for(r"delayproxy_listening")
        agent = ["--agent", "command", "--agent-command", INSTANT]
        common = ["--skip-service", "--no-verify"]
        self.cli("ann", "setup", "--invite", invite, "--handle", "ann", *agent, *common)
        ken_invite = self.cli("ann", "invite", "create")
        self.cli("ken", "setup", "--invite", ken_invite, "--handle", "ken", *agent, *common)
        self.start_listener("ken")

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str], **kw: Any) -> Child:
        child = Child(name, argv, self.root / f"{name}.log", env=env, **kw)
        self.children.append(child)
        return child

    def start_listener(self, who: str) -> Child:
        home = self.homes[who]
        child = self.spawn(
            f"{who}-listener",
            [str(BIN / "twistd"), "-n", "--pidfile=", "--logfile=-", "agentcall-listen"],
            child_env(home),
            cwd=home,
        )
        child.wait_for(r"relay_connected")
        return child

    def start_ann_service(self) -> None:
        if self.ann_service is None:
            self.ann_service = self.start_listener("ann")

    def stop_ann_service(self) -> None:
        if self.ann_service is not None:
            self.ann_service.stop()
            self.children.remove(self.ann_service)
            self.ann_service = None

    def cli(self, who: str, *argv: str, timeout: float = CALL_TIMEOUT_S) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "agentcall", *argv],
            env=child_env(self.homes[who]),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.homes[who],
        )
        if done.returncode != 0:
            raise BenchError(f"agentcall {argv[0]} ({who}) failed: {done.stderr.strip()[-800:]}")
        return done.stdout.strip()

    def set_delay(self, delay_ms: float) -> None:
        """Every leg's one-way delay; waits (bounded) until the proxy has taken it."""
        self.control.write_text(json.dumps({"delay_ms": {"*": delay_ms}}), encoding="utf-8")
        if self.proxy is None:
            return
        before = len(delayproxy.read_events(self.events))
        self.proxy.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            configs = [
                e for e in delayproxy.read_events(self.events)[before:] if e.get("ev") == "config"
            ]
            if configs and configs[-1]["delay_ms"].get("*") == delay_ms:
                return
            time.sleep(0.02)
        raise BenchError("the proxy did not take the new delay")

    def call(self) -> dict[str, Any]:
        """One `agentcall call` by ann to ken: wall ms and, with the proxy, the legs' counts."""
        started = time.monotonic()
        out = self.cli("ann", "call", f"@{ORG}/ken", "instant question")
        ended = time.monotonic()
        if "instant" not in out:
            raise BenchError(f"unexpected answer: {out[:200]!r}")
        sample: dict[str, Any] = {"wall_ms": round((ended - started) * 1000, 1)}
        if self.with_proxy:
            time.sleep(0.2)  # the proxy's last events of the call (its close) are being written
            counts = delayproxy.summarize(delayproxy.read_events(self.events), started, ended)
            sample["legs"] = {leg: c.as_dict() for leg, c in sorted(counts.items())}
        return sample

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()
        self.children.clear()


def agent_time_ms(runs: int) -> float:
    """The instant agent on its own: the command the listener runs, with a prompt on stdin."""
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(
            ["sh", "-c", "cat >/dev/null; echo instant"],
            input=b"prompt",
            capture_output=True,
            check=True,
            timeout=30,
        )
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 1)


def summarize_point(samples: list[dict[str, Any]]) -> dict[str, Any]:
    walls = sorted(s["wall_ms"] for s in samples)
    point: dict[str, Any] = {
        "calls": len(samples),
        "wall_ms_p50": round(statistics.median(walls), 1),
        "wall_ms_min": walls[0],
        "wall_ms_max": walls[-1],
    }
    legs: dict[str, Any] = {}
    for leg in ("caller", "listener"):
        per = [s.get("legs", {}).get(leg, {}) for s in samples]
        if not any(per):
            continue
        legs[leg] = {
            key: statistics.median(p.get(key, 0) for p in per)
            for key in ("round_trips", "handshakes", "bursts", "connections_used")
        }
    if legs:
        point["legs"] = legs
        direct = [s for s in samples if s.get("legs", {}).get("caller", {}).get("handshakes")]
        point["caller_dialled_relay"] = f"{len(direct)}/{len(samples)}"
    return point


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="3 calls per point")
    p.add_argument("--calls", type=int, help="calls per point (10; --quick 3)")
    p.add_argument("--delay-ms", type=float, default=25.0, help="one-way delay per leg (25)")
    p.add_argument("--paths", default="direct,service", help="comma list of direct,service (both)")
    p.add_argument("--results-dir", type=Path, default=BENCH / "results")
    p.add_argument("--keep-workdir", action="store_true")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    calls = args.calls or (3 if args.quick else 10)
    paths = [x for x in args.paths.split(",") if x]
    if not set(paths) <= {"direct", "service"} or not 1 <= calls <= 200:
        p.error("--paths takes direct and/or service; --calls 1..200")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    machine = relayproc.machine_facts()
    print(f"AgentCall call-path benchmark ({'quick' if args.quick else 'full'}) {stamp}")
    workdir = Path(tempfile.mkdtemp(prefix="agentcall-callpath-"))
    world = World(workdir, proxy=True)
    result: dict[str, Any] = {
        "kind": "callpath",
        "timestamp": stamp,
        "quick": args.quick,
        "machine": machine,
        "checkout": relayproc.checkout_facts(),
        "load_avg_start": os.getloadavg(),
        "options": {"calls": calls, "delay_ms": args.delay_ms, "paths": paths},
    }
    status = 1
    try:
        world.start()
        agent_ms = agent_time_ms(max(5, calls))
        result["agent_ms"] = agent_ms
        print(f"  · relay, proxy, ken's listener up; the instant agent alone: {agent_ms} ms")
        points = []
        for path in paths:
            if path == "service":
                world.start_ann_service()
            else:
                world.stop_ann_service()
            world.set_delay(0.0)
            world.call()  # warm: pins ken's keys on first contact; not part of the figures
            for delay in (0.0, args.delay_ms):
                world.set_delay(delay)
                samples = [world.call() for _ in range(calls)]
                point = summarize_point(samples)
                rtt = 2 * delay
                point.update(
                    path=path,
                    delay_ms=delay,
                    rtt_ms=rtt,
                    floor_ms=round(agent_ms + 2 * rtt, 1),
                )
                point["over_floor_ms"] = round(point["wall_ms_p50"] - point["floor_ms"], 1)
                points.append(point)
                print(f"  · {path} at {delay:g} ms one way: {point_line(point)}", flush=True)
        world.stop_ann_service()
        for path in paths:
            at = {pt["delay_ms"]: pt for pt in points if pt["path"] == path}
            if 0.0 in at and args.delay_ms in at and args.delay_ms > 0:
                extra = at[args.delay_ms]["wall_ms_p50"] - at[0.0]["wall_ms_p50"]
                at[args.delay_ms]["network_cost_ms"] = round(extra, 1)
                at[args.delay_ms]["network_cost_rtts"] = round(extra / (2 * args.delay_ms), 2)
        result["points"] = points
        status = 0
    except KeyboardInterrupt:
        print("\ninterrupted")
        status = 130
    except (BenchError, subprocess.TimeoutExpired) as exc:
        print(f"bench failed: {exc}")
    finally:
        world.stop()
        if args.keep_workdir:
            print(f"  work dir kept: {workdir}")
        else:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    if status == 0:
        result["load_avg_end"] = os.getloadavg()
        print(report(result))
        args.results_dir.mkdir(parents=True, exist_ok=True)
        out = args.results_dir / f"callpath-{stamp}.json"
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"results: {out}")
    return status


def point_line(pt: dict[str, Any]) -> str:
    legs = pt.get("legs", {})
    rts = ", ".join(
        f"{leg} {c['round_trips']:g} RT ({c['handshakes']:g} conn + {c['bursts']:g} bursts)"
        for leg, c in legs.items()
    )
    return (
        f"wall p50 {pt['wall_ms_p50']} ms (min {pt['wall_ms_min']}); floor {pt['floor_ms']} ms;"
        f" {rts}; caller dialled the relay in {pt.get('caller_dialled_relay', '?')} calls"
    )


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def report(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        "",
        f"== AgentCall call path over a simulated network · {r['timestamp']}"
        + (" · QUICK" if r["quick"] else ""),
        f"machine  {m['cpu_model']} · {m['cores']} cores · Python {m['python']} · Twisted"
        f" {m['twisted']} · autobahn {m['autobahn']} · load {r['load_avg_start'][0]:.2f}",
        f"agent    the instant agent alone: {r['agent_ms']} ms (median)",
        "floor    agent + one round trip per leg (caller-relay, relay-listener)",
        "path      one-way   wall p50 (min)      floor    over    network cost"
        "      caller RT   listener RT   dialled",
    ]
    for pt in r["points"]:
        legs = pt.get("legs", {})
        cost = (
            f"{pt['network_cost_ms']} ms = {pt['network_cost_rtts']} RTT"
            if "network_cost_ms" in pt
            else "-"
        )
        lines.append(
            f"{pt['path']:<9} {pt['delay_ms']:>5g} ms  {pt['wall_ms_p50']:>7} ({pt['wall_ms_min']})"
            f"  {pt['floor_ms']:>7}  {pt['over_floor_ms']:>6}  {cost:<18}"
            f"  {legs.get('caller', {}).get('round_trips', '-'):>8}"
            f"  {legs.get('listener', {}).get('round_trips', '-'):>10}"
            f"     {pt.get('caller_dialled_relay', '?')}"
        )
    lines.append(
        "RT       per leg: TCP connections opened + bursts/2 during the call (delayproxy.py);"
        " 'dialled' = calls whose CLI opened its own connection to the relay (not the service)"
    )
    lines.append(
        "target   via the service, warm keys: at most one RT per leg beyond the agent's time"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
