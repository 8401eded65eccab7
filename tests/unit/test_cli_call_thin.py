"""`agentcall call` through a running service: the same output as the direct path, and a CLI
process that imports no Twisted, autobahn or crypto. The service is a stub on a real UNIX
socket (a thread), answering with the lines a real one would send."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from agentcall.caller.call import CallResult, QueuedJob
from agentcall.caller.callflow import ended_from_result
from agentcall.cli import call as call_cli
from agentcall.local import unixsocket
from agentcall.local.home import Home
from agentcall.wire import codec
from agentcall.wire.local import LocalStatus
from tests.unit.cli_helpers import install, isolate, run_with_clock
from tests.unit.localstub import (
    imported,
    loaded,
    run_probed,
    serve_lines,
    service_key,
    serving,
)
from tests.unit.test_cli_call import CALL_ID, FakeFlow, failed, reply, run

REPO = Path(__file__).resolve().parents[2]


@attrs.define
class StubService:
    """Accepts connections on the installation's socket; answers each with ``lines``."""

    listening: socket.socket
    path: Path
    key: str
    lines: list[bytes] = attrs.field(factory=list)
    requests: list[dict[str, object]] = attrs.field(factory=list)
    hang_up_after: int | None = None  # close after this many lines, without an ended one

    def serve(self) -> None:
        serve_lines(self.listening, self.key, self._answer)

    def _answer(self, request: bytes) -> list[bytes]:
        self.requests.append(json.loads(request))
        return self.lines if self.hang_up_after is None else self.lines[: self.hang_up_after]


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StubService]:
    home_dir = isolate(monkeypatch, tmp_path)
    install(home_dir)
    path = Home.from_environ({"HOME": str(home_dir)}).service_socket_path
    sock, _identity = unixsocket.bind_listening(path)
    service = StubService(sock, path, service_key(path))
    with serving(sock, service.serve):
        yield service


def _statuses() -> list[bytes]:
    return [
        codec.encode(LocalStatus(state, CALL_ID)) for state in ("ringing", "answered", "working")
    ]


def _elapsed_free(text: str) -> str:
    return re.sub(r"\d+\.\ds", "N.Ns", text)


OUTCOMES = {
    "reply": (reply("fine\x1b[2J"), None),
    "reply-task": (reply("fine", task="review"), None),
    "failure": (failed("busy", detail="another call"), None),
    "offered": (failed("task_not_offered", offered=("ask", "review")), "review"),
    "queued": (
        CallResult("@acme/bob", None, 0.1, job=QueuedJob(CALL_ID, 1_750_003_600)),
        None,
    ),
}


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("name", sorted(OUTCOMES))
def test_both_paths_print_the_same(
    name: str,
    as_json: bool,
    stub: StubService,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    result, task = OUTCOMES[name]
    result = attrs.evolve(result, address="@acme/bob")
    argv = ["bob", "hello", *(["--task", task] if task else []), *(["--json"] if as_json else [])]

    stub.lines = [*_statuses(), codec.encode(ended_from_result(result, task))]
    thin = run(capsys, *argv)
    assert stub.requests, "the call did not go through the service"

    # The same call placed directly (no service), with the flow faked the same way.
    stub.path.unlink()  # no service any more
    fake = FakeFlow(result)
    monkeypatch.setattr("agentcall.caller.call.place", fake.place)
    monkeypatch.setattr(call_cli, "run_on_reactor", run_with_clock)
    direct = run(capsys, *argv)
    assert fake.calls, "the call did not go directly"

    assert thin[0] == direct[0]
    assert thin[1] == direct[1]
    assert _elapsed_free(thin[2]) == _elapsed_free(direct[2])


def test_the_request_carries_the_call_as_typed(
    stub: StubService, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.lines = [
        codec.encode(ended_from_result(attrs.evolve(reply("ok"), address="@acme/bob"), None))
    ]
    code, _out, _err = run(
        capsys,
        "bob",
        "two",
        "words",
        "--task",
        "review",
        "--continue",
        "--no-queue",
        "--timeout",
        "30",
    )
    assert code == 0
    assert stub.requests == [
        {
            "type": "call",
            "target": "bob",
            "message": "two words",
            "task": "review",
            "continue": True,
            "context_id": None,
            "queue": False,
            "timeout_ms": 30_000,
        }
    ]


def test_a_service_that_stops_mid_call_is_one_line_and_exit_one(
    stub: StubService, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.lines = _statuses()
    stub.hang_up_after = 2
    code, out, err = run(capsys, "bob", "hello")
    assert (code, out) == (1, "")
    progress, last = err.splitlines()
    assert progress.startswith("ringing…")
    assert last.startswith("agentcall: the local AgentCall service stopped during the call")


def test_a_service_stopping_mid_call_in_json(
    stub: StubService, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.lines = []
    code, out, _err = run(capsys, "bob", "hello", "--json")
    assert code == 1
    assert json.loads(out)["code"] == "service_stopped"


def test_garbage_from_the_service_is_one_line_too(
    stub: StubService, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.lines = [b'{"type": "ended", "kind": "answer"}']
    code, _out, err = run(capsys, "bob", "hello")
    assert code == 1
    assert "cannot read" in err.splitlines()[-1]


def test_a_nested_call_is_refused_before_the_service_is_asked(
    stub: StubService, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTCALL_CALL_ID", CALL_ID)
    code, _out, err = run(capsys, "bob", "hello")
    assert code == 1 and "nested calls are not supported" in err
    assert stub.requests == []


@pytest.mark.slow
def test_the_thin_path_imports_no_twisted_autobahn_or_crypto(
    stub: StubService, tmp_path: Path
) -> None:
    """The CLI as its own process against the stub: at exit, none of them is in sys.modules."""
    stub.lines = [
        *_statuses(),
        codec.encode(ended_from_result(attrs.evolve(reply("fine"), address="@acme/bob"), None)),
    ]
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCALL_")}
    env["HOME"] = str(tmp_path / "home")
    done = run_probed(["call", "bob", "hello"], env, REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "fine\n"
    assert stub.requests, "the call did not go through the stub service"
    assert imported(done) == set()
    # Nor attrs, cattrs, the codec or the relay's frames (the lines read and write themselves),
    # nor what only minting ids or writing files needs.
    assert loaded(done) == set()


def test_a_relay_named_for_this_run_bypasses_the_service(
    stub: StubService, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """AGENTCALL_RELAY overrides the relay for one run; the service keeps its own relay, so
    such a call is placed directly."""
    monkeypatch.setenv("AGENTCALL_RELAY", "https://other.example")
    fake = FakeFlow(attrs.evolve(reply("direct"), address="@acme/bob"))
    monkeypatch.setattr("agentcall.caller.call.place", fake.place)
    monkeypatch.setattr(call_cli, "run_on_reactor", run_with_clock)
    code, out, _err = run(capsys, "bob", "hello")
    assert (code, out) == (0, "direct\n")
    assert stub.requests == [] and fake.calls
