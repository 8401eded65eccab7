"""Faults, handled (issue 25): `kill -9` of the relay and the listeners at seeded moments.

A real relay, two callees (ken, rita: a fake claude that answers after a short while, echoing
the caller's message) who opted in to offline delivery, and two callers (ann, bob). A driver
with ``random.Random(seed)`` takes a fixed number of steps, each one of: a burst of calls (the
first to an idle callee is answered live, the rest are queued), let the work run until a
listener's result is confirmed, SIGKILL or SIGTERM a listener and start it again, SIGKILL the
relay and start it again (same port and database), or SIGKILL all three. A kill lands at once
or just after an event it waits for: a listener's delivery, accept, sealed result, confirmed
result or reconnection; the relay's delivery, stored result, or a listener attaching (the
reconciliation of what it holds). The driver never sleeps: every wait is for a log line, a
process exit or a `jobs get --wait` long-poll.

Then every acknowledged job must end, and the run must show:

- every acknowledged job answered (with its own question's answer) or failed
  ``indeterminate_execution`` or ``delivery_failed``; never expired, cancelled or anything else;
- no agent run twice for one message, no run on the wrong callee, none for a call that was not
  taken, none for a job that ended ``delivery_failed``, exactly one for an answered job;
- no answer carrying another message's token (cross-wiring);
- the relay's jobs are exactly the acknowledged ones, with at most three attempts each;
- no message or answer in plaintext in any of the relay's database files;
- no traceback in the relay's log, a listener's log or any CLI's output; every SIGTERM'd
  listener stopped by itself;
- no stall: a connected listener with jobs outstanding confirms a result within a minute.

A run's trace (steps, moments, outcomes) is in ``fault-trace.txt`` beside its logs.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentcall import limits
from tests.e2e.installs import Install, World, two_people
from tests.e2e.processes import LogFollower

pytestmark = pytest.mark.e2e

SEEDS = (25, 2026)
STEPS = 26
# Long enough that kills often land while an agent runs, short enough that the queue drains.
AGENT_SECONDS = 1.5
# Bounds on waits for events; a loaded machine is only slower, a missed event is logged.
MOMENT_WAIT_S = 15.0  # a kill's moment (the event it waits for) that does not come: kill anyway
# A listener's reconnect delay grows with each dial that finds the relay down (to 60 s at most).
RECONNECT_WAIT_S = 180.0
PROGRESS_WAIT_S = 60.0  # a "let it run" step: a result confirmed within this, or a stall
SETTLE_WAIT_S = 60  # one `jobs get --wait` in the final phase
SETTLE_ROUNDS = 6  # ... and at most this many of them per job
CALL_WAIT_S = 300  # one `agentcall call` (at most 420 s; one answered live takes seconds)
PENDING_EXIT = 75
ANSWER = "FAKE-AGENT-ANSWER"
ACCEPTED_FAILURES = frozenset({"indeterminate_execution", "delivery_failed"})
OUTSTANDING = ("queued", "delivered", "running")
# Where a listener's kill lands: at once, or just after the listener logs this event.
LISTENER_MOMENTS = (
    "job_delivered",
    "job_accepted",
    "job_result",
    "job_acknowledged",
    "relay_connected",
)
TOKEN = re.compile(r"\bF\d{4}-\d{3}-[0-9a-f]{8}\b")


@attrs.define
class Sent:
    """One `agentcall call`: what was asked, and what the CLI said."""

    n: int
    caller: Install
    callee: Install
    message: str
    token: str
    job_id: str | None = None  # acknowledged: queued as this job
    live: dict[str, Any] | None = None  # answered live, not queued
    refused: dict[str, Any] | None = None  # not taken (busy, an error)
    ended: dict[str, Any] | None = None  # the job's terminal `jobs get --json`

    @property
    def address(self) -> str:
        return f"@acme/{self.callee.name}"

    @property
    def expected_answer(self) -> str:
        return f"{ANSWER}: {self.message}"


@attrs.define
class FaultDriver:
    """Takes the seeded steps, records every call and what became of it, then checks the run;
    what it finds wrong goes to ``violations`` (all of it reported at once, with the trace)."""

    world: World
    callers: tuple[Install, ...]
    callees: tuple[Install, ...]
    rng: random.Random
    seed: int
    sent: list[Sent] = attrs.field(factory=list)
    trace: list[str] = attrs.field(factory=list)
    violations: list[str] = attrs.field(factory=list)
    cli_errors: list[str] = attrs.field(factory=list)
    started: float = attrs.field(factory=time.monotonic)

    # --- bookkeeping ------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.trace.append(f"{time.monotonic() - self.started:7.2f}s {text}")

    def cli(
        self, who: Install, *args: str, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        done = who.cli(*args, timeout=timeout)
        if "Traceback" in done.stderr or "Traceback" in done.stdout:
            self.cli_errors.append(f"{who.name} {' '.join(args)}:\n{done.stderr}{done.stdout}")
        return done

    def relay_jobs(self) -> dict[str, tuple[str, str | None, int, str]]:
        """The relay's jobs, read from its database: job_id -> (state, reason, attempts,
        callee)."""
        uri = f"file:{self.world.relay.database}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as db:
            rows = db.execute("SELECT job_id, state, reason, attempts, callee FROM jobs").fetchall()
        return {row[0]: (row[1], row[2], row[3], row[4]) for row in rows}

    def outstanding(self, callee: Install, states: tuple[str, ...] = OUTSTANDING) -> int:
        """How many of ``callee``'s jobs the relay has in one of ``states`` now."""
        try:
            jobs = self.relay_jobs()
        except sqlite3.Error as exc:
            self.note(f"relay database unreadable ({exc}); assuming work is outstanding")
            return 1
        return sum(state in states and who == callee.name for state, _, _, who in jobs.values())

    def listener_log(self, callee: Install) -> LogFollower:
        assert callee.listener is not None
        return callee.listener.log

    def connected(self, callee: Install) -> bool:
        """Whether ``callee``'s listener last said it was connected to the relay."""
        said = re.findall(r"relay_(?:dis)?connected", self.listener_log(callee).text())
        return bool(said) and said[-1] == "relay_connected"

    def wait_connected(self, callee: Install) -> None:
        """Return once ``callee``'s listener is connected to the relay (as its log says)."""
        log = self.listener_log(callee)
        mark = log.mark()
        if not self.connected(callee):
            log.wait_for(r"relay_connected", RECONNECT_WAIT_S, since=mark)

    def wait_moment(self, log: LogFollower, pattern: str, since: int, what: str) -> None:
        try:
            log.wait_for(pattern, MOMENT_WAIT_S, since=since)
        except (TimeoutError, RuntimeError) as exc:
            self.note(f"  moment {what} not reached ({exc}); acting anyway")

    # --- steps ------------------------------------------------------------------------------

    def step_queue(self) -> None:
        """A burst of one to four calls at once: the first to reach an idle callee is answered
        live, the others find it busy and are queued (so is any call to a callee whose
        listener is away)."""
        burst: list[tuple[Sent, subprocess.Popen[str]]] = []
        for _ in range(self.rng.randint(1, 4)):
            caller = self.rng.choice(self.callers)
            callee = self.rng.choice(self.callees)
            n = len(self.sent)
            token = f"F{self.seed % 10000:04d}-{n:03d}-{self.rng.getrandbits(32):08x}"
            sent = Sent(n, caller, callee, f"fault drill {token}: answer me once", token)
            self.sent.append(sent)
            burst.append((sent, caller.cli_async("call", sent.address, sent.message, "--json")))
        for sent, process in burst:
            stdout, stderr = process.communicate(timeout=CALL_WAIT_S)
            self.record_call(sent, process.returncode, stdout, stderr)

    def record_call(self, sent: Sent, code: int, stdout: str, stderr: str) -> None:
        if "Traceback" in stdout + stderr:
            self.cli_errors.append(f"{sent.caller.name} call {sent.token}:\n{stderr}{stdout}")
        what = f"call {sent.caller.name}->{sent.callee.name} {sent.token}"
        try:
            body: dict[str, Any] = json.loads(stdout) if stdout.strip() else {}
        except ValueError:
            self.violations.append(f"{what} printed no JSON with --json: {stdout!r} {stderr!r}")
            body = {}
        if code == 0 and body.get("queued"):
            sent.job_id = str(body["job_id"])
            self.note(f"{what}: queued as job {sent.job_id}")
        elif code == 0:
            sent.live = body
            self.note(f"{what}: answered live")
        else:
            sent.refused = body or {"exit": code, "stderr": stderr}
            self.note(f"{what}: refused {sent.refused}")

    def step_let_run(self) -> None:
        busy = [callee for callee in self.callees if self.outstanding(callee)]
        if not busy:
            self.note("let run: nothing outstanding")
            return
        callee = self.rng.choice(busy)
        log = self.listener_log(callee)
        mark = log.mark()
        self.wait_connected(callee)
        try:
            log.wait_for(r"job_acknowledged", PROGRESS_WAIT_S, since=mark)
            self.note(f"let run: {callee.name} had a result confirmed")
        except TimeoutError:
            stalled = {job: row for job, row in self.relay_jobs().items() if row[0] in OUTSTANDING}
            self.violations.append(
                f"stall: {callee.name}'s listener confirmed no result within "
                f"{PROGRESS_WAIT_S:g}s while the relay held {stalled}"
            )
            self.note(f"let run: STALL on {callee.name}")

    def kill_listener(self, callee: Install, sig: signal.Signals) -> None:
        listener = callee.listener
        assert listener is not None
        mark = listener.log.mark()
        # Only moments that can come: a delivery (and its accept) needs a queued job; a result,
        # any job not ended; a reconnection (the listener then says what it holds), a listener
        # away from the relay.
        queued = self.outstanding(callee, ("queued",)) > 0
        pending = self.outstanding(callee) > 0
        possible = {
            "job_delivered": queued,
            "job_accepted": queued,
            "job_result": pending,
            "job_acknowledged": pending,
            "relay_connected": not self.connected(callee),
        }
        moment = self.rng.choice(["now", *(m for m in LISTENER_MOMENTS if possible[m])])
        if moment != "now":
            # \b: "job_result" is not "job_results_resent".
            self.wait_moment(listener.log, rf"{moment}\b", mark, f"{callee.name} {moment}")
        if sig == signal.SIGKILL:
            listener.process.send_signal(signal.SIGKILL)
            listener.process.wait(timeout=30)
        else:
            began = time.monotonic()
            listener.process.send_signal(signal.SIGTERM)
            try:
                listener.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.violations.append(
                    f"{callee.name}'s listener did not stop within 60 s of SIGTERM"
                )
                listener.process.kill()
                listener.process.wait(timeout=30)
            code = listener.process.returncode
            self.note(f"  SIGTERM took {time.monotonic() - began:.2f}s, exit {code}")
            # twistd ends itself with the signal that stopped it, once it has shut down.
            if code not in (0, -signal.SIGTERM):
                self.violations.append(f"{callee.name}'s listener exited {code} on SIGTERM")
            try:
                listener.log.wait_for(r"listener_stopped", 10, since=mark)
            except (TimeoutError, RuntimeError):
                self.violations.append(f"{callee.name}'s listener stopped without its last word")
        self.note(f"{sig.name} {callee.name}'s listener at {moment}")
        callee.start_listener()

    def step_kill_listener(self) -> None:
        self.kill_listener(self.rng.choice(self.callees), signal.SIGKILL)

    def step_term_listener(self) -> None:
        self.kill_listener(self.rng.choice(self.callees), signal.SIGTERM)

    def step_kill_relay(self) -> None:
        relay = self.world.relay
        # Marks first, so an event logged while the state is read still counts.
        relay_mark = relay.log.mark()
        marks = {callee.name: self.listener_log(callee).mark() for callee in self.callees}
        queued = [c for c in self.callees if self.outstanding(c, ("queued",))]
        pending = [c for c in self.callees if self.outstanding(c)]
        away = [c for c in self.callees if not self.connected(c)]
        candidates: list[tuple[str, LogFollower, str, int]] = [("now", relay.log, "", 0)]
        if queued:
            candidates.append(("delivered", relay.log, r"job_delivered", relay_mark))
        if pending:
            sealer = self.rng.choice(pending)
            sealing = (self.listener_log(sealer), r"job_result\b", marks[sealer.name])
            candidates.append(("sealed", *sealing))
            candidates.append(("stored", relay.log, r"job_result_stored", relay_mark))
        if away:
            # While a returning listener says what it holds and the relay reconciles.
            who = self.rng.choice(away).name
            attached = rf"listener_attached org='acme' handle='{who}'"
            candidates.append(("attached", relay.log, attached, relay_mark))
        moment, log, pattern, since = self.rng.choice(candidates)
        if moment != "now":
            self.wait_moment(log, pattern, since, moment)
        marks = {callee.name: self.listener_log(callee).mark() for callee in self.callees}
        relay.process.send_signal(signal.SIGKILL)
        relay.process.wait(timeout=30)
        relay.restart()
        self.note(f"SIGKILL relay at {moment}; restarted")
        if self.rng.random() < 0.5:
            # Or not: calls queued meanwhile wait in the mailbox for the listeners to return.
            for callee in self.callees:
                log = self.listener_log(callee)
                log.wait_for(r"relay_connected", RECONNECT_WAIT_S, since=marks[callee.name])
            self.note("  both listeners connected again")

    def step_crash_all(self) -> None:
        relay = self.world.relay
        for callee in self.callees:
            assert callee.listener is not None
            callee.listener.process.send_signal(signal.SIGKILL)
        relay.process.send_signal(signal.SIGKILL)
        relay.process.wait(timeout=30)
        for callee in self.callees:
            assert callee.listener is not None
            callee.listener.process.wait(timeout=30)
        relay.restart()
        for callee in self.callees:
            callee.start_listener()
        self.note("SIGKILL relay and both listeners; all restarted")

    def run(self, steps: int) -> None:
        actions: list[tuple[Callable[[], None], int]] = [
            (self.step_queue, 8),
            (self.step_let_run, 3),
            (self.step_kill_listener, 3),
            (self.step_term_listener, 2),
            (self.step_kill_relay, 3),
            (self.step_crash_all, 1),
        ]
        for _ in range(steps):
            (action,) = self.rng.choices(
                [a for a, _ in actions], weights=[w for _, w in actions], k=1
            )
            action()

    # --- the end ----------------------------------------------------------------------------

    def settle_one(self, sent: Sent) -> None:
        assert sent.job_id is not None
        for _ in range(SETTLE_ROUNDS):
            done = self.cli(
                sent.caller,
                "jobs",
                "get",
                sent.address,
                sent.job_id,
                "--wait",
                str(SETTLE_WAIT_S),
                "--json",
                timeout=SETTLE_WAIT_S + 60,
            )
            if done.returncode == PENDING_EXIT:
                continue
            try:
                sent.ended = json.loads(done.stdout)
            except ValueError:
                sent.ended = {"stdout": done.stdout, "stderr": done.stderr}
            sent.ended["rc"] = done.returncode
            return

    def settle(self) -> None:
        jobs = [sent for sent in self.sent if sent.job_id is not None]
        with ThreadPoolExecutor(max_workers=3) as pool:
            list(pool.map(self.settle_one, jobs))
        self.note(f"settled {len(jobs)} jobs")

    def check(self, logs: list[Path]) -> None:
        runs = self.agent_runs()
        relay_jobs = self.relay_jobs()
        acknowledged = {sent.job_id for sent in self.sent if sent.job_id is not None}
        if set(relay_jobs) != acknowledged:
            self.violations.append(
                f"the relay's jobs {sorted(relay_jobs)} are not the acknowledged "
                f"{sorted(acknowledged)}"
            )
        for sent in self.sent:
            self.check_one(sent, runs, relay_jobs)
        for token, callee in runs:
            if not any(sent.token == token for sent in self.sent):
                self.violations.append(f"{callee}'s agent ran unknown message {token}")
        for path in logs:
            text = path.read_text(errors="replace") if path.exists() else ""
            if "Traceback" in text:
                excerpt = text[max(text.index("Traceback") - 600, 0) :][:3000]
                self.violations.append(f"a traceback in {path}:\n{excerpt}")
        self.violations.extend(f"a traceback from the CLI: {e}" for e in self.cli_errors)
        database = self.world.relay.database
        for path in database.parent.iterdir():
            if not path.name.startswith(database.name):
                continue
            data = path.read_bytes()
            for needle in [ANSWER] + [sent.token for sent in self.sent]:
                if needle.encode() in data:
                    self.violations.append(f"plaintext {needle!r} in the relay's {path.name}")

    def summary(self) -> str:
        outcomes = Counter(
            str(sent.ended.get("reason") or sent.ended.get("state")) if sent.ended else "unended"
            for sent in self.sent
            if sent.job_id is not None
        )
        live = sum(sent.live is not None for sent in self.sent)
        refused = sum(sent.refused is not None for sent in self.sent)
        return f"jobs: {dict(outcomes)}; live calls: {live}; refused: {refused}"

    def agent_runs(self) -> Counter[tuple[str, str]]:
        """(token, callee) -> how many agent processes started with that message."""
        runs: Counter[tuple[str, str]] = Counter()
        for callee in self.callees:
            for run in callee.agent_runs():
                for token in set(TOKEN.findall(str(run.get("prompt", "")))):
                    runs[(token, callee.name)] += 1
        return runs

    def check_one(
        self,
        sent: Sent,
        runs: Counter[tuple[str, str]],
        relay_jobs: dict[str, tuple[str, str | None, int, str]],
    ) -> None:
        what = f"{sent.token} ({sent.caller.name}->{sent.callee.name}, job {sent.job_id})"
        here = runs[(sent.token, sent.callee.name)]
        elsewhere = sum(
            n for (t, c), n in runs.items() if t == sent.token and c != sent.callee.name
        )
        if elsewhere:
            self.violations.append(f"{what} ran on another callee's agent")
        if here > 1:
            self.violations.append(f"{what} ran {here} times")
        if sent.refused is not None:
            if here:
                self.violations.append(f"{what} was refused {sent.refused} yet ran")
            return
        if sent.live is not None:
            self.check_answer(what, sent, sent.live, here)
            return
        assert sent.job_id is not None
        ended = sent.ended
        if ended is None:
            self.violations.append(f"{what} did not end within the settle bound")
            return
        row = relay_jobs.get(sent.job_id)
        if row is not None and row[2] > limits.MAILBOX_MAX_ATTEMPTS:
            self.violations.append(f"{what} was delivered {row[2]} times")
        if row is not None and row[0] != ended.get("state"):
            self.violations.append(f"{what} ended {ended.get('state')} but the relay has {row}")
        if ended.get("job_id") != sent.job_id:
            self.violations.append(f"{what}: `jobs get` answered for {ended.get('job_id')}")
        state = ended.get("state")
        if state == "answered":
            self.check_answer(what, sent, ended, here)
        elif state == "failed" and ended.get("reason") in ACCEPTED_FAILURES:
            if ended["reason"] == "delivery_failed" and here:
                self.violations.append(f"{what} ended delivery_failed, yet its agent ran")
        else:
            self.violations.append(f"{what} ended {ended}")

    def check_answer(self, what: str, sent: Sent, body: dict[str, Any], runs: int) -> None:
        text = str(body.get("text"))
        if body.get("ok") is not True or text != sent.expected_answer:
            others = [s.token for s in self.sent if s.token != sent.token and s.token in text]
            self.violations.append(f"{what} answered {body} (other messages' tokens: {others})")
        if runs != 1:
            self.violations.append(f"{what} was answered after {runs} agent runs")


