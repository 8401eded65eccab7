"""Recovery through the composed relay (memory transports, real SQLite): issuing a recovery key,
redeeming it once, and every refusal looking the same."""

from __future__ import annotations

import json
from typing import Any

from agentcall.crypto import recovery
from agentcall.crypto.keys import IdentityKey
from agentcall.relay import audit
from agentcall.wire import codec
from agentcall.wire.closecodes import CLOSE_RECOVERED
from agentcall.wire.http import KeysResponse, RecoverRequest
from tests.unit.crypto_helpers import NOW, ORIGIN, Party, make_party
from tests.unit.relay_helpers import fired
from tests.unit.test_relay_protocol import Switch, switch

__all__ = ["switch"]

KEN = "@acme/ken"


def publish(s: Switch, party: Party) -> None:
    token = s.tokens["ken"]
    for path, record in (
        ("/v1/keys/identity", party.identity),
        ("/v1/keys/encryption", party.encryption),
    ):
        answer = s.relay.request("PUT", path, body=codec.encode(record), token=token, handle="ken")
        assert answer.status == 200, answer.body


def issue(s: Switch, party: Party, issued_at: int) -> IdentityKey:
    key = IdentityKey.generate()
    record = recovery.with_recovery_key(
        party.identity_key, party.identity.record, key.public_b64, issued_at
    )
    answer = s.relay.request(
        "PUT", "/v1/keys/identity", body=codec.encode(record), token=s.tokens["ken"], handle="ken"
    )
    assert answer.status == 200, answer.body
    return key


def redeem(
    s: Switch, key: IdentityKey, new: Party, *, at: float = NOW
) -> tuple[int, dict[str, Any]]:
    statement = recovery.make_statement(key, ORIGIN, KEN, new.identity_pub, int(at))
    body = RecoverRequest(org="acme", handle="ken", identity=new.identity, statement=statement)
    answer = s.relay.request("POST", "/v1/recover", body=codec.encode(body), host="10.0.0.9")
    return answer.status, answer.json()


def events(s: Switch, name: str) -> int:
    return sum(1 for row in fired(s.relay.store.audit_rows("acme", limit=500)) if row.event == name)


def test_a_recovery_key_is_published_by_re_signing_and_an_older_one_cannot_return(
    switch: Switch,
) -> None:
    ken = make_party(KEN)
    publish(switch, ken)
    issue(switch, ken, 100)
    issue(switch, ken, 200)  # a new code retires the first
    assert events(switch, audit.RECOVERY_ISSUE) == 2
    older = recovery.with_recovery_key(
        ken.identity_key, ken.identity.record, IdentityKey.generate().public_b64, 150
    )
    back = switch.relay.request(
        "PUT", "/v1/keys/identity", body=codec.encode(older), token=switch.tokens["ken"],
        handle="ken",
    )  # fmt: skip
    assert (back.status, back.json()["error"]) == (409, "identity_key_exists")
    other = make_party(KEN)  # another identity key altogether: never
    swap = switch.relay.request(
        "PUT", "/v1/keys/identity", body=codec.encode(other.identity), token=switch.tokens["ken"],
        handle="ken",
    )  # fmt: skip
    assert swap.status == 409


def test_a_code_moves_the_address_once_and_cuts_the_old_machine_off(switch: Switch) -> None:
    old = make_party(KEN)
    publish(switch, old)
    key = issue(switch, old, int(NOW))
    old_socket = switch.connect("role=listen", "ken")
    new = make_party(KEN)

    status, registered = redeem(switch, key, new)

    switch.flush()
    assert status == 200 and registered["address"] == KEN
    assert old_socket.close_code == CLOSE_RECOVERED
    assert (
        switch.relay.request("GET", "/v1/me", token=switch.tokens["ken"], handle="ken").status
        == 401
    )
    token = registered["token"]
    assert switch.relay.request("GET", "/v1/me", token=token, handle="ken").status == 200
    served = switch.relay.request("GET", "/v1/keys/ken", token=switch.tokens["ann"], handle="ann")
    keys = codec.decode(served.body, KeysResponse)
    assert keys.identity == new.identity and keys.encryption is None  # old epochs are gone
    [link] = keys.recovered
    assert link.previous.record.identity_pub == old.identity_pub
    assert recovery.walk(old.identity_pub, keys.identity, keys.recovered) == int(NOW)
    assert events(switch, audit.RECOVERY_REDEEM) == 1
    # The new identity publishes its first epoch afresh.
    put = switch.relay.request(
        "PUT", "/v1/keys/encryption", body=codec.encode(new.encryption), token=token, handle="ken"
    )
    assert put.status == 200
    # A used code is dead: the record now names no recovery key.
    again, refused = redeem(switch, key, make_party(KEN))
    assert (again, refused["error"]) == (403, "recovery_refused")


def test_every_bad_recovery_is_the_same_refusal(switch: Switch) -> None:
    old = make_party(KEN)
    publish(switch, old)
    new = make_party(KEN)
    # No recovery key published yet.
    assert redeem(switch, IdentityKey.generate(), new)[1]["error"] == "recovery_refused"
    key = issue(switch, old, int(NOW))
    answers = [
        redeem(switch, IdentityKey.generate(), new),  # a key the record does not name
        redeem(switch, key, new, at=NOW - 3600),  # a stale statement
    ]
    wrong_handle = RecoverRequest(
        org="acme",
        handle="nobody",
        identity=new.identity,
        statement=recovery.make_statement(key, ORIGIN, KEN, new.identity_pub, int(NOW)),
    )
    raw = switch.relay.request("POST", "/v1/recover", body=codec.encode(wrong_handle))
    answers.append((raw.status, raw.json()))
    assert [a for a in answers] == [
        (403, {"error": "recovery_refused", "message": "recovery refused"})
    ] * 3
    # Nothing changed: the old identity is still served, the old token still works.
    assert (
        switch.relay.request("GET", "/v1/me", token=switch.tokens["ken"], handle="ken").status
        == 200
    )
    body = json.loads(switch.relay.request("POST", "/v1/recover", body=b"{}").body)
    assert body["error"] == "bad_request"
