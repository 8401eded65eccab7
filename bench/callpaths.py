"""The other ways a relay_bench call is placed: on the caller's persistent socket, and through
the bare relay (bench/bare_relay.py) in its two modes.

Every way fills the same :class:`loadgen.Probe` at the same points (a "sent" stamp when the
frame is handed to the socket; "incoming" and "outcome" stamps once the frame is decoded), so
relay-added latency means the same thing for all of them.

**Persistent path** (the product's one socket per installation): the caller holds its own
listener socket (``role=listen``) and sends ``call_request`` with ``to`` = the callee's handle,
several at once. The relay answers on that socket: ``call_status`` / ``call_error`` /
``call_queued`` carry the request's ``correlation_id`` (the first ``call_status`` tells the
call id), ``call_outcome`` carries only the ``call_id``. ``cancel_call {call_id}`` sent on it
cancels (sent here when a call times out).

**Bare relay**: no auth, no ready frame, no crypto. The caller sends ``CORR FRAME`` (per-call,
``/call?to=NAME``) or ``NAME CORR FRAME`` (persistent, ``/mux``), FRAME being a real encoded
``incoming_call`` of this run; the echo listener decodes it as the product's listener would,
answers with a real encoded ``call_outcome``, and the caller decodes that. So the bench does
the same decoding inside the measured window on both relays; what differs is the relay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import txaio
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from loadgen import CALL_TIMEOUT_S, Env, Presealed, Probe, Target, now, seal_to
from seeding import Identity
from twisted.internet import defer
from twisted.internet.endpoints import TCP4ClientEndpoint

from agentcall import ids
from agentcall.client.ws import ClientSocket, SocketClosed, open_socket, set_relay_protocol_options
from agentcall.crypto import envelope
from agentcall.wire import codec, frames, payloads

txaio.use_twisted()

# How long the first persistent call may wait for any answer before the path is declared
# unsupported by this relay (a relay without the mux ignores call_request on a listener socket).
PERSISTENT_PROBE_S = 5.0


class PathUnsupported(Exception):
    """The relay did not answer a call placed on a listener socket."""


# --- the persistent path on the real relay -------------------------------------------------------


class PersistentCaller:
    """One caller identity's long-lived listener socket, carrying its outgoing calls."""

    def __init__(self, env: Env, me: Identity) -> None:
        self.env = env
        self.me = me
        self.socket: ClientSocket | None = None
        self.closed: SocketClosed | None = None
        # correlation id -> the call's probe and its terminal frame; call id -> correlation id
        self._pending: dict[str, tuple[Probe, defer.Deferred[frames.Frame]]] = {}
        self._correlation_of: dict[str, str] = {}
        self.unexpected = 0  # frames that matched no call of ours

    async def start(self) -> None:
        env = self.env
        self.socket = await open_socket(
            env.reactor,
            env.relay_url,
            self.me.credentials,
            frames.Role.LISTEN,
            ca_file=env.ca_file,
            on_frame=self._on_frame,
            on_close=self._on_close,
        )

    def _on_close(self, info: SocketClosed) -> None:
        self.closed = info
        pending, self._pending = self._pending, {}
        self._correlation_of.clear()
        for _probe, d in pending.values():
            if not d.called:
                d.errback(RuntimeError(f"persistent socket closed ({info.code})"))

    def _end(self, correlation: str | None, frame: frames.Frame) -> None:
        entry = self._pending.pop(correlation, None) if correlation is not None else None
        if entry is None:
            self.unexpected += 1
            return
        for call_id in [c for c, corr in self._correlation_of.items() if corr == correlation]:
            del self._correlation_of[call_id]
        probe, d = entry
        if isinstance(frame, frames.CallOutcome):
            probe.outcome = now()
        if not d.called:
            d.callback(frame)

    def _on_frame(self, frame: frames.Frame) -> None:
        if isinstance(frame, frames.CallStatus):
            corr = frame.correlation_id
            if corr is not None and corr in self._pending:
                self._correlation_of.setdefault(frame.call_id, corr)
            elif frame.call_id not in self._correlation_of:
                self.unexpected += 1
        elif isinstance(frame, frames.CallOutcome):
            self._end(self._correlation_of.get(frame.call_id), frame)
        elif isinstance(frame, frames.CallError):
            corr = frame.correlation_id
            if corr is None and frame.call_id is not None:
                corr = self._correlation_of.get(frame.call_id)
            self._end(corr, frame)
        elif isinstance(frame, frames.CallQueued):
            self._end(frame.correlation_id, frame)
        # incoming_call and the rest: this socket's identity is never called in the bench

    async def call(
        self,
        target: Target,
        message: str,
        timeout_s: float,
        presealed: Presealed | None = None,
    ) -> Probe:
        """One call; with ``presealed`` its envelopes were sealed beforehand and the answer is
        checked to be the one sealed instead of being opened."""
        env, caller = self.env, self.me
        socket = self.socket
        if socket is None or not socket.is_open:
            raise RuntimeError("the persistent socket is not open")
        probe = Probe(start=now())
        if presealed is None:
            sealed, request, correlation = seal_to(env, caller, target, message)
        else:
            sealed, request, correlation = presealed.request, None, presealed.correlation_id
            env.presealed[correlation] = presealed
        terminal: defer.Deferred[frames.Frame] = defer.Deferred()
        self._pending[correlation] = (probe, terminal)
        env.probes[correlation] = probe
        probe.dialled = probe.ready = now()  # nothing to dial: the socket is already open
        try:
            socket.send(
                frames.CallRequest(
                    envelope=sealed, correlation_id=correlation, to=target.identity.handle
                )
            )
            probe.sent = now()
            try:
                result = await terminal.addTimeout(timeout_s, env.reactor)
            except defer.TimeoutError:
                # Hang up on the relay's side too, if it ever told us the call id.
                for call_id, corr in list(self._correlation_of.items()):
                    if corr == correlation:
                        socket.send(frames.CancelCall(call_id=call_id))
                        del self._correlation_of[call_id]
                raise
        finally:
            del env.probes[correlation]
            env.presealed.pop(correlation, None)
            self._pending.pop(correlation, None)
        if isinstance(result, frames.CallError):
            raise RuntimeError(f"call_error {result.code}")
        if isinstance(result, frames.CallQueued):
            raise RuntimeError("call_queued (this bench never asks to queue)")
        assert isinstance(result, frames.CallOutcome)
        if presealed is not None:
            if result.envelope != presealed.answer:
                raise RuntimeError("the answer is not the one the listener sealed")
            probe.done = now()
            return probe
        assert request is not None
        response = envelope.open_response(
            result.envelope,
            my_key=caller.encryption,
            my_record=caller.encryption_record.record,
            request=request,
            responder_identity_pub=target.keys.identity.record.identity_pub,
            now=time.time(),
        )
        outcome = response.outcome
        if not isinstance(outcome, payloads.Reply) or outcome.text != f"echo: {message}":
            raise RuntimeError("the reply is not the echo of the request")
        probe.done = now()
        return probe


