"""Load on the relay through the product's own client code: echo listeners, callers, idle sockets.

Everything here runs on the bench process's one reactor and stamps events with one clock
(:func:`time.monotonic`), so the listener's and the caller's timestamps of a call compare
directly. Each call carries a fresh correlation id; the listener finds the call's
:class:`Probe` by it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
from seeding import Identity
from twisted.internet import defer

from agentcall import ids
from agentcall.client.ws import ClientSocket, SocketClosed, open_socket
from agentcall.crypto import envelope
from agentcall.relayurl import RelayUrl
from agentcall.wire import frames, http, payloads

now = time.monotonic
CALL_TIMEOUT_S = 30.0


@attrs.define
class Probe:
    """Timestamps (monotonic seconds) of one call; None where the call never got there."""

    start: float  # before sealing the request
    dialled: float | None = None  # open_socket called
    ready: float | None = None  # the relay's ready frame arrived
    sent: float | None = None  # call_request handed to the socket (t0)
    incoming: float | None = None  # listener got incoming_call (t1)
    answered: float | None = None  # listener handed call_outcome to its socket (t2)
    outcome: float | None = None  # caller got call_outcome (t3)
    done: float | None = None  # caller opened and checked the reply

    @property
    def relay_added(self) -> float:
        """(t1 - t0) + (t3 - t2): time the call spent between the bench's two sockets."""
        assert None not in (self.sent, self.incoming, self.answered, self.outcome)
        return (self.incoming - self.sent) + (self.outcome - self.answered)  # type: ignore[operator]


@attrs.define
class Target:
    """What a caller knows of the callee: fetched once from the relay, then pinned."""

    identity: Identity
    keys: http.KeysResponse


class Env:
    """Shared by every client of one run."""

    def __init__(self, reactor: Any, relay_url: RelayUrl, ca_file: str | None) -> None:
        self.reactor = reactor
        self.relay_url = relay_url
        self.origin = relay_url.origin
        self.ca_file = ca_file
        self.probes: dict[str, Probe] = {}
        self.errors: Counter[str] = Counter()
        self.open_call_sockets = 0
        self.samples: dict[str, bytes] = {}  # one encoded frame of each kind, for decode timing
        # correlation id -> a call sealed before its phase (see Presealed): the echo listener
        # answers it with the answer sealed beforehand instead of opening and sealing.
        self.presealed: dict[str, Presealed] = {}

    def error(self, what: str) -> None:
        self.errors[what[:160]] += 1


def _ignore(_frame: frames.Frame) -> None:
    return None


@attrs.frozen
class Presealed:
    """One call sealed before its phase, so that the bench's crypto is not in the loop.

    The relay never opens an envelope; it routes on the clear header and forwards the sealed
    bytes. So a loaded phase whose request and echo answer were sealed beforehand (both real,
    sealed by the right keys) loads the relay exactly as the inline one does, while the bench
    only checks that what arrived is what was sealed: the same decoding and no crypto, as the
    bare relay's clients do.
    """

    correlation_id: str
    request: frames.SealedEnvelope
    answer: frames.SealedEnvelope


def preseal(
    env: Env, pairs: Sequence[tuple[Identity, Target]], total: int, message: str
) -> list[Presealed]:
    """Calls 0..total-1 (pair n % K), each with the callee's echo answer sealed already."""
    sealed: list[Presealed] = []
    for n in range(total):
        caller, target = pairs[n % len(pairs)]
        request_envelope, request, correlation = seal_to(env, caller, target, message)
        callee = target.identity
        answer = envelope.seal_response(
            responder=callee.identity,
            request=request,
            outcome=payloads.Reply(text=f"echo: {message}"),
            caller_encryption=caller.encryption_record.record,
            now=time.time(),
        )
        sealed.append(Presealed(correlation, request_envelope, answer))
    return sealed


def after_a_write(reactor: Any, step: Callable[[], None]) -> None:
    """Run ``step`` once the reactor has polled, so what was sent before it is written first.

    A ``callLater(0)`` runs before the reactor's next poll (and so before its writes); one
    scheduled from inside it runs after that poll.
    """
    reactor.callLater(0, reactor.callLater, 0, step)


