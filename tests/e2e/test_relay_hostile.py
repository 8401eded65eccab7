"""Hostile input against a real relay process: it refuses clearly, never crashes, never leaks."""

from __future__ import annotations

import json
import socket
import sqlite3
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor

from agentcall import limits
from agentcall.client.ws import open_socket
from agentcall.errors import ApiError, ApiErrorCode, CallErrorCode
from agentcall.invites import parse_invite_url
from agentcall.wire import frames, http
from tests.e2e.parties import Party, echo, enrol, invite
from tests.e2e.processes import RelayProcess

pytestmark = pytest.mark.e2e

Relay = tuple[RelayProcess, dict[str, str]]


def _tls(process: RelayProcess) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=process.ca_file)


def _raw_request(
    process: RelayProcess,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        process.url.http(path), data=body, method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, context=_tls(process), timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _healthy(process: RelayProcess) -> bool:
    status, body = _raw_request(process, "GET", "/v1/status")
    return process.alive() and status == 200 and body["ok"] is True


async def _admin(relay: Relay, handle: str) -> Party:
    process, invites = relay
    admin = await enrol(process.url, process.ca_file, invites["acme"], handle)
    invites["acme"] = await invite(admin, http.MemberRole.ADMIN)
    return admin


@pytest_twisted.ensureDeferred
async def test_every_enrolment_error_is_distinct(relay: Relay) -> None:
    """Reused, revoked and unknown invites, taken and malformed handles: one code each."""
    process, _ = relay
    admin = await _admin(relay, "root-ops")
    url = await invite(admin)
    await enrol(process.url, process.ca_file, url, "joe")

    async def code_for(invite_url: str, handle: str) -> tuple[int, ApiErrorCode]:
        with pytest.raises(ApiError) as info:
            await enrol(process.url, process.ca_file, invite_url, handle)
        return info.value.status, info.value.code

    assert await code_for(url, "joe2") == (410, ApiErrorCode.INVITE_USED)
    fresh = await invite(admin)
    assert await code_for(fresh, "joe") == (409, ApiErrorCode.HANDLE_TAKEN)
    assert await code_for(fresh, "Not_A_Handle") == (400, ApiErrorCode.HANDLE_INVALID)
    assert await code_for(fresh, "admin") == (400, ApiErrorCode.HANDLE_INVALID)
    created = await admin.api().create_invite(http.InviteCreateRequest())
    await admin.api().revoke_invite(created.info.id)
    assert await code_for(created.invite, "kim") == (410, ApiErrorCode.INVITE_REVOKED)
    link = parse_invite_url(fresh)
    unknown = fresh.replace(link.secret, "B" * 43)
    assert await code_for(unknown, "kim") == (404, ApiErrorCode.INVITE_UNKNOWN)
    # The taken-handle attempt left the invite usable.
    await enrol(process.url, process.ca_file, fresh, "kim")

    member = await enrol(process.url, process.ca_file, await invite(admin), "lou")
    with pytest.raises(ApiError) as info:
        await member.api().create_invite(http.InviteCreateRequest())
    assert info.value.code is ApiErrorCode.FORBIDDEN
    listed = await admin.api().list_invites()
    assert {i.status for i in listed.invites} >= {http.InviteStatus.USED, http.InviteStatus.REVOKED}


@pytest_twisted.ensureDeferred
async def test_key_publication_rules_hold_over_http(relay: Relay) -> None:
    """Identity keys are never replaced; records may only name yourself; epochs only go up."""
    admin = await _admin(relay, "keys-admin")
    await admin.publish_keys()
    other = Party(relay_url=admin.relay_url, ca_file=admin.ca_file, registration=admin.registration)
    with pytest.raises(ApiError) as info:
        await other.publish_keys()  # a different identity key for the same handle
    assert info.value.code is ApiErrorCode.IDENTITY_KEY_EXISTS
    assert admin.encryption_record is not None
    with pytest.raises(ApiError) as info:
        await admin.api().put_encryption_key(admin.encryption_record)
    assert info.value.code in {ApiErrorCode.EPOCH_NOT_INCREASING, ApiErrorCode.SIGNATURE_INVALID}

    status, body = _raw_request(
        relay[0], "PUT", "/v1/keys/identity", b"{" * 20000, {"content-type": "application/json"}
    )
    assert status in {401, 413}
    status, body = _raw_request(relay[0], "POST", "/v1/register", b"[1,2,3]")
    assert (status, body["error"]) == (400, "bad_request")
    status, body = _raw_request(relay[0], "POST", "/v1/register", b"x" * 100_000)
    assert (status, body["error"]) == (413, "body_too_large")


@pytest_twisted.ensureDeferred
async def test_oversize_and_garbage_frames_are_refused_without_harm(relay: Relay) -> None:
    """Oversize requests get message_too_large; garbage gets protocol_error; relay lives on."""
    process, _ = relay
    admin = await _admin(relay, "big-sender")
    await admin.publish_keys()
    target = await enrol(process.url, process.ca_file, await invite(admin), "big-target")
    await target.publish_keys()
    target.answer = echo
    await target.listen()

    sealed, _ = await admin.seal_to(target, "x")
    huge = frames.SealedEnvelope(
        v=1,
        direction=sealed.direction,
        relay_origin=sealed.relay_origin,
        from_=sealed.from_,
        to=sealed.to,
        key_id=sealed.key_id,
        epoch=sealed.epoch,
        ct="A" * (limits.MAX_REQUEST_FRAME_BYTES + 10),
    )
    terminal, _ = await admin.call("big-target", huge)
    assert isinstance(terminal, frames.CallError)
    assert terminal.code is CallErrorCode.MESSAGE_TOO_LARGE

    # Beyond the absolute frame cap the relay drops the connection (1009) before parsing.
    dropped: list[Any] = []
    big = await open_socket(
        reactor,
        process.url,
        admin.credentials,
        frames.Role.CALL,
        to="big-target",
        ca_file=process.ca_file,
        on_frame=lambda _f: None,
        on_close=dropped.append,
    )
    big._protocol.maxMessagePayloadSize = 0  # type: ignore[attr-defined]  # ours would refuse
    big._protocol.sendMessage(b"x" * (limits.MAX_FRAME_BYTES + 1))
    await _until(lambda: bool(dropped))
    assert dropped[0].code in {1006, 1009}  # autobahn drops the TCP connection outright

    # Garbage text and binary on a caller socket: protocol_error, socket closed.
    got: list[frames.Frame] = []
    closes: list[object] = []
    caller = await open_socket(
        reactor,
        process.url,
        admin.credentials,
        frames.Role.CALL,
        to="big-target",
        ca_file=process.ca_file,
        on_frame=got.append,
        on_close=closes.append,
    )
    caller._protocol.sendMessage(b"\xff\xfe not json", isBinary=True)
    await _until(lambda: bool(closes))
    assert [f.code for f in got if isinstance(f, frames.CallError)] == [
        CallErrorCode.PROTOCOL_ERROR
    ]
    # The target's listener saw nothing of any of it.
    assert not [f for f in target.received if isinstance(f, frames.IncomingCall)]
    assert _healthy(process)


@pytest_twisted.ensureDeferred
async def test_raw_garbage_and_half_open_sockets_never_crash_the_relay(relay: Relay) -> None:
    """Non-TLS bytes, TLS garbage, and idle half-open connections leave the relay serving."""
    process, _ = relay
    port = process.url.port
    idle = []
    for _ in range(5):  # half-open: connected, never speaking
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        idle.append(s)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"\x00\x01garbage" * 1000)
    with _tls(process).wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=60), server_hostname="localhost"
    ) as s:
        s.sendall(b"GET /v1/ws?role=listen HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n")
        s.sendall(b"\x00" * 4096)
    with _tls(process).wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=60), server_hostname="localhost"
    ) as s:
        s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: localhost\r\n")  # never finished
        assert _healthy(process)
    admin = await _admin(relay, "after-garbage")
    assert (await admin.api().whoami()).handle == "after-garbage"
    for s in idle:
        s.close()
    assert _healthy(process)


