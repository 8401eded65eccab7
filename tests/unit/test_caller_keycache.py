"""The callee key records a caller keeps: the reuse rule, the table, and place() using them.

The rule is a pure function of the kept records and ``now``; place() is driven on a Clock with
a fake key directory that counts what it was asked and a fake callee that can rotate.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer

from agentcall import limits
from agentcall.caller import keycache
from agentcall.caller.call import CallRefused, CallResult, place
from agentcall.client.api import Credentials
from agentcall.crypto import envelope
from agentcall.crypto.keys import fingerprint
from agentcall.crypto.pins import Pin
from agentcall.db import open_database
from agentcall.errors import CallErrorCode, StoreError
from agentcall.local.config import Config
from agentcall.local.home import Home
from agentcall.local.keystore import LocalKeys
from agentcall.local.statedb import STATE_SCHEMA, SqlitePinStorage, StateDb
from agentcall.relayurl import RelayUrl
from agentcall.wire import codec
from agentcall.wire.frames import CallError, CallOutcome, CallQueued, CallRequest, CallStatus
from agentcall.wire.keyrecords import KeysResponse
from agentcall.wire.payloads import Reply
from tests.unit.cli_helpers import NOW, ORIGIN, install, run_with_clock
from tests.unit.crypto_helpers import DAY, Party, make_party, rotate
from tests.unit.test_caller import CALL_ID, Callee, FakeDirectory
from tests.unit.test_db_engine import only_version

BOB = "@acme/bob"
HOUR = 3600.0
LEAD = limits.KEY_ROTATE_BEFORE_S


def records(party: Party) -> KeysResponse:
    return KeysResponse(identity=party.identity, encryption=party.encryption)


# --- the rule ----------------------------------------------------------------------------------

# Bob's record is valid from NOW - 1 day to NOW + 29 days; he may rotate from NOW + 22 days.
BOB_PARTY = make_party(BOB, origin=ORIGIN)
NOT_AFTER = float(BOB_PARTY.enc_record.not_after)


def kept(fetched_at: float = NOW, keys: KeysResponse | None = None) -> keycache.KeptKeys:
    return keycache.KeptKeys(BOB, keys or records(BOB_PARTY), fetched_at)


@pytest.mark.parametrize(
    ("case", "kept_keys", "now", "reuse"),
    [
        ("nothing kept", None, NOW, False),
        ("fresh", kept(), NOW + 60, True),
        ("a week on, long before the lead", kept(), NOW + 7 * DAY, True),
        ("just before the rotation lead", kept(), NOT_AFTER - LEAD - 1, True),
        ("inside the lead, fetched long ago", kept(), NOT_AFTER - LEAD, False),
        (
            "inside the lead, fetched 59 min ago",
            kept(NOT_AFTER - LEAD),
            NOT_AFTER - LEAD + 3540,
            True,
        ),
        (
            "inside the lead, fetched an hour ago",
            kept(NOT_AFTER - LEAD),
            NOT_AFTER - LEAD + HOUR,
            False,
        ),
        ("the last second of the window", kept(NOT_AFTER - 10), NOT_AFTER - 1, True),
        ("expired", kept(NOT_AFTER - 10), NOT_AFTER, False),
        ("not valid yet", kept(), float(BOB_PARTY.enc_record.not_before) - 1, False),
        ("fetched in the future (clock went back)", kept(NOT_AFTER - 60), NOT_AFTER - 120, False),
        (
            "no encryption record",
            kept(keys=KeysResponse(identity=BOB_PARTY.identity)),
            NOW,
            False,
        ),
    ],
)
def test_when_kept_records_are_reused(
    case: str, kept_keys: keycache.KeptKeys | None, now: float, reuse: bool
) -> None:
    decision = keycache.decide(kept_keys, now)
    assert isinstance(decision, keycache.Reuse) is reuse, decision
    if reuse:
        assert isinstance(decision, keycache.Reuse) and decision.kept == kept_keys


def test_the_rule_follows_the_limits() -> None:
    """A callee rotates in the last KEY_ROTATE_BEFORE_S of its epoch; the caller's reuse stops
    there, and inside it the caller asks at most once every KEY_CACHE_REFETCH_S."""
    assert limits.KEY_ROTATE_BEFORE_S == 7 * DAY
    assert limits.KEY_CACHE_REFETCH_S == HOUR
    assert isinstance(
        keycache.decide(kept(), NOT_AFTER - 2 * DAY, rotate_before_s=DAY), keycache.Reuse
    )
    assert isinstance(
        keycache.decide(kept(NOT_AFTER - LEAD), NOT_AFTER - LEAD + 120, refetch_s=60),
        keycache.Fetch,
    )


# --- the table ---------------------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Any:
    home = Home.from_environ({"HOME": str(tmp_path)})
    opened = StateDb.open(home)
    yield opened
    opened.close()


def test_kept_records_survive_reopening_per_relay(tmp_path: Path) -> None:
    home = Home.from_environ({"HOME": str(tmp_path)})
    db = StateDb.open(home)
    db.peer_keys(ORIGIN).keep(BOB, records(BOB_PARTY), NOW)
    db.close()
    db = StateDb.open(home)
    try:
        assert db.peer_keys(ORIGIN).get(BOB) == kept()
        assert db.peer_keys("other.example").get(BOB) is None
        assert db.peer_keys(ORIGIN).forget(BOB)
        assert db.peer_keys(ORIGIN).get(BOB) is None
    finally:
        db.close()


def test_newer_records_replace_the_kept_ones(db: StateDb) -> None:
    store = db.peer_keys(ORIGIN)
    store.keep(BOB, records(BOB_PARTY), NOW)
    newer = rotate(BOB_PARTY)
    store.keep(BOB, records(newer), NOW + 5)
    assert store.get(BOB) == kept(NOW + 5, records(newer))


def test_records_of_another_address_are_not_kept_under_this_one(db: StateDb) -> None:
    with pytest.raises(ValueError, match="another address"):
        db.peer_keys(ORIGIN).keep("@acme/eve", records(BOB_PARTY), NOW)


@pytest.mark.parametrize(
    "row",
    [
        (b"not json", NOW),
        (b'{"identity": 1}', NOW),
        ("text, not a blob", NOW),
        (b"{}", "yesterday"),
    ],
)
def test_a_damaged_row_is_no_record(db: StateDb, row: tuple[object, object]) -> None:
    db.connection.execute(
        "INSERT INTO peer_keys (relay_origin, address, records, fetched_at) VALUES (?, ?, ?, ?)",
        (ORIGIN, BOB, *row),
    )
    assert db.peer_keys(ORIGIN).get(BOB) is None


def test_a_row_naming_someone_else_is_no_record(db: StateDb) -> None:
    """Kept under bob's address, but the records are eve's: never used for bob."""
    eve = make_party("@acme/eve", origin=ORIGIN)
    db.connection.execute(
        "INSERT INTO peer_keys (relay_origin, address, records, fetched_at) VALUES (?, ?, ?, ?)",
        (ORIGIN, BOB, codec.encode(records(eve)), NOW),
    )
    assert db.peer_keys(ORIGIN).get(BOB) is None


def test_a_version_four_database_upgrades_and_keeps_its_rows(tmp_path: Path) -> None:
    """The previous release's state.sqlite keeps its pins and gains an empty peer_keys."""
    home = Home.from_environ({"HOME": str(tmp_path)})
    home.create_private(home.state_db_path)
    old = open_database(home.state_db_path, only_version(STATE_SCHEMA, 4, tmp_path / "v4"))
    pin = Pin(ORIGIN, BOB, BOB_PARTY.identity_pub, "SHA256:" + "0" * 32, int(NOW), 1)
    SqlitePinStorage(old.connection).put(pin)
    old.connection.close()
    db = StateDb.open(home)
    try:
        assert db.connection.execute("SELECT version FROM version").fetchone() == (6,)
        assert db.pins.get(ORIGIN, BOB) == pin
        assert db.peer_keys(ORIGIN).get(BOB) is None
        db.peer_keys(ORIGIN).keep(BOB, records(BOB_PARTY), NOW)
        assert db.peer_keys(ORIGIN).get(BOB) == kept()
    finally:
        db.close()