class EchoListener:
    """A listener session that answers every call at once with a sealed echo (no agent).

    Like the product's listener (``agentcall.listener.core``), it sends ``call_accepted`` and
    ``call_started`` as soon as the request has opened and been admitted, and the outcome once
    the agent has run: here the agent is nothing, but the outcome still leaves in a later write
    than the two before it, as it does from a real listener (which spawns the agent between
    them). The relay's handling of those two frames is thus not inside the measured answer leg.
    """

    def __init__(self, env: Env, me: Identity, callers: dict[str, Identity]) -> None:
        self.env = env
        self.me = me
        self.callers = callers  # handle -> identity: the caller keys this listener has pinned
        self.socket: ClientSocket | None = None
        self.closed: SocketClosed | None = None
        self.answered = 0

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

    def _on_frame(self, frame: frames.Frame) -> None:
        if not isinstance(frame, frames.IncomingCall):
            return
        arrived = now()
        probe = self.env.probes.get(frame.correlation_id)
        if probe is not None:
            probe.incoming = arrived
        socket = self.socket
        assert socket is not None
        presealed = self.env.presealed.get(frame.correlation_id)
        if presealed is not None:
            self._answer_presealed(socket, frame, probe, presealed)
            return
        try:
            self._answer(socket, frame, probe)
        except Exception as exc:
            self.env.error(f"listener: {type(exc).__name__}: {exc}")
            socket.send(frames.CallRejected(call_id=frame.call_id))

    def _answer_presealed(
        self,
        socket: ClientSocket,
        frame: frames.IncomingCall,
        probe: Probe | None,
        presealed: Presealed,
    ) -> None:
        if frame.envelope != presealed.request:
            self.env.error("listener: the request is not the one sealed")
            socket.send(frames.CallRejected(call_id=frame.call_id))
            return
        socket.send(frames.CallAccepted(call_id=frame.call_id))
        socket.send(frames.CallStarted(call_id=frame.call_id))

        after_a_write(
            self.env.reactor,
            lambda: self._send_outcome(socket, frame.call_id, presealed.answer, probe),
        )

    def _send_outcome(
        self,
        socket: ClientSocket,
        call_id: str,
        sealed: frames.SealedEnvelope,
        probe: Probe | None,
    ) -> None:
        socket.send(
            frames.CallOutcome(call_id=call_id, terminal=frames.Terminal.COMPLETED, envelope=sealed)
        )
        if probe is not None:
            probe.answered = now()
        self.answered += 1

    def _answer(
        self, socket: ClientSocket, frame: frames.IncomingCall, probe: Probe | None
    ) -> None:
        me = self.me
        caller = self.callers[frame.from_]
        request = envelope.open_request(
            frame.envelope,
            my_key=me.encryption,
            my_record=me.encryption_record.record,
            relay_origin=self.env.origin,
            expected_from=caller.address,
            expected_to=me.address,
            sender_identity_pub=caller.identity_record.record.identity_pub,
            now=time.time(),
        )
        socket.send(frames.CallAccepted(call_id=frame.call_id))
        socket.send(frames.CallStarted(call_id=frame.call_id))
        if "incoming_call" not in self.env.samples:
            self.env.samples["incoming_call"] = _encoded(frame)

        def finish() -> None:
            try:
                sealed = envelope.seal_response(
                    responder=me.identity,
                    request=request,
                    outcome=payloads.Reply(text=f"echo: {request.message}"),
                    caller_encryption=caller.encryption_record.record,
                    now=time.time(),
                )
            except Exception as exc:
                self.env.error(f"listener: {type(exc).__name__}: {exc}")
                return
            self._send_outcome(socket, frame.call_id, sealed, probe)

        after_a_write(self.env.reactor, finish)


def _encoded(frame: frames.Frame) -> bytes:
    from agentcall.wire import codec

    return codec.encode(frame)


def seal_to(
    env: Env, caller: Identity, target: Target, message: str
) -> tuple[frames.SealedEnvelope, payloads.RequestPayload, str]:
    """``message`` sealed from ``caller`` to ``target``, its plaintext, a fresh correlation id."""
    keys = target.keys
    assert keys.encryption is not None
    sealed, request = envelope.seal_request(
        sender=caller.identity,
        sender_address=caller.address,
        recipient_identity=keys.identity.record,
        recipient_encryption=keys.encryption.record,
        relay_origin=env.origin,
        message=message,
        task=None,
        context_id=None,
        now=time.time(),
    )
    return sealed, request, ids.mint_correlation_id()


async def one_call(env: Env, caller: Identity, target: Target, message: str) -> Probe:
    """Seal, dial, send, wait for the outcome, open and check it; the probe of the call."""
    probe = Probe(start=now())
    sealed, request, correlation = seal_to(env, caller, target, message)
    terminal: defer.Deferred[frames.Frame] = defer.Deferred()

    def on_frame(frame: frames.Frame) -> None:
        if isinstance(frame, (frames.CallOutcome, frames.CallError)) and not terminal.called:
            probe.outcome = now()
            terminal.callback(frame)

    def on_close(info: SocketClosed) -> None:
        env.open_call_sockets -= 1
        if not terminal.called:
            terminal.errback(RuntimeError(f"call socket closed without outcome ({info.code})"))

    env.probes[correlation] = probe
    try:
        probe.dialled = now()
        socket = await open_socket(
            env.reactor,
            env.relay_url,
            caller.credentials,
            frames.Role.CALL,
            to=target.identity.handle,
            ca_file=env.ca_file,
            on_frame=on_frame,
            on_close=on_close,
        )
        env.open_call_sockets += 1
        probe.ready = now()
        socket.send(frames.CallRequest(envelope=sealed, correlation_id=correlation))
        probe.sent = now()
        try:
            result = await terminal.addTimeout(CALL_TIMEOUT_S, env.reactor)
        finally:
            socket.close()
    finally:
        del env.probes[correlation]
    if isinstance(result, frames.CallError):
        raise RuntimeError(f"call_error {result.code}")
    assert isinstance(result, frames.CallOutcome)
    if "call_outcome" not in env.samples:
        env.samples["call_outcome"] = _encoded(result)
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