async def open_persistent(env: Env, callers: Sequence[Identity]) -> dict[str, PersistentCaller]:
    sockets = {who.handle: PersistentCaller(env, who) for who in callers}
    await defer.gatherResults([defer.ensureDeferred(s.start()) for s in sockets.values()])
    return sockets


async def probe_persistent(
    persistent: dict[str, PersistentCaller],
    pair: tuple[Identity, Target],
    message: str,
    timeout_s: float = PERSISTENT_PROBE_S,
) -> Probe:
    """One call on the persistent path, bounded: :class:`PathUnsupported` when nothing came."""
    caller, target = pair
    try:
        return await persistent[caller.handle].call(target, message, timeout_s)
    except defer.TimeoutError:
        raise PathUnsupported(
            f"no answer within {timeout_s:g} s to a call_request on a listener socket: this"
            " relay does not carry outgoing calls on the persistent socket (yet)"
        ) from None


def persistent_placer(
    persistent: dict[str, PersistentCaller],
    pairs: Sequence[tuple[Identity, Target]],
    message: str,
    presealed: Sequence[Presealed] | None = None,
) -> Callable[[int], Any]:
    """Call n from pair n % K; with ``presealed``, call n is ``presealed[n]``."""

    async def place(n: int) -> Probe:
        caller, target = pairs[n % len(pairs)]
        sealed = None if presealed is None else presealed[n]
        return await persistent[caller.handle].call(target, message, CALL_TIMEOUT_S, sealed)

    return place


# --- the bare relay ------------------------------------------------------------------------------


