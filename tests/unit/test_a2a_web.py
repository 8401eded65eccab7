"""The bridge's HTTP side in memory: a real Site on a memory transport, a fake placer.

Every request carries the bridge's token unless a test says otherwise; the gate's own tests
(the 401s, the run peer, no ``Server`` header) are in ``test_a2a_gate.py``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from agentcall.a2a import web
from agentcall.filetrust import PrivateFileError
from agentcall.wire.local import EndKind, LocalCall, LocalEnded
from tests.unit.relay_helpers import Answer, parse_answer

PORT = 8470
TOKEN = "T" * 43
KEN = "@acme/ken"
CTX = "ctx_" + "B" * 22
CALL_ID = "5f0c3a5e-1b2c-4d3e-8f4a-0123456789ab"


@attrs.define
class Placed:
    request: LocalCall
    on_state: Callable[[str], None]
    done: defer.Deferred[LocalEnded]
    cancelled: bool = False


class FakePlacer:
    """Records each call; the test says how it goes."""

    def __init__(self) -> None:
        self.calls: list[Placed] = []

    def place(
        self, request: LocalCall, on_state: Callable[[str], None]
    ) -> defer.Deferred[LocalEnded]:
        placed: Placed

        def cancel(_d: defer.Deferred[LocalEnded]) -> None:
            placed.cancelled = True

        placed = Placed(request, on_state, defer.Deferred(cancel))
        self.calls.append(placed)
        return placed.done


class FakeTokens:
    """The bridge's token as a test sets it; ``problem`` makes it unusable."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.problem: str | None = None

    def current(self) -> str:
        if self.problem is not None:
            raise PrivateFileError(Path("/state/a2a.token"), self.problem, "rotate it")
        return self.token


class FakeRunPeer:
    """Says which client endpoints belong to a run; records every lookup."""

    def __init__(self) -> None:
        self.runs: dict[int, int] = {}  # client port -> pid of a run
        self.asked: list[tuple[Any, Any]] = []

    def __call__(self, client: Any, server: Any) -> int | None:
        self.asked.append((client, server))
        return self.runs.get(client[1])


def _events(answer: Answer) -> list[Any]:
    """The SSE events of a stream's body, each a JSON-RPC response."""
    chunks = [c for c in answer.body.split(b"\n\n") if c]
    assert all(c.startswith(b"data: ") for c in chunks), answer.body
    return [json.loads(c[len(b"data: ") :]) for c in chunks]


class Harness:
    def __init__(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_780_000_000)
        self.placer = FakePlacer()
        counter = iter(range(1, 10_000))
        self.bridge = web.Bridge(
            self.clock, self.placer, "acme", mint=lambda: f"id-{next(counter)}"
        )
        self.tokens = FakeTokens()
        self.run_peer = FakeRunPeer()
        self.site = web.make_site(
            self.bridge, lambda: PORT, frozenset(), self.tokens, self.run_peer
        )
        self.last_protocol: Any = None

    def open(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        host: str = f"127.0.0.1:{PORT}",
        headers: dict[str, str] | None = None,
        client_port: int = 40000,
    ) -> StringTransport:
        """Send a request (HTTP/1.0, so a stream is the raw body); the transport it answers on.

        ``headers`` add to or replace the defaults; an empty value leaves that header out."""
        lines = [f"{method} {path} HTTP/1.0", f"Host: {host}"]
        sent = {
            "A2A-Version": "1.0",
            "Content-Type": "application/json",
            "Authorization": f"Bearer {self.tokens.token}",
        }
        sent.update(headers or {})
        lines += [f"{name}: {value}" for name, value in sent.items() if value]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")
        return self.open_raw(raw, client_port=client_port)

    def open_raw(self, raw: bytes, *, client_port: int = 40000) -> StringTransport:
        """Send ``raw`` bytes on a new connection from ``client_port``; its transport."""
        address = IPv4Address("TCP", "127.0.0.1", client_port)
        protocol = self.site.buildProtocol(address)
        transport = StringTransport(
            hostAddress=IPv4Address("TCP", "127.0.0.1", PORT), peerAddress=address
        )
        assert protocol is not None
        protocol.makeConnection(transport)
        protocol.dataReceived(raw)
        self.last_protocol = protocol
        return transport

    def request(self, method: str, path: str, body: bytes | None = None, **kw: Any) -> Answer:
        return parse(self.open(method, path, body, **kw))

    def rpc(self, method: str, params: dict[str, Any], path: str = "/agents/acme/ken") -> Any:
        return self.request("POST", path, _rpc(method, params)).json()


