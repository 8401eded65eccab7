"""The A2A bridge end to end, driven by the official ``a2a-sdk`` client (nobody here wrote it).

A real relay, ken's real listener with the fake agent, and ann's ``agentcall a2a serve`` as a
process. ann is caller-only (no listener service), so the bridge dials the relay itself. The
SDK fetches ken's Agent Card from the bridge, streams a message (the call's lifecycle comes as
task status updates, the answer as a text artifact), sends one without streaming, follows up
in the same contextId, reads a task back with GetTask, and meets an unknown address.

Every request but the card carries the token `agentcall a2a token` prints, put there by the
SDK's own ``AuthInterceptor`` from the bearer scheme the card declares; without it, or with a
rotated one, the bridge refuses (401).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.installs import AgentGate, Install, World, a2a_bridge, two_people

pytestmark = pytest.mark.e2e

a2a_client = pytest.importorskip("a2a.client", reason="the a2a-sdk test client is not installed")
httpx = pytest.importorskip("httpx")
a2a_errors = pytest.importorskip("a2a.utils.errors")
from a2a.client import AuthInterceptor, ClientCallContext, CredentialService  # noqa: E402
from a2a.types import a2a_pb2 as pb  # noqa: E402

# Bounds each wait for the bridge's answer (never a delay): generous for a loaded machine.
CLIENT_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("a2a")) as world:
        world.ken.edit_config(agent_timeout_s=120)
        # At debug, ken's listener logs call_cancelled: how the cancel test sees the hang-up.
        world.ken.start_listener(AGENTCALL_LOG_LEVEL="debug")
        yield world


@pytest.fixture(scope="module")
def bridge(world: World) -> Iterator[str]:
    """ann's bridge: she is caller-only, so it dials the relay itself."""
    with a2a_bridge(world.ann) as (url, log):
        yield url
        # Every call through ann's bridge went the direct way.
        assert "path='service'" not in log.text()
        assert "path='direct'" in log.text()
        # No token it was shown, right or wrong, ever reached its log.
        assert _SHOWN
        assert not any(token in log.text() for token in _SHOWN)


# Every token sent to a bridge in this module, to look for in its log at the end.
_SHOWN: list[str] = []


def _token(install: Install) -> str:
    """The bridge's token, as its owner gets it."""
    done = install.cli("a2a", "token")
    assert done.returncode == 0, done.stderr
    _SHOWN.append(done.stdout.strip())
    return _SHOWN[-1]


