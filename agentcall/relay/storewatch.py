"""Whether the relay's storage takes writes, one failure episode at a time.

The store reports every operation that failed because the storage did (a full disk, a
read-only filesystem, an I/O error: :mod:`agentcall.db.faults`). The first report opens an
*episode*: it is logged once (``storage_failing``, with the code and the operation), the
storage counts as not writable (``/readyz`` answers 503, the metric says 0), and a probe write
is tried every :data:`PROBE_EVERY_S`. The first probe that commits ends the episode
(``storage_recovered``, with how long it lasted and how many operations failed meanwhile) and
tells whoever waits for it (the mailbox desk retries what it could not do). Every failed
operation in between is counted in the metric, never logged one line each: a relay on a full
disk must not fill the rest of it with tracebacks.

Only a probe ends an episode, never another operation that happened to succeed: a read, or a
write SQLite could fit in space it already had, says nothing about the next write.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from agentcall.errors import CallErrorCode, StorageFault
from agentcall.logevents import Logger
from agentcall.relay.metrics import NO_METRICS, RelayEvents

__all__ = ["PROBE_EVERY_S", "StorageWatch", "storage_detail"]

_log = Logger(namespace="agentcall.relay.storage")

# How often a failing storage is tried again: soon enough that callers are served within
# seconds of space returning, rare enough to cost nothing on a disk that stays full.
PROBE_EVERY_S = 5.0
# What an HTTP client is told to wait before asking again (``Retry-After``).
RETRY_AFTER_S = 30

_DETAILS = {
    CallErrorCode.STORAGE_FULL: (
        "the relay's storage is full, so it cannot take this now; try again later"
    ),
    CallErrorCode.UNAVAILABLE: (
        "the relay cannot use its storage right now, so it cannot take this; try again later"
    ),
}


def storage_detail(fault: StorageFault) -> str:
    """What the asker is told (never the storage's own message: paths stay on the relay)."""
    return _DETAILS.get(fault.code, _DETAILS[CallErrorCode.UNAVAILABLE])


class StorageWatch:
    """Follows the store's faults; probes while they last; says when they end."""

    def __init__(
        self,
        clock: IReactorTime,
        probe: Callable[[float], Deferred[None]],
        metrics: RelayEvents = NO_METRICS,
        *,
        probe_every_s: float = PROBE_EVERY_S,
    ) -> None:
        self._clock = clock
        self._probe = probe
        self._metrics = metrics
        self._probe_every_s = probe_every_s
        self._failing: StorageFault | None = None
        self._since = 0.0
        self._failures = 0
        self._next_probe: IDelayedCall | None = None
        self._stopped = False
        self._failing_hooks: list[Callable[[], object]] = []
        self._recovered: list[Callable[[], object]] = []
        metrics.storage_writable(True)

    @property
    def failing(self) -> StorageFault | None:
        """The fault of the episode under way (its latest kind), or None while writes work."""
        return self._failing

    def when_failing(self, hook: Callable[[], object]) -> None:
        """Call ``hook()`` at the start of every episode."""
        self._failing_hooks.append(hook)

    def when_recovered(self, hook: Callable[[], object]) -> None:
        """Call ``hook()`` at the end of every episode."""
        self._recovered.append(hook)

    def fault(self, fault: StorageFault, operation: str) -> None:
        """The store's report: ``operation`` failed because the storage did."""
        self._metrics.storage_fault(str(fault.code))
        previous, self._failing = self._failing, fault
        self._failures += 1
        if previous is None:
            self._since = self._clock.seconds()
            self._failures = 1
            self._metrics.storage_writable(False)
            _log.error(
                "storage_failing", code=str(fault.code), operation=operation, reason=str(fault)
            )
            self._arm()
            _call_each(self._failing_hooks, "storage_failing_hook_failed")
        elif previous.code is not fault.code:
            # Full, then failing otherwise (or back): worth one more line, not one per request.
            _log.error(
                "storage_failing", code=str(fault.code), operation=operation, reason=str(fault)
            )

    def stop(self) -> None:
        self._stopped = True
        if self._next_probe is not None and self._next_probe.active():
            self._next_probe.cancel()
        self._next_probe = None

    def _arm(self) -> None:
        if self._stopped:
            return
        if self._next_probe is None or not self._next_probe.active():
            self._next_probe = self._clock.callLater(self._probe_every_s, self._try)

    def _try(self) -> None:
        self._next_probe = None
        if self._failing is None:
            return
        tried = self._probe(self._clock.seconds())
        tried.addCallbacks(self._writes_again, self._still_failing)

    def _writes_again(self, _: object) -> None:
        if self._failing is None:  # pragma: no cover - only a probe ends an episode
            return
        lasted = self._clock.seconds() - self._since
        _log.info(
            "storage_recovered",
            code=str(self._failing.code),
            after_s=round(lasted, 3),
            failed_operations=self._failures,
        )
        self._failing = None
        self._metrics.storage_writable(True)
        _call_each(self._recovered, "storage_recovered_hook_failed")

    def _still_failing(self, failure: Failure) -> None:
        if not failure.check(StorageFault):
            # Not the storage (a bug in the probe): said once per probe, and probed again.
            _log.failure("storage_probe_failed", failure=failure)
        self._arm()


def _call_each(hooks: list[Callable[[], object]], event: str) -> None:
    for hook in list(hooks):
        try:
            hook()
        except Exception:
            _log.failure(event)
