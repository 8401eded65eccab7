"""A scripted OpenAI Responses API on loopback, for driving the real ``codex`` binary.

Codex 0.171 offers the model one JavaScript "code mode" tool, ``exec`` (a custom tool inside
the ``additional_tools`` input item); shell commands and patches are nested calls made from
that script: ``tools.exec_command({cmd})`` and ``tools.apply_patch(text)``. A :class:`CodeExec`
turn therefore answers with a ``custom_tool_call`` to ``exec`` carrying JavaScript, built by
:func:`shell` or :func:`patch`; a :class:`Final` turn answers with an assistant message.

The turn for a request is chosen like the Anthropic mock's: by how many outputs for this
script's own call ids the input already holds. The answer is streamed as SSE events.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from tests.realagents.mockhttp import (
    DEFAULT_LIFETIME_S,
    RecordedRequest,
    Reply,
    ScriptedServer,
    sse,
)

_OUTPUT_TYPES = frozenset({"custom_tool_call_output", "function_call_output"})


@attrs.frozen
class CodeExec:
    """The model calls the code-mode ``exec`` tool with this JavaScript source."""

    source: str


@attrs.frozen
class Final:
    """The model answers with text; the turn ends."""

    text: str


Turn = CodeExec | Final


def shell(cmd: str) -> CodeExec:
    """A shell command through ``tools.exec_command``; its result goes back as text."""
    return CodeExec(
        f"const r = await tools.exec_command({{cmd: {json.dumps(cmd)}}});\ntext(JSON.stringify(r));"
    )


def patch(body: str) -> CodeExec:
    """A freeform patch (``*** Begin Patch`` … ``*** End Patch``) through ``tools.apply_patch``."""
    return CodeExec(
        f"const r = await tools.apply_patch({json.dumps(body)});\ntext(JSON.stringify(r));"
    )


def mcp_tool(server: str, tool: str, arguments: Mapping[str, Any]) -> CodeExec:
    """A tool of a configured MCP server, which Codex 0.171 defers to ``exec`` as
    ``tools.mcp__<server>__<tool>``; the text blocks of its result go back as the output,
    after a first line saying whether it was an error."""
    return CodeExec(
        f"const r = await tools.mcp__{server}__{tool}({json.dumps(dict(arguments))});\n"
        'text("isError=" + String(r.isError === true));\n'
        'text((r.content || []).map((c) => c.text || "").join("\\n"));'
    )


def add_file_patch(path: str, content: str) -> str:
    """The patch text that adds one file holding ``content`` (one ``+`` line per line)."""
    lines = "".join(f"+{line}\n" for line in content.splitlines())
    return f"*** Begin Patch\n*** Add File: {path}\n{lines}*** End Patch\n"


@attrs.frozen
class ToolOutput:
    """What Codex sent back for one of the scripted calls, flattened to text."""

    call_id: str
    text: str


def _flatten(output: object) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "\n".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in output
        )
    return "" if output is None else json.dumps(output)


def _input_items(body: object) -> list[dict[str, Any]]:
    if not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return []
    return [item for item in body["input"] if isinstance(item, dict)]


def _offers_tools(body: object) -> bool:
    if not isinstance(body, dict):
        return False
    return bool(body.get("tools")) or any(
        item.get("type") == "additional_tools" for item in _input_items(body)
    )


class MockResponses:
    """The Responses API stand-in. Use :meth:`script` before each CLI run."""

    def __init__(self, lifetime_s: float = DEFAULT_LIFETIME_S) -> None:
        self._lock = threading.Lock()
        self._turns: tuple[Turn, ...] = (Final("no script was set"),)
        self._prefix = "call_unset_"
        self.server = ScriptedServer(self._answer, lifetime_s)

    # --- test side ------------------------------------------------------------------------

    def script(self, turns: Sequence[Turn]) -> list[str]:
        """Replace the script; returns the call id each CodeExec turn will carry."""
        if not turns or not isinstance(turns[-1], Final):
            raise ValueError("a script ends with a Final turn")
        prefix = f"call_{secrets.token_hex(6)}_"
        with self._lock:
            self._turns = tuple(turns)
            self._prefix = prefix
        return [f"{prefix}{k:02d}" for k, t in enumerate(turns) if isinstance(t, CodeExec)]

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.server.requests

    def tool_outputs(self) -> dict[str, ToolOutput]:
        """Every tool output seen in any request, by call id."""
        found: dict[str, ToolOutput] = {}
        for request in self.requests:
            for item in _input_items(request.json):
                if item.get("type") in _OUTPUT_TYPES:
                    ident = str(item.get("call_id"))
                    found[ident] = ToolOutput(ident, _flatten(item.get("output")))
        return found

    def start(self) -> MockResponses:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    # --- server side ----------------------------------------------------------------------

    def _answer(self, request: RecordedRequest) -> Reply:
        route = request.route
        if request.method in ("GET", "HEAD"):
            if route.endswith("/models"):
                return Reply.of_json(200, {"object": "list", "data": [], "models": []})
            return _not_found()
        if not route.endswith("/responses") or not isinstance(request.json, dict):
            return _not_found()
        with self._lock:
            turns, prefix = self._turns, self._prefix
        items = _input_items(request.json)
        done = {
            str(item.get("call_id"))
            for item in items
            if item.get("type") in _OUTPUT_TYPES and str(item.get("call_id")).startswith(prefix)
        }
        step = min(len(done), len(turns) - 1)
        turn = turns[step]
        if isinstance(turn, CodeExec) and _offers_tools(request.json):
            item: dict[str, Any] = {
                "type": "custom_tool_call",
                "id": f"ctc_{prefix}{step:02d}",
                "call_id": f"{prefix}{step:02d}",
                "name": "exec",
                "input": turn.source,
                "status": "completed",
            }
        else:
            text = turn.text if isinstance(turn, Final) else "the mock has no tool to call"
            item = {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{secrets.token_hex(6)}",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        return _stream(item)


def _not_found() -> Reply:
    return Reply.of_json(404, {"error": {"message": "not in the mock", "type": "not_found"}})


def _stream(item: Mapping[str, Any]) -> Reply:
    response_id = f"resp_{secrets.token_hex(6)}"
    usage = {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 6,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 18,
    }
    events: list[tuple[str, Mapping[str, Any]]] = [
        (
            "response.created",
            {"type": "response.created", "response": {"id": response_id, "status": "in_progress"}},
        ),
        (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        ),
        (
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        ),
        (
            "response.completed",
            {
                "type": "response.completed",
                "response": {"id": response_id, "status": "completed", "usage": usage},
            },
        ),
    ]
    return Reply(200, sse(events), "text/event-stream")
