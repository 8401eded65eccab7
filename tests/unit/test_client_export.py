"""The audit export from the client side, against a small streaming server on a loopback
socket: events handed over as their lines arrive, and every way an export can stop short."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import pytest_twisted  # type: ignore[import-untyped,unused-ignore]
from twisted.internet import defer, task
from twisted.internet import reactor as _reactor
from twisted.internet.endpoints import serverFromString
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from agentcall.client.api import (
    MAX_EXPORT_LINE_BYTES,
    Credentials,
    ExportIncomplete,
    RelayApi,
)
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.relayurl import RelayUrl
from agentcall.wire import codec
from agentcall.wire.http import AuditEvent, AuditExportEnd

reactor: Any = _reactor
F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, None]])
CREDS = Credentials(org="acme", handle="ada", token="SECRETsecretSECRETsecretSECRETsecretSECRET1")


def twisted_test(f: F) -> F:
    result: F = pytest_twisted.ensureDeferred(f)
    return result


def line(n: int) -> bytes:
    return codec.encode(AuditEvent(id=n, at_ms=n, event="call.submit", actor="ann")) + b"\n"


def end(events: int) -> bytes:
    return codec.encode(AuditExportEnd(complete=True, events=events)) + b"\n"


class Streamer(Resource):
    """Writes ``chunks`` one reactor turn apart, then finishes (or drops the connection)."""

    isLeaf = True

    def __init__(self, chunks: list[bytes], *, finish: bool = True, status: int = 200) -> None:
        super().__init__()
        self.chunks = chunks
        self.finish = finish
        self.status = status
        self.uris: list[bytes] = []
        self.written: list[int] = []  # how many chunks were out when the client saw an event

    def render(self, request: Request) -> int:
        self.uris.append(request.uri)
        self.gone = False
        request.notifyFinish().addErrback(lambda _f: setattr(self, "gone", True))
        request.setResponseCode(self.status)
        task.deferLater(reactor, 0, self._next, request, 0)
        return NOT_DONE_YET

    def _next(self, request: Request, index: int) -> None:
        if self.gone:  # the client hung up (it found the export broken)
            return
        if index < len(self.chunks):
            request.write(self.chunks[index])
            self.written.append(index)
            task.deferLater(reactor, 0.01, self._next, request, index + 1)
        elif self.finish:
            request.finish()
        else:
            request.channel.transport.abortConnection()  # type: ignore[union-attr]


@pytest.fixture
def ports() -> Iterator[list[Any]]:
    running: list[Any] = []
    yield running
    for port in running:
        pytest_twisted.blockon(defer.maybeDeferred(port.stopListening))


async def serve(ports: list[Any], resource: Resource, **kw: Any) -> RelayApi:
    port = await serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(Site(resource))
    ports.append(port)
    url = RelayUrl.parse(f"http://127.0.0.1:{port.getHost().port}")
    return RelayApi(reactor, url, CREDS, **kw)


@twisted_test
async def test_events_are_handed_over_as_they_arrive_and_the_end_line_closes(
    ports: list[Any],
) -> None:
    streamer = Streamer([line(1) + line(2)[:10], line(2)[10:], line(3) + end(3)])
    api = await serve(ports, streamer)
    got: list[tuple[int, int]] = []
    done = await api.export_audit(
        lambda e: got.append((e.id, len(streamer.written))), since=10, until=20
    )
    assert done == AuditExportEnd(complete=True, events=3)
    # Event 1 was handed over while only the first chunk had been written.
    assert got == [(1, 1), (2, 2), (3, 3)]
    assert streamer.uris == [b"/v1/audit/export?since=10&until=20"]


@pytest.mark.parametrize(
    ("chunks", "finish", "says"),
    [
        ([line(1), line(2)], True, "stopped after 2 events without its end line"),
        ([line(1), line(2)], False, "stopped after 2 events without its end line"),
        ([line(1), end(1)], False, "stopped after 1 events without its end line"),
        ([line(1), end(2)], True, "its end line counts 2 events"),
        ([line(1), end(1), line(2)], True, "data after its end line"),
        ([line(1), b'{"id": "x"}\n'], True, "line 2 is not an audit event"),
        ([b"x" * (MAX_EXPORT_LINE_BYTES + 1)], True, "a line longer than"),
        ([line(1), end(1) + b'{"id"'], True, "data after its end line"),
    ],
)
@twisted_test
async def test_an_export_that_stops_short_or_is_broken_is_incomplete(
    ports: list[Any], chunks: list[bytes], finish: bool, says: str
) -> None:
    api = await serve(ports, Streamer(chunks, finish=finish))
    got: list[int] = []
    with pytest.raises(ExportIncomplete) as failed:
        await api.export_audit(lambda e: got.append(e.id))
    assert says in str(failed.value)
    assert failed.value.events == len(got)


@twisted_test
async def test_a_relay_gone_quiet_mid_export_is_incomplete(ports: list[Any]) -> None:
    streamer = Streamer([line(1)])
    streamer._next = lambda request, index: (  # type: ignore[method-assign]
        request.write(line(1)) if index == 0 else None
    )
    api = await serve(ports, streamer, timeout_s=0.3)
    with pytest.raises(ExportIncomplete, match=r"no data from .* for 0\.3 s after 1 events"):
        await api.export_audit(lambda _e: None)


@twisted_test
async def test_a_sink_that_fails_stops_the_export(ports: list[Any]) -> None:
    api = await serve(ports, Streamer([line(1), line(2), end(2)]))

    def full(_event: AuditEvent) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        await api.export_audit(full)


@twisted_test
async def test_a_refusal_is_an_api_error(ports: list[Any]) -> None:
    body = b'{"error": "forbidden", "message": "only an organisation admin may do this"}'
    api = await serve(ports, Streamer([body], status=403))
    with pytest.raises(ApiError) as refused:
        await api.export_audit(lambda _e: None)
    assert (refused.value.status, refused.value.code) == (403, ApiErrorCode.FORBIDDEN)


def test_bounds_are_checked_before_any_request() -> None:
    api = RelayApi(reactor, RelayUrl.parse("http://127.0.0.1:9"), CREDS)
    results: list[Any] = []
    api.export_audit(lambda _e: None, since=-1).addErrback(results.append)
    assert results and results[0].check(ValueError)
