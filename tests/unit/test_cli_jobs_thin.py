"""`agentcall jobs` through a running service: the same stdout, stderr and exit status as the
direct path, and a CLI process that imports no Twisted, autobahn or crypto.

The service is a stub on a real UNIX socket (a thread) that does what the real one does with a
jobs request: :func:`agentcall.caller.jobsflow.run_request` against the relay's job routes in
memory, on a Clock. The direct path runs the same flow from the CLI's process against the same
routes, set up the same way again."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentcall import limits
from agentcall.caller import jobsflow
from agentcall.cli import call as call_cli
from agentcall.cli import viaservice
from agentcall.client.api import RelayUnreachable
from agentcall.local import unixsocket
from agentcall.local.home import Home
from agentcall.wire import codec, local
from agentcall.wire.http import JobFailureReason, JobInfo, JobState
from agentcall.wire.local import TO_SERVICE, LocalEnded, LocalJobs, LocalProgress
from agentcall.wire.payloads import CallFailure, Reply
from tests.unit.cli_helpers import run_with_clock
from tests.unit.localstub import imported, run_probed, serve_lines, service_key, serving
from tests.unit.mailbox_helpers import JOB_ID, KEN, OTHER_JOB, FakeJobRelay, job
from tests.unit.test_cli_call_thin import REPO
from tests.unit.test_cli_jobs import RUNNING, STOPPING, World, listed, run, world

__all__ = ["world"]  # the fixture, used by name


@attrs.define
class JobsStub:
    """Accepts connections on the installation's socket and runs each jobs request."""

    listening: socket.socket
    path: Path
    key: str
    world: World
    requests: list[dict[str, object]] = attrs.field(factory=list)
    hang_up: bool = False  # close after reading the request, saying nothing
    refuse: bool = False  # answer as a service that knows only calls does

    def serve(self) -> None:
        serve_lines(self.listening, self.key, self._reply)

    def _reply(self, line: bytes) -> list[bytes]:
        self.requests.append(json.loads(line))
        if self.hang_up:
            return []
        if self.refuse:
            return [codec.encode(LocalEnded.refused("bad_request", "jobs is not expected here"))]
        return [codec.encode(out) for out in self._answer(line)]

    def _answer(self, line: bytes) -> list[object]:
        request = local.decode_line(line, TO_SERVICE, max_bytes=limits.MAX_LOCAL_REQUEST_BYTES)
        assert isinstance(request, LocalJobs)
        home, config = call_cli.load_installation()
        relay = self.world.relay
        said: list[object] = []

        async def work(clock: Any) -> object:
            relay.clock = clock
            return await jobsflow.run_request(
                clock,
                home,
                config,
                request,
                lambda text: said.append(LocalProgress(text)),
                api=relay,
            )

        ended = run_with_clock(work)
        return [*said, ended]


@pytest.fixture
def stub(world: World) -> Iterator[JobsStub]:
    path = Home.from_environ().service_socket_path
    sock, _identity = unixsocket.bind_listening(path)
    service = JobsStub(sock, path, service_key(path), world)
    with serving(sock, service.serve):
        yield service


def _answer(text: str) -> Callable[[World], None]:
    return lambda w: w.answer(Reply(text=text, task="ask"))


def _script(*infos: JobInfo) -> Callable[[World], None]:
    def setup(w: World) -> None:
        w.relay.script = list(infos)

    return setup


def _stopping(*then: JobInfo) -> Callable[[World], None]:
    def setup(w: World) -> None:
        w.relay.script = [RUNNING, *then]
        w.relay.cancel_answer = STOPPING

    return setup


def _unreachable(w: World) -> None:
    w.relay.fail = RelayUnreachable("connection refused")


FAILED = job(state=JobState.FAILED, reason=JobFailureReason.DELIVERY_FAILED, attempts=3)
CANCELLED = job(state=JobState.CANCELLED, attempts=1)

SCENARIOS: dict[str, tuple[Callable[[World], None], list[str]]] = {
    "list": (listed, ["list"]),
    "list-filtered": (listed, ["list", "bob"]),
    "list-empty": (lambda w: None, ["list"]),
    "get-answer": (_answer("ok\x1b[2J the disk"), ["get", KEN, JOB_ID]),
    "get-refused": (lambda w: w.answer(CallFailure(code="blocked")), ["get", KEN, JOB_ID]),
    "get-pending": (lambda w: None, ["get", KEN, JOB_ID, "--wait", "45"]),
    "get-failed": (_script(FAILED), ["get", KEN, JOB_ID, "--wait", "600"]),
    "get-unknown": (lambda w: None, ["get", KEN, OTHER_JOB]),
    "get-bad-target": (lambda w: None, ["get", "no such one", JOB_ID]),
    "get-unreachable": (_unreachable, ["get", KEN, JOB_ID]),
    "cancel-queued": (lambda w: None, ["cancel", KEN, JOB_ID]),
    "cancel-running": (_stopping(STOPPING, CANCELLED), ["cancel", KEN, JOB_ID]),
    "cancel-outlasted": (_stopping(STOPPING), ["cancel", KEN, JOB_ID, "--wait", "45"]),
    "cancel-ended": (_script(CANCELLED), ["cancel", KEN, JOB_ID]),
    "list-unreachable": (_unreachable, ["list", KEN]),
}


