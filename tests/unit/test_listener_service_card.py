"""The listener service's card: published through its own relay API once connected, and again
by its timer after the owner offers a task (Clock time; no sockets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import attrs
from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock

from agentcall import limits
from agentcall.crypto.card import verify_card
from agentcall.listener.service import make_listener_service
from agentcall.local.home import Home
from agentcall.wire.http import SignedCardRecord
from tests.unit.crypto_helpers import ORIGIN
from tests.unit.test_listener_core import install


@attrs.define
class FakeApi:
    sent: list[SignedCardRecord] = attrs.field(factory=list)

    def put_card(self, card: SignedCardRecord) -> defer.Deferred[SignedCardRecord]:
        self.sent.append(card)
        return defer.succeed(card)


@attrs.define
class UsableSocket:
    usable: bool = True


def test_the_service_publishes_its_card_when_ready_and_after_an_offer(tmp_path: Path) -> None:
    environ = install(tmp_path)
    reactor = MemoryReactorClock()
    service = make_listener_service(reactor, environ)
    api = FakeApi()
    service._api = cast(Any, api)
    service.card.check()
    assert api.sent == []  # no relay socket yet
    socket = cast(Any, UsableSocket())
    service.link.attach(socket)
    service.card.check()
    [first] = api.sent
    keys_pub = service.core.keys.identity.public_b64
    verify_card(first, address="@acme/ken", relay_origin=ORIGIN, identity_pub=keys_pub)
    assert [t.id for t in first.record.tasks] == ["ask"]

    # The owner offers a new task; the service's timer notices within one interval.
    home = Home.from_environ(environ)
    skill = tmp_path / "AgentCall" / "tasks" / "review" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("---\ndescription: Review a diff\n---\nGo.\n")
    home.policy_path.write_text(json.dumps({"version": 2, "default_offer": ["ask", "review"]}))
    home.policy_path.chmod(0o600)
    service.startService()
    try:
        reactor.advance(limits.CARD_CHECK_INTERVAL_S + 1)
        assert [[t.id for t in c.record.tasks] for c in api.sent][-1] == ["ask", "review"]
        count = len(api.sent)
        reactor.advance(limits.CARD_CHECK_INTERVAL_S + 1)
        assert len(api.sent) == count  # nothing changed: nothing sent
    finally:
        service.link.detach(socket)
        service.stopService()
