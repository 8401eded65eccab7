"""The relay HTTP client against small in-test servers on real loopback sockets.

TLS comes from the throwaway CA in agentcall.testing.tlsca: the right CA, another CA, a
certificate for another name; plain http only to loopback.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
import pytest_twisted  # type: ignore[import-untyped,unused-ignore]
from OpenSSL import SSL
from service_identity import VerificationError
from twisted.internet import defer
from twisted.internet import reactor as _reactor
from twisted.internet.endpoints import serverFromString
from twisted.internet.error import DNSLookupError
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import ResponseNeverReceived
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from agentcall import limits
from agentcall.client.api import (
    MAX_RESPONSE_BODY_BYTES,
    Credentials,
    MissingCredentials,
    RelayApi,
    RelayUnreachable,
    describe_failure,
)
from agentcall.client.tls import CaFileError, RelayTlsPolicy
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.relayurl import RelayUrl
from agentcall.testing.tlsca import CA, ServerCert, make_ca
from agentcall.wire import codec
from agentcall.wire.frames import Direction, SealedEnvelope
from agentcall.wire.http import (
    InviteInfo,
    InviteStatus,
    JobInfo,
    JobList,
    JobSide,
    JobState,
    MemberRole,
    OfflineDelivery,
    RegisterRequest,
    StatusResponse,
    WhoAmIResponse,
)

reactor: Any = _reactor
F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, None]])
TOKEN = "SECRETsecretSECRETsecretSECRETsecretSECRET1"
CREDS = Credentials(org="acme", handle="ann", token=TOKEN)


def twisted_test(f: F) -> F:
    """Run an async test on the reactor (pytest-twisted is untyped)."""
    result: F = pytest_twisted.ensureDeferred(f)
    return result


# --- a fake relay -------------------------------------------------------------------------------


@attrs.frozen
class Seen:
    method: bytes
    path: bytes
    headers: dict[bytes, bytes]
    body: bytes
    uri: bytes = b""  # the path with its query


class FakeRelay(Resource):
    """Answers scripted (status, body) per (method, path) and records what it was sent."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.routes: dict[tuple[bytes, bytes], tuple[int, bytes]] = {}
        self.seen: list[Seen] = []
        self.hang = False
        self.arrived: defer.Deferred[None] = defer.Deferred()

    def answer(self, method: bytes, path: str, status: int, body: object) -> None:
        raw = body if isinstance(body, bytes) else codec.encode(body)
        self.routes[(method, path.encode())] = (status, raw)

    def render(self, request: Request) -> bytes | int:
        assert request.method is not None and request.path is not None
        headers = {k.lower(): v[0] for k, v in request.requestHeaders.getAllRawHeaders()}
        assert request.content is not None
        self.seen.append(
            Seen(request.method, request.path, headers, request.content.read(), request.uri)
        )
        if not self.arrived.called:
            self.arrived.callback(None)
        if self.hang:
            return NOT_DONE_YET
        status, body = self.routes.get(
            (request.method, request.path), (404, b'{"error":"not_found","message":"no"}')
        )
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"application/json")
        return body


@attrs.frozen
class Pki:
    ca: CA
    other_ca: CA
    server: ServerCert
    wrong_name: ServerCert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    base = tmp_path_factory.mktemp("pki")
    ca = make_ca(base / "ca")
    return Pki(
        ca=ca,
        other_ca=make_ca(base / "other"),
        server=ca.issue_server(base / "srv", hostnames=["localhost"], ips=["127.0.0.1"]),
        wrong_name=ca.issue_server(
            base / "srv", hostnames=["relay.other.test"], ips=[], name="wrong"
        ),
    )


class Servers:
    """Starts servers from endpoint strings; the fixture stops them afterwards."""

    def __init__(self) -> None:
        self.ports: list[Any] = []

    async def start(self, resource: Resource, description: str) -> int:
        site = Site(resource)
        port = await serverFromString(reactor, description).listen(site)
        self.ports.append(port)
        number: int = port.getHost().port
        return number


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    for port in running.ports:
        pytest_twisted.blockon(defer.maybeDeferred(port.stopListening))


async def tls_relay(servers: Servers, cert: ServerCert) -> tuple[FakeRelay, int]:
    relay = FakeRelay()
    return relay, await servers.start(relay, cert.endpoint_string(0))


