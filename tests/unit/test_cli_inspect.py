"""`agentcall inspect ADDRESS` against a fake relay API: pin states, the card checked against
the pin, the contact note, presence, the command that would change trust, and that inspecting
never pins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer

from agentcall.caller.inspection import PinView
from agentcall.cli import call as call_cli
from agentcall.cli.main import main
from agentcall.client.api import RelayUnreachable
from agentcall.crypto.card import make_card
from agentcall.crypto.keys import IdentityKey
from agentcall.crypto.pins import PinBook
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.local.contacts import ContactBook
from agentcall.local.home import Home
from agentcall.local.keystore import LocalKeys
from agentcall.local.statedb import StateDb
from agentcall.wire.http import (
    AgentKind,
    CardTask,
    KeysResponse,
    PresenceResponse,
    SignedCardRecord,
)
from tests.unit.cli_helpers import NOW, ORIGIN, install, isolate, run_with_clock
from tests.unit.crypto_helpers import Party, make_party

REVIEW = CardTask(id="review", name="Code review", summary="Review a diff")


def card_for(key: IdentityKey, address: str, *, at: int = int(NOW)) -> SignedCardRecord:
    return make_card(key, ORIGIN, address, issued_at=at, agent_kind=AgentKind.CODEX, tasks=[REVIEW])


@attrs.define
class FakeApi:
    keys: dict[str, KeysResponse] = attrs.field(factory=dict)
    cards: dict[str, SignedCardRecord] = attrs.field(factory=dict)
    online: bool = True
    asked: list[tuple[str, str]] = attrs.field(factory=list)
    failure: Exception | None = None

    def _found(self, route: str, handle: str, table: dict[str, Any]) -> defer.Deferred[Any]:
        self.asked.append((route, handle))
        if self.failure is not None:
            return defer.fail(self.failure)
        if handle not in table:
            return defer.fail(ApiError(404, ApiErrorCode.NOT_FOUND, "none"))
        return defer.succeed(table[handle])

    def get_keys(self, handle: str) -> defer.Deferred[KeysResponse]:
        return self._found("keys", handle, self.keys)

    def get_card(self, handle: str) -> defer.Deferred[SignedCardRecord]:
        return self._found("card", handle, self.cards)

    def presence(self) -> defer.Deferred[PresenceResponse]:
        self.asked.append(("presence", ""))
        return defer.succeed(PresenceResponse(address="@acme/ann", online=self.online))


@attrs.define
class World:
    home: Home
    keys: LocalKeys
    api: FakeApi
    ken: Party

    def pin_ken(self, party: Party | None = None) -> None:
        party = party or self.ken
        db = StateDb.open(self.home)
        try:
            PinBook(db.pins).check_and_pin(party.address, party.identity, party.encryption, NOW)
        finally:
            db.close()

    def pinned(self) -> str | None:
        db = StateDb.open(self.home)
        try:
            pin = db.pins.get(ORIGIN, "@acme/ken")
        finally:
            db.close()
        return None if pin is None else pin.identity_pub


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> World:
    home, _config, keys = install(isolate(monkeypatch, tmp_path))  # @acme/ann
    ken = make_party("@acme/ken")
    api = FakeApi(keys={"ken": KeysResponse(ken.identity, ken.encryption)})
    api.keys["ann"] = KeysResponse(keys.identity_record, keys.current_record)
    api.cards["ken"] = card_for(ken.identity_key, ken.address)
    monkeypatch.setattr(call_cli, "relay_api", lambda _reactor, _config: api)
    monkeypatch.setattr(call_cli, "run_on_reactor", run_with_clock)
    return World(home, keys, api, ken)


def inspect(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def as_json(capsys: pytest.CaptureFixture[str], target: str) -> dict[str, Any]:
    code, out, err = inspect(capsys, target, "--json")
    assert code == 0, err
    body: dict[str, Any] = json.loads(out)
    return body


def test_an_unseen_identity_shows_its_card_as_unpinned_and_is_not_pinned(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    body = as_json(capsys, "@acme/ken")
    assert body["pin"] == "unseen" and body["pinned_fingerprint"] is None
    assert body["fingerprint"] is not None
    assert body["card_state"] == "unpinned"
    assert body["card"]["tasks"] == [
        {"id": "review", "name": "Code review", "summary": "Review a diff"}
    ]
    assert body["presence"] == "undisclosed"
    assert body["next"] == 'agentcall call @acme/ken "hello"'
    assert world.pinned() is None  # inspecting pins nothing
    # Presence of someone else is never even asked for.
    assert ("presence", "") not in world.api.asked
    code, out, _err = inspect(capsys, "@acme/ken")
    assert code == 0
    assert "identity: unseen" in out and "not pinned yet" in out
    assert "  review — Code review" in out
    assert "presence: undisclosed (presence is private" in out
    assert 'to change trust: agentcall call @acme/ken "hello"' in out


def test_a_pinned_identity_gets_a_verified_card_and_no_command(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.pin_ken()
    body = as_json(capsys, "ken")  # a handle in the own organisation
    assert (body["pin"], body["card_state"], body["next"]) == ("pinned", "verified", None)
    assert body["fingerprint"] == body["pinned_fingerprint"]
    assert "card: verified against your pin" in inspect(capsys, "ken")[1]


def test_a_changed_identity_refuses_the_card_and_names_the_reset(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.pin_ken()
    before = world.pinned()
    newcomer = make_party("@acme/ken")
    world.api.keys["ken"] = KeysResponse(newcomer.identity, newcomer.encryption)
    world.api.cards["ken"] = card_for(newcomer.identity_key, newcomer.address)
    body = as_json(capsys, "@acme/ken")
    assert body["pin"] == "changed" and body["fingerprint"] != body["pinned_fingerprint"]
    assert body["card_state"] == "refused" and body["card"] is None
    assert body["next"] == "agentcall trust --reset @acme/ken"
    assert world.pinned() == before  # not replaced
    out = inspect(capsys, "@acme/ken")[1]
    assert "CHANGED" in out and "review" not in out
    assert "to change trust: agentcall trust --reset @acme/ken" in out


def test_a_card_that_does_not_verify_is_never_shown(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pinned or not, a card signed by another key, or dated for another address, is refused."""
    forged = card_for(IdentityKey.generate(), "@acme/ken")
    world.api.cards["ken"] = forged
    body = as_json(capsys, "@acme/ken")
    assert (body["card_state"], body["card"]) == ("refused", None)
    assert "another identity key" in body["card_problem"]
    world.pin_ken()
    world.api.cards["ken"] = card_for(world.ken.identity_key, "@acme/ann")
    body = as_json(capsys, "@acme/ken")
    assert (body["card_state"], body["card"]) == ("refused", None)
    assert "Code review" not in inspect(capsys, "@acme/ken")[1]


