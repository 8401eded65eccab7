"""The bridge on ``twisted.web``: Agent Cards, JSON-RPC requests, and task streams over SSE.

:class:`Bridge` holds the tasks and contexts (:mod:`agentcall.a2a.tasks`) and starts calls
through a placer (:class:`agentcall.a2a.placing.CallPlacer`); :class:`BridgeResource` is the
thin HTTP side: it checks ``Host`` and the body's type, reads at most a request's worth, lets
:mod:`agentcall.a2a.rpc` read the request and writes what comes back. Every JSON-RPC answer,
an error too, is HTTP 200 with a JSON body, as A2A's JSON-RPC binding has it; a streaming
request that is refused before it starts gets that same JSON answer instead of a stream.

In front of it, :class:`agentcall.a2a.gate.Gate` lets through only the owner's own local
clients (a loopback ``Host``, the bearer token, no answering agent's run); no answer names the
server software (:class:`CappedRequest`).

A task outlives the HTTP request that started it: a client that hangs up can still read the
task with ``GetTask``; only ``CancelTask`` hangs up the call.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet import defer
from twisted.python.failure import Failure
from twisted.web import http, resource, server

from agentcall import __version__, limits
from agentcall.a2a import cards, contexts, gate, rpc, tasks
from agentcall.cli.render import describe_error
from agentcall.errors import CallErrorCode
from agentcall.logevents import Logger
from agentcall.wire.local import LocalCall, LocalEnded

log = Logger()

LOCAL_ONLY = gate.LOCAL_ONLY
# One stream event, or the end of the stream (None).
Watcher = Callable[[dict[str, Any] | None], None]


class Placer(Protocol):
    def place(
        self, request: LocalCall, on_state: Callable[[str], None]
    ) -> defer.Deferred[LocalEnded]: ...


def _describe(code: CallErrorCode) -> str:
    try:
        return describe_error(code)
    except KeyError:
        return str(code)


def _mint() -> str:
    return str(uuid.uuid4())


class Bridge:
    """The tasks, contexts and running calls of one bridge process."""

    def __init__(
        self, reactor: Any, placer: Placer, org: str, mint: Callable[[], str] = _mint
    ) -> None:
        self.reactor = reactor
        self.placer = placer
        self.org = org
        self.tasks = tasks.TaskBook()
        self.contexts = contexts.ContextBook()
        self._mint = mint
        self._running: dict[str, defer.Deferred[LocalEnded]] = {}
        self._started: dict[str, float] = {}
        self._watchers: dict[str, list[Watcher]] = {}

    # --- the methods --------------------------------------------------------------------

    def send(self, address: str, params: rpc.SendParams) -> tasks.TaskRecord:
        """Start the call ``params`` asks for; the task it became (SUBMITTED)."""
        if params.task_id is not None:
            known = self.tasks.get(params.task_id)
            if known is None:
                raise rpc.RpcError(rpc.Code.TASK_NOT_FOUND, f"no task {params.task_id}")
            raise rpc.RpcError(
                rpc.Code.UNSUPPORTED_OPERATION,
                f"task {params.task_id} takes no more messages (each message is one call); "
                "send a new message, with the same contextId to follow up",
            )
        try:
            joined = self.contexts.resolve(params.context_id, address, self._mint())
        except contexts.ContextMismatch as exc:
            raise rpc.RpcError(rpc.Code.INVALID_PARAMS, str(exc)) from None
        try:
            request = LocalCall(
                target=address,
                message=params.text,
                task=params.task,
                context_id=joined.agentcall_context,
                # A2A clients wait on the task; a job kept for days has no place in one.
                queue=False,
            )
        except ValueError as exc:
            raise rpc.RpcError(
                rpc.Code.INVALID_PARAMS, f"the message cannot be sent: {exc}"
            ) from None
        task_id = self._mint()
        message = tasks.text_message(
            params.message_id, joined.context_id, task_id, params.text, role="ROLE_USER"
        )
        record = self.tasks.put(
            tasks.new_task(task_id, joined.context_id, address, message, self.reactor.seconds())
        )
        self._started[task_id] = self.reactor.seconds()

        def on_state(call_state: str) -> None:
            current = self.tasks.get(task_id)
            if current is None:
                return
            moved = tasks.advanced(current, call_state, self.reactor.seconds())
            if moved is not None:
                self.tasks.put(moved)
                self._tell(task_id, tasks.status_update(moved))

        def ended(outcome: LocalEnded) -> None:
            self._running.pop(task_id, None)
            self._end(task_id, tasks.finish(outcome, _describe))

        def failed(failure: Failure) -> None:
            self._running.pop(task_id, None)
            if failure.check(defer.CancelledError):
                end = tasks.Finish(tasks.TaskState.CANCELED, "canceled [canceled]", "canceled")
            else:
                log.failure("a2a_call_crashed", failure)
                end = tasks.Finish(
                    tasks.TaskState.FAILED,
                    "the bridge failed placing the call [internal]",
                    "internal",
                )
            self._end(task_id, end)

        # A placer that raises instead of answering fails this task, not the request.
        running = defer.maybeDeferred(self.placer.place, request, on_state)
        self._running[task_id] = running
        running.addCallbacks(ended, failed)
        log.info("a2a_task_started", task_id=task_id, address=address)
        return self.tasks.get(task_id) or record

    def get(self, params: rpc.TaskIdParams) -> dict[str, Any]:
        record = self._known(params.task_id)
        return tasks.task_json(record, params.history_length)

    def cancel(self, params: rpc.TaskIdParams) -> dict[str, Any]:
        record = self._known(params.task_id)
        running = self._running.pop(params.task_id, None)
        if record.done or running is None:
            raise rpc.RpcError(
                rpc.Code.TASK_NOT_CANCELABLE,
                f"task {params.task_id} has ended ({record.state}); there is nothing to cancel",
            )
        end = tasks.Finish(
            tasks.TaskState.CANCELED, "canceled by the client: the call was hung up", "canceled"
        )
        self._end(params.task_id, end)
        running.cancel()  # hangs up; what it reports later changes nothing
        current = self.tasks.get(params.task_id) or record
        return tasks.task_json(current)

    # --- watching -----------------------------------------------------------------------

    def watch(self, task_id: str, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher`` with each stream event of a running task, then None at its end;
        the function returned stops watching."""
        watchers = self._watchers.setdefault(task_id, [])
        watchers.append(watcher)

        def stop() -> None:
            if watcher in self._watchers.get(task_id, []):
                self._watchers[task_id].remove(watcher)

        return stop

    def _tell(self, task_id: str, event: dict[str, Any] | None) -> None:
        for watcher in list(self._watchers.get(task_id, [])):
            watcher(event)

    def _end(self, task_id: str, end: tasks.Finish) -> None:
        start = self._started.pop(task_id, None)
        current = self.tasks.get(task_id)
        if current is None or current.done:
            return
        record = self.tasks.put(tasks.finished(current, end, self._mint(), self.reactor.seconds()))
        self.contexts.settle(record.context_id, record.address, end, self.reactor.seconds())
        log.info(
            "a2a_task_ended",
            task_id=task_id,
            address=record.address,
            state=str(record.state),
            code=end.code,
            elapsed_s=None if start is None else round(self.reactor.seconds() - start, 3),
        )
        artifact = tasks.artifact_update(record)
        if artifact is not None:
            self._tell(task_id, artifact)
        self._tell(task_id, tasks.status_update(record))
        self._tell(task_id, None)
        self._watchers.pop(task_id, None)

    def _known(self, task_id: str) -> tasks.TaskRecord:
        record = self.tasks.get(task_id)
        if record is None:
            raise rpc.RpcError(
                rpc.Code.TASK_NOT_FOUND, f"no task {task_id} (tasks are kept in memory)"
            )
        return record


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class BridgeResource(resource.Resource):
    """Every path of the bridge: cards (GET) and JSON-RPC (POST) under ``/agents/ORG/HANDLE``."""

    isLeaf = True

    def __init__(self, bridge: Bridge, port: Callable[[], int], names: frozenset[str]) -> None:
        super().__init__()
        self._bridge = bridge
        self._port = port
        self._names = names

    def _host(self, request: server.Request) -> str | None:
        return cards.allowed_host(request.getHeader("host"), self._port(), self._names)

    def _plain(self, request: server.Request, code: int, text: str) -> bytes:
        return gate.json_refusal(request, code, text)

    def render_GET(self, request: server.Request) -> bytes:
        request.setHeader("x-content-type-options", "nosniff")
        host = self._host(request)
        if host is None:
            return self._plain(request, http.FORBIDDEN, LOCAL_ONLY)
        where = cards.route(request.postpath or [], self._bridge.org)
        if isinstance(where, cards.NoRoute):
            return self._plain(request, http.NOT_FOUND, where.reason)
        if not where.card:
            return self._plain(
                request,
                http.NOT_ALLOWED,
                "POST JSON-RPC here; the card is at .well-known/agent-card.json",
            )
        scheme = "https" if request.isSecure() else "http"
        card = cards.agent_card(f"{scheme}://{host}", where.address, __version__)
        request.setHeader("content-type", "application/json")
        request.setHeader("cache-control", "no-store")
        return _json(card)

    def render_POST(self, request: server.Request) -> bytes | int:
        request.setHeader("x-content-type-options", "nosniff")
        if self._host(request) is None:
            return self._plain(request, http.FORBIDDEN, LOCAL_ONLY)
        where = cards.route(request.postpath or [], self._bridge.org)
        if isinstance(where, cards.NoRoute):
            return self._plain(request, http.NOT_FOUND, where.reason)
        if where.card:
            return self._plain(request, http.NOT_ALLOWED, "the card is read with GET")
        content_type = (request.getHeader("content-type") or "").split(";")[0].strip().lower()
        if content_type not in ("application/json", "application/a2a+json"):
            return self._plain(
                request, http.UNSUPPORTED_MEDIA_TYPE, "a JSON-RPC request is application/json"
            )
        body = request.content.read(rpc.MAX_BODY_BYTES + 1) if request.content else b""
        try:
            parsed = rpc.parse_request(body, request.getHeader(rpc.VERSION_HEADER))
            return self._dispatch(request, where.address, parsed)
        except rpc.RpcError as exc:
            return self._answer(request, rpc.error(exc.request_id, exc.code, exc.message))

    def _answer(self, request: server.Request, value: dict[str, Any]) -> bytes:
        request.setHeader("content-type", "application/json")
        body = _json(value)
        request.setHeader("content-length", str(len(body)))
        return body

    def _dispatch(self, request: server.Request, address: str, parsed: rpc.Request) -> bytes | int:
        bridge = self._bridge
        params = parsed.params
        if isinstance(params, rpc.TaskIdParams):
            if parsed.method == rpc.GET_TASK:
                return self._answer(request, rpc.result(parsed.request_id, bridge.get(params)))
            return self._answer(request, rpc.result(parsed.request_id, bridge.cancel(params)))
        record = bridge.send(address, params)
        if parsed.method == rpc.SEND_STREAMING:
            return self._stream(request, parsed.request_id, record)
        if params.return_immediately:
            shown = tasks.task_json(record, params.history_length)
            return self._answer(request, rpc.result(parsed.request_id, {"task": shown}))
        return self._wait(request, parsed.request_id, record, params.history_length)

    def _wait(
        self,
        request: server.Request,
        request_id: rpc.RequestId,
        record: tasks.TaskRecord,
        history_length: int | None,
    ) -> bytes | int:
        """Answer ``SendMessage`` once its task has ended."""
        current = self._bridge.tasks.get(record.task_id) or record
        if current.done:
            shown = {"task": tasks.task_json(current, history_length)}
            return self._answer(request, rpc.result(request_id, shown))
        gone: list[bool] = []
        request.notifyFinish().addErrback(lambda _f: gone.append(True))

        def watcher(event: dict[str, Any] | None) -> None:
            if event is not None or gone:
                return
            current = self._bridge.tasks.get(record.task_id) or record
            shown = {"task": tasks.task_json(current, history_length)}
            request.write(self._answer(request, rpc.result(request_id, shown)))
            request.finish()

        self._bridge.watch(record.task_id, watcher)
        return server.NOT_DONE_YET

    def _stream(
        self, request: server.Request, request_id: rpc.RequestId, record: tasks.TaskRecord
    ) -> int:
        """``SendStreamingMessage``: the task, then its status updates and answer, over SSE."""
        request.setHeader("content-type", "text/event-stream")
        request.setHeader("cache-control", "no-store")
        gone: list[bool] = []

        def event(value: dict[str, Any]) -> None:
            request.write(b"data: " + _json(rpc.result(request_id, value)) + b"\n\n")

        def watcher(value: dict[str, Any] | None) -> None:
            if gone:
                return
            if value is None:
                request.finish()
                return
            event(value)

        stop = self._bridge.watch(record.task_id, watcher)

        def left(_failure: Failure) -> None:
            gone.append(True)
            stop()

        request.notifyFinish().addErrback(left)
        current = self._bridge.tasks.get(record.task_id) or record
        event({"task": tasks.task_json(current)})
        if current.done:
            # Ended before the stream began (a refusal that needed no network).
            stop()
            artifact = tasks.artifact_update(current)
            if artifact is not None:
                event(artifact)
            event(tasks.status_update(current))
            request.finish()
        return server.NOT_DONE_YET


