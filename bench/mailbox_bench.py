"""AgentCall offline-mailbox benchmark: enqueue and delivery throughput, bytes stored per job.

Run from the checkout: ``.venv/bin/python bench/mailbox_bench.py [--quick] ...``.
See bench/README.md ("Offline mailbox") for what is measured and how to read the figures.

Against a real ``twistd -n agentcall-relay`` on loopback, with identities seeded straight through
the store (the callees opted in to offline delivery there) and real sealed envelopes:

1. enqueue: K callers send ``call_request {queue: true}`` to offline callees; ``call_queued``/s;
2. deliver: the callees attach with ``?role=listen&mailbox=1`` and answer every
   ``job_delivery`` with ``job_accepted`` and a sealed ``job_result``; ``job_ack``/s end to end;
3. bytes: the relay database's growth per queued (and per answered) job, next to the sealed
   bytes alone;
4. fetch: ``GET /v1/jobs/<id>`` latency for the callers, each answer opened and checked.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for _path in (str(REPO), str(BENCH)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from twisted.internet import epollreactor  # noqa: E402

epollreactor.install()

import attrs  # noqa: E402
import loadgen  # noqa: E402
import relayproc  # noqa: E402
from seeding import Identity, seed_identities  # noqa: E402
from twisted.internet import defer  # noqa: E402

from agentcall import ids, limits  # noqa: E402
from agentcall.client import ws  # noqa: E402
from agentcall.client.api import RelayApi  # noqa: E402
from agentcall.crypto import envelope  # noqa: E402
from agentcall.relay.store import open_relay_store  # noqa: E402
from agentcall.relayurl import RelayUrl  # noqa: E402
from agentcall.wire import codec, frames, http, payloads  # noqa: E402

ORG = "bench"
now = time.monotonic
CALL_TIMEOUT_S = 30.0
SETTLE_S = 1.0

DEFAULTS = {"callers": 400, "callees": 80, "jobs_per_caller": 10, "rounds": 3, "fetches": 300}
QUICK = {"callers": 60, "callees": 12, "jobs_per_caller": 10, "rounds": 2, "fetches": 50}


class BenchError(Exception):
    """The run cannot go on (the relay died, a phase did not complete)."""


# --- options -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="mailbox_bench.py",
        description="Benchmark the offline mailbox of a real `twistd -n agentcall-relay`.",
    )
    p.add_argument("--callers", "-K", type=int, help="caller identities (400)")
    p.add_argument("--callees", "-M", type=int, help="opted-in callee identities (80)")
    p.add_argument(
        "--jobs-per-caller",
        "-J",
        type=int,
        help=f"jobs each caller queues per round (10; at most the cap of"
        f" {limits.MAILBOX_MAX_OUTSTANDING_PER_CALLER} outstanding)",
    )
    p.add_argument("--rounds", type=int, help="enqueue+deliver rounds on one database (3)")
    p.add_argument("--fetches", type=int, help="GET /v1/jobs/<id> timed after the last round")
    p.add_argument("--concurrency", "-C", type=int, default=16, help="enqueue calls in flight")
    p.add_argument("--open-window", type=int, default=32, help="listeners dialling at once")
    p.add_argument("--message-bytes", type=int, default=1000, help="request text size (1000)")
    p.add_argument("--answer-bytes", type=int, default=1000, help="answer text size (1000)")
    p.add_argument(
        "--seal-inline",
        action="store_true",
        help="listeners open each request and seal its answer on delivery (like a real"
        " listener; the bench's CPU then bounds the delivery rate) instead of beforehand",
    )
    p.add_argument(
        "--calls-per-hour",
        type=int,
        default=limits.CALLS_PER_HOUR_PER_PAIR,
        help=f"the relay's pair rate cap ({limits.CALLS_PER_HOUR_PER_PAIR}, the product's)",
    )
    p.add_argument("--quick", action="store_true", help="small numbers: a smoke run in ~30 s")
    p.add_argument("--phase-budget", type=float, default=300.0, help="seconds per phase (300)")
    p.add_argument("--results-dir", type=Path, default=BENCH / "results")
    p.add_argument("--keep-workdir", action="store_true", help="keep the temp dir (db, log)")
    args = p.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    for name, value in base.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("callers", "callees", "jobs_per_caller", "rounds", "concurrency", "open_window"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.fetches < 0:
        p.error("--fetches must be at least 0")
    if args.jobs_per_caller > limits.MAILBOX_MAX_OUTSTANDING_PER_CALLER:
        p.error(
            f"--jobs-per-caller above the relay's cap of"
            f" {limits.MAILBOX_MAX_OUTSTANDING_PER_CALLER} outstanding jobs per caller"
        )
    if args.concurrency > args.callers:
        p.error("--concurrency above --callers would put two calls of one caller in flight")
    for name in ("message_bytes", "answer_bytes"):
        if not 1 <= getattr(args, name) <= 60_000:
            p.error(f"--{name.replace('_', '-')} must be 1..60000")
    per_callee = -(-args.callers * args.jobs_per_caller // args.callees)
    if per_callee > limits.MAILBOX_MAX_QUEUED_PER_CALLEE:
        p.error(
            f"{per_callee} jobs per callee exceeds the per-callee queue cap of"
            f" {limits.MAILBOX_MAX_QUEUED_PER_CALLEE}; use more --callees"
        )
    per_pair = args.rounds * -(-args.jobs_per_caller // args.callees)
    if per_pair > args.calls_per_hour:
        p.error(f"{per_pair} calls per pair exceeds --calls-per-hour {args.calls_per_hour}")
    return args


# --- statistics ----------------------------------------------------------------------------------


def percentile(ordered: Sequence[float], q: float) -> float:
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summary_ms(seconds: Sequence[float]) -> dict[str, float] | None:
    if not seconds:
        return None
    ordered = sorted(s * 1000 for s in seconds)
    return {
        "n": len(ordered),
        "p50": round(percentile(ordered, 0.50), 3),
        "p90": round(percentile(ordered, 0.90), 3),
        "p99": round(percentile(ordered, 0.99), 3),
        "max": round(ordered[-1], 3),
        "mean": round(statistics.fmean(ordered), 3),
    }


def _ms(s: dict[str, float] | None, *keys: str) -> str:
    if not s:
        return "-"
    return "/".join(f"{s[k]:.1f}" for k in keys)


# --- the jobs ------------------------------------------------------------------------------------


@attrs.define(eq=False)
class Job:
    """One queued call, from sealing to its fetched answer (monotonic stamps)."""

    caller: Identity
    callee: Identity
    sealed: frames.SealedEnvelope
    request: payloads.RequestPayload
    request_bytes: int  # the encoded SealedEnvelope: what the relay stores
    job_id: str | None = None
    sent: float | None = None  # call_request handed to the socket
    dialled: float | None = None
    queued: float | None = None  # call_queued arrived
    answer: frames.SealedEnvelope | None = None
    answer_bytes: int = 0
    delivered: float | None = None  # the listener got job_delivery
    result_sent: float | None = None  # job_accepted and job_result handed to the socket
    acked: float | None = None  # the listener got job_ack
    attempt: int = 0


def answer_text(job: Job, size: int) -> str:
    head = f"answer to {job.request.request_id}: "
    return (head + "x" * size)[:size] if size > len(head) else head


def seal_jobs(
    origin: str,
    callers: Sequence[Identity],
    callees: Sequence[Identity],
    per_caller: int,
    message_bytes: int,
    round_no: int,
) -> list[Job]:
    """Every job of one round, sealed now (not measured), in sending order: consecutive jobs
    come from different callers, and each caller's jobs go to different callees."""
    jobs: list[Job] = []
    k, m = len(callers), len(callees)
    for j in range(per_caller):
        for c, caller in enumerate(callers):
            callee = callees[(c * per_caller + j) % m]
            head = f"round {round_no} job {j} from {caller.handle}: "
            message = (head + "mailbox " * (message_bytes // 8 + 1))[:message_bytes]
            sealed, request = envelope.seal_request(
                sender=caller.identity,
                sender_address=caller.address,
                recipient_identity=callee.identity_record.record,
                recipient_encryption=callee.encryption_record.record,
                relay_origin=origin,
                message=message,
                task=None,
                context_id=None,
                now=time.time(),
                validity_s=limits.MAX_ENVELOPE_VALIDITY_S,
            )
            jobs.append(Job(caller, callee, sealed, request, len(codec.encode(sealed))))
    assert len(jobs) == k * per_caller
    return jobs


def seal_answer(job: Job, size: int) -> frames.SealedEnvelope:
    return envelope.seal_response(
        responder=job.callee.identity,
        request=job.request,
        outcome=payloads.Reply(text=answer_text(job, size)),
        caller_encryption=job.caller.encryption_record.record,
        now=time.time(),
        validity_s=limits.MAX_ENVELOPE_VALIDITY_S,
    )


# --- phase 1: enqueue ----------------------------------------------------------------------------


async def enqueue_one(env: loadgen.Env, job: Job) -> None:
    terminal: defer.Deferred[frames.Frame] = defer.Deferred()

    def on_frame(frame: frames.Frame) -> None:
        terminal_kinds = (frames.CallQueued, frames.CallError, frames.CallOutcome)
        if isinstance(frame, terminal_kinds) and not terminal.called:
            job.queued = now()
            terminal.callback(frame)

    def on_close(info: ws.SocketClosed) -> None:
        if not terminal.called:
            terminal.errback(RuntimeError(f"call socket closed without an answer ({info.code})"))

    job.dialled = now()
    socket = await ws.open_socket(
        env.reactor,
        env.relay_url,
        job.caller.credentials,
        frames.Role.CALL,
        to=job.callee.handle,
        ca_file=env.ca_file,
        on_frame=on_frame,
        on_close=on_close,
    )
    try:
        socket.send(
            frames.CallRequest(
                envelope=job.sealed, correlation_id=ids.mint_correlation_id(), queue=True
            )
        )
        job.sent = now()
        result = await terminal.addTimeout(CALL_TIMEOUT_S, env.reactor)
    finally:
        socket.close()
    if isinstance(result, frames.CallError):
        raise RuntimeError(f"call_error {result.code}: {result.detail}")
    if not isinstance(result, frames.CallQueued):
        raise RuntimeError(f"expected call_queued, got {result.type}")
    job.job_id = result.job_id


@attrs.define
class PhaseRun:
    ok: int
    failed: int
    elapsed_s: float
    timed_out: bool


async def run_enqueue(
    env: loadgen.Env, jobs: Sequence[Job], concurrency: int, budget_s: float
) -> PhaseRun:
    todo = iter(jobs)
    ok = failed = 0
    deadline = now() + budget_s

    async def worker() -> None:
        nonlocal ok, failed
        for job in todo:
            if now() > deadline:
                return
            try:
                await enqueue_one(env, job)
                ok += 1
            except Exception as exc:
                failed += 1
                env.error(f"enqueue: {type(exc).__name__}: {exc}")

    started = now()
    everything = defer.DeferredList(
        [defer.ensureDeferred(worker()) for _ in range(min(concurrency, len(jobs)))],
        consumeErrors=True,
    )
    everything.addTimeout(budget_s + CALL_TIMEOUT_S + 5, env.reactor)
    timed_out = False
    try:
        await everything
    except defer.TimeoutError:
        timed_out = True
    return PhaseRun(ok, failed, now() - started, timed_out or now() > deadline)


# --- phase 2: deliver ----------------------------------------------------------------------------


class Deliveries:
    """What every mailbox listener of one round shares: the jobs and the count of acks."""

    def __init__(self, env: loadgen.Env, jobs: Sequence[Job], answer_bytes: int, inline: bool):
        self.env = env
        self.jobs = {job.job_id: job for job in jobs if job.job_id is not None}
        self.answer_bytes = answer_bytes
        self.inline = inline
        self.acked = 0
        self.frames: Counter[str] = Counter()
        self.cycles: list[float] = []  # between two job_delivery frames to one listener
        # A job_delivery that arrived while the listener's previous result was not yet acked.
        self.delivered_before_ack = 0
        self.all_acked: defer.Deferred[None] = defer.Deferred()
        if not self.jobs:
            self.all_acked.callback(None)

    def ack(self, job: Job) -> None:
        job.acked = now()
        self.acked += 1
        if self.acked == len(self.jobs) and not self.all_acked.called:
            self.all_acked.callback(None)


class MailboxListener:
    """A callee's listener socket with ``mailbox=1``: takes every job, answers it at once."""

    def __init__(self, shared: Deliveries, me: Identity) -> None:
        self.shared = shared
        self.me = me
        self.socket: ws.ClientSocket | None = None
        self.closed: ws.SocketClosed | None = None
        self.last_delivery: float | None = None
        self.unacked: set[str] = set()

    def start(self) -> defer.Deferred[ws.ClientSocket]:
        env = self.shared.env
        query = {"role": str(frames.Role.LISTEN), "mailbox": "1"}
        # ws.open_socket has no mailbox flag (the listener's own connection adds it); the same
        # factory with the listener's query.
        factory = ws._RelayClientFactory(
            env.reactor,
            env.relay_url,
            self.me.credentials,
            frames.Role.LISTEN,
            query,
            handlers=(self._on_frame, self._on_close),
        )
        endpoint = ws.relay_endpoint(env.reactor, env.relay_url, env.ca_file)
        opening = factory.dial(endpoint, env.reactor)

        def opened(socket: ws.ClientSocket) -> ws.ClientSocket:
            self.socket = socket
            return socket

        return opening.addCallback(opened)

    def _on_close(self, info: ws.SocketClosed) -> None:
        self.closed = info

    def _on_frame(self, frame: frames.Frame) -> None:
        shared = self.shared
        shared.frames[frame.type] += 1
        try:
            if isinstance(frame, frames.JobDelivery):
                self._take(frame)
            elif isinstance(frame, frames.JobAck):
                job = shared.jobs.get(frame.job_id)
                if job is None or job.acked is not None:
                    shared.env.error("listener: job_ack for an unknown or acked job")
                    return
                self.unacked.discard(frame.job_id)
                shared.ack(job)
        except Exception as exc:
            shared.env.error(f"listener: {type(exc).__name__}: {exc}")

    def _take(self, frame: frames.JobDelivery) -> None:
        arrived = now()
        shared, socket = self.shared, self.socket
        if socket is None:  # a delivery before ready is impossible; count it if it happens
            raise RuntimeError("job_delivery before the socket was ready")
        if self.last_delivery is not None:
            shared.cycles.append(arrived - self.last_delivery)
        self.last_delivery = arrived
        if self.unacked:
            shared.delivered_before_ack += 1
        job = shared.jobs.get(frame.job_id)
        if job is None:
            raise RuntimeError(f"job_delivery of a job this round did not queue: {frame.job_id}")
        job.delivered, job.attempt = arrived, frame.attempt
        if frame.from_ != job.caller.handle or frame.envelope != job.sealed:
            raise RuntimeError("the delivered request is not the one queued")
        if shared.inline:
            request = envelope.open_request(
                frame.envelope,
                my_key=self.me.encryption,
                my_record=self.me.encryption_record.record,
                relay_origin=shared.env.origin,
                expected_from=job.caller.address,
                expected_to=self.me.address,
                sender_identity_pub=job.caller.identity_record.record.identity_pub,
                now=time.time(),
            )
            if request.request_id != job.request.request_id:
                raise RuntimeError("opened another request than the one queued")
            job.answer = seal_answer(job, shared.answer_bytes)
            job.answer_bytes = len(codec.encode(job.answer))
        assert job.answer is not None
        socket.send(frames.JobAccepted(job_id=frame.job_id))
        socket.send(
            frames.JobResult(
                job_id=frame.job_id, terminal=frames.Terminal.COMPLETED, envelope=job.answer
            )
        )
        job.result_sent = now()
        self.unacked.add(frame.job_id)


async def attach_listeners(
    env: loadgen.Env, listeners: Sequence[MailboxListener], window: int
) -> int:
    """Dial every listener, at most ``window`` at once; how many failed."""
    todo = iter(listeners)
    failed = 0

    async def worker() -> None:
        nonlocal failed
        for listener in todo:
            try:
                await listener.start()
            except Exception as exc:
                failed += 1
                env.error(f"attach: {type(exc).__name__}: {exc}")

    await defer.DeferredList(
        [defer.ensureDeferred(worker()) for _ in range(min(window, len(listeners)))],
        consumeErrors=True,
    )
    return failed


# --- phase 4: fetch ------------------------------------------------------------------------------


async def fetch_answers(env: loadgen.Env, jobs: Sequence[Job]) -> tuple[list[float], int]:
    """``GET /v1/jobs/<id>`` for each job, one at a time, by its caller; the answer is opened
    and checked against the request the caller kept. (latencies, failures)"""
    latencies: list[float] = []
    failed = 0
    apis: dict[str, RelayApi] = {}
    for job in jobs:
        assert job.job_id is not None
        caller = job.caller
        api = apis.get(caller.handle)
        if api is None:
            api = apis[caller.handle] = RelayApi(
                env.reactor, env.relay_url, caller.credentials, ca_file=env.ca_file
            )
        started = now()
        try:
            info = await api.get_job(job.job_id)
            latencies.append(now() - started)
            if info.state is not http.JobState.ANSWERED or info.answer is None:
                raise RuntimeError(f"job is {info.state}, not answered with an answer")
            response = envelope.open_response(
                info.answer,
                my_key=caller.encryption,
                my_record=caller.encryption_record.record,
                request=job.request,
                responder_identity_pub=job.callee.identity_record.record.identity_pub,
                now=time.time(),
            )
            outcome = response.outcome
            if not isinstance(outcome, payloads.Reply) or not outcome.text.startswith(
                f"answer to {job.request.request_id}"
            ):
                raise RuntimeError("the fetched answer is not the one sealed")
        except Exception as exc:
            failed += 1
            env.error(f"fetch: {type(exc).__name__}: {exc}")
    return latencies, failed


# --- the database --------------------------------------------------------------------------------

_TABLES = ("jobs", "job_sealed", "audit")


def db_stats(database: Path) -> dict[str, Any]:
    """Sizes of the relay's database: the files as they are, then after a WAL checkpoint the
    pages in use (page_count - freelist) and each table's and index's bytes (dbstat)."""

    def size(path: Path) -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0

    wal = database.with_name(database.name + "-wal")
    stats: dict[str, Any] = {"file_bytes": size(database), "wal_bytes": size(wal)}
    conn = sqlite3.connect(database, timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 30000")
        busy, log_frames, moved = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        stats["checkpoint"] = {"busy": busy, "wal_frames": log_frames, "checkpointed": moved}
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        stats.update(
            page_size=page_size,
            page_count=pages,
            freelist_count=free,
            db_bytes=pages * page_size,
            used_bytes=(pages - free) * page_size,
        )
        by_object: dict[str, int] = {}
        owner = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master").fetchall())
        for name, bytes_ in conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
            table = owner.get(name, name)
            key = table if table in _TABLES else "other"
            by_object[key] = by_object.get(key, 0) + int(bytes_)
        stats["bytes_by_table"] = by_object  # each table with its indexes
        stats["rows"] = {
            t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in _TABLES
        }
        payload = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(request)), 0), COALESCE(SUM(LENGTH(answer)), 0)"
            " FROM job_sealed"
        ).fetchone()
        stats["sealed_payload_bytes"] = {"requests": payload[0], "answers": payload[1]}
    finally:
        conn.close()
    stats["file_bytes_after_checkpoint"] = size(database)
    stats["wal_bytes_after_checkpoint"] = size(wal)
    return stats