def test_a_closed_database_is_a_store_error(db: StateDb) -> None:
    store = db.peer_keys(ORIGIN)
    db.close()
    with pytest.raises(StoreError):
        store.get(BOB)


# --- place() with kept records -----------------------------------------------------------------


class CountingDirectory(FakeDirectory):
    """The relay's key routes, counting the fetches of other members' keys."""

    def __init__(self, served: dict[str, KeysResponse]) -> None:
        super().__init__(served)
        self.fetched: list[str] = []

    def get_keys(self, handle: str) -> defer.Deferred[KeysResponse]:
        if handle != "ann":  # ann's own, looked up when she publishes a rotation of hers
            self.fetched.append(handle)
        return super().get_keys(handle)


@attrs.define
class Bob:
    """Bob's listener: holds some of his epochs; a request sealed to another is refused as the
    relay reports a listener's call_rejected (call_error protocol_error with the call id)."""

    party: Party
    ann_keys: LocalKeys
    holds: set[int] = attrs.field(factory=lambda: {1})
    frames: list[CallRequest] = attrs.field(factory=list)

    def dial(
        self,
        reactor: Any,
        relay_url: RelayUrl,
        credentials: Credentials,
        handle: str,
        frame: CallRequest,
        **kw: Any,
    ) -> defer.Deferred[CallOutcome | CallError | CallQueued]:
        self.frames.append(frame)
        kw["on_status"](CallStatus(call_id=CALL_ID, state="ringing"))
        if (
            frame.envelope.epoch not in self.holds
            or frame.envelope.key_id != self.party.enc_record.key_id
        ):
            return defer.succeed(CallError(code=CallErrorCode.PROTOCOL_ERROR, call_id=CALL_ID))
        callee = Callee(
            self.party, self.ann_keys, lambda req: Reply(text=f"epoch {frame.envelope.epoch}")
        )
        return callee.dial(reactor, relay_url, credentials, handle, frame, **kw)


