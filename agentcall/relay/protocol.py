"""The relay's WebSocket adapter: autobahn in, typed frames out, decisions in the cores.

One socket per party at ``/v1/ws``. ``?role=listen`` holds a listener session for the
authenticated identity (with ``&mailbox=1`` it also takes offline-mailbox deliveries) and is
the installation's persistent socket: it also carries the calls its owner places, several at
once (:mod:`agentcall.relay.outgoing`). ``?role=call&to=HANDLE`` carries exactly one call.
The protocol only authenticates, enforces sizes, decodes, and hands frames to :class:`CallBook` and
:class:`Switchboard`, and a listener's job frames to :class:`JobDesk`; it never decides routing
itself. The front door
(:class:`~agentcall.relay.door.Door`) caps caller sockets per identity, sees every failed
authentication, and gives a caller socket a deadline for its ``call_request``.
"""

from __future__ import annotations

import struct
from typing import Any

import txaio
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectionDeny, ConnectionRequest
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.python.failure import Failure
from zope.interface import implementer

from agentcall import limits
from agentcall.errors import CallErrorCode, MalformedFrame
from agentcall.interfaces import IChannel
from agentcall.logevents import Logger, without_option_dump
from agentcall.relay.auth import authenticate_headers
from agentcall.relay.calls import CallBook
from agentcall.relay.door import Door, source_of
from agentcall.relay.gate import TurnedAway
from agentcall.relay.jobs import JobDesk
from agentcall.relay.lastseen import LastSeen
from agentcall.relay.outgoing import SocketCalls
from agentcall.relay.store_interface import Member, RelayStore
from agentcall.relay.switchboard import Switchboard
from agentcall.relay.wsframe import complete_text_frame
from agentcall.relay.wsmask import unmask
from agentcall.wire import codec, frames
from agentcall.wire.closecodes import (
    CLOSE_BAD_REQUEST,
    CLOSE_NORMAL,
    CLOSE_TOO_MANY,
    CLOSE_UNAUTHORIZED,
)

txaio.use_twisted()

_log = Logger(namespace="agentcall.relay.ws")

# The first bytes of an unmasked final text frame (RFC 6455 5.2), by payload length.
_TEXT_HEADERS = tuple(bytes((0x81, n)) for n in range(126))
_TEXT_126 = bytes((0x81, 126))
_TEXT_127 = bytes((0x81, 127))


@implementer(IChannel)
class WebSocketChannel:
    """What the cores see of a socket: send a frame, close it."""

    def __init__(self, protocol: RelayWebSocket, peer: str) -> None:
        self._protocol = protocol
        self.peer = peer

    def send(self, frame: object) -> None:
        protocol = self._protocol
        if protocol.opened:
            raw = protocol.factory.verbatim.bytes_of(frame)
            protocol.send_text(codec.encode(frame) if raw is None else raw)

    def close(self, code: int, reason: str) -> None:
        self._protocol.sendClose(code, reason[:100])


class Unsent:
    """The connections written to while one socket's bytes are read; written out at its end.

    Twisted buffers a write until the reactor's next poll, and before that poll it runs every
    timer that is due (audit batches, log lines put off): on the way a call's frames would
    wait behind them. At the end of each read the connections it wrote to are asked to write
    at once, as the reactor would (``doWrite``), only when nothing else is in play: plain TCP
    (no TLS layer), connected, not closing, no producer. Anything else stays the reactor's.
    Frames a read produces for one connection still leave together.
    """

    def __init__(self) -> None:
        self.reading = False
        self._written: list[Any] = []
        self.flushed = 0  # connections written out early (for tests and the bench)

    def note(self, transport: Any) -> None:
        if self.reading:
            self._written.append(transport)

    def flush(self) -> None:
        written, self._written = self._written, []
        for transport in dict.fromkeys(written):
            connection = _plain_tcp(transport)
            if connection is not None:
                self.flushed += 1
                # None, or a failure the reactor meets again at its own doWrite and handles.
                connection.doWrite()