class CappedRequest(server.Request):
    """A request that keeps at most one byte more of its body than a JSON-RPC request may
    have, so a huge upload costs neither memory nor disk; the rest is read and dropped, and
    :func:`agentcall.a2a.rpc.read_envelope` refuses what was kept as too large."""

    _kept = 0

    def write(self, data: bytes) -> None:
        if not self.startedWriting:
            # Twisted names itself (``Server: TwistedWeb/…``) in every answer, its own error
            # pages too, which all pass here before the headers go out; a client learns
            # nothing from us about what answers it.
            self.responseHeaders.removeHeader(b"server")
        super().write(data)

    def handleContentChunk(self, data: bytes) -> None:
        room = rpc.MAX_BODY_BYTES + 1 - self._kept
        if room > 0:
            kept = data[:room]
            self._kept += len(kept)
            super().handleContentChunk(kept)


def make_site(
    bridge: Bridge,
    port: Callable[[], int],
    names: frozenset[str],
    tokens: gate.TokenSource,
    run_peer: gate.RunPeer,
) -> server.Site:
    """The HTTP site of ``bridge`` behind its gate; ``port`` says the port it listens on (for
    Host checks), ``tokens`` the bearer token requests must carry, ``run_peer`` which clients
    to refuse."""

    def local(request: server.Request) -> bool:
        return cards.allowed_host(request.getHeader("host"), port(), names) is not None

    front = gate.Gate(BridgeResource(bridge, port, names), local, tokens, run_peer)
    site = server.Site(front, requestFactory=CappedRequest)
    site.displayTracebacks = False
    site.noisy = False
    site.timeOut = limits.CLIENT_CALL_TIMEOUT_S + 60
    return site
