"""What a card reveals (card_offer), how it is summarised, drift, and the listener's publisher."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import defer

from agentcall import limits
from agentcall.crypto.card import verify_card
from agentcall.crypto.keys import IdentityKey
from agentcall.errors import ApiError, ApiErrorCode
from agentcall.listener.card import (
    CardOffer,
    CardPublisher,
    card_offer,
    drift,
    offer_of,
    sign_offer,
    summary_of,
)
from agentcall.listener.ceiling import Ceiling
from agentcall.listener.policy import Access, CallerRule, Policy
from agentcall.listener.tasks import BUILTIN_ASK, Task, TaskSet
from agentcall.wire.http import AgentKind, CardTask, SignedCardRecord
from tests.unit.crypto_helpers import NOW, ORIGIN

CLAUDE = AgentKind.CLAUDE
KEY = IdentityKey.generate()


def task(task_id: str, description: str = "d", **changes: Any) -> Task:
    return attrs.evolve(Task(id=task_id, name=task_id.title(), description=description), **changes)


def tasks(*more: Task) -> TaskSet:
    return TaskSet(tasks={BUILTIN_ASK.id: BUILTIN_ASK, **{t.id: t for t in more}})


def test_only_the_default_menu_is_on_the_card_and_nothing_else_of_a_task() -> None:
    """Grants to one caller, tasks not offered by default, tools, workdirs, keywords, examples
    and instructions never reach the card."""
    secret = task(
        "deploy",
        "Deploy prod",
        tools=frozenset({"read", "exec"}),
        keywords=("prod",),
        examples=("deploy v2",),
        instructions="use the token in ~/.prod",
        workdir=Path("/srv/prod"),
    )
    review = task("review", "Review a diff\nThen say what is wrong.", keywords=("diff",))
    policy = Policy(
        default_offer=("ask", "review"),
        callers=(CallerRule(handle="ana", grants=("deploy",)),),
    )
    offer = card_offer(CLAUDE, policy, None, tasks(secret, review))
    assert offer == CardOffer(
        agent_kind=CLAUDE,
        tasks=(
            CardTask(id="ask", name="Ask a question", summary=BUILTIN_ASK.description),
            CardTask(id="review", name="Review", summary="Review a diff"),
        ),
    )
    everything = repr(offer)
    for hidden in ("deploy", "ana", "prod", "diff\n", "Then say", "exec", "/srv", "token"):
        assert hidden not in everything


def test_blocked_by_default_caller_only_and_the_ceiling_narrow_the_card() -> None:
    review = task("review")
    policy = Policy(default_offer=("ask", "review"))
    blocked = attrs.evolve(policy, default_access=Access.BLOCKED)
    assert card_offer(CLAUDE, blocked, None, tasks(review)) == CardOffer(agent_kind=CLAUDE)
    assert card_offer(None, policy, None, tasks(review)) == CardOffer(agent_kind=None)
    ceiling = Ceiling(path="/etc/agentcall/policy.json", allowed_tasks=frozenset({"ask"}))
    offer = card_offer(CLAUDE, policy, ceiling, tasks(review))
    assert [t.id for t in offer.tasks] == ["ask"]


def test_summaries_are_one_clean_line_within_the_limit() -> None:
    assert summary_of("\n\n  First line  \nsecond") == "First line"
    assert summary_of("a\x1b]0;title\x07b\u202ec\tand") == "ab c and"
    long = summary_of("é" * 1000)
    assert len(long.encode()) <= limits.MAX_CARD_SUMMARY_BYTES and long.endswith("…")
    assert summary_of("   ") == "(no description)"


def test_a_menu_too_big_for_a_card_says_how_many_were_left_off() -> None:
    many = [task(f"t{n:03}", "x" * 250) for n in range(60)]
    policy = Policy(default_offer=tuple(t.id for t in many))
    offer = card_offer(CLAUDE, policy, None, tasks(*many))
    assert len(offer.tasks) < 60 and offer.omitted == 60 - len(offer.tasks)
    # It can still be signed: the record's own bounds hold.
    sign_offer(offer, IdentityKey.generate(), ORIGIN, "@acme/ken", NOW)


def test_drift_names_what_differs() -> None:
    key = IdentityKey.generate()
    published = sign_offer(
        CardOffer(CLAUDE, (CardTask(id="ask", name="Ask", summary="s"),)),
        key,
        ORIGIN,
        "@acme/ken",
        NOW,
    ).record
    assert drift(published, offer_of(published)) == []
    here = CardOffer(
        AgentKind.CODEX,
        (
            CardTask(id="ask", name="Ask", summary="changed"),
            CardTask(id="new", name="New", summary="s"),
        ),
    )
    assert drift(published, here) == [
        "agent claude published, codex here",
        "task new offered here but not on the published card",
        "task ask has another name or description here",
    ]
    assert drift(published, CardOffer(CLAUDE)) == [
        "task ask on the published card but no longer offered"
    ]


@attrs.define
class FakeApi:
    sent: list[SignedCardRecord] = attrs.field(factory=list)
    failure: Exception | None = None

    def put_card(self, signed: SignedCardRecord) -> defer.Deferred[SignedCardRecord]:
        if self.failure is not None:
            return defer.fail(self.failure)
        self.sent.append(signed)
        return defer.succeed(signed)


@attrs.define
class World:
    offer: CardOffer
    api: FakeApi = attrs.field(factory=FakeApi)
    connected: bool = True
    key: IdentityKey = attrs.field(factory=IdentityKey.generate)
    now: float = NOW
    broken: bool = False

    def make_offer(self) -> CardOffer:
        if self.broken:
            raise ValueError("policy.json is not JSON")
        return self.offer

    def publisher(self) -> CardPublisher:
        return CardPublisher(
            make_offer=self.make_offer,
            sign=lambda offer: sign_offer(offer, self.key, ORIGIN, "@acme/ken", self.now),
            api=lambda: self.api,
            connected=lambda: self.connected,
        )


def test_the_publisher_publishes_once_connected_and_again_only_on_change() -> None:
    world = World(CardOffer(CLAUDE))
    publisher = world.publisher()
    world.connected = False
    publisher.check()
    assert world.api.sent == []
    world.connected = True
    publisher.check()
    publisher.check()
    assert len(world.api.sent) == 1
    verify_card(
        world.api.sent[0],
        address="@acme/ken",
        relay_origin=ORIGIN,
        identity_pub=world.key.public_b64,
    )
    world.offer = CardOffer(CLAUDE, (CardTask(id="ask", name="Ask", summary="s"),))
    world.now += 10
    publisher.check()
    assert [len(c.record.tasks) for c in world.api.sent] == [0, 1]
    assert world.api.sent[1].record.issued_at == NOW + 10
    assert publisher.published == world.offer


@pytest.mark.parametrize(
    "failure",
    [ApiError(409, ApiErrorCode.CARD_NOT_NEWER, "older"), ConnectionError("relay gone")],
)
def test_a_failed_publish_is_tried_again_at_the_next_check(failure: Exception) -> None:
    world = World(CardOffer(CLAUDE))
    world.api.failure = failure
    publisher = world.publisher()
    done = publisher.check()
    assert done.called and done.result is None  # never raises: a timer calls it
    assert publisher.published is None
    world.api.failure = None
    publisher.check()
    assert len(world.api.sent) == 1


def test_unreadable_files_leave_the_card_as_it_was() -> None:
    world = World(CardOffer(CLAUDE), broken=True)
    publisher = world.publisher()
    publisher.check()
    assert world.api.sent == [] and publisher.published is None


@given(
    name=st.text(st.characters() | st.integers(0x80, 0x9F).map(chr), max_size=300),
    description=st.text(st.characters() | st.sampled_from("\x1b\x9b\u202e\r\n\t "), max_size=1500),
)
def test_any_task_text_makes_a_card_that_can_be_signed(name: str, description: str) -> None:
    """Whatever an owner writes in a task's name and description, the card entry made of it
    passes the wire's own validators (one clean line, within its byte limits)."""
    odd = task("odd", description, name=name)
    offer = card_offer(CLAUDE, Policy(default_offer=("odd",)), None, tasks(odd))
    [entry] = [t for t in offer.tasks if t.id == "odd"]
    assert "\n" not in entry.summary and "\x1b" not in entry.name + entry.summary
    assert len(entry.summary.encode()) <= limits.MAX_CARD_SUMMARY_BYTES
    sign_offer(offer, KEY, ORIGIN, "@acme/ken", NOW)