class _BareProtocol(WebSocketClientProtocol):
    factory: _BareFactory
    log = txaio.make_logger(level="info")  # type: ignore[attr-defined]

    def onOpen(self) -> None:
        self.factory.opened(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.factory.handler(payload)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.factory.closed(code)

    def send(self, payload: bytes) -> None:
        self.sendMessage(payload, isBinary=False)


class _BareFactory(WebSocketClientFactory):
    protocol = _BareProtocol  # type: ignore[assignment]

    def __init__(self, url: str, reactor: Any, handler: Callable[[bytes], None]) -> None:
        super().__init__(url, reactor=reactor)
        set_relay_protocol_options(self)
        self.handler = handler
        self.ready: defer.Deferred[_BareProtocol] = defer.Deferred()
        self.on_close: Callable[[int | None], None] = lambda _code: None

    def opened(self, protocol: _BareProtocol) -> None:
        if not self.ready.called:
            self.ready.callback(protocol)

    def closed(self, code: int | None) -> None:
        if not self.ready.called:
            self.ready.errback(RuntimeError(f"bare relay closed before open ({code})"))
        self.on_close(code)


class BareEnv:
    """The bare relay's address and the real frames of this run that its calls carry."""

    def __init__(self, env: Env, port: int, request_frame: bytes, outcome_frame: bytes) -> None:
        self.env = env
        self.reactor = env.reactor
        self.port = port
        self.request_frame = request_frame
        self.outcome_frame = outcome_frame
        self.probes: dict[bytes, Probe] = {}

    async def dial(self, path: str, handler: Callable[[bytes], None]) -> _BareProtocol:
        factory = _BareFactory(f"ws://127.0.0.1:{self.port}{path}", self.reactor, handler)
        endpoint = TCP4ClientEndpoint(self.reactor, "127.0.0.1", self.port, timeout=10)
        connecting = endpoint.connect(factory)

        def failed(failure: Any) -> None:
            if not factory.ready.called:
                factory.ready.errback(failure)

        connecting.addErrback(failed)
        protocol: _BareProtocol = await factory.ready.addTimeout(10, self.reactor)
        return protocol


class BareListener:
    """Answers every bare call at once: decode the request frame, send the outcome frame."""

    def __init__(self, bare: BareEnv, name: str) -> None:
        self.bare = bare
        self.name = name
        self.socket: _BareProtocol | None = None

    async def start(self) -> None:
        self.socket = await self.bare.dial(f"/listen?id={self.name}", self._on_message)

    def _on_message(self, payload: bytes) -> None:
        route, _, rest = payload.partition(b" ")
        if b"." in route:  # SID.CORR FRAME (persistent)
            corr, frame = route.partition(b".")[2], rest
        else:  # KEY CORR FRAME (per-call)
            corr, _, frame = rest.partition(b" ")
        codec.decode_frame(frame, frames.TO_LISTENER)
        probe = self.bare.probes.get(corr)
        if probe is not None:
            probe.incoming = now()
        reply = route + b" " + (b"" if b"." in route else corr + b" ") + self.bare.outcome_frame
        assert self.socket is not None
        self.socket.send(reply)
        if probe is not None:
            probe.answered = now()


def _decode_answer(payload: bytes) -> tuple[bytes, bytes]:
    corr, _, frame = payload.partition(b" ")
    return corr, frame


async def bare_call_per_socket(bare: BareEnv, to: str) -> Probe:
    """One bare call on its own socket (dial, send, answer, close)."""
    probe = Probe(start=now())
    corr = ids.mint_correlation_id().encode()
    answer: defer.Deferred[bytes] = defer.Deferred()

    def on_message(payload: bytes) -> None:
        got, frame = _decode_answer(payload)
        codec.decode_frame(frame, frames.TO_CALLER)
        probe.outcome = now()
        if got == corr and not answer.called:
            answer.callback(frame)

    bare.probes[corr] = probe
    try:
        probe.dialled = now()
        socket = await bare.dial(f"/call?to={to}", on_message)
        probe.ready = now()
        socket.factory.on_close = lambda code: (
            None if answer.called else answer.errback(RuntimeError(f"closed ({code})"))
        )
        socket.send(corr + b" " + bare.request_frame)
        probe.sent = now()
        try:
            await answer.addTimeout(CALL_TIMEOUT_S, bare.reactor)
        finally:
            socket.sendClose(1000)
    finally:
        del bare.probes[corr]
    probe.done = now()
    return probe


class BareMux:
    """One persistent bare socket carrying several calls at once."""

    def __init__(self, bare: BareEnv) -> None:
        self.bare = bare
        self.socket: _BareProtocol | None = None
        self._waiting: dict[bytes, tuple[Probe, defer.Deferred[bytes]]] = {}

    async def start(self) -> None:
        self.socket = await self.bare.dial("/mux", self._on_message)

    def _on_message(self, payload: bytes) -> None:
        corr, frame = _decode_answer(payload)
        codec.decode_frame(frame, frames.TO_CALLER)
        waiting = self._waiting.pop(corr, None)
        if waiting is not None:
            waiting[0].outcome = now()
            waiting[1].callback(frame)

    async def call(self, to: str) -> Probe:
        probe = Probe(start=now())
        corr = ids.mint_correlation_id().encode()
        answer: defer.Deferred[bytes] = defer.Deferred()
        self._waiting[corr] = (probe, answer)
        self.bare.probes[corr] = probe
        probe.dialled = probe.ready = now()
        try:
            assert self.socket is not None
            self.socket.send(to.encode() + b" " + corr + b" " + self.bare.request_frame)
            probe.sent = now()
            await answer.addTimeout(CALL_TIMEOUT_S, self.bare.reactor)
        finally:
            del self.bare.probes[corr]
            self._waiting.pop(corr, None)
        probe.done = now()
        return probe


def bare_placer(
    bare: BareEnv, names: Sequence[tuple[str, str]], mux: dict[str, BareMux] | None
) -> Callable[[int], Any]:
    """Call n goes from caller names[n % K][0] to listener names[n % K][1]."""

    async def place(n: int) -> Probe:
        caller, callee = names[n % len(names)]
        if mux is None:
            return await bare_call_per_socket(bare, callee)
        return await mux[caller].call(callee)

    return place


def sample_frames(env: Env) -> tuple[bytes, bytes]:
    """The encoded incoming_call and call_outcome the real relay delivered in this run."""
    request = env.samples.get("incoming_call")
    outcome = env.samples.get("call_outcome")
    if request is None or outcome is None:
        raise RuntimeError("no real call has been made yet to take frame samples from")
    return request, outcome
