"""Test clients that speak the real protocol to a real relay: enrol, publish keys, call, answer.

A :class:`Party` is one identity. As a callee it opens a listener socket and answers each
incoming call by opening the sealed request and sealing an echo reply, the way a listener
would without an agent. Everything goes through the product's own client library.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet import defer, reactor

from agentcall.client.api import Credentials, RelayApi
from agentcall.client.ws import ClientSocket, SocketClosed, open_socket, place_call
from agentcall.crypto import envelope, records
from agentcall.crypto.keys import EncryptionKey, IdentityKey
from agentcall.invites import parse_invite_url
from agentcall.relayurl import RelayUrl
from agentcall.wire import frames, http, payloads


@attrs.define
class Party:
    relay_url: RelayUrl
    ca_file: str
    registration: http.RegisterResponse
    identity: IdentityKey = attrs.field(factory=IdentityKey.generate)
    encryption: EncryptionKey = attrs.field(factory=EncryptionKey.generate)
    identity_record: http.SignedIdentityRecord | None = None
    encryption_record: http.SignedEncryptionKeyRecord | None = None
    received: list[frames.Frame] = attrs.field(factory=list)
    closes: list[SocketClosed] = attrs.field(factory=list)
    answer: Callable[[payloads.RequestPayload], payloads.Reply | payloads.CallFailure] | None = None
    socket: ClientSocket | None = None
    close_waiters: list[defer.Deferred[SocketClosed]] = attrs.field(factory=list)

    @property
    def credentials(self) -> Credentials:
        r = self.registration
        return Credentials(org=r.org, handle=r.handle, token=r.token)

    @property
    def address(self) -> str:
        return self.registration.address

    @property
    def handle(self) -> str:
        return self.registration.handle

    def api(self) -> RelayApi:
        return RelayApi(reactor, self.relay_url, self.credentials, ca_file=self.ca_file)

    async def publish_keys(self) -> None:
        origin = self.relay_url.origin
        self.identity_record = records.make_identity_record(self.identity, origin, self.address)
        now = int(time.time())
        self.encryption_record = records.make_encryption_record(
            self.identity,
            self.encryption,
            origin,
            self.address,
            epoch=1,
            not_before=now - 60,
            not_after=now + 7 * 86400,
            previous=None,
        )
        await self.api().put_identity_key(self.identity_record)
        await self.api().put_encryption_key(self.encryption_record)

    async def keys_of(self, handle: str) -> http.KeysResponse:
        keys: http.KeysResponse = await self.api().get_keys(handle)
        return keys

    # --- callee ------------------------------------------------------------------------------

    async def listen(self) -> ClientSocket:
        socket: ClientSocket = await open_socket(
            reactor,
            self.relay_url,
            self.credentials,
            frames.Role.LISTEN,
            ca_file=self.ca_file,
            on_frame=self._on_frame,
            on_close=self._on_close,
        )
        self.socket = socket
        return socket

    def _on_close(self, info: SocketClosed) -> None:
        self.closes.append(info)
        waiters, self.close_waiters = self.close_waiters, []
        for waiter in waiters:
            waiter.callback(info)

    def next_close(self) -> defer.Deferred[SocketClosed]:
        """Fires when one of this party's listener sockets closes next."""
        waiter: defer.Deferred[SocketClosed] = defer.Deferred()
        self.close_waiters.append(waiter)
        return waiter

    def _on_frame(self, frame: frames.Frame) -> None:
        self.received.append(frame)
        if isinstance(frame, frames.IncomingCall) and self.answer is not None:
            defer.ensureDeferred(self._answer(frame))

    async def _answer(self, incoming: frames.IncomingCall) -> None:
        caller = await self.keys_of(incoming.from_)
        assert self.encryption_record is not None and caller.encryption is not None
        request = envelope.open_request(
            incoming.envelope,
            my_key=self.encryption,
            my_record=self.encryption_record.record,
            relay_origin=self.relay_url.origin,
            expected_from=f"@{self.registration.org}/{incoming.from_}",
            expected_to=self.address,
            sender_identity_pub=caller.identity.record.identity_pub,
            now=time.time(),
        )
        socket = self.socket
        assert socket is not None
        socket.send(frames.CallAccepted(call_id=incoming.call_id))
        socket.send(frames.CallStarted(call_id=incoming.call_id))
        assert self.answer is not None
        outcome = self.answer(request)
        sealed = envelope.seal_response(
            responder=self.identity,
            request=request,
            outcome=outcome,
            caller_encryption=caller.encryption.record,
            now=time.time(),
        )
        terminal = (
            frames.Terminal.COMPLETED
            if isinstance(outcome, payloads.Reply)
            else frames.Terminal.FAILED
        )
        socket.send(
            frames.CallOutcome(call_id=incoming.call_id, terminal=terminal, envelope=sealed)
        )

    # --- caller ------------------------------------------------------------------------------

    async def seal_to(
        self, target: Party | http.KeysResponse, message: str, **overrides: Any
    ) -> tuple[frames.SealedEnvelope, payloads.RequestPayload]:
        keys = (
            target if isinstance(target, http.KeysResponse) else await self.keys_of(target.handle)
        )
        assert keys.encryption is not None
        return envelope.seal_request(
            sender=self.identity,
            sender_address=overrides.pop("sender_address", self.address),
            recipient_identity=keys.identity.record,
            recipient_encryption=keys.encryption.record,
            relay_origin=self.relay_url.origin,
            message=message,
            task=None,
            context_id=None,
            now=overrides.pop("now", time.time()),
            **overrides,
        )

    async def call(
        self, target_handle: str, sealed: frames.SealedEnvelope
    ) -> tuple[frames.CallOutcome | frames.CallError, list[frames.CallStatus]]:
        statuses: list[frames.CallStatus] = []
        request = frames.CallRequest(envelope=sealed, correlation_id=_correlation())
        terminal = await place_call(
            reactor,
            self.relay_url,
            self.credentials,
            target_handle,
            request,
            ca_file=self.ca_file,
            on_status=statuses.append,
        )
        if isinstance(terminal, frames.CallQueued):
            raise AssertionError("call_request here never asks to be queued")
        return terminal, statuses

    def open_outcome(
        self, outcome: frames.CallOutcome, request: payloads.RequestPayload, responder: Party
    ) -> payloads.ResponsePayload:
        assert self.encryption_record is not None and responder.identity_record is not None
        return envelope.open_response(
            outcome.envelope,
            my_key=self.encryption,
            my_record=self.encryption_record.record,
            request=request,
            responder_identity_pub=responder.identity_record.record.identity_pub,
            now=time.time(),
        )

    def open_outcome_with(
        self, outcome: frames.CallOutcome, request: payloads.RequestPayload, responder_pub: str
    ) -> payloads.ResponsePayload:
        assert self.encryption_record is not None
        return envelope.open_response(
            outcome.envelope,
            my_key=self.encryption,
            my_record=self.encryption_record.record,
            request=request,
            responder_identity_pub=responder_pub,
            now=time.time(),
        )


def _correlation() -> str:
    from agentcall import ids

    return ids.mint_correlation_id()


async def enrol(relay_url: RelayUrl, ca_file: str, invite_url: str, handle: str) -> Party:
    link = parse_invite_url(invite_url)
    api = RelayApi(reactor, relay_url, None, ca_file=ca_file)
    registration = await api.register(
        http.RegisterRequest(org=link.org, invite=link.secret, handle=handle)
    )
    return Party(relay_url=relay_url, ca_file=ca_file, registration=registration)


async def invite(admin: Party, role: http.MemberRole = http.MemberRole.MEMBER) -> str:
    created = await admin.api().create_invite(http.InviteCreateRequest(role=role))
    return created.invite


def echo(request: payloads.RequestPayload) -> payloads.Reply:
    return payloads.Reply(text=f"echo from {request.to}: {request.message}")
