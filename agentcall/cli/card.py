"""``agentcall card``: what callers see of this installation — its address, agent and menu.

The card is computed locally from the same layers the listener admits calls with (policy.json,
the tasks on disk, the admin ceiling) by :func:`agentcall.listener.card.card_offer`, the one
place that decides what a card may reveal. ``--publish`` signs it with the identity key and
publishes it on the relay (the listener does the same at start and whenever it changes).
:func:`doctor_check` compares the published card with the local files for ``agentcall doctor``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentcall.cli.doctor_checks import Check, DoctorDeps, RelayFacts
    from agentcall.listener.card import CardOffer
    from agentcall.local.config import Config
    from agentcall.local.home import Home
    from agentcall.local.keystore import LocalKeys
    from agentcall.wire.http import CardRecord, SignedCardRecord

DESCRIPTION = """\
Show what callers see of this installation: its address, the agent that answers, and the
tasks on offer to every allowed caller (the default menu), each with its name and the first
line of its description. Callers you gave tasks individually (`agentcall allow`) get more,
and blocked callers get nothing; `agentcall policy` shows each one. None of that is on the
card: every member of the organisation can read it.

The card is computed here from policy.json, ~/AgentCall/tasks and the admin ceiling. The
running listener signs it with your identity key and publishes it on the relay when it starts
and whenever it changes; --publish does it now. Callers read it with `agentcall inspect`."""

EPILOG = """\
examples:
  agentcall card
  agentcall card --publish
  agentcall card --json | jq -r '.tasks[].id'"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--publish",
        action="store_true",
        help="sign the card with the identity key and publish it on the relay",
    )


def local_offer(home: Home, config: Config, action: str) -> CardOffer:
    """The card the local files make, or a CommandError saying what to fix."""
    from agentcall.cli import owner
    from agentcall.listener.card import card_offer

    layers = owner.load_layers(home)
    policy = owner.policy_or_fail(home, action)
    ceiling = owner.ceiling_or_fail(action)
    return card_offer(config.agent_kind, policy, ceiling, layers.tasks)


def card_json(address: str, offer: CardOffer | CardRecord) -> dict[str, Any]:
    """A card (local or published) as one JSON-ready value."""
    return {
        "address": address,
        "agent_kind": None if offer.agent_kind is None else str(offer.agent_kind),
        "answers_calls": offer.agent_kind is not None,
        "tasks": [{"id": t.id, "name": t.name, "summary": t.summary} for t in offer.tasks],
        "omitted": offer.omitted,
    }


def build_card() -> dict[str, Any]:
    """The local card as one JSON-ready value, or a CommandError saying what to fix."""
    from agentcall.cli import owner
    from agentcall.cli.main import CommandError
    from agentcall.local.config import NotSetUp

    home = owner.home_or_fail()
    config = owner.load_layers(home).config
    if config is None:
        raise CommandError(str(NotSetUp(home)))
    body = card_json(config.address, local_offer(home, config, "show the card"))
    body["published"] = False
    return body


def render_tasks(card: dict[str, Any]) -> list[str]:
    """The agent and task lines of a card (terminal-safe)."""
    from agentcall.cli.render import safe_cell

    if not card["answers_calls"]:
        return ["agent: none (caller-only: this installation answers no calls)"]
    lines = [f"agent: {safe_cell(card['agent_kind'])}"]
    lines.append("tasks on offer to every allowed caller:" if card["tasks"] else "tasks: none")
    for task in card["tasks"]:
        lines.append(f"  {safe_cell(task['id'])} — {safe_cell(task['name'])}")
        lines.append(f"    {safe_cell(task['summary'])}")
    if card["omitted"]:
        lines.append(f"  (and {card['omitted']} more that did not fit on the card)")
    return lines


def render(card: dict[str, Any]) -> str:
    lines = [f"address: {card['address']}", *render_tasks(card)]
    if not card["tasks"] and card["answers_calls"]:
        lines.append("(callers you allowed individually still get what you granted them)")
    if card["published"] and card.get("changed") is False:
        lines.append("the relay already has this card: nothing to publish")
    elif card["published"]:
        lines.append("published on the relay: callers see this card")
    else:
        lines.append(
            "(computed locally; the running listener publishes it, or `agentcall card --publish`)"
        )
    return "\n".join(lines)