def _plain_tcp(transport: Any) -> Any:
    """The TCP connection under ``transport`` (through wrappers), if it may be written now."""
    for _ in range(4):
        if transport is None or not hasattr(transport, "wrappedProtocol"):
            break
        transport = getattr(transport, "transport", None)
    if transport is None or getattr(transport, "TLS", True) or not hasattr(transport, "doWrite"):
        return None
    if (
        not transport.connected
        or transport.disconnecting
        or getattr(transport, "_writeDisconnecting", True)
        or getattr(transport, "_writeDisconnected", True)
        or transport.producer is not None
        or not (transport._tempDataBuffer or transport.dataBuffer)
    ):
        return None
    return transport


class Verbatim:
    """The listener frame being routed right now, with the bytes it arrived as.

    A listener's ``call_outcome`` goes on to the caller unchanged (the book checks its route and
    passes the very same object); sending the bytes that came in, rather than encoding the
    decoded frame again, spares the relay the cost of re-encoding a sealed answer of up to a
    quarter megabyte. Routing is synchronous, so one slot is enough.
    """

    def __init__(self) -> None:
        self._frame: object | None = None
        self._raw = b""

    def hold(self, frame: object, raw: bytes) -> None:
        self._frame, self._raw = frame, raw

    def clear(self) -> None:
        self._frame, self._raw = None, b""

    def bytes_of(self, frame: object) -> bytes | None:
        return self._raw if frame is self._frame and self._frame is not None else None