@pytest_twisted.ensureDeferred
async def test_audit_rows_are_metadata_only(relay: Relay) -> None:
    """After calls, the relay's database holds call metadata and never message or reply text."""
    process, _ = relay
    admin = await _admin(relay, "audit-a")
    await admin.publish_keys()
    member = await enrol(process.url, process.ca_file, await invite(admin), "audit-b")
    await member.publish_keys()
    member.answer = echo
    await member.listen()
    secret_text = "the-launch-codes-are-7319"
    sealed, _ = await admin.seal_to(member, secret_text)
    terminal, _ = await admin.call("audit-b", sealed)
    assert isinstance(terminal, frames.CallOutcome)

    def call_rows() -> list[Any]:
        with sqlite3.connect(process.database) as db:
            return db.execute(
                "SELECT event, actor, target FROM audit WHERE org = 'acme'"
                " AND call_id IS NOT NULL AND (actor IN ('audit-a', 'audit-b'))"
            ).fetchall()

    # The relay writes a call's rows a few milliseconds after its frames (one batch).
    await _until(lambda: ("call.complete", "audit-b", "audit-a") in call_rows(), timeout=10.0)
    rows = call_rows()
    assert ("call.submit", "audit-a", "audit-b") in rows
    assert ("call.complete", "audit-b", "audit-a") in rows
    for path in process.database.parent.glob("relay.sqlite*"):
        assert secret_text.encode() not in path.read_bytes()
    assert secret_text not in process.log.text()
    assert admin.registration.token not in process.log.text()


async def _until(predicate: Any, timeout: float = 60.0) -> None:
    """Wait on the reactor (not the wall clock in a sleep) until the predicate holds."""
    from twisted.internet import task

    waited = 0.0
    while not predicate():
        if waited > timeout:
            raise TimeoutError("condition not reached")
        await task.deferLater(reactor, 0.02, lambda: None)
        waited += 0.02