def growth(before: dict[str, Any], after: dict[str, Any], jobs: int) -> dict[str, Any]:
    """Per-job growth between two :func:`db_stats` readings."""
    if jobs <= 0:
        return {}
    per_table = {
        name: round((after["bytes_by_table"].get(name, 0) - bytes_) / jobs, 1)
        for name, bytes_ in before["bytes_by_table"].items()
    }
    files_before = before["file_bytes"] + before["wal_bytes"]
    files_after = after["file_bytes"] + after["wal_bytes"]
    return {
        "used_bytes_per_job": round((after["used_bytes"] - before["used_bytes"]) / jobs, 1),
        "db_bytes_per_job": round((after["db_bytes"] - before["db_bytes"]) / jobs, 1),
        "files_with_wal_bytes_per_job": round((files_after - files_before) / jobs, 1),
        "bytes_by_table_per_job": per_table,
    }


# --- the run -------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, reactor: Any, database: Path) -> None:
        self.args = args
        self.reactor = reactor
        self.database = database
        self.relay: relayproc.Relay | None = None
        self.result: dict[str, Any] = {}

    def say(self, text: str) -> None:
        print(f"  · {text}", flush=True)

    def check_relay(self) -> None:
        if self.relay is None or not self.relay.alive():
            raise BenchError("the relay process exited")

    async def run(
        self, env: loadgen.Env, callers: Sequence[Identity], callees: Sequence[Identity]
    ) -> None:
        args = self.args
        # The callers' view of the callees' keys comes from the relay: check one against what
        # was published (the jobs are sealed to the published records).
        api = RelayApi(self.reactor, env.relay_url, callers[0].credentials, ca_file=env.ca_file)
        keys = await api.get_keys(callees[0].handle)
        if keys.encryption is None or keys.encryption.record != callees[0].encryption_record.record:
            raise BenchError("the relay returned other keys than were published")
        rounds = []
        last_jobs: list[Job] = []
        for number in range(1, args.rounds + 1):
            jobs = seal_jobs(
                env.origin, callers, callees, args.jobs_per_caller, args.message_bytes, number
            )
            rounds.append(await self.one_round(env, callees, jobs, number))
            last_jobs = jobs
        self.result["rounds"] = rounds
        if args.fetches and last_jobs:
            answered = [job for job in last_jobs if job.acked is not None]
            step = max(1, len(answered) // args.fetches)
            sample = answered[::step][: args.fetches]
            relay = self.relay
            assert relay is not None
            cpu = relayproc.proc_cpu_s(relay.pid)
            started = now()
            latencies, failed = await fetch_answers(env, sample)
            elapsed = now() - started
            cpu = relayproc.proc_cpu_s(relay.pid) - cpu
            self.result["fetch"] = {
                "fetched": len(latencies),
                "failed": failed,
                "latency_ms": summary_ms(latencies),
                "per_s": round(len(sample) / elapsed, 1) if elapsed > 0 else None,
                "relay_cpu_ms_per_fetch": round(cpu * 1000 / len(sample), 3) if sample else None,
            }
            self.say(f"fetch: {len(latencies)} answers fetched and opened, {failed} failed")

    async def one_round(
        self,
        env: loadgen.Env,
        callees: Sequence[Identity],
        jobs: Sequence[Job],
        number: int,
    ) -> dict[str, Any]:
        args, relay = self.args, self.relay
        assert relay is not None
        pid = relay.pid
        out: dict[str, Any] = {"round": number}

        self.say(f"round {number}: {len(jobs)} requests sealed")
        self.check_relay()
        await loadgen.sleep(self.reactor, SETTLE_S)
        db_before = db_stats(self.database)

        # 1. enqueue
        relay_cpu, bench_cpu = relayproc.proc_cpu_s(pid), relayproc.self_cpu_s()
        run = await run_enqueue(env, jobs, args.concurrency, args.phase_budget)
        relay_cpu = relayproc.proc_cpu_s(pid) - relay_cpu
        bench_cpu = relayproc.self_cpu_s() - bench_cpu
        queued = [job for job in jobs if job.job_id is not None]
        out["enqueue"] = {
            "jobs": len(jobs),
            "queued": run.ok,
            "failed": run.failed,
            "timed_out": run.timed_out,
            "elapsed_s": round(run.elapsed_s, 3),
            "queued_per_s": round(run.ok / run.elapsed_s, 1) if run.elapsed_s > 0 else None,
            "request_to_queued_ms": summary_ms([j.queued - j.sent for j in queued]),  # type: ignore[operator]
            "dial_to_queued_ms": summary_ms([j.queued - j.dialled for j in queued]),  # type: ignore[operator]
            "relay_cpu_ms_per_job": round(relay_cpu * 1000 / run.ok, 3) if run.ok else None,
            "relay_core_use": round(relay_cpu / run.elapsed_s, 3) if run.elapsed_s else None,
            "bench_core_use": round(bench_cpu / run.elapsed_s, 3) if run.elapsed_s else None,
        }
        self.say(
            f"round {number} enqueue: {run.ok} queued, {run.failed} failed in"
            f" {run.elapsed_s:.1f} s = {out['enqueue']['queued_per_s']} call_queued/s"
        )
        if run.failed or run.timed_out:
            raise BenchError(f"enqueue failed: {dict(env.errors)}")
        self.check_relay()
        await loadgen.sleep(self.reactor, SETTLE_S)
        db_queued = db_stats(self.database)
        sealed_requests = sum(job.request_bytes for job in queued)

        # Answers sealed now unless the listeners seal them on delivery (--seal-inline).
        if not args.seal_inline:
            started = now()
            for job in queued:
                job.answer = seal_answer(job, args.answer_bytes)
                job.answer_bytes = len(codec.encode(job.answer))
            self.say(f"round {number}: {len(queued)} answers sealed in {now() - started:.1f} s")

        # 2. deliver
        shared = Deliveries(env, queued, args.answer_bytes, args.seal_inline)
        listeners = [MailboxListener(shared, callee) for callee in callees]
        relay_cpu, bench_cpu = relayproc.proc_cpu_s(pid), relayproc.self_cpu_s()
        started = now()
        attach_failed = await attach_listeners(env, listeners, args.open_window)
        attached_s = now() - started
        timed_out = False
        try:
            await shared.all_acked.addTimeout(args.phase_budget, self.reactor)
        except defer.TimeoutError:
            timed_out = True
        elapsed = now() - started
        relay_cpu = relayproc.proc_cpu_s(pid) - relay_cpu
        bench_cpu = relayproc.self_cpu_s() - bench_cpu
        acked = [job for job in queued if job.acked is not None]
        out["deliver"] = {
            "listeners": len(listeners),
            "attach_failed": attach_failed,
            "attach_s": round(attached_s, 3),
            "answered": len(acked),
            "timed_out": timed_out,
            "elapsed_s": round(elapsed, 3),
            "answered_per_s": round(len(acked) / elapsed, 1) if elapsed > 0 else None,
            "delivery_to_ack_ms": summary_ms([j.acked - j.delivered for j in acked]),  # type: ignore[operator]
            "result_to_ack_ms": summary_ms([j.acked - j.result_sent for j in acked]),  # type: ignore[operator]
            "listener_cycle_ms": summary_ms(shared.cycles),
            "delivered_before_previous_ack": shared.delivered_before_ack,
            "first_delivery_s": round(min(j.delivered for j in acked) - started, 3)  # type: ignore[type-var,operator]
            if acked
            else None,
            "redelivered": sum(1 for j in acked if j.attempt > 1),
            "frames_seen": dict(shared.frames),
            "relay_cpu_ms_per_job": round(relay_cpu * 1000 / len(acked), 3) if acked else None,
            "relay_core_use": round(relay_cpu / elapsed, 3) if elapsed else None,
            "bench_core_use": round(bench_cpu / elapsed, 3) if elapsed else None,
            "seal_inline": args.seal_inline,
        }
        self.say(
            f"round {number} deliver: {len(acked)}/{len(queued)} answered in {elapsed:.1f} s"
            f" = {out['deliver']['answered_per_s']} job_ack/s"
        )
        if timed_out or len(acked) < len(queued):
            raise BenchError(
                f"delivery incomplete ({len(acked)}/{len(queued)}): {dict(env.errors)}"
            )
        self.check_relay()
        await loadgen.sleep(self.reactor, SETTLE_S)
        db_answered = db_stats(self.database)

        # The callees go offline again (the next round queues for them).
        for listener in listeners:
            if listener.socket is not None:
                listener.socket.close()
        deadline = now() + 30
        while any(li.socket and li.closed is None for li in listeners) and now() < deadline:
            await loadgen.sleep(self.reactor, 0.1)
        out["listener_drops"] = sum(
            1 for li in listeners if li.closed is not None and li.socket is None
        )

        sealed_answers = sum(job.answer_bytes for job in acked)
        out["bytes"] = {
            "sealed_request_bytes_per_job": round(sealed_requests / len(queued), 1),
            "sealed_answer_bytes_per_job": round(sealed_answers / len(acked), 1),
            "queued": growth(db_before, db_queued, len(queued)),
            "answered": growth(db_before, db_answered, len(acked)),
            "db_before": db_before,
            "db_queued": db_queued,
            "db_answered": db_answered,
        }
        return out


def start_relay(
    args: argparse.Namespace, workdir: Path
) -> tuple[relayproc.Relay, RelayUrl, list[Identity], list[Identity], float]:
    port = relayproc.free_port()
    url = RelayUrl.parse(f"http://127.0.0.1:{port}")
    database = workdir / "relay.sqlite"
    callee_handles = [f"box-{i:04d}" for i in range(args.callees)]
    caller_handles = [f"cal-{i:04d}" for i in range(args.callers)]
    started = time.monotonic()
    identities = seed_identities(database, ORG, url.origin, callee_handles + caller_handles)
    callees, callers = identities[: args.callees], identities[args.callees :]
    store = open_relay_store(database).registry
    try:
        for callee in callees:
            store.set_offline_delivery(ORG, callee.handle, True, time.time())
    finally:
        store.close()
    seed_s = time.monotonic() - started
    relay = relayproc.Relay(
        [
            str(relayproc.BIN / "twistd"),
            "-n",
            "--pidfile=",
            "--logfile=-",
            "agentcall-relay",
            "--database",
            str(database),
            "--listen",
            f"tcp:{port}:interface=127.0.0.1",
            "--url",
            str(url),
            "--calls-per-hour",
            str(args.calls_per_hour),
            # Every bench socket comes from 127.0.0.1 (the default cap is 64 per source).
            "--max-per-source",
            "100000",
        ],
        workdir,
    )
    return relay, url, callers, callees, seed_s


def run_reactor(bench: Bench, env: loadgen.Env, callers: Any, callees: Any) -> None:
    reactor = bench.reactor
    box: dict[str, Any] = {}

    def finished(result: object) -> None:
        box["result"] = result
        reactor.stop()

    def begin() -> None:
        d = defer.ensureDeferred(bench.run(env, callers, callees))
        d.addBoth(finished)

    reactor.callWhenRunning(begin)
    reactor.run()
    if "result" not in box:
        raise KeyboardInterrupt
    outcome = box["result"]
    if hasattr(outcome, "raiseException"):
        outcome.raiseException()


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm)
    from twisted.internet import reactor

    relayproc.raise_nofile_limit()
    machine = relayproc.machine_facts()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    print(f"AgentCall mailbox benchmark ({'quick' if args.quick else 'full'}) {stamp}")
    print(f"  {machine_line(machine)}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="agentcall-mailbox-bench-"))
    relay: relayproc.Relay | None = None
    bench = Bench(args, reactor, workdir / "relay.sqlite")
    status = 1
    t0 = time.monotonic()
    try:
        relay, url, callers, callees, seed_s = start_relay(args, workdir)
        bench.relay = relay
        port = relay.wait_ready(30.0)
        bench.say(
            f"{len(callers)} callers and {len(callees)} opted-in callees seeded in {seed_s:.1f} s;"
            f" relay pid {relay.pid}"
        )
        if port != url.port:
            raise BenchError(f"relay listens on {port}, expected {url.port}")
        env = loadgen.Env(reactor, url, None)
        bench.result.update(
            {
                "timestamp": stamp,
                "kind": "mailbox",
                "quick": args.quick,
                "machine": machine,
                "checkout": relayproc.checkout_facts(),
                "options": {
                    "callers": args.callers,
                    "callees": args.callees,
                    "jobs_per_caller": args.jobs_per_caller,
                    "rounds": args.rounds,
                    "concurrency": args.concurrency,
                    "open_window": args.open_window,
                    "message_bytes": args.message_bytes,
                    "answer_bytes": args.answer_bytes,
                    "seal_inline": args.seal_inline,
                    "calls_per_hour": args.calls_per_hour,
                    "fetches": args.fetches,
                },
                "seed_s": round(seed_s, 2),
                "loadavg_at_start": os.getloadavg(),
            }
        )
        gc.collect()
        gc.freeze()
        run_reactor(bench, env, callers, callees)
        bench.result["errors"] = dict(env.errors)
        bench.result["relay_log_lines"] = relay.log_lines()
        bench.result["relay_rss_kib"] = relayproc.proc_status_kib(relay.pid)
        bench.result["loadavg_at_end"] = os.getloadavg()
        status = 0
    except KeyboardInterrupt:
        print("\ninterrupted")
        status = 130
    except BenchError as exc:
        print(f"bench failed: {exc}")
        if relay is not None:
            print(relay.tail())
    finally:
        if relay is not None:
            bench.result["relay_exit_code"] = relay.stop()
        if args.keep_workdir:
            print(f"  work dir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    bench.result["run_s"] = round(time.monotonic() - t0, 1)
    if status == 0:
        print(report(bench.result))
        args.results_dir.mkdir(parents=True, exist_ok=True)
        out = args.results_dir / f"{stamp}.json"
        out.write_text(json.dumps(bench.result, indent=2) + "\n", encoding="utf-8")
        print(f"results: {display_path(out)}")
    return status


# --- the report ----------------------------------------------------------------------------------


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m['cpu_model']} · {m['cores']} cores · {m['mem_total_mib']} MiB · Python {m['python']}"
        f" · Twisted {m['twisted']} · SQLite {sqlite3.sqlite_version}"
    )


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def report(r: dict[str, Any]) -> str:
    o = r["options"]
    commit = ((r.get("checkout") or {}).get("commit") or "unknown")[:12]
    lines = [
        "",
        f"== AgentCall mailbox benchmark · {r['timestamp']} · {r['run_s']} s",
        f"machine  {machine_line(r['machine'])}",
        f"checkout {commit}; load average {r['loadavg_at_start'][0]:.2f} at start,"
        f" {r['loadavg_at_end'][0]:.2f} at end (2 cores busy elsewhere skew everything)",
        f"setup    {o['callers']} callers x {o['jobs_per_caller']} jobs -> {o['callees']} opted-in"
        f" callees per round, {o['rounds']} round(s); {o['message_bytes']} B requests,"
        f" {o['answer_bytes']} B answers; {o['concurrency']} enqueue calls in flight;"
        f" answers sealed {'on delivery' if o['seal_inline'] else 'beforehand'}",
        "enqueue  round  queued/s  call_request->call_queued ms p50/p90/p99"
        "   dial->queued p50   relay CPU/job  relay|bench core",
    ]
    for rnd in r["rounds"]:
        e = rnd["enqueue"]
        lines.append(
            f"{'':9}{rnd['round']:>5}  {e['queued_per_s']:>8}  "
            f"{_ms(e['request_to_queued_ms'], 'p50', 'p90', 'p99'):<29}"
            f"  {_ms(e['dial_to_queued_ms'], 'p50'):>16}   {e['relay_cpu_ms_per_job']:>7} ms"
            f"    {e['relay_core_use']:.0%}|{e['bench_core_use']:.0%}"
        )
    lines.append(
        "deliver  round  answered/s  result->ack ms p50/p99  listener cycle ms p50/p99"
        "   relay CPU/job  relay|bench core"
    )
    for rnd in r["rounds"]:
        d = rnd["deliver"]
        lines.append(
            f"{'':9}{rnd['round']:>5}  {d['answered_per_s']:>10}  "
            f"{_ms(d['result_to_ack_ms'], 'p50', 'p99'):<22}"
            f"  {_ms(d['listener_cycle_ms'], 'p50', 'p99'):<24}"
            f"  {d['relay_cpu_ms_per_job']:>7} ms"
            f"    {d['relay_core_use']:.0%}|{d['bench_core_use']:.0%}"
        )
        lines.append(
            f"{'':16}{d['answered']} jobs by {d['listeners']} listeners in {d['elapsed_s']} s"
            f" (attach {d['attach_s']} s, first delivery at {d['first_delivery_s']} s,"
            f" {d['redelivered']} redelivered; {d['delivered_before_previous_ack']} deliveries"
            " came before the previous job's job_ack)"
        )
    for rnd in r["rounds"]:
        b = rnd["bytes"]
        q, a = b["queued"], b["answered"]
        tables = ", ".join(f"{k} {v:g}" for k, v in q["bytes_by_table_per_job"].items())
        lines.append(
            f"bytes    round {rnd['round']}:"
            f" sealed request {b['sealed_request_bytes_per_job']:g} B;"
            f" database +{q['used_bytes_per_job']:g} B per queued job (pages in use after a"
            f" checkpoint; {tables}); files incl. WAL +{q['files_with_wal_bytes_per_job']:g} B"
        )
        lines.append(
            f"{'':9}once answered: sealed answer {b['sealed_answer_bytes_per_job']:g} B;"
            f" database +{a['used_bytes_per_job']:g} B per job over before the round"
            f" (request dropped, answer and metadata kept); file"
            f" {b['db_answered']['db_bytes'] / 1e6:.2f} MB,"
            f" {b['db_answered']['freelist_count']} free pages"
        )
    f = r.get("fetch")
    if f:
        lines.append(
            f"fetch    GET /v1/jobs/<id> one at a time, answer opened: {f['fetched']} ok,"
            f" {f['failed']} failed; ms p50/p90/p99/max"
            f" {_ms(f['latency_ms'], 'p50', 'p90', 'p99', 'max')}; relay CPU"
            f" {f['relay_cpu_ms_per_fetch']} ms/fetch"
        )
    if r.get("errors"):
        lines.append(f"errors   {r['errors']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