def parse(transport: StringTransport) -> Answer:
    return parse_answer(transport.value())


def _rpc(method: str, params: dict[str, Any], request_id: Any = "r1") -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    ).encode()


def _send(text: str = "why?", **message: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": text}]}
    body.update(message)
    return {"message": body}


def _answer(text: str = "the answer", context_id: str | None = CTX) -> LocalEnded:
    return LocalEnded(EndKind.ANSWER, KEN, CALL_ID, text=text, task="ask", context_id=context_id)


@pytest.fixture
def bridge() -> Harness:
    return Harness()


def test_the_card_is_served(bridge: Harness) -> None:
    answer = bridge.request("GET", "/agents/acme/ken/.well-known/agent-card.json")
    assert answer.status == 200
    assert answer.headers["content-type"] == "application/json"
    card = answer.json()
    assert card["supportedInterfaces"][0]["url"] == f"http://127.0.0.1:{PORT}/agents/acme/ken"


def test_the_card_uses_the_host_the_client_named(bridge: Harness) -> None:
    card = bridge.request(
        "GET", "/agents/acme/ken/.well-known/agent-card.json", host=f"localhost:{PORT}"
    ).json()
    assert card["supportedInterfaces"][0]["url"].startswith(f"http://localhost:{PORT}/")


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_foreign_host_is_forbidden(bridge: Harness, method: str) -> None:
    answer = bridge.request(
        method, "/agents/acme/ken", _rpc("SendMessage", _send()), host=f"evil.example:{PORT}"
    )
    assert answer.status == 403
    assert "local clients only" in answer.json()["error"]
    assert bridge.placer.calls == []


def test_unknown_paths_and_other_orgs_are_404(bridge: Harness) -> None:
    assert bridge.request("GET", "/").status == 404
    answer = bridge.request("GET", "/agents/other/ken/.well-known/agent-card.json")
    assert answer.status == 404
    assert "outside your organisation" in answer.json()["error"]
    assert bridge.request("POST", "/agents/other/ken", _rpc("GetTask", {"id": "x"})).status == 404


def test_wrong_methods_on_a_path_are_405(bridge: Harness) -> None:
    assert bridge.request("GET", "/agents/acme/ken").status == 405
    posted = bridge.request("POST", "/agents/acme/ken/.well-known/agent-card.json", b"{}")
    assert posted.status == 405


def test_a_body_that_is_not_json_typed_is_415(bridge: Harness) -> None:
    """A browser page can post text/plain across origins without asking; that is refused."""
    answer = bridge.request(
        "POST",
        "/agents/acme/ken",
        _rpc("SendMessage", _send()),
        headers={"Content-Type": "text/plain"},
    )
    assert answer.status == 415
    assert bridge.placer.calls == []


def test_errors_are_json_rpc_with_http_200(bridge: Harness) -> None:
    answer = bridge.request("POST", "/agents/acme/ken", b"{oops")
    assert answer.status == 200
    assert answer.json()["error"]["code"] == -32700
    missing = bridge.request(
        "POST", "/agents/acme/ken", _rpc("GetTask", {"id": "x"}), headers={"A2A-Version": ""}
    )
    assert missing.json()["error"]["code"] == -32009
    assert bridge.rpc("GetTask", {"id": "nope"})["error"]["code"] == -32001


def test_a_huge_body_is_refused_and_not_kept(bridge: Harness) -> None:
    from agentcall.a2a import rpc

    huge = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": "'
        + b"x" * (rpc.MAX_BODY_BYTES * 3)
        + b'"}'
    )
    answer = parse(bridge.open("POST", "/agents/acme/ken", huge)).json()
    assert answer["error"]["code"] == -32600
    assert "larger than" in answer["error"]["message"]
    assert bridge.placer.calls == []


