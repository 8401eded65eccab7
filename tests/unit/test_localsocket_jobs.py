"""The local socket's dispatch by request type: a jobs request goes to the jobs handler, a call
to the call handler, exactly as before; a client that hangs up stops the jobs work. Sessions on
memory transports with a Clock, nothing waited on but events."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock

from agentcall import limits
from agentcall.listener.localsocket import EventSink, Handlers, LocalSession, LocalSocketService
from agentcall.local.unixsocket import PeerCredentials
from agentcall.wire import codec, local
from agentcall.wire.local import (
    FROM_SERVICE_JOBS,
    EndKind,
    LocalEnded,
    LocalJobs,
    LocalJobsEnded,
    LocalProgress,
)
from tests.unit.agent_helpers import reactor
from tests.unit.mailbox_helpers import JOB_ID, KEN, job
from tests.unit.test_listener_localsocket import REQUEST, Handler, MemoryTransport

GET = LocalJobs("get", "ken", JOB_ID, wait_s=120)
DONE = LocalJobsEnded(1_750_000_000, KEN, info=job())


class JobsHandler:
    """Records each jobs request; the test decides when and how each one ends."""

    def __init__(self) -> None:
        self.requests: list[tuple[LocalJobs, EventSink, defer.Deferred[LocalJobsEnded]]] = []
        self.cancelled = False

    def __call__(self, request: LocalJobs, send: EventSink) -> defer.Deferred[LocalJobsEnded]:
        def cancel(_d: defer.Deferred[LocalJobsEnded]) -> None:
            self.cancelled = True

        work: defer.Deferred[LocalJobsEnded] = defer.Deferred(cancel)
        self.requests.append((request, send, work))
        return work


def session(
    *, with_jobs: bool = True
) -> tuple[LocalSession, MemoryTransport, Handler, JobsHandler]:
    calls, jobs = Handler(), JobsHandler()

    def read_peer(_sock: Any) -> PeerCredentials:
        return PeerCredentials(pid=42, uid=os.getuid(), gid=0)

    handlers = Handlers(calls, jobs if with_jobs else None)
    server = LocalSocketService(
        reactor,
        Path("/unused"),
        handlers,
        read_peer=read_peer,
        clock=Clock(),
        is_run_peer=lambda _pid, _leaders: False,
    )
    server.key = "cd" * 32
    proto = LocalSession(server)
    transport = MemoryTransport()
    proto.makeConnection(transport)
    proto.dataReceived(local.encode_key_line(server.key))
    return proto, transport, calls, jobs


def lines(transport: MemoryTransport) -> list[object]:
    return [
        local.decode_line(line, FROM_SERVICE_JOBS, max_bytes=limits.MAX_LOCAL_EVENT_BYTES)
        for line in transport.value().splitlines()
    ]


def test_a_jobs_request_goes_to_the_jobs_handler_with_its_progress() -> None:
    proto, transport, calls, jobs = session()
    proto.dataReceived(codec.encode(GET) + b"\n")
    assert calls.calls == []
    [(request, send, work)] = jobs.requests
    assert request == GET
    send(LocalProgress(f"waiting up to 120 s for job {JOB_ID}…"))
    assert not transport.disconnecting
    work.callback(DONE)
    assert lines(transport) == [LocalProgress(f"waiting up to 120 s for job {JOB_ID}…"), DONE]
    assert transport.disconnecting


def test_a_call_still_goes_to_the_call_handler() -> None:
    proto, _transport, calls, jobs = session()
    proto.dataReceived(codec.encode(REQUEST) + b"\n")
    assert jobs.requests == [] and [c[0] for c in calls.calls] == [REQUEST]


def test_a_client_that_hangs_up_stops_the_jobs_work() -> None:
    proto, transport, _calls, jobs = session()
    proto.dataReceived(codec.encode(GET) + b"\n")
    transport.loseConnection()
    proto.connectionLost()
    assert jobs.cancelled
    assert transport.value() == b""


def test_jobs_work_that_breaks_is_a_local_error_worded_for_jobs() -> None:
    proto, transport, _calls, jobs = session()
    proto.dataReceived(codec.encode(GET) + b"\n")
    jobs.requests[0][2].errback(RuntimeError("boom"))
    [refusal] = lines(transport)
    assert isinstance(refusal, LocalEnded) and refusal.kind is EndKind.REFUSED
    assert refusal.code == "local_error" and "jobs command" in str(refusal.message)
    assert "boom" not in transport.value().decode()


def test_a_service_without_a_jobs_handler_refuses_the_request() -> None:
    proto, transport, calls, _jobs = session(with_jobs=False)
    proto.dataReceived(codec.encode(GET) + b"\n")
    [refusal] = lines(transport)
    assert isinstance(refusal, LocalEnded) and refusal.code == "bad_request"
    assert calls.calls == [] and transport.disconnecting


def test_a_service_line_in_place_of_a_request_is_refused() -> None:
    proto, transport, calls, jobs = session()
    proto.dataReceived(codec.encode(DONE) + b"\n")
    [refusal] = lines(transport)
    assert isinstance(refusal, LocalEnded) and refusal.code == "bad_request"
    assert calls.calls == [] and jobs.requests == []