@attrs.define
class CallRun:
    probes: list[Probe]
    failed: int
    elapsed_s: float
    timed_out: bool


async def run_calls(
    env: Env,
    pairs: Sequence[tuple[Identity, Target]],
    total: int,
    concurrency: int,
    budget_s: float,
    message: str,
    place: Callable[[int], Awaitable[Probe]] | None = None,
) -> CallRun:
    """``total`` calls by ``concurrency`` workers, pairs taken round-robin; bounded by budget.

    ``place(n)`` places call number ``n`` another way (the persistent path, the bare relay);
    by default a call is :func:`one_call` on its own socket."""
    numbers = iter(range(total))
    probes: list[Probe] = []
    failed = 0
    deadline = now() + budget_s

    async def worker() -> None:
        nonlocal failed
        for n in numbers:
            if now() > deadline:
                return
            try:
                if place is not None:
                    probes.append(await place(n))
                else:
                    caller, target = pairs[n % len(pairs)]
                    probes.append(await one_call(env, caller, target, message))
            except Exception as exc:
                failed += 1
                env.error(f"caller: {type(exc).__name__}: {exc}")

    started = now()
    workers = [defer.ensureDeferred(worker()) for _ in range(min(concurrency, total))]
    everything = defer.DeferredList(workers, consumeErrors=True)
    everything.addTimeout(budget_s + CALL_TIMEOUT_S + 5, env.reactor)
    timed_out = False
    try:
        await everything
    except defer.TimeoutError:
        timed_out = True
    elapsed = now() - started
    return CallRun(probes, failed, elapsed, timed_out or now() > deadline)


@attrs.define
class IdleRun:
    sockets: list[ClientSocket]
    failed: int
    elapsed_s: float
    closes: list[int]  # a one-element counter of closes seen, shared with the handlers


async def open_idle(
    env: Env,
    identities: Sequence[Identity],
    window: int,
    budget_s: float,
    progress: Callable[[int, int], None] | None = None,
) -> IdleRun:
    """Open one listener socket per identity, at most ``window`` dialling at once; each one
    counts once its ready frame arrived. Failures are retried once at the end."""
    sockets: list[ClientSocket] = []
    closes = [0]
    started = now()
    deadline = started + budget_s

    def on_close(_info: SocketClosed) -> None:
        closes[0] += 1

    async def open_all(batch: Sequence[Identity]) -> list[Identity]:
        todo = iter(batch)
        failed: list[Identity] = []

        async def worker() -> None:
            for who in todo:
                if now() > deadline:
                    failed.append(who)
                    continue
                try:
                    socket = await open_socket(
                        env.reactor,
                        env.relay_url,
                        who.credentials,
                        frames.Role.LISTEN,
                        ca_file=env.ca_file,
                        on_frame=_ignore,
                        on_close=on_close,
                    )
                except Exception as exc:
                    failed.append(who)
                    env.error(f"idle: {type(exc).__name__}: {exc}")
                    continue
                sockets.append(socket)
                if progress is not None and len(sockets) % 1000 == 0:
                    progress(len(sockets), len(identities))

        await defer.DeferredList(
            [defer.ensureDeferred(worker()) for _ in range(min(window, len(batch)))],
            consumeErrors=True,
        )
        return failed

    failed = await open_all(identities)
    if failed and now() < deadline:
        failed = await open_all(failed)
    return IdleRun(sockets, len(failed), now() - started, closes)


async def close_all(env: Env, run: IdleRun, budget_s: float) -> float:
    """Close every idle socket and wait (bounded) until their closes were seen; seconds taken."""
    started = now()
    for socket in run.sockets:
        socket.close()
    while run.closes[0] < len(run.sockets) and now() - started < budget_s:
        await sleep(env.reactor, 0.1)
    return now() - started


def sleep(reactor: Any, seconds: float) -> defer.Deferred[None]:
    d: defer.Deferred[None] = defer.Deferred()
    reactor.callLater(seconds, d.callback, None)
    return d


class LoopLag:
    """How late the bench's own reactor runs a timer: a measure of its queueing under load."""

    def __init__(self, reactor: Any, interval_s: float = 0.01) -> None:
        self.reactor = reactor
        self.interval_s = interval_s
        self.lags: list[float] = []
        self._pending: Any = None

    def start(self) -> None:
        self._schedule()

    def _schedule(self) -> None:
        due = now() + self.interval_s
        self._pending = self.reactor.callLater(self.interval_s, self._tick, due)

    def _tick(self, due: float) -> None:
        self.lags.append(max(0.0, now() - due))
        if len(self.lags) < 1_000_000:
            self._schedule()

    def stop(self) -> list[float]:
        if self._pending is not None and self._pending.active():
            self._pending.cancel()
        self._pending = None
        return self.lags