@pytest.fixture
def ann(tmp_path: Path) -> tuple[Home, Config, LocalKeys]:
    return install(tmp_path / "ann")


def place_at(
    ann: tuple[Home, Config, LocalKeys],
    directory: FakeDirectory,
    dial: Callable[..., defer.Deferred[CallOutcome | CallError | CallQueued]],
    now: float = NOW,
) -> CallResult:
    home, config, keys = ann

    async def work(reactor: Any) -> CallResult:
        return await place(
            reactor,
            home,
            config,
            keys,
            BOB,
            "hello",
            None,
            lambda _s: None,
            api=directory,
            dial=dial,
        )

    return run_with_clock(work, now=now)


def kept_in(ann: tuple[Home, Config, LocalKeys]) -> keycache.KeptKeys | None:
    db = StateDb.open(ann[0])
    try:
        return db.peer_keys(ORIGIN).get(BOB)
    finally:
        db.close()


def test_a_second_call_to_the_same_callee_fetches_nothing(ann: Any) -> None:
    bob = Bob(make_party(BOB, origin=ORIGIN), ann[2])
    directory = CountingDirectory({"bob": records(bob.party)})
    assert place_at(ann, directory, bob.dial).text == "epoch 1"
    assert directory.fetched == ["bob"]
    kept_keys = kept_in(ann)
    assert kept_keys is not None and kept_keys.keys == records(bob.party)
    assert place_at(ann, directory, bob.dial, NOW + 3 * DAY).text == "epoch 1"
    assert directory.fetched == ["bob"]


def test_inside_the_rotation_lead_the_caller_asks_at_most_hourly(ann: Any) -> None:
    bob = Bob(make_party(BOB, origin=ORIGIN), ann[2])
    directory = CountingDirectory({"bob": records(bob.party)})
    lead = NOT_AFTER - LEAD + 60
    place_at(ann, directory, bob.dial)
    place_at(ann, directory, bob.dial, lead)
    place_at(ann, directory, bob.dial, lead + 30 * 60)
    assert directory.fetched == ["bob", "bob"]
    place_at(ann, directory, bob.dial, lead + HOUR + 1)
    assert directory.fetched == ["bob", "bob", "bob"]


def test_a_rotated_callee_that_dropped_the_old_epoch_gets_the_call_resent_once(ann: Any) -> None:
    """Ann kept bob's epoch 1; bob rotated and holds only epoch 2 now. His listener refuses
    the first request; ann fetches, sees epoch 2, and sends a new request (new request id)."""
    old = make_party(BOB, origin=ORIGIN)
    bob = Bob(old, ann[2])
    directory = CountingDirectory({"bob": records(old)})
    place_at(ann, directory, bob.dial)
    newer = rotate(old)
    bob.party, bob.holds = newer, {2}
    directory.served["bob"] = records(newer)
    result = place_at(ann, directory, bob.dial, NOW + DAY)
    assert result.ok and result.text == "epoch 2"
    _first, second, third = bob.frames
    assert (second.envelope.epoch, third.envelope.epoch) == (1, 2)
    assert second.correlation_id != third.correlation_id
    refused, resent = (
        envelope.open_request(
            frame.envelope,
            my_key=party.enc_key,
            my_record=party.enc_record,
            relay_origin=ORIGIN,
            expected_from="@acme/ann",
            expected_to=BOB,
            sender_identity_pub=ann[2].identity.public_b64,
            now=NOW + DAY,
        )
        for frame, party in ((second, old), (third, newer))
    )
    assert refused.request_id != resent.request_id
    assert refused.message == resent.message == "hello"
    assert directory.fetched == ["bob", "bob"]
    kept_keys = kept_in(ann)
    assert kept_keys is not None and kept_keys.keys == records(newer)


