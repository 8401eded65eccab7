"""The relay's Prometheus metrics, counted by the composed relay on memory transports."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import txaio as _txaio

from agentcall.relay.mailbox import MailboxLimits
from agentcall.relay.metrics import NO_METRICS, PrometheusMetrics
from agentcall.wire import codec
from agentcall.wire.frames import CallError, CallRequest, Direction
from tests.unit.crypto_helpers import NOW
from tests.unit.relay_helpers import memory_relay, sealed_looking
from tests.unit.test_relay_mailbox_wired import CORRELATION, api, queue_one, sealed_request
from tests.unit.test_relay_protocol import REQUEST, Switch

txaio: Any = _txaio


@pytest.fixture
def measured(tmp_path: Path) -> Iterator[tuple[Switch, list[PrometheusMetrics]]]:
    kept: list[PrometheusMetrics] = []

    def make(switchboard: Any) -> PrometheusMetrics:
        kept.append(PrometheusMetrics(switchboard.count))
        return kept[-1]

    relay = memory_relay(tmp_path, now=NOW, metrics=make)
    previous = txaio.config.loop
    txaio.config.loop = relay.reactor
    try:
        yield Switch(relay), kept
    finally:
        txaio.config.loop = previous


def value(text: str, sample: str) -> float:
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    assert found is not None, f"{sample} not in\n{text}"
    return float(found.group(1))


def test_calls_listeners_refusals_and_the_front_door_are_counted(
    measured: tuple[Switch, list[PrometheusMetrics]],
) -> None:
    switch, [metrics] = measured
    switch.connect("role=listen", "ken")
    assert value(metrics.text().decode(), "agentcall_listeners_connected") == 1.0
    caller = switch.connect("role=call&to=nobody", "ann")
    caller.send(REQUEST)
    switch.flush()
    switch.relay.request("GET", "/v1/nothing-here")
    text = metrics.text().decode()
    assert value(text, 'agentcall_calls_refused_total{code="unknown_handle"}') == 1.0
    assert value(text, 'agentcall_front_door_total{reason="api_refused"}') == 1.0
    # No address, handle or organisation in any sample.
    assert "acme" not in text and "ken" not in text and "nobody" not in text


def test_a_call_that_rang_is_counted_with_its_duration(
    measured: tuple[Switch, list[PrometheusMetrics]],
) -> None:
    from agentcall.wire.frames import CallStatus

    switch, [metrics] = measured
    ken = switch.connect("role=listen", "ken")
    ann = switch.connect("role=call&to=ken", "ann")
    ann.send(REQUEST)
    switch.flush()
    [ringing] = [f for f in ann.frames if isinstance(f, CallStatus)]
    switch.relay.reactor.advance(2.0)
    assert ken.socket is not None
    ann.socket.sendClose(1000)  # type: ignore[union-attr]
    switch.flush()
    switch.relay.reactor.advance(400)  # past the deadline: the call times out
    text = metrics.text().decode()
    assert value(text, 'agentcall_calls_total{outcome="call.timeout"}') == 1.0
    assert value(text, "agentcall_call_duration_seconds_count") == 1.0
    assert ringing.call_id not in text


def test_database_errors_are_counted_and_no_metrics_costs_nothing() -> None:
    metrics = PrometheusMetrics(lambda: 0)
    metrics.database_error()
    assert value(metrics.text().decode(), "agentcall_database_errors_total") == 1.0
    NO_METRICS.database_error()  # the default: accepted, ignored
    NO_METRICS.call_ended("call.complete", 1.0)


def test_the_mailbox_bytes_held_and_its_refusals_are_measured(tmp_path: Path) -> None:
    """The gauge follows what every mailbox holds (0 at start, up with a queued call, down when
    it is dropped); a call refused at the relay-wide cap is counted by its reason."""
    one_request = len(codec.encode(sealed_request()))
    kept: list[PrometheusMetrics] = []

    def make(switchboard: Any) -> PrometheusMetrics:
        kept.append(PrometheusMetrics(switchboard.count))
        return kept[-1]

    caps = MailboxLimits(max_held_bytes_total=one_request)
    relay = memory_relay(tmp_path, now=NOW, metrics=make, mailbox=caps)
    previous = txaio.config.loop
    txaio.config.loop = relay.reactor
    try:
        switch = Switch(relay)
        [metrics] = kept
        assert value(metrics.text().decode(), "agentcall_mailbox_held_bytes") == 0.0
        switch.tokens["lee"] = relay.enrol("lee")
        for callee in ("ken", "lee"):
            api(switch, "PUT", "/v1/me/offline-delivery", callee, {"enabled": True})
        job_id = queue_one(switch)
        assert value(metrics.text().decode(), "agentcall_mailbox_held_bytes") == one_request
        ann = switch.connect("role=call&to=lee", "ann")
        to_lee = sealed_looking(Direction.REQUEST, "@acme/ann", "@acme/lee")
        ann.send(CallRequest(envelope=to_lee, correlation_id=CORRELATION, queue=True))
        switch.flush()
        assert isinstance(ann.frames[1], CallError)
        text = metrics.text().decode()
        assert value(text, 'agentcall_jobs_refused_total{reason="relay_bytes_full"}') == 1.0
        api(switch, "POST", f"/v1/jobs/{job_id}/cancel", "ann")
        assert value(metrics.text().decode(), "agentcall_mailbox_held_bytes") == 0.0
        NO_METRICS.job_refused("relay_bytes_full")  # the default: accepted, ignored
        NO_METRICS.mailbox_held(1)
    finally:
        txaio.config.loop = previous