def status_body(port: int) -> StatusResponse:
    return StatusResponse(ok=True, version="0.1.0", relay_origin=f"127.0.0.1:{port}")


def whoami_body(port: int) -> WhoAmIResponse:
    return WhoAmIResponse(
        org="acme",
        handle="ann",
        address="@acme/ann",
        role=MemberRole.MEMBER,
        relay_origin=f"127.0.0.1:{port}",
    )


# --- TLS -----------------------------------------------------------------------------------------


@twisted_test
async def test_tls_with_the_right_ca_reaches_the_relay(pki: Pki, servers: Servers) -> None:
    """With the relay's CA trusted, a status request succeeds and carries no credentials."""
    relay, port = await tls_relay(servers, pki.server)
    relay.answer(b"GET", "/v1/status", 200, status_body(port))
    api = RelayApi(
        reactor, RelayUrl.parse(f"https://127.0.0.1:{port}"), CREDS, str(pki.ca.cert_file)
    )
    assert await api.status() == status_body(port)
    assert b"authorization" not in relay.seen[0].headers


@twisted_test
async def test_tls_checks_a_dns_name_too(pki: Pki, servers: Servers) -> None:
    """A certificate for localhost is accepted when the URL says localhost."""
    relay, port = await tls_relay(servers, pki.server)
    relay.answer(b"GET", "/v1/status", 200, status_body(port))
    api = RelayApi(
        reactor, RelayUrl.parse(f"https://localhost:{port}"), None, str(pki.ca.cert_file)
    )
    assert (await api.status()).ok


@twisted_test
async def test_another_ca_is_not_trusted(pki: Pki, servers: Servers) -> None:
    """A relay certificate from a CA we do not trust fails before any request is sent."""
    relay, port = await tls_relay(servers, pki.server)
    api = RelayApi(
        reactor, RelayUrl.parse(f"https://127.0.0.1:{port}"), CREDS, str(pki.other_ca.cert_file)
    )
    with pytest.raises(RelayUnreachable, match="not trusted") as caught:
        await api.whoami()
    assert relay.seen == []
    assert TOKEN not in str(caught.value)


@twisted_test
async def test_a_certificate_for_another_name_is_refused(pki: Pki, servers: Servers) -> None:
    """A trusted certificate that does not name the host we dialled is refused."""
    relay, port = await tls_relay(servers, pki.wrong_name)
    api = RelayApi(
        reactor, RelayUrl.parse(f"https://127.0.0.1:{port}"), CREDS, str(pki.ca.cert_file)
    )
    with pytest.raises(RelayUnreachable, match=r"not valid for 127\.0\.0\.1"):
        await api.whoami()
    assert relay.seen == []


