"""A relay whose storage fails: refused in words, logged once, not ready, and back by itself.

The disk fills at the SQLite connection (:class:`FillingConnection`: writes fail as SQLite's do
on a full disk); a real full filesystem is tests/e2e/test_storage_full.py's."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs
from twisted.python.failure import Failure

from agentcall.errors import CallErrorCode, StorageFault
from agentcall.logevents import Logger
from agentcall.relay.audit import AuditDropped
from agentcall.relay.metrics import PrometheusMetrics
from agentcall.relay.storewatch import PROBE_EVERY_S, RETRY_AFTER_S, StorageWatch
from tests.unit.relay_helpers import (
    FillingConnection,
    MemoryRelay,
    fill_disk_of,
    fired,
    memory_relay,
)
from tests.unit.test_relay_metrics import value

NOW = 1_750_000_000.0
FULL = StorageFault(CallErrorCode.STORAGE_FULL, "the relay's storage is full: disk full")
FAILING = StorageFault(CallErrorCode.UNAVAILABLE, "the relay's storage is failing: I/O")


# --- the watch --------------------------------------------------------------------------------


class Probe:
    def __init__(self) -> None:
        self.works = False
        self.tried: list[float] = []

    def __call__(self, now: float) -> Deferred[None]:
        self.tried.append(now)
        return succeed(None) if self.works else fail(FULL)


def events(logged: Sequence[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [event for event in logged if event.get("event") == name]


def test_an_episode_is_logged_once_probed_and_ended_by_a_probe_only() -> None:
    clock, probe = Clock(), Probe()
    metrics = PrometheusMetrics(lambda: 0)
    watch = StorageWatch(clock, probe, metrics)
    recovered: list[float] = []
    watch.when_recovered(lambda: recovered.append(clock.seconds()))
    assert watch.failing is None
    assert value(metrics.text().decode(), "agentcall_storage_writable") == 1.0
    with capturedLogs() as logged:
        for _ in range(50):
            watch.fault(FULL, "decide_jobs")
        assert watch.failing is FULL
        [failing] = events(logged, "storage_failing")
        assert (failing["code"], failing["operation"]) == ("storage_full", "decide_jobs")
        assert failing["log_level"] is LogLevel.error
        text = metrics.text().decode()
        assert value(text, 'agentcall_storage_faults_total{code="storage_full"}') == 50.0
        assert value(text, "agentcall_storage_writable") == 0.0
        # Probed every PROBE_EVERY_S while it fails, and nothing more is said meanwhile.
        clock.pump([PROBE_EVERY_S] * 3)
        assert probe.tried == [PROBE_EVERY_S * n for n in (1, 2, 3)]
        assert len(events(logged, "storage_failing")) == 1 and recovered == []
        probe.works = True
        clock.advance(PROBE_EVERY_S)
        [back] = events(logged, "storage_recovered")
    assert back["after_s"] == PROBE_EVERY_S * 4 and back["failed_operations"] == 50
    assert watch.failing is None and recovered == [PROBE_EVERY_S * 4]
    assert value(metrics.text().decode(), "agentcall_storage_writable") == 1.0
    clock.pump([PROBE_EVERY_S] * 10)
    assert len(probe.tried) == 4  # no probing while writes work


def test_a_change_of_kind_is_said_once_more_and_a_second_episode_is_its_own() -> None:
    clock, probe = Clock(), Probe()
    watch = StorageWatch(clock, probe)
    with capturedLogs() as logged:
        watch.fault(FULL, "record_many")
        watch.fault(FULL, "record_many")
        watch.fault(FAILING, "decide_jobs")
        watch.fault(FAILING, "decide_jobs")
        assert [e["code"] for e in events(logged, "storage_failing")] == [
            "storage_full",
            "unavailable",
        ]
        probe.works = True
        clock.advance(PROBE_EVERY_S)
        watch.fault(FULL, "probe")
        assert len(events(logged, "storage_failing")) == 3
    assert watch.failing is FULL


def test_a_probe_that_fails_for_another_reason_is_logged_and_tried_again() -> None:
    clock = Clock()
    tried: list[float] = []

    def broken(now: float) -> Deferred[None]:
        tried.append(now)
        return fail(ValueError("a bug in the probe"))

    watch = StorageWatch(clock, broken)
    watch.fault(FULL, "probe")
    with capturedLogs() as logged:
        clock.pump([PROBE_EVERY_S] * 2)
    assert len(events(logged, "storage_probe_failed")) == 2 and len(tried) == 2
    watch.stop()
    clock.pump([PROBE_EVERY_S] * 5)
    assert len(tried) == 2


# --- the relay on a full disk -----------------------------------------------------------------


@pytest.fixture
def full(tmp_path: Path) -> Iterator[tuple[MemoryRelay, FillingConnection, str]]:
    relay = memory_relay(tmp_path, now=NOW)
    token = relay.enrol("ann")
    disk = fill_disk_of(relay.store)
    yield relay, disk, token


def test_a_write_on_a_full_disk_is_503_storage_full_and_never_a_traceback(
    full: tuple[MemoryRelay, FillingConnection, str],
) -> None:
    relay, disk, token = full
    body = json.dumps({"enabled": True}).encode()
    disk.full = True
    with capturedLogs() as logged:
        answers = [
            relay.request("PUT", "/v1/me/offline-delivery", body=body, token=token, handle="ann")
            for _ in range(20)
        ]
    for answer in answers:
        assert answer.status == 503
        assert answer.json()["error"] == "storage_full"
        assert "storage is full" in answer.json()["message"]
        assert "disk" not in answer.json()["message"]  # never the storage's own words
        assert answer.headers["retry-after"] == str(RETRY_AFTER_S)
    assert len(events(logged, "storage_failing")) == 1
    assert not [e for e in logged if e.get("log_level") is LogLevel.critical]
    assert not [e for e in logged if "log_failure" in e and e["log_level"] > LogLevel.debug]


def test_readyz_is_not_ready_while_writes_fail_and_ready_once_a_probe_writes(
    full: tuple[MemoryRelay, FillingConnection, str],
) -> None:
    relay, disk, token = full
    disk.full = True
    body = json.dumps({"enabled": True}).encode()
    relay.request("PUT", "/v1/me/offline-delivery", body=body, token=token, handle="ann")
    answer = relay.request("GET", "/readyz")
    assert (answer.status, answer.json()) == (503, {"ok": False, "problem": "storage_full"})
    relay.reactor.pump([PROBE_EVERY_S] * 4)
    assert relay.request("GET", "/readyz").status == 503  # still full: the probes fail
    disk.full = False
    with capturedLogs() as logged:
        relay.reactor.advance(PROBE_EVERY_S)
    assert len(events(logged, "storage_recovered")) == 1
    assert relay.request("GET", "/readyz").status == 200
    again = relay.request("PUT", "/v1/me/offline-delivery", body=body, token=token, handle="ann")
    assert again.status == 200
    status = fired(relay.store.mailbox_status("acme", "ann"))
    assert status is not None and status.offline_delivery


def test_failures_logged_in_aggregate_are_one_debug_line_and_others_keep_their_traceback() -> None:
    log = Logger(namespace="test")
    with capturedLogs() as logged:
        log.failure("write_failed", failure=Failure(FULL), call_id="x")
        log.failure("row_failed", failure=Failure(AuditDropped("call.fail row dropped")))
        log.failure("bug", failure=Failure(ValueError("a bug")))
    levels = {event["event"]: event["log_level"] for event in logged}
    assert levels == {
        "write_failed": LogLevel.debug,
        "row_failed": LogLevel.debug,
        "bug": LogLevel.critical,
    }
    [bug] = [event for event in logged if event["event"] == "bug"]
    assert isinstance(bug["log_failure"], Failure)
    assert not any("log_failure" in event for event in logged if event["event"] != "bug")


def test_a_stopped_watch_probes_no_more_and_the_hooks_see_each_episode() -> None:
    clock, probe = Clock(), Probe()
    watch = StorageWatch(clock, probe)
    seen: list[str] = []
    watch.when_failing(lambda: seen.append("failing"))
    watch.when_recovered(lambda: seen.append("recovered"))
    watch.fault(FULL, "record_many")
    watch.fault(FULL, "record_many")
    probe.works = True
    clock.advance(PROBE_EVERY_S)
    watch.fault(FAILING, "decide_jobs")
    assert seen == ["failing", "recovered", "failing"]
    watch.stop()
    watch.fault(FAILING, "decide_jobs")
    clock.pump([PROBE_EVERY_S] * 4)
    assert len(probe.tried) == 1


def test_the_store_does_not_count_its_own_probe_as_a_failed_operation(
    full: tuple[MemoryRelay, FillingConnection, str],
) -> None:
    relay, disk, _token = full
    reported: list[str] = []
    relay.store.watch_faults(lambda _fault, operation: reported.append(operation))
    disk.full = True
    failed = relay.store.probe(NOW)
    failures: list[Failure] = []
    failed.addErrback(failures.append)
    [failure] = failures
    assert failure.check(StorageFault) and reported == []
    disk.full = False
    assert fired(relay.store.probe(NOW)) is None