def test_own_address_shows_presence_and_checks_against_the_own_key(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.api.cards["ann"] = card_for(world.keys.identity, "@acme/ann")
    body = as_json(capsys, "@acme/ann")
    assert (body["pin"], body["card_state"], body["presence"]) == ("own", "verified", "online")
    world.api.online = False
    assert as_json(capsys, "@acme/ann")["presence"] == "offline"


def test_a_contact_name_resolves_and_its_note_shows(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    ContactBook(world.home).add("kenny", "@acme/ken", "builds the parser")
    body = as_json(capsys, "kenny")
    assert body["address"] == "@acme/ken"
    assert (body["contact"], body["note"]) == ("kenny", "builds the parser")
    # Inspected by address, the contact is found by its address.
    assert as_json(capsys, "@acme/ken")["note"] == "builds the parser"


def test_no_published_keys_or_card(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    body = as_json(capsys, "@acme/zed")
    assert (body["pin"], body["fingerprint"], body["card_state"]) == ("unseen", None, "none")
    assert "no published keys" in body["keys_problem"] and body["next"] is None


def test_an_unreachable_relay_is_one_line_and_another_org_is_refused(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.api.failure = RelayUnreachable("no answer from relay.example within 10 s")
    code, out, err = inspect(capsys, "@acme/ken")
    assert (code, out) == (1, "") and "cannot inspect @acme/ken" in err
    assert len(err.strip().splitlines()) == 1
    world.api.failure = None
    code, _out, err = inspect(capsys, "@beta/ken")
    assert code == 1 and err


def test_the_pin_states_are_the_documented_ones() -> None:
    assert {str(view) for view in PinView} == {"unseen", "pinned", "changed", "recovered", "own"}


def test_a_recovered_identity_is_named_and_its_card_verified_and_no_pin_moves(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ken issued a recovery code, then recovered on a new machine: ann's pin of the old key
    vouches for the new one through the chain, so inspect says recovered (with the date),
    verifies the new card against the new key, and leaves the pin where it was. A stranger
    with the same links but another key is still a changed identity."""
    from tests.unit.test_crypto_recovery import recover, with_code

    old, recovery_key = with_code(world.ken)
    world.pin_ken(old)
    new, link = recover(old, recovery_key, at=int(NOW) + 3600)
    world.api.keys["ken"] = KeysResponse(new.identity, new.encryption, recovered=(link,))
    world.api.cards["ken"] = card_for(new.identity_key, new.address, at=int(NOW) + 4000)
    body = as_json(capsys, "@acme/ken")
    assert (body["pin"], body["card_state"]) == ("recovered", "verified")
    assert body["recovered_at"] == int(NOW) + 3600
    assert body["next"] == 'agentcall call @acme/ken "hello"'
    assert world.pinned() == old.identity_pub
    out = inspect(capsys, "@acme/ken")[1]
    assert "@acme/ken recovered their identity on" in out and "Code review" in out
    stranger = make_party("@acme/ken")
    world.api.keys["ken"] = KeysResponse(stranger.identity, stranger.encryption, recovered=(link,))
    world.api.cards["ken"] = card_for(stranger.identity_key, stranger.address, at=int(NOW) + 5000)
    body = as_json(capsys, "@acme/ken")
    assert (body["pin"], body["card_state"], body["card"]) == ("changed", "refused", None)


def test_an_older_card_after_a_newer_one_was_verified_is_a_replay(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A relay that serves an older (genuinely signed) card after ann saw a newer one verified
    is caught; an unpinned card's date is not remembered."""
    old = card_for(world.ken.identity_key, world.ken.address, at=int(NOW) - 600)
    new = card_for(world.ken.identity_key, world.ken.address, at=int(NOW))
    world.api.cards["ken"] = new
    assert as_json(capsys, "@acme/ken")["card_state"] == "unpinned"
    world.api.cards["ken"] = old
    assert as_json(capsys, "@acme/ken")["card_state"] == "unpinned"  # nothing remembered yet
    world.pin_ken()
    world.api.cards["ken"] = new
    assert as_json(capsys, "@acme/ken")["card_state"] == "verified"
    world.api.cards["ken"] = old
    replayed = as_json(capsys, "@acme/ken")
    assert (replayed["card_state"], replayed["card"]) == ("refused", None)
    assert "older than one already seen" in replayed["card_problem"]
    assert world.pinned() == world.ken.identity_pub  # and still no pin was touched