@without_option_dump
class RelayWebSocket(WebSocketServerProtocol):
    factory: RelayWebSocketFactory
    # autobahn owns ``self.log`` and logs the whole upgrade request, bearer token included, at
    # debug level; pin it to info whatever the global level is. Our events go to ``_log``.
    log = txaio.make_logger(level="info")  # type: ignore[attr-defined]

    def __init__(self) -> None:
        super().__init__()
        self.member: Member | None = None
        self.role: frames.Role | None = None
        self.target: str | None = None
        # A listener that said mailbox=1 takes offline-mailbox deliveries.
        self.mailbox = False
        self.channel: WebSocketChannel | None = None
        # A listener socket's own outgoing calls (the installation's persistent socket).
        self.outgoing: SocketCalls | None = None
        # Not `is_open`: autobahn keeps its own Deferred under that name.
        self.opened = False
        self._refusal: tuple[int, CallErrorCode, str] | None = None
        # The identity whose caller-socket count this socket holds, until it closes.
        self._counted_caller: str | None = None
        self._call_request_deadline: IDelayedCall | None = None
        # True while the store checks the upgrade's credentials.
        self._authenticating = False

    # --- the frame path ----------------------------------------------------------------------
    #
    # autobahn builds the arguments of a debug line (hltype, hlval: qualified names, colours) on
    # every read and every write, whatever the log level; with a few frames per call that was
    # a tenth of the relay's CPU on the persistent path. These take the same steps without it.

    def dataReceived(self, data: bytes) -> None:
        unsent = self.factory.unsent
        if unsent.reading:  # pragma: no cover - reads do not nest; never flush from inside one
            self._read(data)
            return
        unsent.reading = True
        try:
            self._read(data)
        finally:
            unsent.reading = False
            unsent.flush()

    def _read_fast(self) -> bool:
        """Whether whole text frames at the head of the buffer may skip autobahn's reader:
        open, between messages, and none of the options that reader would act on."""
        options: Any = self
        return (
            self.state == WebSocketProtocol.STATE_OPEN
            and self.current_frame is None
            and not self.inside_message
            and not self.failedByMe
            and self._perMessageCompress is None
            and not options.utf8validateIncoming
            and not options.logFrames
            and not options.logOctets
            and not self.trackedTimings
        )

    def _read(self, data: bytes) -> None:
        """``data`` as autobahn would read it, whole final text frames taken on directly
        (:mod:`agentcall.relay.wsframe`): the same payloads, counters and keepalive reset, in
        order, with autobahn reading from the first frame that is anything else."""
        if not self._read_fast():
            self._dataReceived(data)
            return
        options: Any = self
        stats = self.trafficStats
        stats.incomingOctetsWireLevel += len(data)
        buffered = self.data + data if self.data else data
        limit = min(
            (cap for cap in (options.maxFramePayloadSize, options.maxMessagePayloadSize) if cap),
            default=0,
        )
        pos = 0
        while self.state == WebSocketProtocol.STATE_OPEN and not self.failedByMe:
            found = complete_text_frame(buffered, pos, limit)
            if found is None:
                break
            start, end = found
            payload = unmask(buffered[start:end], buffered[start - 4 : start], 0)
            pos = end
            size = end - start
            stats.incomingOctetsWebSocketLevel += size
            stats.incomingOctetsAppLevel += size
            stats.incomingWebSocketFrames += 1
            stats.incomingWebSocketMessages += 1
            if self.autoPingTimeoutCall and options.autoPingRestartOnAnyTraffic:
                self._cancelAutoPingTimeoutCall()
            self.onMessage(payload, False)
        self.data = buffered[pos:] if pos else buffered
        if self.data:
            # The rest (a control frame, a part of a frame, anything unusual) is autobahn's,
            # in whatever state the messages above left the connection.
            self.consumeData()

    def onFrameData(self, payload: bytes) -> bool | None:
        # The factory sets applyMask=False: autobahn passes each chunk of a frame as it came,
        # still masked (its null masker only counts), and it is unmasked here in one pass.
        mask: bytes | None = self.current_frame.mask  # type: ignore[assignment] # bytes, not str
        if payload and mask is not None:
            offset = self.current_frame_masker.pointer() - len(payload)
            payload = unmask(payload, mask, offset)
        return super().onFrameData(payload)

    def send_text(self, payload: bytes) -> None:
        """One unfragmented, uncompressed, unmasked text message: the bytes autobahn's
        ``sendMessage`` would write, written straight to the transport."""
        # The per-connection options autobahn copies from the factory (untyped there).
        options: Any = self
        if (
            self.state != WebSocketProtocol.STATE_OPEN
            or self.send_queue
            or options.autoFragmentSize
            or self._perMessageCompress is not None
            or options.maskServerFrames
            or options.logFrames
            or options.logOctets
            or self.trackedTimings
            or 0 < options.maxMessagePayloadSize < len(payload)
        ):
            # Anything unusual (or a refusal to send) is autobahn's to handle.
            self.sendMessage(payload, isBinary=False)
            return
        size = len(payload)
        if size <= 125:
            header = _TEXT_HEADERS[size]
        elif size <= 0xFFFF:
            header = _TEXT_126 + struct.pack("!H", size)
        else:
            header = _TEXT_127 + struct.pack("!Q", size)
        data = header + payload
        transport = options.transport
        transport.write(data)
        self.factory.unsent.note(transport)
        stats = self.trafficStats
        stats.outgoingWebSocketMessages += 1
        stats.outgoingWebSocketFrames += 1
        stats.outgoingOctetsAppLevel += size
        stats.outgoingOctetsWebSocketLevel += size
        stats.outgoingOctetsWireLevel += len(data)

    # --- handshake ---------------------------------------------------------------------------

    def processHandshake(self) -> None:
        # Bytes that arrive while the credentials are checked stay buffered (autobahn reads
        # them as frames once open); they must not be parsed as a second upgrade request.
        if not self._authenticating:
            super().processHandshake()

    # autobahn runs onConnect through txaio.as_future and answers the upgrade once a returned
    # Deferred fires; its annotation does not say so.
    def onConnect(  # type: ignore[override]
        self, request: ConnectionRequest
    ) -> Deferred[None] | None:
        """Check the upgrade; autobahn answers it once the returned Deferred has fired."""
        headers: dict[str, str] = request.headers
        params: dict[str, list[str]] = request.params
        role_values = params.get("role", [])
        try:
            self.role = frames.Role(role_values[0]) if len(role_values) == 1 else None
        except ValueError:
            self.role = None
        if self.role is None:
            self._refusal = (CLOSE_BAD_REQUEST, CallErrorCode.PROTOCOL_ERROR, "role missing")
            return None
        if self.role is frames.Role.CALL:
            to = params.get("to", [])
            self.target = to[0] if len(to) == 1 else None
        else:
            self.mailbox = params.get("mailbox", []) == ["1"]
        self._authenticating = True

        def checked(result: object) -> object:
            self._authenticating = False
            return result

        return self.factory.authenticate(headers).addCallback(self._authenticated).addBoth(checked)

    def _authenticated(self, member: Member | None) -> None:
        if self.state == WebSocketProtocol.STATE_CLOSED:
            # The client left while the store answered: nothing to count, nothing to open.
            raise ConnectionDeny(ConnectionDeny.BAD_REQUEST, "gone")
        self.member = member
        if self.member is None:
            peer = self.transport.getPeer() if self.transport is not None else None
            self.factory.door.auth_failed(source_of(peer))
            self._refusal = (CLOSE_UNAUTHORIZED, CallErrorCode.UNAUTHORIZED, "unauthorized")
            _log.debug("ws_unauthorized", role=str(self.role), peer=self.peer)
        elif self.role is frames.Role.CALL:
            identity = self.member.address
            if self.factory.door.gate.admit_caller(identity):
                self._counted_caller = identity
            else:
                self.factory.door.turned_away.note(TurnedAway.CALLERS_PER_IDENTITY)
                self._refusal = (
                    CLOSE_TOO_MANY,
                    CallErrorCode.RATE_LIMITED,
                    "too many caller sockets for this identity",
                )

    def onOpen(self) -> None:
        self.opened = True
        # Answered (ready or a refusal): the next upgrade may take this one's place.
        self.factory.door.upgrade_answered(self.transport)
        self._release_handshake()
        member = self.member
        self.channel = WebSocketChannel(self, peer=self.peer or "?")
        if self._refusal is not None or member is None or self.role is None:
            close_code, error, reason = self._refusal or (
                CLOSE_BAD_REQUEST,
                CallErrorCode.PROTOCOL_ERROR,
                "bad request",
            )
            if self.role is frames.Role.CALL:
                self.channel.send(frames.CallError(code=error))
            self.sendClose(close_code, reason)
            return
        self.factory.door.websocket_opened(self.transport)
        self.factory.seen.note(member.org, member.handle, self.factory.door.clock.seconds())
        address = f"@{member.org}/{member.handle}"
        ready = frames.Ready(
            role=self.role,
            address=address,
            relay_origin=self.factory.relay_origin,
            calls=self.role is frames.Role.LISTEN,
            # A mailbox listener says first what jobs it holds (JobDesk reconciles its leases).
            jobs_held=self.role is frames.Role.LISTEN and self.mailbox,
        )
        self.channel.send(ready)
        if self.role is frames.Role.CALL:
            # Known to the switchboard so that removing the member closes this socket too.
            self.factory.switchboard.attach_caller(member.org, member.handle, self.channel)
            door = self.factory.door
            self._call_request_deadline = door.clock.callLater(
                door.config.call_request_timeout_s, self._call_request_overdue
            )
        if self.role is frames.Role.LISTEN:
            self.outgoing = SocketCalls(self.factory.calls, self.channel, member.org, member.handle)
            self.factory.switchboard.attach_listener(member.org, member.handle, self.channel)
            _log.info(
                "listener_attached", org=member.org, handle=member.handle, mailbox=self.mailbox
            )
            self.factory.jobs.listener_attached(
                member.org, member.handle, self.channel, mailbox=self.mailbox
            )

    def _call_request_overdue(self) -> None:
        """A caller socket that answers pings but never asks for a call holds a socket for
        nothing; it is closed like any other protocol error."""
        self._call_request_deadline = None
        self.factory.door.turned_away.note(TurnedAway.CALL_REQUEST_TIMEOUT)
        if self.channel is not None and self.opened:
            self._fail_caller(self.channel, CallErrorCode.PROTOCOL_ERROR)

    def _stop_call_request_deadline(self) -> None:
        call, self._call_request_deadline = self._call_request_deadline, None
        if call is not None and call.active():
            call.cancel()

    def _release_handshake(self) -> None:
        """Drop what the upgrade left behind: an idle listener should cost only its socket.

        The twisted.web connection that carried the upgrade stays registered as the socket's
        producer (keeping its request and headers alive), and autobahn keeps the raw handshake.
        """
        transport: Any = self.transport
        if transport is not None and getattr(transport, "producer", None) is not None:
            transport.unregisterProducer()
        for name in (
            "http_request_data",
            "http_headers",
            "http_raw_headers",
            "http_request_uri",
            "http_request_params",
            "http_request_path",
        ):
            if hasattr(self, name):
                setattr(self, name, None)

    # --- frames ------------------------------------------------------------------------------

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        member, channel = self.member, self.channel
        if member is None or channel is None or self._refusal is not None:
            return
        if self.role is frames.Role.CALL:
            self._from_caller(member, channel, payload, isBinary)
        else:
            self._from_listener(member, channel, payload, isBinary)

    def _from_caller(
        self, member: Member, channel: WebSocketChannel, payload: bytes, is_binary: bool
    ) -> None:
        # Size first: nothing of an oversize request is parsed.
        if len(payload) > limits.MAX_REQUEST_FRAME_BYTES:
            self._fail_caller(channel, CallErrorCode.MESSAGE_TOO_LARGE)
            return
        try:
            if is_binary:
                raise MalformedFrame("binary frames are not part of the protocol")
            frame = codec.decode_frame(
                payload, frames.FROM_CALLER, max_bytes=limits.MAX_REQUEST_FRAME_BYTES
            )
        except MalformedFrame:
            _log.info("caller_frame_malformed", org=member.org, handle=member.handle)
            self._fail_caller(channel, CallErrorCode.PROTOCOL_ERROR)
            return
        book = self.factory.calls
        if isinstance(frame, frames.CallRequest):
            self._stop_call_request_deadline()
            if self.target is None:
                self._fail_caller(channel, CallErrorCode.UNKNOWN_HANDLE)
                return
            routed = book.submit(member.org, member.handle, self.target, channel, frame)
            routed.addErrback(self._routing_failed, channel)
        else:
            book.from_caller(channel, frame)

    def _from_listener(
        self, member: Member, channel: WebSocketChannel, payload: bytes, is_binary: bool
    ) -> None:
        try:
            if is_binary:
                raise MalformedFrame("binary frames are not part of the protocol")
            frame = codec.decode_frame(
                payload, frames.FROM_LISTENER, max_bytes=limits.MAX_RESPONSE_FRAME_BYTES
            )
        except MalformedFrame:
            # A listener's bad frame concerns only its own calls; drop it, keep the session.
            _log.info("listener_frame_malformed", org=member.org, handle=member.handle)
            return
        if isinstance(frame, frames.JOB_FRAMES_FROM_LISTENER):
            # The desk logs and absorbs its own failures; the result only says it is done.
            self.factory.jobs.from_listener(member.org, member.handle, channel, frame)
            return
        if isinstance(frame, frames.OUTGOING_FROM_LISTENER):
            self._outgoing_call(frame, len(payload))
            return
        verbatim = self.factory.verbatim
        verbatim.hold(frame, payload)
        try:
            self.factory.calls.from_listener(member.org, member.handle, channel, frame)
        finally:
            verbatim.clear()

    def _outgoing_call(self, frame: frames.Frame, size: int) -> None:
        """A call this installation places on its own socket, or a cancel of one."""
        outgoing = self.outgoing
        if outgoing is None:  # pragma: no cover - set in onOpen before any frame is read
            return
        if isinstance(frame, frames.CancelCall):
            outgoing.cancel(frame)
        elif isinstance(frame, frames.CallRequest):
            if size > limits.MAX_REQUEST_FRAME_BYTES:
                # The listener cap let it through; a request has the smaller, caller's cap.
                outgoing.refuse(frame, CallErrorCode.MESSAGE_TOO_LARGE, "the request is too large")
                return
            outgoing.request(frame)

    def _routing_failed(self, failure: Failure, channel: WebSocketChannel) -> None:
        # A bug in routing, not the caller's fault: logged with its traceback, never left as an
        # unhandled error; the caller's socket ends so it does not wait for its deadline.
        _log.failure("call_routing_failed", failure=failure)
        channel.close(CLOSE_NORMAL, "internal error")

    def _fail_caller(self, channel: WebSocketChannel, code: CallErrorCode) -> None:
        channel.send(frames.CallError(code=code))
        channel.close(CLOSE_NORMAL, str(code))

    # --- teardown ----------------------------------------------------------------------------

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        was_open, self.opened = self.opened, False
        self._stop_call_request_deadline()
        counted, self._counted_caller = self._counted_caller, None
        if counted is not None:
            self.factory.door.gate.release_caller(counted)
        member, channel = self.member, self.channel
        if not was_open or member is None or channel is None or self._refusal is not None:
            return
        self.factory.seen.note(member.org, member.handle, self.factory.door.clock.seconds())
        if self.role is frames.Role.LISTEN:
            self.factory.switchboard.detach_listener(member.org, member.handle, channel)
            self.factory.calls.listener_gone(member.org, member.handle, channel)
            self.factory.jobs.listener_gone(member.org, member.handle, channel)
            if self.outgoing is not None:
                self.outgoing.socket_gone()
            _log.info("listener_detached", org=member.org, handle=member.handle, code=code)
        else:
            self.factory.switchboard.detach_caller(member.org, member.handle, channel)
            self.factory.calls.caller_gone(channel)