def test_no_resend_when_the_relay_serves_the_same_records(ann: Any) -> None:
    """The callee refused for a reason of its own: the same records again would change
    nothing, so the refusal is the answer."""
    bob = Bob(make_party(BOB, origin=ORIGIN), ann[2])
    directory = CountingDirectory({"bob": records(bob.party)})
    place_at(ann, directory, bob.dial)
    bob.holds = set()
    result = place_at(ann, directory, bob.dial, NOW + DAY)
    assert result.code is CallErrorCode.PROTOCOL_ERROR
    assert len(bob.frames) == 2
    assert directory.fetched == ["bob", "bob"]


def test_the_resend_happens_once(ann: Any) -> None:
    old = make_party(BOB, origin=ORIGIN)
    bob = Bob(old, ann[2], holds=set())
    directory = CountingDirectory({"bob": records(old)})
    place_at(ann, directory, bob.dial)  # refused, with fetched records: no resend
    assert len(bob.frames) == 1
    directory.served["bob"] = records(rotate(old))
    result = place_at(ann, directory, bob.dial, NOW + DAY)
    assert result.code is CallErrorCode.PROTOCOL_ERROR
    assert len(bob.frames) == 3  # the kept epoch 1, then epoch 2 once, refused both times


def test_a_refusal_of_the_relays_own_is_not_resent(ann: Any) -> None:
    """A protocol_error before any call id exists is the relay's, not the callee's."""
    bob = Bob(make_party(BOB, origin=ORIGIN), ann[2])
    directory = CountingDirectory({"bob": records(bob.party)})
    place_at(ann, directory, bob.dial)
    frames: list[CallRequest] = []

    def relay_refuses(
        *args: Any, **_kw: Any
    ) -> defer.Deferred[CallOutcome | CallError | CallQueued]:
        frames.append(args[4])
        return defer.succeed(
            CallError(code=CallErrorCode.PROTOCOL_ERROR, detail="one call per connection")
        )

    directory.served["bob"] = records(rotate(bob.party))
    result = place_at(ann, directory, relay_refuses, NOW + DAY)
    assert result.code is CallErrorCode.PROTOCOL_ERROR
    assert len(frames) == 1 and directory.fetched == ["bob"]


def test_kept_records_that_no_longer_match_the_pin_are_a_hard_error(ann: Any) -> None:
    """Bob's pin now holds another identity (reset and re-pinned elsewhere, say): the kept
    records are refused identity_changed, exactly as fetched ones would be, and not dialled."""
    bob = Bob(make_party(BOB, origin=ORIGIN), ann[2])
    directory = CountingDirectory({"bob": records(bob.party)})
    place_at(ann, directory, bob.dial)
    db = StateDb.open(ann[0])
    pin = db.pins.get(ORIGIN, BOB)
    assert pin is not None
    other = make_party(BOB, origin=ORIGIN)
    db.pins.put(attrs.evolve(pin, identity_pub=other.identity_pub))
    db.close()
    with pytest.raises(CallRefused) as refused:
        place_at(ann, directory, bob.dial, NOW + 60)
    assert refused.value.code == "identity_changed"
    assert len(bob.frames) == 1 and directory.fetched == ["bob"]


@pytest.mark.parametrize(
    ("swapped", "rolled_back", "code"),
    [
        (True, True, "identity_changed"),
        (True, False, "identity_changed"),
        (False, True, "keys_rejected"),
    ],
    ids=["swapped and rolled back", "swapped", "rolled back"],
)
def test_a_relay_swapping_or_rolling_back_keys_is_refused_for_what_it_did(
    ann: Any, swapped: bool, rolled_back: bool, code: str
) -> None:
    """Bob is pinned at epoch 2. Another identity key is refused as the identity change, with
    both fingerprints, whatever its epoch; bob's own older epoch is refused as a rollback."""
    old = make_party(BOB, origin=ORIGIN)
    bob = Bob(rotate(old), ann[2], holds={2})
    directory = CountingDirectory({"bob": records(bob.party)})
    assert place_at(ann, directory, bob.dial).ok
    db = StateDb.open(ann[0])
    pinned = db.pins.get(ORIGIN, BOB)
    assert db.peer_keys(ORIGIN).forget(BOB)  # so this call asks the relay
    db.close()
    party = make_party(BOB, origin=ORIGIN) if swapped else old
    served = party if rolled_back else rotate(rotate(party))
    directory.served["bob"] = records(served)
    with pytest.raises(CallRefused) as refused:
        place_at(ann, directory, bob.dial, NOW + 60)
    assert refused.value.code == code
    assert pinned is not None
    if swapped:
        assert pinned.fingerprint in str(refused.value)
        assert fingerprint(served.identity.record) in str(refused.value)
    else:
        assert "below the highest seen (2)" in str(refused.value)
    assert len(bob.frames) == 1


