"""The relay's HTTP API through a real Site on memory transports: every route, the refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from twisted.internet.error import ConnectionDone
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.errors import StoreError
from agentcall.relay.store_interface import RelayStore
from agentcall.wire import codec
from agentcall.wire.http import KeysResponse, MemberRole
from tests.unit.crypto_helpers import NOW, make_party, rotate
from tests.unit.relay_helpers import (
    ORIGIN,
    HeldStore,
    MemoryRelay,
    fired,
    memory_relay,
    parse_answer,
    raw_request,
)

INVITE_ID = "ab" * 32


@pytest.fixture
def relay(tmp_path: Path) -> MemoryRelay:
    return memory_relay(tmp_path, now=NOW)


def test_status_needs_no_credentials(relay: MemoryRelay) -> None:
    answer = relay.request("GET", "/v1/status")
    assert answer.status == 200
    assert answer.json() == {"ok": True, "relay_origin": ORIGIN, "version": None}
    assert answer.headers["cache-control"] == "no-store"


def test_register_hands_out_a_token_that_then_authenticates(relay: MemoryRelay) -> None:
    secret, _ = fired(
        relay.store.create_invite(
            "acme",
            created_by=None,
            role=MemberRole.MEMBER,
            expires_in_days=7,
            description=None,
            now=NOW,
        )
    )
    body = json.dumps({"org": "acme", "invite": secret, "handle": "ann"}).encode()
    answer = relay.request("POST", "/v1/register", body=body)
    assert answer.status == 200
    registered = answer.json()
    assert (registered["address"], registered["role"]) == ("@acme/ann", "member")
    me = relay.request("GET", "/v1/me", token=registered["token"], handle="ann")
    assert me.status == 200 and me.json()["address"] == "@acme/ann"
    # The invite was used up.
    again = relay.request("POST", "/v1/register", body=body.replace(b'"ann"', b'"bob"'))
    assert again.status >= 400


def test_missing_or_wrong_credentials_are_401(relay: MemoryRelay) -> None:
    relay.enrol("ann")
    assert relay.request("GET", "/v1/me").status == 401
    wrong = relay.request("GET", "/v1/me", token="x" * 43, handle="ann")
    assert (wrong.status, wrong.json()["error"]) == (401, "unauthorized")


def test_publish_identity_then_encryption_then_fetch_them(relay: MemoryRelay) -> None:
    ann, bob = relay.enrol("ann"), relay.enrol("bob")
    party = make_party("@acme/ann")
    early = relay.request(
        "PUT", "/v1/keys/encryption", body=codec.encode(party.encryption), token=ann, handle="ann"
    )
    assert (early.status, early.json()["error"]) == (409, "identity_key_missing")
    put = relay.request(
        "PUT", "/v1/keys/identity", body=codec.encode(party.identity), token=ann, handle="ann"
    )
    assert put.status == 200
    put = relay.request(
        "PUT", "/v1/keys/encryption", body=codec.encode(party.encryption), token=ann, handle="ann"
    )
    assert put.status == 200
    fetched = relay.request("GET", "/v1/keys/ann", token=bob, handle="bob")
    assert fetched.status == 200
    assert codec.decode(fetched.body, KeysResponse) == KeysResponse(
        identity=party.identity, encryption=party.encryption
    )
    # The same epoch again does not chain to the one published.
    replay = relay.request(
        "PUT", "/v1/keys/encryption", body=codec.encode(party.encryption), token=ann, handle="ann"
    )
    assert (replay.status, replay.json()["error"]) == (400, "signature_invalid")
    nxt = rotate(party)
    put = relay.request(
        "PUT", "/v1/keys/encryption", body=codec.encode(nxt.encryption), token=ann, handle="ann"
    )
    assert put.status == 200


def test_a_record_for_someone_else_or_another_relay_is_refused(relay: MemoryRelay) -> None:
    ann = relay.enrol("ann")
    for party in (make_party("@acme/bob"), make_party("@acme/ann", origin="other.example")):
        answer = relay.request(
            "PUT", "/v1/keys/identity", body=codec.encode(party.identity), token=ann, handle="ann"
        )
        assert (answer.status, answer.json()["error"]) == (400, "record_invalid")
    assert fired(relay.store.fetch_keys("acme", "ann")) is None


def test_keys_of_a_handle_that_published_none_are_404(relay: MemoryRelay) -> None:
    ann = relay.enrol("ann")
    for handle in ("nobody", "identity"):
        answer = relay.request("GET", f"/v1/keys/{handle}", token=ann, handle="ann")
        assert (answer.status, answer.json()["error"]) == (404, "not_found")


def test_a_malformed_body_is_400(relay: MemoryRelay) -> None:
    ann = relay.enrol("ann")
    answer = relay.request("PUT", "/v1/keys/identity", body=b"{", token=ann, handle="ann")
    assert (answer.status, answer.json()["error"]) == (400, "bad_request")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/invites", b"{}"),
        ("GET", "/v1/invites", None),
        ("POST", f"/v1/invites/{INVITE_ID}/revoke", None),
    ],
)
def test_invite_routes_are_refused_to_a_member(
    relay: MemoryRelay, method: str, path: str, body: bytes | None
) -> None:
    ann = relay.enrol("ann")
    answer = relay.request(method, path, body=body, token=ann, handle="ann")
    assert (answer.status, answer.json()["error"]) == (403, "forbidden")


def test_an_admin_creates_lists_and_revokes_invites(relay: MemoryRelay) -> None:
    ada = relay.enrol("ada", MemberRole.ADMIN)
    created = relay.request(
        "POST", "/v1/invites", body=b'{"role": "member"}', token=ada, handle="ada"
    )
    assert created.status == 200
    invite = created.json()
    assert invite["invite"].startswith(f"https://{ORIGIN}/invite/acme#")
    listed = relay.request("GET", "/v1/invites", token=ada, handle="ada")
    assert invite["info"]["id"] in [row["id"] for row in listed.json()["invites"]]
    revoked = relay.request(
        "POST", f"/v1/invites/{invite['info']['id']}/revoke", token=ada, handle="ada"
    )
    assert (revoked.status, revoked.json()["status"]) == (200, "revoked")


def test_presence_is_of_oneself_only(relay: MemoryRelay) -> None:
    ann = relay.enrol("ann")
    answer = relay.request("GET", "/v1/presence", token=ann, handle="ann")
    assert answer.json() == {"address": "@acme/ann", "online": False}


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/nothing-here", 404),
        ("POST", "/v1/keys/ann", 404),
        ("GET", f"/v1/invites/{INVITE_ID}/revoke", 404),
        ("DELETE", "/v1/me", 405),
        ("PUT", "/v1/status", 405),
        ("GET", "/v1/register", 405),
        ("DELETE", "/v1/keys/identity", 405),
    ],
)
def test_unknown_routes_are_404_and_wrong_methods_405_before_credentials(
    relay: MemoryRelay, method: str, path: str, status: int
) -> None:
    answer = relay.request(method, path)
    assert answer.status == status
    assert answer.json()["error"] == ("not_found" if status == 404 else "method_not_allowed")


def test_a_body_over_the_cap_is_413_before_anything_else(relay: MemoryRelay) -> None:
    body = b" " * (limits.MAX_HTTP_BODY_BYTES + 1)
    answer = relay.request("PUT", "/v1/keys/identity", body=body)
    assert (answer.status, answer.json()["error"]) == (413, "body_too_large")


# --- a store that answers later ------------------------------------------------------------


def held_relay(tmp_path: Path, *names: str) -> tuple[MemoryRelay, HeldStore]:
    """A relay whose store holds the named methods until the test releases them."""
    made: list[HeldStore] = []

    def wrap(store: RelayStore) -> RelayStore:
        made.append(HeldStore(store, *names))
        return cast(RelayStore, made[0])

    relay = memory_relay(tmp_path, now=NOW, wrap=wrap)
    return relay, made[0]


def register_body(relay: MemoryRelay, *, wrong: bool = False) -> bytes:
    secret, _ = fired(
        relay.store.create_invite(
            "acme",
            created_by=None,
            role=MemberRole.MEMBER,
            expires_in_days=7,
            description=None,
            now=NOW,
        )
    )
    if wrong:
        secret = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    return json.dumps({"org": "acme", "invite": secret, "handle": "ann"}).encode()


def test_the_answer_waits_for_the_store(tmp_path: Path) -> None:
    """Nothing is written while the store has not answered; then the usual body is."""
    relay, held = held_relay(tmp_path, "register")
    protocol, transport = relay.connect()
    protocol.dataReceived(raw_request("POST", "/v1/register", body=register_body(relay)))
    assert transport.value() == b"" and len(held.pending) == 1
    held.release()
    answer = parse_answer(transport.value())
    assert answer.status == 200 and answer.json()["address"] == "@acme/ann"
    assert answer.headers["content-length"] == str(len(answer.body))


def test_a_refusal_from_a_late_store_is_the_same_json_error(tmp_path: Path) -> None:
    """An ApiError arriving as a failed Deferred renders exactly like one raised at once."""
    relay, held = held_relay(tmp_path, "register")
    protocol, transport = relay.connect()
    body = register_body(relay, wrong=True)
    protocol.dataReceived(raw_request("POST", "/v1/register", body=body))
    held.release()
    late = parse_answer(transport.value())
    (tmp_path / "b").mkdir()
    at_once = memory_relay(tmp_path / "b", now=NOW)
    direct = at_once.request("POST", "/v1/register", body=register_body(at_once, wrong=True))
    assert (late.status, late.json()) == (direct.status, direct.json())
    assert late.json() == {"error": "invite_unknown", "message": "no such invite"}


def test_a_failing_store_is_a_json_500(tmp_path: Path) -> None:
    """A database failure becomes the API's internal error body, not a traceback."""
    relay, held = held_relay(tmp_path, "authenticate")
    protocol, transport = relay.connect()
    protocol.dataReceived(raw_request("GET", "/v1/me", token="t" * 43, handle="ann"))
    with capturedLogs() as captured:
        held.fail(StoreError("database error: disk I/O error"))
    answer = parse_answer(transport.value())
    assert answer.status == 500
    assert answer.json() == {"error": "internal", "message": "internal error"}
    assert [e.get("event") for e in captured if e.get("event") == "api_internal_error"]


