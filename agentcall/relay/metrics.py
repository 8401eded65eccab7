"""What the relay counts for an operator's monitoring (Prometheus), apart from what it does.

The cores report through :class:`RelayEvents` (a few plain methods); :data:`NO_METRICS` ignores
them, so a relay without ``--metrics`` pays one method call per event and imports nothing.
:class:`PrometheusMetrics` keeps the counters in a registry of its own (no process or platform
collectors: the relay's own numbers only) and :func:`metrics_site` serves them, on an endpoint
apart from the relay's (``--metrics``, loopback unless the operator says otherwise). Nothing
here carries an address, a handle or an organisation: only counts by outcome and reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class RelayEvents(Protocol):
    def call_ended(self, audit_event: str, seconds: float) -> None:
        """A call that rang is over (``call.complete``, ``call.fail``, …) after ``seconds``."""
        ...

    def call_refused(self, code: str) -> None:
        """A call request refused before it rang (``rate_limited``, ``offline``, …)."""
        ...

    def turned_away(self, reason: str) -> None:
        """The front door refused, evicted or held something (a ``TurnedAway`` value)."""
        ...

    def database_error(self) -> None:
        """A write or read of the relay's database failed."""
        ...

    def storage_fault(self, code: str) -> None:
        """An operation failed because the storage did (``storage_full``, ``unavailable``)."""
        ...

    def storage_writable(self, writable: bool) -> None:
        """The storage takes writes (again), or stopped taking them."""
        ...

    def job_refused(self, reason: str) -> None:
        """A call could not be queued in the offline mailbox (a ``mailbox.Refusal`` value:
        ``busy``, ``callee_bytes_full``, ``relay_bytes_full``, …)."""
        ...

    def mailbox_held(self, total_bytes: int) -> None:
        """The sealed bytes the offline mailbox holds for every callee together, as the
        store last said."""
        ...


class _NoMetrics:
    def call_ended(self, audit_event: str, seconds: float) -> None:
        pass

    def call_refused(self, code: str) -> None:
        pass

    def turned_away(self, reason: str) -> None:
        pass

    def database_error(self) -> None:
        pass

    def storage_fault(self, code: str) -> None:
        pass

    def storage_writable(self, writable: bool) -> None:
        pass

    def job_refused(self, reason: str) -> None:
        pass

    def mailbox_held(self, total_bytes: int) -> None:
        pass


NO_METRICS: RelayEvents = _NoMetrics()

# Call durations from ringing to the end: an instant agent is tens of milliseconds, the
# deadline six minutes.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 360)


class PrometheusMetrics:
    """The relay's counters in a registry of their own."""

    def __init__(self, listeners: Callable[[], int]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self._calls = Counter(
            "agentcall_calls",
            "Calls that rang, by how they ended (the audit event).",
            ["outcome"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "agentcall_call_duration_seconds",
            "Time from a call's request to its end.",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self._refused = Counter(
            "agentcall_calls_refused",
            "Call requests refused before they rang, by error code (rate_limited among them).",
            ["code"],
            registry=self.registry,
        )
        self._door = Counter(
            "agentcall_front_door",
            "Connections, sockets and requests the front door refused, evicted or held, by "
            "reason (connection caps, evictions, accept_held and upgrades_busy among them).",
            ["reason"],
            registry=self.registry,
        )
        self._database = Counter(
            "agentcall_database_errors",
            "Reads or writes of the relay database that failed.",
            registry=self.registry,
        )
        self._storage_faults = Counter(
            "agentcall_storage_faults",
            "Operations that failed because the relay's storage did, by code (storage_full: "
            "out of space or read-only; unavailable: I/O errors and the like).",
            ["code"],
            registry=self.registry,
        )
        self._storage_writable = Gauge(
            "agentcall_storage_writable",
            "1 while the relay's storage takes writes, 0 from a storage fault until a probe "
            "write succeeds again.",
            registry=self.registry,
        )
        self._jobs_refused = Counter(
            "agentcall_jobs_refused",
            "Calls the offline mailbox could not queue, by reason (relay_bytes_full: the "
            "relay-wide --mailbox-max-total-bytes was reached).",
            ["reason"],
            registry=self.registry,
        )
        self._mailbox_held = Gauge(
            "agentcall_mailbox_held_bytes",
            "Sealed bytes the offline mailbox holds for every callee together (requests "
            "waiting, answers kept), what --mailbox-max-total-bytes caps.",
            registry=self.registry,
        )
        connected = Gauge(
            "agentcall_listeners_connected",
            "Identities with a live listener socket.",
            registry=self.registry,
        )
        connected.set_function(lambda: float(listeners()))

    def call_ended(self, audit_event: str, seconds: float) -> None:
        self._calls.labels(outcome=audit_event).inc()
        self._duration.observe(max(seconds, 0.0))

    def call_refused(self, code: str) -> None:
        self._refused.labels(code=code).inc()

    def turned_away(self, reason: str) -> None:
        self._door.labels(reason=reason).inc()

    def database_error(self) -> None:
        self._database.inc()

    def storage_fault(self, code: str) -> None:
        self._storage_faults.labels(code=code).inc()

    def storage_writable(self, writable: bool) -> None:
        self._storage_writable.set(1.0 if writable else 0.0)

    def job_refused(self, reason: str) -> None:
        self._jobs_refused.labels(reason=reason).inc()

    def mailbox_held(self, total_bytes: int) -> None:
        self._mailbox_held.set(total_bytes)

    def text(self) -> bytes:
        """The exposition a scrape gets (also what the tests read)."""
        from prometheus_client import generate_latest

        body: bytes = generate_latest(self.registry)
        return body


def metrics_site(metrics: PrometheusMetrics) -> Any:
    """A twisted.web Site answering ``GET /metrics`` (and nothing else)."""
    from prometheus_client.twisted import MetricsResource
    from twisted.web import resource, server

    root = resource.Resource()
    root.putChild(b"metrics", MetricsResource(registry=metrics.registry))
    site = server.Site(root)
    site.noisy = False
    site.displayTracebacks = False
    return site
