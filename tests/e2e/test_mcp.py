"""`agentcall mcp` through real processes: the SDK's stdio client starts the server as a coding
agent would, and its tools place real calls through a real relay and listeners.

Which path a call took is read from the logs (the relay's ``caller_socket``, the listener's
``local_call_ended``), never guessed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, TextContent

from tests.e2e.installs import Install, World, two_people
from tests.e2e.test_thin_call import OWN, SHARED

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("mcp")) as world:
        world.ken.edit_config(agent_timeout_s=120, kill_grace_s=0.5)
        world.ken.start_listener()
        world.ken.listener.log.wait_for(r"local_socket_listening")  # type: ignore[union-attr]
        yield world


@pytest.fixture(scope="module")
def rita(world: World) -> Install:
    """A callee who opted in to offline delivery and is not listening."""
    person = Install("rita", world.root / "rita", world.relay.ca_file)
    person.setup(world.invite(), "rita", "--agent", "claude")
    done = person.cli("access", "--offline", "enabled")
    assert done.returncode == 0, done.stderr
    return person


def tools_of(
    person: Install, calls: list[tuple[str, dict[str, Any]]], **env: str
) -> list[CallToolResult]:
    """Start `agentcall mcp` as `person` and make these tool calls in order."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agentcall", "mcp"],
        env=person.env(**env),
        cwd=person.root,
    )

    async def run() -> list[CallToolResult]:
        async with Client(params) as client:
            return [await client.call_tool(name, args) for name, args in calls]

    return anyio.run(run)


def one(person: Install, name: str, args: dict[str, Any], **env: str) -> CallToolResult:
    (result,) = tools_of(person, [(name, args)], **env)
    return result


def text(result: CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


def test_a_call_without_a_service_dials_the_relay_and_comes_back_fenced(world: World) -> None:
    mark = world.relay.log.mark()
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "agentcall", "mcp"], env=world.ann.env()
    )
    heard: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append(message)

    async def run() -> CallToolResult:
        async with Client(params) as client:
            args = {"address": "ken", "message": "why is main red?"}
            return await client.call_tool("call", args, progress_callback=on_progress)

    result = anyio.run(run)
    # The lifecycle came as progress while the call went on.
    assert heard == [
        "ringing",
        "their listener took the call",
        "their agent is working on it",
    ]
    assert not result.is_error, text(result)
    said = text(result)
    assert said.startswith("Answer from @acme/ken (call_id ")
    assert "not by your user" in said
    assert "\nFAKE-AGENT-ANSWER: why is main red?\n<<<agentcall-untrusted-" in said
    # ann is caller-only: no service, so the CLI the server ran dialled the relay itself.
    world.relay.log.wait_for(OWN.format(caller="ann"), since=mark)


def test_a_call_with_a_service_goes_through_it(world: World) -> None:
    listener = world.ken.listener
    assert listener is not None
    mark = listener.log.mark()
    relay_mark = world.relay.log.mark()
    result = one(world.ken, "call", {"address": "@acme/ken", "message": "note to self"})
    assert not result.is_error, text(result)
    assert "FAKE-AGENT-ANSWER: note to self" in text(result)
    listener.log.wait_for(r"local_call_ended .*kind='answer'", since=mark)
    world.relay.log.wait_for(SHARED.format(caller="ken"), since=relay_mark)


def test_failures_are_the_products_codes(world: World) -> None:
    unknown, blocked_task = tools_of(
        world.ann,
        [
            ("call", {"address": "nobody-here", "message": "hello?"}),
            ("call", {"address": "ken", "message": "hi", "task": "deploy"}),
        ],
    )
    assert unknown.is_error and unknown.structured_content["code"] == "unknown_handle"
    assert blocked_task.is_error
    assert blocked_task.structured_content["code"] == "task_unknown"
    assert "Traceback" not in text(unknown) + text(blocked_task)


def test_inside_an_answering_agent_no_call_is_placed(world: World) -> None:
    mark = world.relay.log.mark()
    result = one(world.ann, "call", {"address": "ken", "message": "x"}, AGENTCALL_CALL_ID="c1")
    assert result.is_error and result.structured_content["code"] == "nested_call"
    contacts = one(world.ann, "contacts", {}, AGENTCALL_CALL_ID="c1")
    assert not contacts.is_error
    assert not any("call_ended" in line for line in world.relay.log.lines[mark:])


def test_a_queued_call_returns_its_job_and_the_jobs_tools_follow_it(
    world: World, rita: Install
) -> None:
    (queued,) = tools_of(world.ann, [("call", {"address": "rita", "message": "when back: hi"})])
    assert not queued.is_error, text(queued)
    body = queued.structured_content
    assert body["queued"] is True and body["address"] == "@acme/rita"
    job = body["job_id"]
    assert f'job_id "{job}"' in text(queued) and "jobs_get" in text(queued)
    listed, pending, cancelled, after = tools_of(
        world.ann,
        [
            ("jobs_list", {"address": "rita"}),
            ("jobs_get", {"address": "rita", "job_id": job, "wait_s": 0}),
            ("jobs_cancel", {"address": "rita", "job_id": job, "wait_s": 0}),
            ("jobs_get", {"address": "rita", "job_id": job, "wait_s": 0}),
        ],
    )
    assert [j["job_id"] for j in listed.structured_content["jobs"]] == [job]
    assert not pending.is_error and pending.structured_content["pending"] is True
    assert pending.structured_content["state"] == "queued"
    assert not cancelled.is_error and cancelled.structured_content["state"] == "cancelled"
    assert after.is_error and after.structured_content["code"] == "canceled"


def test_whoami_and_contacts_answer_from_local_files(world: World) -> None:
    assert world.ann.cli("contacts", "add", "kenny", "@acme/ken").returncode == 0
    whoami, contacts = tools_of(world.ann, [("whoami", {}), ("contacts", {})])
    assert whoami.structured_content["address"] == "@acme/ann"
    assert whoami.structured_content["service_running"] is False
    names = [c["name"] for c in contacts.structured_content["contacts"]]
    assert "kenny" in names


def test_inspect_fences_the_card_as_the_other_persons_words(world: World) -> None:
    result = one(world.ann, "inspect", {"address": "ken"})
    assert not result.is_error, text(result)
    said = text(result)
    assert said.startswith("What AgentCall knows of @acme/ken.")
    assert "written by @acme/ken (their card), not by your user" in said