def test_a_request_keeps_at_most_one_byte_over_the_limit(bridge: Harness) -> None:
    from twisted.web.http import HTTPChannel

    from agentcall.a2a import rpc

    channel = HTTPChannel()
    channel.site = bridge.site  # type: ignore[attr-defined]
    channel.transport = StringTransport()
    request = web.CappedRequest(channel)
    request.gotLength(None)
    for _ in range(5):
        request.handleContentChunk(b"x" * rpc.MAX_BODY_BYTES)
    assert request.content is not None
    assert request.content.seek(0, 2) == rpc.MAX_BODY_BYTES + 1


def test_send_message_waits_for_the_answer(bridge: Harness) -> None:
    transport = bridge.open("POST", "/agents/acme/ken", _rpc("SendMessage", _send("why?")))
    assert transport.value() == b""  # nothing until the call ends
    (placed,) = bridge.placer.calls
    assert placed.request.target == KEN
    assert placed.request.message == "why?"
    assert placed.request.queue is False
    assert placed.request.context_id is None
    placed.on_state("ringing")
    placed.on_state("working")
    placed.done.callback(_answer("\x1b[2Jthe answer"))
    body = parse(transport).json()
    assert body["id"] == "r1"
    task = body["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"][0]["text"] == "the answer"
    assert task["artifacts"][0]["metadata"]["agentcall"]["untrusted"] is True
    assert task["history"][0]["messageId"] == "m1"


def test_a_named_task_is_asked_for(bridge: Harness) -> None:
    bridge.open(
        "POST",
        "/agents/acme/ken",
        _rpc("SendMessage", _send(metadata={"agentcall": {"task": "review"}})),
    )
    (placed,) = bridge.placer.calls
    assert placed.request.task == "review"


def test_streaming_reports_the_lifecycle_then_the_answer(bridge: Harness) -> None:
    transport = bridge.open("POST", "/agents/acme/ken", _rpc("SendStreamingMessage", _send()))
    (placed,) = bridge.placer.calls
    placed.on_state("ringing")
    placed.on_state("ringing")  # repeated: not shown twice
    placed.on_state("answered")
    placed.on_state("working")
    placed.done.callback(_answer())
    answer = parse(transport)
    assert answer.headers["content-type"] == "text/event-stream"
    results = [event["result"] for event in _events(answer)]
    assert all(event["id"] == "r1" for event in _events(answer))
    assert results[0]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    states = [r["statusUpdate"]["status"]["state"] for r in results if "statusUpdate" in r]
    assert states == [
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]
    assert "artifactUpdate" in results[-2]
    assert transport.disconnecting  # the stream ends with the task


