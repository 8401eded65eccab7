"""``GET /v1/audit/export``: an organisation's audit rows written to the HTTP response as they
are read, never all held at once.

:class:`ExportStream` is a push producer registered on the request. It reads one page of
``limits.AUDIT_EXPORT_PAGE`` rows from the store (by id, after the last one written), writes
them as NDJSON lines (:class:`~agentcall.wire.http.AuditEvent`), and asks for the next page on
the next reactor turn, unless the transport has paused it (its buffer is full: a slow reader
slows the export down instead of filling the relay's memory). Memory stays at one page and the
transport's buffer whatever the number of rows. The rows are those up to the newest id when the
export began, so rows written meanwhile neither stretch it nor appear half-way.

A whole export ends with one :class:`~agentcall.wire.http.AuditExportEnd` line counting the
events; a store failure half-way aborts the connection instead, so the client sees a body cut
short (no end line, no last chunk), never one that looks complete.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.python.failure import Failure
from twisted.web import server
from zope.interface import implementer

from agentcall import limits
from agentcall.logevents import Logger
from agentcall.relay import api_rules as rules
from agentcall.relay.api_rules import ExportWindow
from agentcall.relay.store_interface import AuditArchive, AuditRow
from agentcall.wire import codec, http

_log = Logger(namespace="agentcall.relay.audit_export")

CONTENT_TYPE = b"application/x-ndjson"


@implementer(IPushProducer)
class ExportStream:
    """Writes the audit rows of ``org`` in ``window`` with ids up to ``up_to_id`` to
    ``request``, a page at a time; :meth:`start` begins, the transport paces it."""

    def __init__(
        self,
        request: server.Request,
        store: AuditArchive,
        clock: IReactorTime,
        org: str,
        window: ExportWindow,
        up_to_id: int,
        *,
        page: int = limits.AUDIT_EXPORT_PAGE,
    ) -> None:
        self._request = request
        self._store = store
        self._clock = clock
        self._org = org
        self._window = window
        self._up_to_id = up_to_id
        self._page = page
        self._after = 0
        self.events = 0
        self.pages = 0
        self._paused = False
        self._reading = False
        self._due: Any = None
        self._done = False

    def start(self) -> None:
        request = self._request
        request.setResponseCode(200)
        request.setHeader(b"content-type", CONTENT_TYPE)
        request.registerProducer(self, True)
        request.notifyFinish().addErrback(lambda _failure: self.stopProducing())
        self._read()

    # --- IPushProducer ----------------------------------------------------------------------

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        self._soon()

    def stopProducing(self) -> None:
        """The client went away: nothing more is read or written."""
        if not self._done:
            self._done = True
            self._cancel_due()
            _log.info("audit_export_abandoned", org=self._org, events=self.events)

    # --- the pages ----------------------------------------------------------------------------

    def _soon(self) -> None:
        if self._done or self._paused or self._reading or self._due is not None:
            return
        self._due = self._clock.callLater(0, self._turn)

    def _turn(self) -> None:
        self._due = None
        self._read()

    def _cancel_due(self) -> None:
        if self._due is not None and self._due.active():
            self._due.cancel()
        self._due = None

    def _read(self) -> None:
        if self._done or self._paused or self._reading:
            return
        self._reading = True
        found = self._store.audit_rows(
            self._org,
            limit=self._page,
            after_id=self._after,
            up_to_id=self._up_to_id,
            since=None if self._window.since is None else float(self._window.since),
            until=None if self._window.until is None else float(self._window.until),
        )
        # A row that is no valid export line fails the export like a failing store does.
        found.addCallback(self._got).addErrback(self._failed)

    def _got(self, rows: list[AuditRow]) -> None:
        self._reading = False
        if self._done:
            return
        self.pages += 1
        if rows:
            lines = [codec.encode(rules.export_event(row)) + b"\n" for row in rows]
            self._after = rows[-1].id
            self.events += len(rows)
            self._request.write(b"".join(lines))
        if len(rows) < self._page:
            self._end()
            return
        # The next page on the next turn, unless the write above paused us (resume asks).
        self._soon()

    def _end(self) -> None:
        self._done = True
        end = http.AuditExportEnd(complete=True, events=self.events)
        self._request.write(codec.encode(end) + b"\n")
        self._request.unregisterProducer()
        self._request.finish()
        _log.info("audit_exported", org=self._org, events=self.events, pages=self.pages)

    def _failed(self, failure: Failure) -> None:
        self._reading = False
        if self._done:
            return
        self._done = True
        _log.failure("audit_export_failed", failure=failure, org=self._org, events=self.events)
        self._request.unregisterProducer()
        # No end line and no last chunk: the client must not take this for a whole export.
        channel: Any = self._request.channel
        if channel is not None and channel.transport is not None:
            channel.transport.abortConnection()