@twisted_test
async def test_ssl_cert_file_is_trusted_when_no_ca_file_is_given(
    pki: Pki, servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SSL_CERT_FILE names the CA when there is no explicit one; an explicit one wins."""
    relay, port = await tls_relay(servers, pki.server)
    relay.answer(b"GET", "/v1/status", 200, status_body(port))
    url = RelayUrl.parse(f"https://127.0.0.1:{port}")
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca.cert_file))
    assert (await RelayApi(reactor, url, None).status()).ok
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.other_ca.cert_file))
    assert (await RelayApi(reactor, url, None, str(pki.ca.cert_file)).status()).ok
    with pytest.raises(RelayUnreachable, match="not trusted"):
        await RelayApi(reactor, url, None).status()


def test_a_missing_ca_file_is_reported_before_dialling(tmp_path: Path) -> None:
    """A CA file that is not there, or is not PEM, is a clear error at construction."""
    url = RelayUrl.parse("https://relay.acme.test")
    with pytest.raises(CaFileError, match=r"cannot read CA file .*nope\.pem"):
        RelayApi(reactor, url, CREDS, str(tmp_path / "nope.pem"))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(CaFileError, match="no PEM certificate"):
        RelayApi(reactor, url, CREDS, str(junk))
    with pytest.raises(CaFileError, match="cannot read"):
        RelayTlsPolicy(environ={"SSL_CERT_FILE": str(tmp_path)})


def test_the_throwaway_ca_writes_private_keys_0600(pki: Pki) -> None:
    """Keys are readable by their owner only; certificates are public."""
    for key in (pki.ca.key_file, pki.server.key_file):
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pki.server.cert_file).st_mode) == 0o644
    assert pki.server.ca_cert_file == pki.ca.cert_file


@twisted_test
async def test_endpoint_strings_survive_colons_and_equals_in_paths(
    tmp_path: Path, servers: Servers
) -> None:
    """Certificate paths with ':', '=' and '\\' still make a working ssl: endpoint."""
    ca = make_ca(tmp_path / "ca")
    cert = ca.issue_server(tmp_path / "we:ird=dir\\x", ips=["127.0.0.1"], hostnames=[])
    relay, port = await tls_relay(servers, cert)
    relay.answer(b"GET", "/v1/status", 200, status_body(port))
    api = RelayApi(reactor, RelayUrl.parse(f"https://127.0.0.1:{port}"), None, str(ca.cert_file))
    assert (await api.status()).ok


# --- plain http on loopback, requests and answers -----------------------------------------------


async def http_relay(servers: Servers) -> tuple[FakeRelay, RelayApi, int]:
    relay = FakeRelay()
    port = await servers.start(relay, "tcp:0:interface=127.0.0.1")
    return relay, RelayApi(reactor, RelayUrl.parse(f"http://127.0.0.1:{port}/pre"), CREDS), port


@twisted_test
async def test_plain_http_to_loopback_works_and_sends_the_credentials(servers: Servers) -> None:
    """Authenticated routes carry bearer token, org and handle; the prefix is kept."""
    relay, api, port = await http_relay(servers)
    relay.answer(b"GET", "/pre/v1/me", 200, whoami_body(port))
    assert await api.whoami() == whoami_body(port)
    headers = relay.seen[0].headers
    assert headers[b"authorization"] == f"Bearer {TOKEN}".encode()
    assert (headers[b"x-agentcall-org"], headers[b"x-agentcall-handle"]) == (b"acme", b"ann")


@twisted_test
async def test_request_bodies_are_the_encoded_wire_object(servers: Servers) -> None:
    """POST bodies are JSON of the request class, labelled as JSON."""
    relay, api, port = await http_relay(servers)
    request = RegisterRequest(org="acme", invite="i" * 43, handle="ann")
    answer = {
        "org": "acme",
        "handle": "ann",
        "address": "@acme/ann",
        "role": "member",
        "token": "t" * 43,
        "relay_origin": f"127.0.0.1:{port}",
    }
    relay.answer(b"POST", "/pre/v1/register", 200, json.dumps(answer).encode())
    registered = await api.register(request)
    assert registered.token == "t" * 43
    seen = relay.seen[0]
    assert codec.decode(seen.body, RegisterRequest) == request
    assert seen.headers[b"content-type"] == b"application/json"
    assert b"authorization" not in seen.headers


@twisted_test
async def test_path_arguments_are_validated_and_placed(servers: Servers) -> None:
    """Invite ids and handles are checked before they become part of a path."""
    relay, api, _port = await http_relay(servers)
    invite_id = "ab" * 32
    info = InviteInfo(
        id=invite_id,
        org="acme",
        role=MemberRole.MEMBER,
        status=InviteStatus.REVOKED,
        created_by="ann",
        created_at=1,
        expires_at=2,
    )
    relay.answer(b"POST", f"/pre/v1/invites/{invite_id}/revoke", 200, info)
    assert await api.revoke_invite(invite_id) == info
    with pytest.raises(ValueError, match="64 lowercase hex"):
        await api.revoke_invite("../../v1/me")
    with pytest.raises(ValueError, match="handle"):
        await api.get_keys("ken/../../me")
    assert len(relay.seen) == 1


@pytest.mark.parametrize(
    ("status", "body", "code", "message"),
    [
        (409, b'{"error":"handle_taken","message":"ann is taken"}', "handle_taken", "ann is taken"),
        (401, b'{"error":"unauthorized","message":"who?"}', "unauthorized", "who?"),
        (502, b"<html>Bad Gateway</html>", "internal", "HTTP 502"),
        (400, b'{"error":"brand_new_code","message":"x"}', "internal", "HTTP 400"),
        (200, b'{"ok":true}', "internal", "not a valid WhoAmIResponse"),
    ],
)
@twisted_test
async def test_error_answers_become_api_errors(
    servers: Servers, status: int, body: bytes, code: str, message: str
) -> None:
    """Non-2xx answers map to ApiError from their body, or to internal with the status."""
    relay, api, _port = await http_relay(servers)
    relay.answer(b"GET", "/pre/v1/me", status, body)
    with pytest.raises(ApiError) as caught:
        await api.whoami()
    assert (caught.value.status, caught.value.code) == (status, ApiErrorCode(code))
    assert message in caught.value.message


@twisted_test
async def test_an_oversize_answer_is_cut_off(servers: Servers) -> None:
    """A body past the response cap is not buffered whole; it is an internal error."""
    relay, api, _port = await http_relay(servers)
    relay.answer(b"GET", "/pre/v1/presence", 200, b" " * (MAX_RESPONSE_BODY_BYTES + 1))
    with pytest.raises(ApiError, match="larger than"):
        await api.presence()


@twisted_test
async def test_authenticated_routes_need_credentials(servers: Servers) -> None:
    """Without credentials an authenticated route fails before any request is sent."""
    relay, _api, port = await http_relay(servers)
    anonymous = RelayApi(reactor, RelayUrl.parse(f"http://127.0.0.1:{port}"), None)
    with pytest.raises(MissingCredentials):
        await anonymous.list_invites()
    assert relay.seen == []


# --- transport failures ------------------------------------------------------------------------


@twisted_test
async def test_a_refused_connection_is_unreachable(servers: Servers) -> None:
    """Nothing listening: RelayUnreachable says the connection was refused."""
    port = await servers.start(FakeRelay(), "tcp:0:interface=127.0.0.1")
    await servers.ports.pop().stopListening()
    api = RelayApi(reactor, RelayUrl.parse(f"http://127.0.0.1:{port}"), CREDS)
    with pytest.raises(RelayUnreachable, match="refused the connection") as caught:
        await api.whoami()
    assert TOKEN not in str(caught.value)


@twisted_test
async def test_a_silent_relay_times_out(servers: Servers) -> None:
    """A relay that accepts but never answers fails after HTTP_TIMEOUT_S on the clock."""
    relay, _api, port = await http_relay(servers)
    relay.hang = True
    clock = Clock()
    api = RelayApi(reactor, RelayUrl.parse(f"http://127.0.0.1:{port}"), CREDS, clock=clock)
    pending = api.whoami()
    await relay.arrived
    assert not pending.called
    clock.advance(limits.HTTP_TIMEOUT_S)
    with pytest.raises(RelayUnreachable, match=r"no answer from 127\.0\.0\.1:\d+ within 10 s"):
        await pending


def test_failure_descriptions_name_the_cause() -> None:
    """Wrapped and bare transport errors become short, specific reasons."""
    url = RelayUrl.parse("https://relay.acme.test:8443")
    dns = describe_failure(DNSLookupError("relay.acme.test"), url)
    assert dns == "cannot resolve relay.acme.test"
    reason = Failure(VerificationError([]))
    wrapped = ResponseNeverReceived([reason])
    assert "not valid for relay.acme.test" in describe_failure(wrapped, url)
    tls = SSL.Error([("SSL routines", "", "certificate verify failed")])
    assert "not trusted (certificate verify failed)" in describe_failure(tls, url)


def test_credentials_never_show_the_token() -> None:
    """repr hides the token; an invalid token is refused without echoing it."""
    assert TOKEN not in repr(CREDS)
    assert TOKEN not in repr(RelayApi(reactor, RelayUrl.parse("http://127.0.0.1:1"), CREDS))
    bad = "bad token\r\nX-Evil: 1" + "x" * 20
    with pytest.raises(ValueError) as caught:
        Credentials(org="acme", handle="ann", token=bad)
    assert bad not in str(caught.value)
    assert "bad token" not in str(caught.value)


# --- the mailbox routes --------------------------------------------------------------------------

JOB_ID = "1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b"


def job_body(**changes: Any) -> JobInfo:
    fields: dict[str, Any] = {
        "job_id": JOB_ID,
        "side": JobSide.SENT,
        "caller": "@acme/ann",
        "callee": "@acme/ken",
        "state": JobState.QUEUED,
        "created_at": 1_750_000_000,
        "expires_at": 1_750_259_200,
        "attempts": 0,
    }
    fields.update(changes)
    return JobInfo(**fields)


@twisted_test
async def test_offline_delivery_is_put_as_its_wire_body(servers: Servers) -> None:
    """PUT /v1/me/offline-delivery carries {"enabled": …} and returns what the relay holds."""
    relay, api, _port = await http_relay(servers)
    relay.answer(b"PUT", "/pre/v1/me/offline-delivery", 200, OfflineDelivery(enabled=True))
    assert await api.set_offline_delivery(True) == OfflineDelivery(enabled=True)
    seen = relay.seen[0]
    assert seen.method == b"PUT"
    assert codec.decode(seen.body, OfflineDelivery) == OfflineDelivery(enabled=True)
    assert json.loads(seen.body) == {"enabled": True}


@twisted_test
async def test_job_routes_are_placed_and_decoded(servers: Servers) -> None:
    """list, get (with and without wait) and cancel reach their paths; the wait is a query."""
    relay, api, _port = await http_relay(servers)
    relay.answer(b"GET", "/pre/v1/jobs", 200, JobList(jobs=(job_body(),)))
    relay.answer(b"GET", f"/pre/v1/jobs/{JOB_ID}", 200, job_body(state=JobState.RUNNING))
    cancelled = job_body(state=JobState.CANCELLED)
    relay.answer(b"POST", f"/pre/v1/jobs/{JOB_ID}/cancel", 200, cancelled)
    assert (await api.list_jobs()).jobs == (job_body(),)
    assert (await api.get_job(JOB_ID)).state is JobState.RUNNING
    assert (await api.get_job(JOB_ID, 30)).state is JobState.RUNNING
    assert await api.cancel_job(JOB_ID) == cancelled
    assert [(s.method, s.uri) for s in relay.seen] == [
        (b"GET", b"/pre/v1/jobs"),
        (b"GET", f"/pre/v1/jobs/{JOB_ID}".encode()),
        (b"GET", f"/pre/v1/jobs/{JOB_ID}?wait=30".encode()),
        (b"POST", f"/pre/v1/jobs/{JOB_ID}/cancel".encode()),
    ]


@twisted_test
async def test_a_job_with_the_largest_answer_is_read_whole(servers: Servers) -> None:
    """A job's sealed answer may be larger than the general body cap; it still decodes."""
    relay, api, _port = await http_relay(servers)
    answer = SealedEnvelope(
        v=1,
        direction=Direction.RESPONSE,
        relay_origin="relay.example",
        from_="@acme/ken",
        to="@acme/ann",
        key_id="0" * 32,
        epoch=1,
        ct="A" * (MAX_RESPONSE_BODY_BYTES + 10),
    )
    body = job_body(state=JobState.ANSWERED, terminal="completed", answer=answer)
    relay.answer(b"GET", f"/pre/v1/jobs/{JOB_ID}", 200, body)
    assert (await api.get_job(JOB_ID)).answer == answer


@pytest.mark.parametrize(
    ("job_id", "wait"),
    [
        ("../../v1/me", 0),
        (JOB_ID.upper(), 0),
        (JOB_ID + "?wait=1", 0),
        (JOB_ID, -1),
        (JOB_ID, 31),
        (JOB_ID, 1.5),
        (JOB_ID, True),
    ],
)
@twisted_test
async def test_job_ids_and_waits_are_checked_before_any_request(
    servers: Servers, job_id: str, wait: Any
) -> None:
    """A job id that is not a uuid4, or a wait outside 0..30 whole seconds, is refused."""
    relay, api, _port = await http_relay(servers)
    with pytest.raises(ValueError):
        await api.get_job(job_id, wait)
    if wait == 0:
        with pytest.raises(ValueError):
            await api.cancel_job(job_id)
    assert relay.seen == []


@twisted_test
async def test_a_long_poll_is_not_cut_off_by_the_http_timeout(servers: Servers) -> None:
    """With wait=30 the relay may stay silent 30 s: the timeout is the usual one after that."""
    relay, _api, port = await http_relay(servers)
    relay.hang = True
    clock = Clock()
    api = RelayApi(reactor, RelayUrl.parse(f"http://127.0.0.1:{port}"), CREDS, clock=clock)
    pending = api.get_job(JOB_ID, 30)
    await relay.arrived
    clock.advance(30)
    assert not pending.called
    clock.advance(limits.HTTP_TIMEOUT_S - 0.5)
    assert not pending.called
    clock.advance(0.5)
    with pytest.raises(RelayUnreachable, match=r"within 40 s"):
        await pending
