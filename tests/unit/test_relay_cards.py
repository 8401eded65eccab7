"""Cards on the relay: PUT /v1/card and GET /v1/cards/<handle> through the whole composed relay
on memory transports, the store's newest-only rule and audit row, and withdrawal on removal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentcall.crypto.card import make_card
from agentcall.crypto.keys import IdentityKey
from agentcall.relay import audit
from agentcall.wire import codec
from agentcall.wire.http import AgentKind, CardTask, MemberRole, SignedCardRecord
from tests.unit.crypto_helpers import NOW, Party, make_party
from tests.unit.relay_helpers import ORIGIN, MemoryRelay, fired, memory_relay

ASK = CardTask(id="ask", name="Ask a question", summary="Ask; it reads.")


@pytest.fixture
def relay(tmp_path: Path) -> MemoryRelay:
    return memory_relay(tmp_path, now=NOW)


def card_of(
    party: Party, *, at: int = NOW, key: IdentityKey | None = None, **changes: Any
) -> SignedCardRecord:
    made = make_card(
        key or party.identity_key,
        ORIGIN,
        party.address,
        issued_at=at,
        agent_kind=AgentKind.CLAUDE,
        tasks=[ASK],
    )
    if not changes:
        return made
    return attrs.evolve(made, record=attrs.evolve(made.record, **changes))


def published(relay: MemoryRelay, handle: str) -> tuple[str, Party]:
    token = relay.enrol(handle)
    party = make_party(f"@acme/{handle}")
    put = relay.request(
        "PUT", "/v1/keys/identity", body=codec.encode(party.identity), token=token, handle=handle
    )
    assert put.status == 200
    return token, party


def put(relay: MemoryRelay, token: str, handle: str, card: SignedCardRecord) -> tuple[int, str]:
    answer = relay.request("PUT", "/v1/card", body=codec.encode(card), token=token, handle=handle)
    return answer.status, answer.json().get("error", "")


def test_a_member_publishes_a_card_and_a_coworker_fetches_it(relay: MemoryRelay) -> None:
    ken_token, ken = published(relay, "ken")
    ann_token = relay.enrol("ann")
    card = card_of(ken)
    assert put(relay, ken_token, "ken", card) == (200, "")
    fetched = relay.request("GET", "/v1/cards/ken", token=ann_token, handle="ann")
    assert fetched.status == 200
    assert codec.decode(fetched.body, SignedCardRecord) == card
    # Ann has none yet; nobody unauthenticated gets one.
    none = relay.request("GET", "/v1/cards/ann", token=ken_token, handle="ken")
    assert (none.status, none.json()["error"]) == (404, "not_found")
    assert relay.request("GET", "/v1/cards/ken").status == 401
    rows = [r for r in fired(relay.store.audit_rows("acme")) if r.event == audit.CARD_PUBLISH]
    assert [(r.actor, r.detail) for r in rows] == [("ken", "tasks=1")]


def test_a_card_that_is_not_the_members_own_is_refused(relay: MemoryRelay) -> None:
    ken_token, ken = published(relay, "ken")
    _ann_token, ann = published(relay, "ann")
    cases = [
        (card_of(ken, key=IdentityKey.generate()), (400, "signature_invalid")),  # forged
        (card_of(ann), (400, "record_invalid")),  # names ann
        (card_of(ken, relay_origin="other.example"), (400, "record_invalid")),
        (card_of(ken, identity_pub=ann.identity_pub), (400, "signature_invalid")),
        (card_of(ken, at=NOW + 3600), (400, "record_invalid")),  # dated in the future
    ]
    for card, refusal in cases:
        assert put(relay, ken_token, "ken", card) == refusal
    nobody = relay.request("GET", "/v1/cards/ken", token=ken_token, handle="ken")
    assert nobody.status == 404


def test_a_card_before_the_identity_key_is_refused(relay: MemoryRelay) -> None:
    token = relay.enrol("ken")
    assert put(relay, token, "ken", card_of(make_party("@acme/ken"))) == (
        409,
        "identity_key_missing",
    )


def test_only_the_newest_card_is_kept_and_an_older_one_is_refused(relay: MemoryRelay) -> None:
    token, ken = published(relay, "ken")
    first, second = card_of(ken, at=NOW - 60), card_of(ken, at=NOW - 30)
    assert put(relay, token, "ken", first) == (200, "")
    assert put(relay, token, "ken", second) == (200, "")
    # The very same card again is a no-op (no second audit row); an older one is a replay.
    assert put(relay, token, "ken", second) == (200, "")
    assert put(relay, token, "ken", first) == (409, "card_not_newer")
    assert put(relay, token, "ken", card_of(ken, at=NOW - 30, omitted=1)) == (
        400,
        "signature_invalid",
    )
    same_second = make_card(
        ken.identity_key,
        ORIGIN,
        ken.address,
        issued_at=NOW - 30,
        agent_kind=AgentKind.CODEX,
        tasks=[],
    )
    assert put(relay, token, "ken", same_second) == (409, "card_not_newer")
    kept = fired(relay.store.fetch_card("acme", "ken"))
    assert kept == second
    rows = [r for r in fired(relay.store.audit_rows("acme")) if r.event == audit.CARD_PUBLISH]
    assert len(rows) == 2


def test_removing_a_member_withdraws_their_card(relay: MemoryRelay) -> None:
    admin = relay.enrol("ada", MemberRole.ADMIN)
    token, ken = published(relay, "ken")
    assert put(relay, token, "ken", card_of(ken)) == (200, "")
    removed = relay.request(
        "POST",
        "/v1/members/ken/remove",
        body=json.dumps({"release": False}).encode(),
        token=admin,
        handle="ada",
    )
    assert removed.status == 200
    gone = relay.request("GET", "/v1/cards/ken", token=admin, handle="ada")
    assert (gone.status, gone.json()["error"]) == (404, "not_found")
    assert fired(relay.store.fetch_card("acme", "ken")) is None


def test_a_recovery_drops_the_old_keys_card_and_the_new_key_publishes_its_own(
    relay: MemoryRelay,
) -> None:
    """The card was signed by the identity a recovery replaces: it goes with it, and a card of
    the new identity is accepted (the old one would not be)."""
    from tests.unit.test_crypto_recovery import recover, with_code

    token, ken = published(relay, "ken")
    old, recovery_key = with_code(ken)
    fired(relay.store.publish_identity("acme", "ken", old.identity, NOW))  # names the key
    assert put(relay, token, "ken", card_of(ken)) == (200, "")
    new, link = recover(old, recovery_key)
    new_token = fired(
        relay.store.recover("acme", "ken", link.previous, link.statement, new.identity, NOW)
    )
    assert fired(relay.store.fetch_card("acme", "ken")) is None
    assert put(relay, new_token, "ken", card_of(ken, at=NOW + 1)) == (400, "signature_invalid")
    assert put(relay, new_token, "ken", card_of(new, at=NOW + 1)) == (200, "")