async def published_card(api: Any, config: Config) -> SignedCardRecord | None:
    """This installation's card as the relay serves it, or None when it has none."""
    from agentcall.errors import ApiError, ApiErrorCode

    try:
        signed: SignedCardRecord = await api.get_card(config.handle)
    except ApiError as exc:
        if exc.code is ApiErrorCode.NOT_FOUND:
            return None
        raise
    return signed


def verified_own(signed: SignedCardRecord | None, keys: LocalKeys) -> CardRecord | None:
    """The published card if it verifies against this installation's own identity key."""
    from agentcall.crypto.card import verify_card
    from agentcall.errors import CardInvalid

    if signed is None:
        return None
    try:
        verify_card(
            signed,
            address=keys.address,
            relay_origin=keys.relay_origin,
            identity_pub=keys.identity.public_b64,
        )
    except CardInvalid:
        return None
    return signed.record


def _publish(home: Home, config: Config, offer: CardOffer) -> bool:
    """Sign and publish; False when the relay already had this very card."""
    from agentcall.cli.call import relay_api, run_on_reactor
    from agentcall.cli.main import CommandError
    from agentcall.client.api import RelayUnreachable
    from agentcall.errors import AgentCallError, ApiError
    from agentcall.listener.card import offer_of, sign_offer
    from agentcall.local.keystore import load_keys

    try:
        keys = load_keys(home)
    except AgentCallError as exc:
        raise CommandError(str(exc)) from None

    async def work(reactor: Any) -> bool:
        api = relay_api(reactor, config)
        kept = verified_own(await published_card(api, config), keys)
        if kept is not None and offer_of(kept) == offer:
            return False
        # Never dated before the kept card: the relay keeps only a newer one.
        now = reactor.seconds() if kept is None else max(reactor.seconds(), kept.issued_at + 1)
        await api.put_card(
            sign_offer(offer, keys.identity, config.relay_origin, config.address, now)
        )
        return True

    try:
        return run_on_reactor(work)
    except (ApiError, RelayUnreachable) as exc:
        raise CommandError(f"cannot publish the card: {exc}") from None
    except AgentCallError as exc:
        raise CommandError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from agentcall.cli import owner
    from agentcall.cli.render import safe_json

    card = build_card()
    if args.publish:
        home = owner.home_or_fail()
        config = owner.load_layers(home).config
        assert config is not None  # build_card refused otherwise
        changed = _publish(home, config, local_offer(home, config, "publish the card"))
        card["published"] = True
        card["changed"] = changed
    print(safe_json(card) if args.json else render(card))
    return 0


async def doctor_fetch(reactor: Any, deps: DoctorDeps, config: Config, facts: RelayFacts) -> object:
    """The published card for :func:`doctor_check`: the card, None (none published), the
    exception that stopped the fetch, or None unasked when the relay was not reachable."""
    if facts.status_error is not None or facts.token_refused:
        return None
    try:
        return await published_card(deps.make_api(reactor, config), config)
    except Exception as exc:
        return exc


def doctor_check(home: Home, config: Config, keys: LocalKeys, fetched: object) -> Check:
    """``agentcall doctor``'s card line: is the published card the one the local files make?"""
    from agentcall.cli import doctor_checks as dc
    from agentcall.cli.main import CommandError
    from agentcall.cli.render import safe_cell
    from agentcall.listener.card import drift
    from agentcall.wire.http import SignedCardRecord

    fix = "start the listener (it publishes the card), or run `agentcall card --publish`"
    try:
        offer = local_offer(home, config, "check the card")
    except CommandError:
        return dc.Check("card", dc.WARN, "not compared: the local files cannot be read", None)
    if isinstance(fetched, Exception):
        problem = safe_cell(str(fetched)) or type(fetched).__name__
        return dc.Check("card", dc.WARN, f"the published card could not be fetched ({problem})")
    if not isinstance(fetched, SignedCardRecord):
        if config.caller_only:
            return dc.Check("card", dc.OK, "none published (caller-only: nothing to offer)")
        return dc.Check("card", dc.WARN, "no card is published: callers cannot see your tasks", fix)
    record = verified_own(fetched, keys)
    if record is None:
        return dc.Check(
            "card",
            dc.FAIL,
            "the published card does not verify against this installation's identity key",
            "run `agentcall card --publish`",
        )
    differences = drift(record, offer)
    if differences:
        return dc.Check(
            "card", dc.WARN, "the published card differs: " + "; ".join(differences), fix
        )
    tasks = len(offer.tasks)
    return dc.Check("card", dc.OK, f"the published card matches the local files ({tasks} task(s))")
