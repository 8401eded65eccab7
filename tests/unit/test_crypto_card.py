"""The signed card: its wire shape's bounds, its signature and what verifying it binds."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from agentcall import limits
from agentcall.crypto import card, transcripts
from agentcall.crypto.keys import IdentityKey
from agentcall.errors import CardInvalid, MalformedFrame
from agentcall.wire import canonical, codec
from agentcall.wire.http import AgentKind, CardRecord, CardTask, SignedCardRecord
from tests.unit.crypto_helpers import NOW, ORIGIN

KEN = "@acme/ken"
ASK = CardTask(id="ask", name="Ask a question", summary="Ask; it reads and changes nothing.")
REVIEW = CardTask(id="review", name="Code review", summary="Review a diff")


def signed(key: IdentityKey, **changes: object) -> SignedCardRecord:
    arguments: dict[str, object] = {
        "issued_at": NOW,
        "agent_kind": AgentKind.CLAUDE,
        "tasks": [REVIEW, ASK],
    }
    arguments.update(changes)
    return card.make_card(key, ORIGIN, KEN, **arguments)  # type: ignore[arg-type]


def check(made: SignedCardRecord, key: IdentityKey, **changes: object) -> None:
    arguments: dict[str, object] = {
        "address": KEN,
        "relay_origin": ORIGIN,
        "identity_pub": key.public_b64,
    }
    arguments.update(changes)
    card.verify_card(made, **arguments)  # type: ignore[arg-type]


def test_a_card_verifies_against_its_own_key_and_keeps_tasks_in_order() -> None:
    key = IdentityKey.generate()
    made = signed(key)
    check(made, key)
    assert [task.id for task in made.record.tasks] == ["ask", "review"]
    assert made.record.identity_pub == key.public_b64
    # Through the wire and back, it still verifies.
    check(codec.decode(codec.encode(made), SignedCardRecord), key)


def test_a_card_signed_by_another_key_is_forged() -> None:
    key, other = IdentityKey.generate(), IdentityKey.generate()
    forged = signed(other)
    with pytest.raises(CardInvalid, match="another identity key"):
        check(forged, key)
    # Claiming the trusted key in the record does not help: the signature is the other's.
    relabelled = attrs.evolve(
        forged, record=attrs.evolve(forged.record, identity_pub=key.public_b64)
    )
    with pytest.raises(CardInvalid, match="signature does not verify"):
        check(relabelled, key)


@pytest.mark.parametrize(
    "change",
    [
        {"tasks": (ASK,)},
        {"agent_kind": AgentKind.CODEX},
        {"issued_at": NOW + 1},
        {"omitted": 3},
        {"tasks": (ASK, attrs.evolve(REVIEW, summary="Review a diff and push it"))},
    ],
)
def test_any_change_to_a_signed_card_breaks_its_signature(change: dict[str, Any]) -> None:
    key = IdentityKey.generate()
    made = signed(key)
    tampered = attrs.evolve(made, record=attrs.evolve(made.record, **change))
    with pytest.raises(CardInvalid, match="signature does not verify"):
        check(tampered, key)


def test_a_card_for_another_address_or_relay_is_refused() -> None:
    key = IdentityKey.generate()
    made = signed(key)
    with pytest.raises(CardInvalid, match="another address"):
        check(made, key, address="@acme/ann")
    with pytest.raises(CardInvalid, match="another relay"):
        check(made, key, relay_origin="other.example")
    # Moving the card to another address breaks the signature too.
    moved = attrs.evolve(made, record=attrs.evolve(made.record, address="@acme/ann"))
    with pytest.raises(CardInvalid, match="signature"):
        check(moved, key, address="@acme/ann")


def test_an_older_card_than_one_seen_is_a_replay() -> None:
    key = IdentityKey.generate()
    old, new = signed(key, issued_at=NOW), signed(key, issued_at=NOW + 60)
    check(new, key, newer_than=NOW + 60)
    with pytest.raises(CardInvalid, match="older"):
        check(old, key, newer_than=NOW + 60)


def test_the_transcript_is_its_own_domain_and_counts_its_tasks() -> None:
    key = IdentityKey.generate()
    record = signed(key).record
    items = transcripts.card_transcript(record)
    assert items[0] == "agentcall/card/v1" and items[8] == 2
    # Moving a task's text between fields changes the bytes (every item is length-prefixed).
    swapped = attrs.evolve(
        record, tasks=(ASK, CardTask(id="review", name="Code review Review", summary="a diff"))
    )
    assert canonical.encode(transcripts.card_transcript(swapped)) != canonical.encode(items)


def _record(**changes: object) -> CardRecord:
    base: dict[str, object] = {
        "v": 1,
        "relay_origin": ORIGIN,
        "address": KEN,
        "identity_pub": "P" * 43,
        "issued_at": NOW,
        "agent_kind": AgentKind.CLAUDE,
        "tasks": (ASK,),
    }
    base.update(changes)
    return CardRecord(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"tasks": tuple(CardTask(id=f"t{n:02}", name="n", summary="s") for n in range(33))},
        {"tasks": (ASK, ASK)},
        {"tasks": (REVIEW, ASK)},
        {"agent_kind": None},
        {"v": 2},
        {"issued_at": -1},
        {"omitted": -1},
    ],
)
def test_records_out_of_bounds_are_refused(change: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _record(**change)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "n" * (limits.MAX_CARD_NAME_BYTES + 1)),
        ("name", "é" * (limits.MAX_CARD_NAME_BYTES // 2 + 1)),  # counted in UTF-8 bytes
        ("summary", "s" * (limits.MAX_CARD_SUMMARY_BYTES + 1)),
        ("summary", "two\nlines"),
        ("summary", "a \x1b[31mred\x1b[0m word"),
        ("name", "right\u202eto left"),
        ("name", ""),
        ("id", "Not A Task"),
    ],
)
def test_oversize_or_unsafe_task_fields_are_refused(field: str, value: str) -> None:
    with pytest.raises(ValueError):
        attrs.evolve(ASK, **{field: value})


def test_the_largest_card_fits_in_one_http_body_and_more_text_is_refused() -> None:
    """32 tasks whose text is all quotes (each escaped to two bytes) still fit; a card past the
    total text budget is refused."""
    per_task = limits.MAX_CARD_TEXT_BYTES // limits.MAX_CARD_TASKS
    tasks = tuple(
        CardTask(id=f"t{n:02}", name='"' * 100, summary='"' * (per_task - 103))
        for n in range(limits.MAX_CARD_TASKS)
    )
    made = signed(IdentityKey.generate(), tasks=tasks)
    wire = codec.encode(made)
    assert len(wire) <= limits.MAX_HTTP_BODY_BYTES
    assert codec.decode(wire, SignedCardRecord) == made
    bigger = tuple(attrs.evolve(t, summary='"' * limits.MAX_CARD_SUMMARY_BYTES) for t in tasks)
    with pytest.raises(ValueError, match="bytes of text"):
        _record(tasks=bigger)


def test_a_hostile_body_is_malformed_not_a_crash() -> None:
    made = codec.encode(signed(IdentityKey.generate())).decode()
    for bad in (
        made.replace('"claude"', '"root"'),
        made.replace('"v":1', '"v":true'),
        made.replace('"ask"', '"../x"'),
    ):
        with pytest.raises(MalformedFrame):
            codec.decode(bad, SignedCardRecord)
