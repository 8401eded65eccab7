"""A scripted Anthropic Messages API on loopback, for driving the real ``claude`` binary.

A script is a list of turns. Each main-loop request (one that offers tools) is answered with
the turn at index *k*, where *k* is how many results for this script's own tool calls the
conversation already carries; so a retried request gets the same turn again, and the earlier
turns of a resumed session (whose tool ids belong to an older script) do not shift the count.
A :class:`ToolUse` turn answers with one ``tool_use`` block, a :class:`Final` turn with text
and ``end_turn``. Side requests without tools (titles, summaries) get a short text, token
counting gets a number, and anything else a harmless 404 in the API's error shape.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from tests.realagents.mockhttp import (
    DEFAULT_LIFETIME_S,
    RecordedRequest,
    Reply,
    ScriptedServer,
    sse,
)

SIDE_ANSWER = "ok"


@attrs.frozen
class ToolUse:
    """The model calls one tool."""

    name: str
    input: Mapping[str, Any]


@attrs.frozen
class Final:
    """The model answers with text and ends its turn."""

    text: str


Turn = ToolUse | Final


@attrs.frozen
class ToolResult:
    """A ``tool_result`` block the CLI sent back, its content flattened to text."""

    tool_use_id: str
    is_error: bool
    text: str


def _flatten(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text", "")) if isinstance(block, dict) else str(block)
            for block in content
        )
    return "" if content is None else json.dumps(content)


def _blocks(messages: object) -> Iterator[dict[str, Any]]:
    if not isinstance(messages, list):
        return
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            for block in message["content"]:
                if isinstance(block, dict):
                    yield block


class MockAnthropic:
    """The Messages API stand-in. Use :meth:`script` before each CLI run."""

    def __init__(self, lifetime_s: float = DEFAULT_LIFETIME_S) -> None:
        self._lock = threading.Lock()
        self._turns: tuple[Turn, ...] = (Final("no script was set"),)
        self._prefix = "toolu_unset_"
        self.server = ScriptedServer(self._answer, lifetime_s)

    # --- test side ------------------------------------------------------------------------

    def script(self, turns: Sequence[Turn]) -> list[str]:
        """Replace the script; returns the tool_use id each ToolUse turn will carry."""
        if not turns or not isinstance(turns[-1], Final):
            raise ValueError("a script ends with a Final turn")
        prefix = f"toolu_{secrets.token_hex(6)}_"
        with self._lock:
            self._turns = tuple(turns)
            self._prefix = prefix
        return [f"{prefix}{k:02d}" for k, t in enumerate(turns) if isinstance(t, ToolUse)]

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.server.requests

    def main_requests(self) -> list[RecordedRequest]:
        """The agent-loop requests: those to /v1/messages that offered tools."""
        return [r for r in self.requests if _is_messages(r) and _offers_tools(r.json)]

    def tool_results(self) -> dict[str, ToolResult]:
        """Every tool_result seen in any request, by tool_use id (the latest copy wins)."""
        found: dict[str, ToolResult] = {}
        for request in self.requests:
            if not _is_messages(request):
                continue
            for block in _blocks(request.json.get("messages")):
                if block.get("type") == "tool_result":
                    ident = str(block.get("tool_use_id"))
                    found[ident] = ToolResult(
                        ident, block.get("is_error") is True, _flatten(block.get("content"))
                    )
        return found

    def start(self) -> MockAnthropic:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    # --- server side ----------------------------------------------------------------------

    def _answer(self, request: RecordedRequest) -> Reply:
        route = request.route
        if request.method in ("GET", "HEAD"):
            if route in ("", "/"):
                return Reply.of_json(200, {})
            return _not_found()
        if route.endswith("/v1/messages/count_tokens"):
            return Reply.of_json(200, {"input_tokens": 42})
        if not route.endswith("/v1/messages") or not isinstance(request.json, dict):
            return _not_found()
        body: dict[str, Any] = request.json
        if not _offers_tools(body):
            return _message(body, [{"type": "text", "text": SIDE_ANSWER}], "end_turn")
        with self._lock:
            turns, prefix = self._turns, self._prefix
        done = {
            str(b.get("tool_use_id"))
            for b in _blocks(body.get("messages"))
            if b.get("type") == "tool_result" and str(b.get("tool_use_id")).startswith(prefix)
        }
        step = min(len(done), len(turns) - 1)
        turn = turns[step]
        if isinstance(turn, ToolUse):
            block = {
                "type": "tool_use",
                "id": f"{prefix}{step:02d}",
                "name": turn.name,
                "input": dict(turn.input),
            }
            return _message(body, [block], "tool_use")
        return _message(body, [{"type": "text", "text": turn.text}], "end_turn")


def _is_messages(request: RecordedRequest) -> bool:
    return (
        request.method == "POST"
        and request.route.endswith("/v1/messages")
        and isinstance(request.json, dict)
    )


def _offers_tools(body: object) -> bool:
    return isinstance(body, dict) and bool(body.get("tools"))


def _not_found() -> Reply:
    return Reply.of_json(
        404, {"type": "error", "error": {"type": "not_found_error", "message": "not in the mock"}}
    )


def _message(body: Mapping[str, Any], blocks: list[dict[str, Any]], stop: str) -> Reply:
    model = str(body.get("model") or "mock-model")
    ident = f"msg_{secrets.token_hex(8)}"
    usage = {
        "input_tokens": 12,
        "output_tokens": 6,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    if not body.get("stream"):
        return Reply.of_json(
            200,
            {
                "id": ident,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": blocks,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": usage,
            },
        )
    start: dict[str, Any] = {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    events: list[tuple[str, Mapping[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            delta: dict[str, Any] = {"type": "text_delta", "text": block["text"]}
        else:
            opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            ),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 6},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return Reply(200, sse(events), "text/event-stream")