def test_a_call_that_ends_at_once_still_answers(bridge: Harness) -> None:
    """A placer that refuses without the network answers before the request is watched."""

    class Refusing(FakePlacer):
        def place(
            self, request: LocalCall, on_state: Callable[[str], None]
        ) -> defer.Deferred[LocalEnded]:
            return defer.succeed(LocalEnded.refused("not_set_up", "run agentcall setup"))

    bridge.bridge.placer = Refusing()
    answer = bridge.rpc("SendMessage", _send())
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_FAILED"
    streamed = bridge.request("POST", "/agents/acme/ken", _rpc("SendStreamingMessage", _send()))
    results = [event["result"] for event in _events(streamed)]
    assert results[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_FAILED"
    assert "not_set_up" in results[-1]["statusUpdate"]["status"]["message"]["parts"][0]["text"]


def test_return_immediately_then_get_task(bridge: Harness) -> None:
    params = _send()
    params["configuration"] = {"returnImmediately": True}
    task = bridge.rpc("SendMessage", params)["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
    (placed,) = bridge.placer.calls
    placed.on_state("working")
    assert bridge.rpc("GetTask", {"id": task["id"]})["result"]["status"]["state"] == (
        "TASK_STATE_WORKING"
    )
    placed.done.callback(_answer())
    got = bridge.rpc("GetTask", {"id": task["id"], "historyLength": 0})["result"]
    assert got["status"]["state"] == "TASK_STATE_COMPLETED"
    assert "history" not in got


def test_cancel_hangs_up_and_ends_the_task(bridge: Harness) -> None:
    params = _send()
    params["configuration"] = {"returnImmediately": True}
    task_id = bridge.rpc("SendMessage", params)["result"]["task"]["id"]
    (placed,) = bridge.placer.calls
    canceled = bridge.rpc("CancelTask", {"id": task_id})["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    assert placed.cancelled
    # The hang-up's own report changes nothing.
    assert bridge.rpc("GetTask", {"id": task_id})["result"]["status"]["state"] == (
        "TASK_STATE_CANCELED"
    )
    again = bridge.rpc("CancelTask", {"id": task_id})
    assert again["error"]["code"] == -32002
    assert bridge.rpc("CancelTask", {"id": "nope"})["error"]["code"] == -32001


def test_a_cancelled_stream_ends_canceled(bridge: Harness) -> None:
    transport = bridge.open("POST", "/agents/acme/ken", _rpc("SendStreamingMessage", _send()))
    (task_id,) = bridge.bridge.tasks.ids()
    bridge.rpc("CancelTask", {"id": task_id})
    results = [event["result"] for event in _events(parse(transport))]
    assert results[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_CANCELED"


def test_a_follow_up_in_the_context_continues_the_conversation(bridge: Harness) -> None:
    first = bridge.open("POST", "/agents/acme/ken", _rpc("SendMessage", _send("one")))
    bridge.placer.calls[0].done.callback(_answer())
    context_id = parse(first).json()["result"]["task"]["contextId"]
    second = bridge.open(
        "POST", "/agents/acme/ken", _rpc("SendMessage", _send("two", contextId=context_id))
    )
    assert bridge.placer.calls[1].request.context_id == CTX
    bridge.placer.calls[1].done.callback(_answer(context_id=CTX))
    assert parse(second).json()["result"]["task"]["contextId"] == context_id
    # The same context with someone else is refused before anything is placed.
    other = bridge.rpc("SendMessage", _send("x", contextId=context_id), path="/agents/acme/ann")
    assert other["error"]["code"] == -32602
    assert len(bridge.placer.calls) == 2


def test_a_message_for_an_existing_task_is_refused(bridge: Harness) -> None:
    params = _send()
    params["configuration"] = {"returnImmediately": True}
    task_id = bridge.rpc("SendMessage", params)["result"]["task"]["id"]
    refused = bridge.rpc("SendMessage", _send(taskId=task_id))
    assert refused["error"]["code"] == -32004
    assert bridge.rpc("SendMessage", _send(taskId="unknown"))["error"]["code"] == -32001
    assert len(bridge.placer.calls) == 1


def test_a_placer_that_crashes_fails_the_task(bridge: Harness) -> None:
    transport = bridge.open("POST", "/agents/acme/ken", _rpc("SendMessage", _send()))
    bridge.placer.calls[0].done.errback(RuntimeError("boom"))
    task = parse(transport).json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    assert "boom" not in json.dumps(task)


def test_a_placer_that_raises_fails_the_task(bridge: Harness) -> None:
    class Raising(FakePlacer):
        def place(
            self, request: LocalCall, on_state: Callable[[str], None]
        ) -> defer.Deferred[LocalEnded]:
            raise RuntimeError("boom")

    bridge.bridge.placer = Raising()
    task = bridge.rpc("SendMessage", _send())["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    assert "[internal]" in task["status"]["message"]["parts"][0]["text"]


def test_a_client_that_hangs_up_leaves_the_task_running(bridge: Harness) -> None:
    from twisted.internet.error import ConnectionDone
    from twisted.python.failure import Failure

    transport = bridge.open("POST", "/agents/acme/ken", _rpc("SendStreamingMessage", _send()))
    assert transport.value().startswith(b"HTTP/1.0 200")
    bridge.last_protocol.connectionLost(Failure(ConnectionDone()))
    (placed,) = bridge.placer.calls
    assert not placed.cancelled
    placed.done.callback(_answer())
    (task_id,) = bridge.bridge.tasks.ids()
    assert bridge.rpc("GetTask", {"id": task_id})["result"]["status"]["state"] == (
        "TASK_STATE_COMPLETED"
    )
