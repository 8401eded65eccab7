"""One relay, wired: the cores, the WebSocket and HTTP adapters, and the front door.

``twistd agentcall-relay`` (:mod:`agentcall.relay.tap`) and the in-memory tests build the relay
with the same :func:`compose`, so what the tests drive is what runs; tap then only adds the
listening port and the periodic jobs around it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from autobahn.twisted.resource import WebSocketResource
from twisted.internet.defer import Deferred
from twisted.web import resource

from agentcall import limits
from agentcall.relay.audit import BatchingAuditSink
from agentcall.relay.calls import CallBook, restore_windows
from agentcall.relay.door import Door, DoorConfig, GatedFactory, RelaySite
from agentcall.relay.invitepage import InvitePages
from agentcall.relay.jobs import JobDesk
from agentcall.relay.lastseen import LastSeen
from agentcall.relay.mailbox import MailboxLimits
from agentcall.relay.metrics import NO_METRICS, RelayEvents
from agentcall.relay.protocol import RelayWebSocketFactory
from agentcall.relay.ratelimit import SlidingWindowLimiter
from agentcall.relay.retention import Retention, RetentionPolicy
from agentcall.relay.store_interface import RelayStore
from agentcall.relay.storewatch import StorageWatch
from agentcall.relay.switchboard import Switchboard
from agentcall.relay.web import ApiWithSocket, CappedRequest, HealthPage, RelayApi


@attrs.frozen
class RelaySettings:
    """What a relay is built from, once ``twistd agentcall-relay``'s options are checked."""

    relay_origin: str
    # The WebSocket's own URL: autobahn's handshake is configured from it.
    ws_url: str
    # The base of the invite links an admin is handed.
    public_url: str
    call_deadline_s: float
    calls_per_hour: int
    door: DoorConfig
    # The offline mailbox's numbers; the per-callee caps are relay options.
    mailbox: MailboxLimits = attrs.field(factory=MailboxLimits)
    # Audit rows and ended invites older than this many days are pruned (legal holds aside).
    audit_retention_days: int = limits.AUDIT_RETENTION_DAYS


@attrs.frozen
class Relay:
    """A composed relay: the factory to listen with, and the parts the periodic jobs (and the
    tests) reach."""

    factory: GatedFactory
    door: Door
    calls: CallBook
    jobs: JobDesk
    switchboard: Switchboard
    limiter: SlidingWindowLimiter
    # Fires once the rate windows hold the calls of the last hour; the relay listens after.
    windows_restored: Deferred[None] = attrs.field(eq=False, repr=False)
    # The call and front-door audit rows, written once per reactor turn (flushed at stop).
    audit: BatchingAuditSink = attrs.field(eq=False, repr=False)
    # Members' last-seen times, written in batches (tap flushes them on a timer and at stop).
    seen: LastSeen = attrs.field(eq=False, repr=False)
    # Prunes old audit rows and invites (tap runs a pass at start and then daily).
    retention: Retention = attrs.field(eq=False, repr=False)
    # Whether the storage takes writes; probes it while it does not (tap stops it at stop).
    storage: StorageWatch = attrs.field(eq=False, repr=False)


def compose(
    settings: RelaySettings,
    store: RelayStore,
    reactor: Any,
    metrics: Callable[[Switchboard], RelayEvents] | None = None,
) -> Relay:
    """Wire one relay over ``store``, with ``reactor`` for its clock and autobahn's timers;
    ``metrics`` makes what counts its events (given the switchboard, for the listener gauge)."""
    switchboard = Switchboard()
    events = NO_METRICS if metrics is None else metrics(switchboard)
    # Told of every operation the storage fails (a full disk): logs the episode once, probes.
    storage = StorageWatch(reactor, store.probe, events)
    store.watch_faults(storage.fault)
    # The windows start from the calls of the last hour, so a restart grants no fresh hour.
    limiter = SlidingWindowLimiter(settings.calls_per_hour, limits.RATE_WINDOW_S)
    windows_restored = restore_windows(store, limiter, reactor.seconds())
    # The rows of one reactor turn go to the store together, in one transaction.
    audit_sink = BatchingAuditSink(store, reactor)
    audit_sink.on_failure = events.database_error

    def live_call_to(org: str, handle: str) -> bool:
        # Bound late: the desk and the book each need the other; the book is made just below.
        return calls.has_call_to(org, handle)

    jobs = JobDesk(
        reactor,
        store,
        switchboard,
        settings.relay_origin,
        settings.mailbox,
        live_call_to=live_call_to,
        keys=store,
        metrics=events,
    )
    calls = CallBook(
        reactor,
        switchboard,
        store,
        audit_sink,
        limiter,
        settings.relay_origin,
        deadline_s=settings.call_deadline_s,
        desk=jobs,
        keys=store,
        metrics=events,
    )
    # Jobs outlive the process: the sweep is armed from the store (failures are logged).
    jobs.start()
    # What could not be written while the storage failed is tried again once it recovers.
    storage.when_failing(jobs.storage_failing)
    storage.when_recovered(jobs.storage_recovered)
    door = Door(settings.door, reactor, audit_sink)
    door.turned_away.on_note = events.turned_away
    seen = LastSeen(store)
    ws_factory = RelayWebSocketFactory(
        settings.ws_url,
        store=store,
        switchboard=switchboard,
        calls=calls,
        jobs=jobs,
        relay_origin=settings.relay_origin,
        reactor=reactor,
        door=door,
        seen=seen,
    )
    api = RelayApi(
        metrics=events,
        store=store,
        jobs=jobs,
        calls=calls,
        switchboard=switchboard,
        clock=reactor,
        relay_origin=settings.relay_origin,
        public_url=settings.public_url,
        door=door,
        seen=seen,
        audit_sink=audit_sink,
    )
    root = resource.Resource()
    root.putChild(b"v1", ApiWithSocket(api, WebSocketResource(ws_factory), door))
    # Probes for a supervisor or load balancer, outside the versioned API.
    root.putChild(b"healthz", HealthPage())
    root.putChild(b"readyz", HealthPage(store, storage))
    # An invite link opened in a browser (the secret after # never reaches the relay).
    root.putChild(b"invite", InvitePages())
    site = RelaySite(root, door, reactor)
    site.requestFactory = CappedRequest
    return Relay(
        GatedFactory(site),
        door,
        calls,
        jobs,
        switchboard,
        limiter,
        windows_restored,
        audit=audit_sink,
        seen=seen,
        retention=Retention(store, reactor, RetentionPolicy(settings.audit_retention_days)),
        storage=storage,
    )