def _enrol(world: World, name: str, *extra: str) -> Install:
    person = Install(name, world.root / name, world.relay.ca_file)
    person.setup(world.invite(), name, *extra)
    return person


@contextlib.contextmanager
def _drill_world(root: Path) -> Iterator[tuple[World, tuple[Install, ...], tuple[Install, ...]]]:
    """ann and bob call; ken and rita answer with a slow fake claude, and opted in."""
    with two_people(root) as world:
        bob = _enrol(world, "bob", "--caller-only")
        rita = _enrol(world, "rita", "--agent", "claude")
        callees = (world.ken, rita)
        try:
            for callee in callees:
                callee.set_scenario({"name": "slow", "seconds": AGENT_SECONDS})
                done = callee.cli("access", "--offline", "enabled")
                assert done.returncode == 0, done.stderr
                callee.start_listener()
            yield world, (world.ann, bob), callees
        finally:
            rita.stop()


@pytest.mark.parametrize("seed", SEEDS)
def test_kills_at_seeded_moments_lose_no_job_and_run_none_twice(tmp_path: Path, seed: int) -> None:
    with _drill_world(tmp_path) as (world, callers, callees):
        driver = FaultDriver(world, callers, callees, random.Random(seed), seed)
        try:
            driver.run(STEPS)
            driver.settle()
        finally:
            for callee in callees:
                callee.stop()
            (tmp_path / "fault-trace.txt").write_text("\n".join(driver.trace) + "\n")
        world.relay.stop()
        logs = [world.relay.database.parent / "relay.log"]
        logs += [callee.root / "listener.log" for callee in callees]
        driver.check(logs)
        driver.note(driver.summary())
        (tmp_path / "fault-trace.txt").write_text("\n".join(driver.trace) + "\n")
        print("\n".join(driver.trace))
        assert not driver.violations, "\n\n".join([*driver.violations, "trace:", *driver.trace])