def test_kept_records_below_the_pinned_epoch_are_fetched_afresh(ann: Any) -> None:
    """Bob called ann with his epoch 2 meanwhile (her listener raised the pin): the kept epoch
    1 would be a rollback now, so it is not used; the relay's epoch 2 is."""
    old = make_party(BOB, origin=ORIGIN)
    bob = Bob(old, ann[2])
    directory = CountingDirectory({"bob": records(old)})
    place_at(ann, directory, bob.dial)
    newer = rotate(old)
    db = StateDb.open(ann[0])
    pin = db.pins.get(ORIGIN, BOB)
    assert pin is not None
    db.pins.put(attrs.evolve(pin, highest_epoch=2))
    db.close()
    bob.party, bob.holds = newer, {2}
    directory.served["bob"] = records(newer)
    result = place_at(ann, directory, bob.dial, NOW + 60)
    assert result.ok and result.text == "epoch 2"
    assert [frame.envelope.epoch for frame in bob.frames] == [1, 2]
    assert directory.fetched == ["bob", "bob"]


def test_expired_kept_records_are_fetched_again(ann: Any) -> None:
    bob = Bob(make_party(BOB, origin=ORIGIN), ann[2])
    directory = CountingDirectory({"bob": records(bob.party)})
    place_at(ann, directory, bob.dial)
    renewed = rotate(
        bob.party, not_before=int(NOT_AFTER) - DAY, not_after=int(NOT_AFTER) + 29 * DAY
    )
    bob.party, bob.holds = renewed, {2}
    directory.served["bob"] = records(renewed)
    assert place_at(ann, directory, bob.dial, NOT_AFTER + 60).text == "epoch 2"
    assert directory.fetched == ["bob", "bob"]


def test_after_a_pin_reset_the_relays_current_records_are_pinned_not_the_kept_ones(
    ann: Any,
) -> None:
    """`agentcall trust --reset` promises that the next call pins what the relay serves then:
    kept records are never what a fresh pin is made from."""
    old = make_party(BOB, origin=ORIGIN)
    bob = Bob(old, ann[2])
    directory = CountingDirectory({"bob": records(old)})
    place_at(ann, directory, bob.dial)
    reinstalled = make_party(BOB, origin=ORIGIN)  # bob's new identity, checked out of band
    db = StateDb.open(ann[0])
    assert db.pins.remove(ORIGIN, BOB)
    db.close()
    bob.party = reinstalled
    directory.served["bob"] = records(reinstalled)
    assert place_at(ann, directory, bob.dial, NOW + 60).ok
    assert directory.fetched == ["bob", "bob"]
    db = StateDb.open(ann[0])
    pin = db.pins.get(ORIGIN, BOB)
    db.close()
    assert pin is not None and pin.identity_pub == reinstalled.identity_pub


def test_a_call_the_callee_took_is_never_sent_again(ann: Any) -> None:
    """A protocol_error after the callee answered (its outcome failed the relay's route check,
    say) may follow a run of its agent: resending could run it twice, so it is not resent,
    even though the relay now serves other records."""
    bob = Bob(make_party(BOB, origin=ORIGIN), ann[2])
    directory = CountingDirectory({"bob": records(bob.party)})
    place_at(ann, directory, bob.dial)
    frames: list[CallRequest] = []

    def taken_then_failed(
        *args: Any, **kw: Any
    ) -> defer.Deferred[CallOutcome | CallError | CallQueued]:
        frames.append(args[4])
        for state in ("ringing", "answered", "working"):
            kw["on_status"](CallStatus(call_id=CALL_ID, state=state))
        return defer.succeed(CallError(code=CallErrorCode.PROTOCOL_ERROR, call_id=CALL_ID))

    directory.served["bob"] = records(rotate(bob.party))
    result = place_at(ann, directory, taken_then_failed, NOW + DAY)
    assert result.code is CallErrorCode.PROTOCOL_ERROR
    assert len(frames) == 1 and directory.fetched == ["bob"]