def test_a_client_gone_before_the_store_answered_is_harmless(tmp_path: Path) -> None:
    """The answer to a client that disconnected is dropped and logged, never raised."""
    relay, held = held_relay(tmp_path, "register")
    protocol, transport = relay.connect()
    protocol.dataReceived(raw_request("POST", "/v1/register", body=register_body(relay)))
    protocol.connectionLost(Failure(ConnectionDone()))
    with capturedLogs() as captured:
        held.release()
    assert transport.value() == b""
    events = [e.get("event") for e in captured]
    assert "api_client_gone" in events and "api_write_failed" not in events
    # The store did its work: the member exists although nobody heard the answer.
    assert fired(relay.store.get_member("acme", "ann")) is not None


def test_the_probes_answer_without_credentials(relay: MemoryRelay) -> None:
    for path in ("/healthz", "/readyz"):
        answer = relay.request("GET", path)
        assert (answer.status, answer.json()) == (200, {"ok": True})
        assert answer.headers["cache-control"] == "no-store"
    assert relay.request("POST", "/healthz").status == 405
    assert relay.request("GET", "/healthz/x").status == 404


def test_readyz_is_503_while_the_database_does_not_answer(tmp_path: Path) -> None:
    wrapped: list[HeldStore] = []

    def hold_ping(store: Any) -> RelayStore:
        wrapped.append(HeldStore(store, "ping"))
        return cast(RelayStore, wrapped[-1])

    held = memory_relay(tmp_path, now=NOW, wrap=hold_ping)
    [store] = wrapped
    protocol, transport = held.connect()
    protocol.dataReceived(raw_request("GET", "/readyz"))
    assert transport.value() == b""  # waiting for the database
    store.fail(StoreError("database is locked"))
    answer = parse_answer(transport.value())
    assert answer.status == 503
    assert json.loads(answer.body) == {"ok": False, "problem": "database_unavailable"}
    # The probe is never answered with the database's own words.
    assert b"locked" not in transport.value()