def _sharing_options(factory: WebSocketServerFactory) -> type[RelayWebSocket]:
    """:class:`RelayWebSocket` with ``factory``'s protocol options as class attributes.

    autobahn copies into each connection the options its class does not have; those ~30
    copies doubled the size of every connection's attribute table (about 1.7 KiB of an idle
    listener's 9.5). Every connection of a factory has the same options, so they are kept once.
    A callable option is a static method, so reading it from a connection gives it unbound.
    """
    names = [*WebSocketProtocol.CONFIG_ATTRS_COMMON, *WebSocketProtocol.CONFIG_ATTRS_SERVER]
    shared: dict[str, Any] = {}
    for name in names:
        value = getattr(factory, name)
        shared[name] = staticmethod(value) if callable(value) else value
    return type(RelayWebSocket.__name__, (RelayWebSocket,), shared)


class RelayWebSocketFactory(WebSocketServerFactory):
    protocol = RelayWebSocket  # type: ignore[assignment]

    def __init__(
        self,
        url: str,
        *,
        store: RelayStore,
        switchboard: Switchboard,
        calls: CallBook,
        jobs: JobDesk,
        relay_origin: str,
        reactor: Any,
        door: Door,
        seen: LastSeen,
    ) -> None:
        # server=None: the upgrade response names no software and no version.
        super().__init__(url, reactor=reactor, server=None)
        self.door = door
        self.seen = seen
        self.store = store
        self.switchboard = switchboard
        self.calls = calls
        self.jobs = jobs
        self.relay_origin = relay_origin
        self.verbatim = Verbatim()
        self.unsent = Unsent()
        self.setProtocolOptions(
            # Leave room above the request cap so an oversize request is answered with
            # message_too_large instead of a bare 1009 close.
            maxFramePayloadSize=limits.MAX_FRAME_BYTES,
            maxMessagePayloadSize=limits.MAX_FRAME_BYTES,
            autoPingInterval=limits.KEEPALIVE_INTERVAL_S,
            autoPingTimeout=limits.KEEPALIVE_TIMEOUT_S,
            openHandshakeTimeout=limits.WS_OPENING_HANDSHAKE_TIMEOUT_S,
            closeHandshakeTimeout=5,
            # A plain GET never reaches autobahn (the resource answers 426); never show its page.
            webStatus=False,
            perMessageCompressionAccept=lambda _offers: None,
            # Frames are decoded as strict UTF-8 by agentcall.wire.codec; no second pass.
            utf8validateIncoming=False,
            # Client frames are unmasked by RelayWebSocket.onFrameData (agentcall.relay.wsmask):
            # autobahn would build a masker object per frame.
            applyMask=False,
        )
        self.protocol = _sharing_options(self)

    def authenticate(self, headers: dict[str, str]) -> Deferred[Member | None]:
        return authenticate_headers(self.store, headers)