class _Token(CredentialService):
    """Gives the SDK the bridge's token for the card's bearer scheme, and nothing else."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def get_credentials(
        self, security_scheme_name: str, context: ClientCallContext | None
    ) -> str | None:
        return self._token if security_scheme_name == "bearer" else None


def _authed(card: Any, http: Any, token: str | None, **config: Any) -> Any:
    """An SDK client for ``card`` that authenticates as the card says (with ``token``)."""
    interceptors = [] if token is None else [AuthInterceptor(_Token(token))]
    factory = a2a_client.ClientFactory(a2a_client.ClientConfig(httpx_client=http, **config))
    return factory.create(card, interceptors=interceptors)


def _message(text: str, context_id: str | None = None) -> pb.SendMessageRequest:
    message = pb.Message(
        message_id=str(uuid.uuid4()), role=pb.ROLE_USER, parts=[pb.Part(text=text)]
    )
    if context_id is not None:
        message.context_id = context_id
    return pb.SendMessageRequest(message=message)


async def _exchange(
    base: str, address_path: str, token: str, *, streaming: bool, texts: list[str]
) -> Any:
    """Fetch the card, send each text in turn (the later ones in the first one's contextId),
    and return the card and, per text, the stream responses received."""
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as http:
        resolver = a2a_client.A2ACardResolver(http, f"{base}{address_path}")
        card = await resolver.get_agent_card()
        client = _authed(card, http, token, streaming=streaming)
        rounds: list[list[pb.StreamResponse]] = []
        context_id: str | None = None
        for text in texts:
            events = [event async for event in client.send_message(_message(text, context_id))]
            rounds.append(events)
            first = events[0]
            context_id = first.task.context_id if first.HasField("task") else None
        last = rounds[-1][-1]
        task_id = last.status_update.task_id if last.HasField("status_update") else last.task.id
        fetched = await client.get_task(pb.GetTaskRequest(id=task_id))
        return card, rounds, fetched


def _answer_text(task: pb.Task) -> str:
    (artifact,) = task.artifacts
    return "".join(part.text for part in artifact.parts)


def test_the_sdk_streams_a_call_and_reads_the_answer(world: World, bridge: str) -> None:
    world.ken.set_scenario("happy")
    card, rounds, fetched = asyncio.run(
        _exchange(
            bridge,
            "/agents/acme/ken",
            _token(world.ann),
            streaming=True,
            texts=["why did CI fail?"],
        )
    )
    assert card.supported_interfaces[0].url == f"{bridge}/agents/acme/ken"
    assert card.supported_interfaces[0].protocol_version == "1.0"
    assert card.capabilities.streaming
    # The SDK read the bearer scheme off the card: that is how its AuthInterceptor knew to
    # send the token, without which the rest of this exchange would have been refused.
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert list(card.security_requirements[0].schemes) == ["bearer"]
    (events,) = rounds
    assert events[0].HasField("task")
    assert events[0].task.status.state == pb.TASK_STATE_SUBMITTED
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    assert pb.TASK_STATE_WORKING in states
    assert states[-1] == pb.TASK_STATE_COMPLETED
    (artifact_event,) = [e for e in events if e.HasField("artifact_update")]
    text = "".join(part.text for part in artifact_event.artifact_update.artifact.parts)
    assert text == "FAKE-AGENT-ANSWER: why did CI fail?"
    assert "@acme/ken" in artifact_event.artifact_update.artifact.name
    assert fetched.status.state == pb.TASK_STATE_COMPLETED
    assert _answer_text(fetched) == text


def test_a_message_without_streaming_and_its_follow_up(world: World, bridge: str) -> None:
    """SendMessage answers with the finished task; a second message in its contextId is a
    follow-up in the AgentCall conversation the first answer opened."""
    world.ken.set_scenario("happy")
    _card, rounds, fetched = asyncio.run(
        _exchange(
            bridge,
            "/agents/acme/ken",
            _token(world.ann),
            streaming=False,
            texts=["first question", "and then?"],
        )
    )
    first, second = rounds
    (one,) = first
    (two,) = second
    assert one.task.status.state == pb.TASK_STATE_COMPLETED
    assert _answer_text(one.task) == "FAKE-AGENT-ANSWER: first question"
    assert two.task.context_id == one.task.context_id
    assert two.task.status.state == pb.TASK_STATE_COMPLETED
    assert fetched.id == two.task.id
    runs = world.ken.agent_runs()
    assert "and then?" in runs[-1]["prompt"]
    # The agent resumed the session of the first answer (what `agentcall call --continue` does).
    assert "--resume" in runs[-1]["argv"]
    assert "--resume" not in runs[-2]["argv"]


def test_an_unknown_address_is_a_rejected_task(world: World, bridge: str) -> None:
    _card, rounds, _fetched = asyncio.run(
        _exchange(
            bridge, "/agents/acme/nobody", _token(world.ann), streaming=False, texts=["hello?"]
        )
    )
    ((only,),) = rounds
    assert only.task.status.state == pb.TASK_STATE_REJECTED
    reason = "".join(part.text for part in only.task.status.message.parts)
    assert "unknown_handle" in reason


def test_a_card_outside_the_organisation_is_not_found(world: World, bridge: str) -> None:
    async def fetch() -> None:
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as http:
            await a2a_client.A2ACardResolver(http, f"{bridge}/agents/other/ken").get_agent_card()

    with pytest.raises(a2a_client.AgentCardResolutionError):
        asyncio.run(fetch())


def test_with_a_running_service_the_call_goes_through_it(world: World) -> None:
    """ken runs his listener service: his own bridge hands the call to it (a call to himself,
    as setup's self-check places one)."""
    world.ken.set_scenario("happy")
    with a2a_bridge(world.ken) as (url, log):
        mark = log.mark()
        _card, rounds, fetched = asyncio.run(
            _exchange(
                url,
                "/agents/acme/ken",
                _token(world.ken),
                streaming=True,
                texts=["through the service?"],
            )
        )
        log.wait_for(r"a2a_call_placed .*path='service'", since=mark)
    assert fetched.status.state == pb.TASK_STATE_COMPLETED
    assert _answer_text(fetched) == "FAKE-AGENT-ANSWER: through the service?"
    states = [e.status_update.status.state for e in rounds[0] if e.HasField("status_update")]
    assert pb.TASK_STATE_WORKING in states


async def _client(http: Any, base: str, token: str | None, **config: Any) -> Any:
    card = await a2a_client.A2ACardResolver(http, base).get_agent_card()
    return _authed(card, http, token, **config)


def test_cancel_task_hangs_up_the_call(world: World, bridge: str, tmp_path: Path) -> None:
    """A task sent to return at once, then cancelled while ken's agent works: the task ends
    CANCELED and ken's listener hears the hang-up; an unknown task is the SDK's own error."""
    assert world.ken.listener is not None
    gate = AgentGate.make(tmp_path / "gate")
    world.ken.set_scenario({"name": "happy", "hold": gate.scenario()})
    mark = world.ken.listener.log.mark()
    base = f"{bridge}/agents/acme/ken"
    token = _token(world.ann)

    async def send() -> pb.Task:
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as http:
            client = await _client(http, base, token, streaming=False, polling=True)
            (event,) = [e async for e in client.send_message(_message("take your time"))]
            task: pb.Task = event.task
            return task

    async def cancel(task_id: str) -> pb.Task:
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as http:
            client = await _client(http, base, token, streaming=False)
            task: pb.Task = await client.cancel_task(pb.CancelTaskRequest(id=task_id))
            with pytest.raises(a2a_errors.TaskNotCancelableError):
                await client.cancel_task(pb.CancelTaskRequest(id=task_id))
            with pytest.raises(a2a_errors.TaskNotFoundError):
                await client.get_task(pb.GetTaskRequest(id="no-such-task"))
            return task

    try:
        sent = asyncio.run(send())
        assert sent.status.state in (pb.TASK_STATE_SUBMITTED, pb.TASK_STATE_WORKING)
        gate.wait_started()
        canceled = asyncio.run(cancel(sent.id))
        world.ken.listener.log.wait_for(r"call_cancelled", since=mark)
    finally:
        world.ken.set_scenario("happy")
        gate.release()
    assert canceled.status.state == pb.TASK_STATE_CANCELED


def _get_task(url: str, authorization: str | None) -> Any:
    """A GetTask of a task nobody has, posted by hand with ``authorization`` (or none)."""
    headers = {"A2A-Version": "1.0", "Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "no-such-task"}}
    return httpx.post(url, json=body, headers=headers, timeout=CLIENT_TIMEOUT_S)


def test_without_the_token_nothing_but_the_card_is_answered(world: World, bridge: str) -> None:
    """The SDK without credentials is refused, and so are hand-made requests without the
    token or with a wrong one; the card stays public. No answer names the server."""
    base = f"{bridge}/agents/acme/ken"

    async def send_without_a_token() -> None:
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as http:
            client = await _client(http, base, None, streaming=False)
            [event async for event in client.send_message(_message("let me in"))]

    with pytest.raises(a2a_client.A2AClientError, match="401"):
        asyncio.run(send_without_a_token())
    missing = _get_task(base, None)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer ")
    assert "agentcall a2a token" in missing.json()["error"]
    _SHOWN.append("x" * 43)
    wrong = _get_task(base, "Bearer " + _SHOWN[-1])
    assert wrong.status_code == 401
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
    card = httpx.get(f"{base}/.well-known/agent-card.json", timeout=CLIENT_TIMEOUT_S)
    assert card.status_code == 200
    allowed = _get_task(base, f"Bearer {_token(world.ann)}")
    assert allowed.json()["error"]["code"] == -32001  # through the gate: no such task
    for answer in (missing, wrong, card, allowed):
        assert "server" not in answer.headers
    # ken's agent was never asked anything by the refused requests.
    assert not any("let me in" in run["prompt"] for run in world.ken.agent_runs())


def test_a_rotated_token_is_taken_without_a_restart(world: World, bridge: str) -> None:
    base = f"{bridge}/agents/acme/ken"
    old = _token(world.ann)
    assert _get_task(base, f"Bearer {old}").status_code == 200
    rotated = world.ann.cli("a2a", "token", "--rotate")
    assert rotated.returncode == 0, rotated.stderr
    new = rotated.stdout.strip()
    assert new != old
    assert new == _token(world.ann)
    assert "running bridges" in rotated.stderr
    assert _get_task(base, f"Bearer {old}").status_code == 401
    assert _get_task(base, f"Bearer {new}").json()["error"]["code"] == -32001