def _fresh(world: World, setup: Callable[[World], None]) -> None:
    """The relay's routes as new (the same object: the CLI's relay_api hands out that one)."""
    new = FakeJobRelay()
    for field in attrs.fields(FakeJobRelay):
        if field.name != "clock":
            setattr(world.relay, field.name, getattr(new, field.name))
    setup(world)


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_both_paths_print_the_same(
    name: str, as_json: bool, stub: JobsStub, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    setup, argv = SCENARIOS[name]
    argv = ["jobs", *argv, *(["--json"] if as_json else [])]

    _fresh(world, setup)
    thin = run(capsys, *argv)
    assert len(stub.requests) == 1, "the command did not go through the service"
    asked_thin = list(world.relay.asked)

    stub.path.unlink()  # no service any more: the same command from this process
    _fresh(world, setup)
    direct = run(capsys, *argv)
    assert len(stub.requests) == 1

    assert thin == direct
    assert asked_thin == world.relay.asked


def test_the_request_carries_the_command_as_typed(
    stub: JobsStub, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, "jobs", "get", "ken", JOB_ID.upper(), "--wait", "45")
    run(capsys, "jobs", "list")
    assert stub.requests == [
        {"type": "jobs", "command": "get", "target": "ken", "job_id": JOB_ID, "wait_s": 45},
        {"type": "jobs", "command": "list", "target": None, "job_id": None, "wait_s": 0},
    ]


@pytest.mark.parametrize(
    ("argv", "wait"),
    [(["get", KEN, JOB_ID, "--wait", "600"], 600), (["cancel", KEN, JOB_ID], 60), (["list"], 0)],
)
def test_the_client_waits_as_long_as_the_job_may(
    argv: list[str],
    wait: int,
    stub: JobsStub,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The thin client's patience covers the long poll it asked for, plus the call's margin."""
    seen: list[float] = []
    real = viaservice._exchange

    def spy(request: Any, patience_s: float, *rest: Any) -> Any:
        seen.append(patience_s)
        return real(request, patience_s, *rest)

    monkeypatch.setattr(viaservice, "_exchange", spy)
    run(capsys, "jobs", *argv)
    assert seen == [wait + limits.LOCAL_RESULT_MARGIN_S]


def test_a_service_that_stops_is_one_line_and_exit_one(
    stub: JobsStub, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.hang_up = True
    code, out, err = run(capsys, "jobs", "get", KEN, JOB_ID)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "agentcall: the local AgentCall service stopped before it said how the request ended; "
        "check `agentcall doctor`, then try again"
    ]
    code, out, _err = run(capsys, "jobs", "list", "--json")
    assert code == 1 and json.loads(out)["code"] == "service_stopped"


def test_a_stale_socket_falls_back_to_the_relay(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A socket file nothing listens on (a killed service): the command runs directly."""
    path = Home.from_environ().service_socket_path
    sock, _identity = unixsocket.bind_listening(path)
    sock.close()  # the file stays, nobody listens
    assert path.exists()
    code, out, _err = run(capsys, "jobs", "cancel", KEN, JOB_ID)
    assert (code, out) == (0, f"job {JOB_ID} to {KEN}: cancelled\n")
    assert ("cancel", JOB_ID) in world.relay.asked


def test_a_relay_named_for_this_run_bypasses_the_service(
    stub: JobsStub,
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AGENTCALL_RELAY", "https://other.example")
    code, _out, _err = run(capsys, "jobs", "list")
    assert code == 0
    assert stub.requests == [] and world.relay.asked == [("list",)]


def test_jobs_inside_an_answering_agent_are_refused_before_the_service_is_asked(
    stub: JobsStub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTCALL_CALL_ID", JOB_ID)
    code, _out, err = run(capsys, "jobs", "list")
    assert code == 1 and "nested calls are not supported" in err
    assert stub.requests == []


@pytest.mark.slow
def test_the_thin_path_imports_no_twisted_autobahn_or_crypto(stub: JobsStub, world: World) -> None:
    """`jobs get` as its own process against the stub: the answer printed, and at exit none of
    them is in sys.modules."""
    world.answer(Reply(text="fine"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCALL_")}
    env["HOME"] = os.environ["HOME"]
    done = run_probed(["jobs", "get", KEN, JOB_ID], env, REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "fine\n"
    assert stub.requests, "the command did not go through the stub service"
    assert imported(done) == set()


def test_cancelling_the_services_work_abandons_the_long_poll(world: World) -> None:
    """What the service does when its client hangs up: the jobs Deferred is cancelled, and the
    long poll at the relay with it (nothing is left waiting on the clock)."""
    from twisted.internet import defer
    from twisted.internet.task import Clock

    home, config = call_cli.load_installation()
    clock = Clock()
    world.relay.clock = clock
    said: list[str] = []
    work = defer.Deferred.fromCoroutine(
        jobsflow.run_request(
            clock,
            home,
            config,
            LocalJobs("get", KEN, JOB_ID, wait_s=120),
            said.append,
            api=world.relay,
        )
    )
    clock.advance(5)
    assert not work.called and clock.getDelayedCalls(), "the long poll is not waiting"
    assert said == [f"waiting up to 120 s for job {JOB_ID}…"]
    work.cancel()
    failures: list[object] = []
    work.addErrback(failures.append)
    assert failures and clock.getDelayedCalls() == []


def test_a_service_that_knows_only_calls_is_passed_over(
    stub: JobsStub, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """An older service refuses a jobs line as malformed, having done nothing: the command
    then runs from this process, as if there were no service."""
    stub.refuse = True
    code, out, _err = run(capsys, "jobs", "cancel", KEN, JOB_ID)
    assert (code, out) == (0, f"job {JOB_ID} to {KEN}: cancelled\n")
    assert len(stub.requests) == 1 and ("cancel", JOB_ID) in world.relay.asked
