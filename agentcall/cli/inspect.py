"""``agentcall inspect ADDRESS``: look at a peer before calling — identity, pin, card, presence.

Reads the relay's published records and card for the address, the local pin and contact, and
(for one's own address only) presence; :func:`agentcall.caller.inspection.inspect` decides what
they mean. Never creates or replaces a pin: it prints the command that would.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentcall.caller.inspection import Inspection
    from agentcall.local.home import Home

DESCRIPTION = """\
Show what you can know about ADDRESS (an @org/handle, a contact name, or a handle in your
organisation) before calling it: the fingerprint of the identity key the relay serves and how
it stands with your pin (unseen: never called; pinned: the key you pinned; recovered: a new key
the recovery key pinned with the old one vouched for, which the next call pins by itself;
changed: not the key you pinned, so calls are refused), your contact note, its published card
(the agent and the tasks it offers everyone, checked against your pin: `verified`, or
`unpinned` while you have not pinned the key yet; a card that does not verify, or is older
than one you saw verified, is never shown), and presence: online or offline for your own
address, `undisclosed` for anyone else (presence is private).

Inspecting never creates or replaces a pin (it only remembers the date of a verified card, so
that an older one served later is refused). When a command would change trust, it is printed:
a first call for an unseen identity, `agentcall trust --reset` for a changed one."""

EPILOG = """\
examples:
  agentcall inspect @acme/ken
  agentcall inspect ken --json | jq .card.tasks"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("address", metavar="ADDRESS", help="@org/handle, contact name or handle")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def to_json(seen: Inspection) -> dict[str, Any]:
    from agentcall.cli.card import card_json

    record = seen.card_record
    return {
        "address": seen.address,
        "contact": seen.contact_name,
        "note": seen.note,
        "pin": str(seen.pin),
        "recovered_at": seen.recovered_at,
        "fingerprint": seen.fingerprint,
        "pinned_fingerprint": seen.pinned_fingerprint,
        "keys_problem": seen.keys_problem,
        "card_state": str(seen.card),
        "card_problem": seen.card_problem,
        "card": None
        if record is None
        else {**card_json(seen.address, record), "issued_at": record.issued_at},
        "presence": str(seen.presence),
        "next": seen.next,
        "next_why": seen.next_why,
    }


_PIN_WORDS = {
    "unseen": "unseen (never called: not pinned yet)",
    "pinned": "pinned (the key you pinned)",
    "changed": "CHANGED (not the key you pinned: calls are refused)",
    "recovered": "recovered (a new key, vouched for by the recovery key you pinned with the old)",
    "own": "your own",
}
_CARD_WORDS = {
    "verified": "verified against your pin",
    "unpinned": "signed by the key the relay serves, which you have not pinned yet",
    "refused": "not shown",
    "none": "none published",
    "unavailable": "could not be fetched",
}


def render(seen: Inspection) -> str:
    from agentcall.cli.call import when
    from agentcall.cli.card import card_json, render_tasks
    from agentcall.cli.render import safe_cell

    lines = [seen.address]
    if seen.contact_name is not None:
        lines.append(f"contact: {safe_cell(seen.contact_name)}")
    if seen.note is not None:
        lines.append(f"note: {safe_cell(seen.note)}")
    lines.append(f"identity: {_PIN_WORDS[str(seen.pin)]}")
    if seen.recovered_at is not None:
        lines.append(f"  {seen.address} recovered their identity on {when(seen.recovered_at)}")
    if seen.fingerprint is not None:
        lines.append(f"  fingerprint: {seen.fingerprint}")
    if seen.pinned_fingerprint is not None and seen.pinned_fingerprint != seen.fingerprint:
        lines.append(f"  pinned fingerprint: {seen.pinned_fingerprint}")
    if seen.keys_problem is not None:
        lines.append(f"  {seen.keys_problem}")
    card_line = f"card: {_CARD_WORDS[str(seen.card)]}"
    if seen.card_problem is not None:
        card_line += f" ({safe_cell(seen.card_problem)})"
    lines.append(card_line)
    if seen.card_record is not None:
        lines.append(f"  issued {when(seen.card_record.issued_at)}")
        lines += [f"  {line}" for line in render_tasks(card_json(seen.address, seen.card_record))]
    presence = str(seen.presence)
    if presence == "undisclosed":
        presence += " (presence is private: only your own is shown)"
    lines.append(f"presence: {presence}")
    if seen.next is not None:
        lines.append(f"to change trust: {seen.next}")
        lines.append(f"  ({seen.next_why})")
    return "\n".join(lines)


def _saw(home: Home, relay_origin: str, address: str, issued_at: int) -> None:
    """Remember a verified card's date (not a pin: only a later replay is refused by it)."""
    from agentcall.cli.main import CommandError
    from agentcall.errors import AgentCallError
    from agentcall.local.statedb import StateDb

    try:
        db = StateDb.open(home)
        try:
            db.seen_cards(relay_origin).saw(address, issued_at)
        finally:
            db.close()
    except AgentCallError as exc:
        raise CommandError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from agentcall import ids
    from agentcall.caller.inspection import CardView, Facts, inspect
    from agentcall.cli.call import load_installation, relay_api, run_on_reactor
    from agentcall.cli.main import CommandError
    from agentcall.cli.render import safe_json
    from agentcall.client.api import RelayUnreachable
    from agentcall.errors import AgentCallError, ApiError, ApiErrorCode
    from agentcall.local.contacts import ContactBook
    from agentcall.local.keystore import load_keys
    from agentcall.local.statedb import StateDb

    home, config = load_installation()
    try:
        book = ContactBook(home)
        address = book.resolve(args.address, config.org)
        contact = book.get(args.address) if not args.address.startswith("@") else None
        if contact is None or contact.address != address:
            contact = next((c for c in book.list() if c.address == address), None)
        keys = load_keys(home)
        db = StateDb.open(home)
        try:
            pin = db.pins.get(config.relay_origin, address)
            card_seen = db.seen_cards(config.relay_origin).newest(address)
        finally:
            db.close()
    except (AgentCallError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    handle = ids.parse_address(address).handle
    own = address == config.address

    async def work(reactor: Any) -> Facts:
        api = relay_api(reactor, config)
        try:
            served = await api.get_keys(handle)
        except ApiError as exc:
            if exc.code is not ApiErrorCode.NOT_FOUND:
                raise
            served = None
        card = card_error = None
        try:
            card = await api.get_card(handle)
        except ApiError as exc:
            if exc.code is not ApiErrorCode.NOT_FOUND:
                card_error = f"the relay refused: {exc.code}"
        online = None
        if own:
            try:
                online = (await api.presence()).online
            except ApiError:
                online = None
        return Facts(
            address=address,
            relay_origin=config.relay_origin,
            own_address=config.address,
            own_identity_pub=keys.identity.public_b64,
            served=served,
            pin=pin,
            card=card,
            card_error=card_error,
            contact_name=None if contact is None else contact.name,
            note=None if contact is None else contact.note,
            online=online,
            card_seen=card_seen,
        )

    try:
        facts = run_on_reactor(work)
    except (ApiError, RelayUnreachable) as exc:
        raise CommandError(f"cannot inspect {address}: {exc}") from None
    except AgentCallError as exc:
        raise CommandError(str(exc)) from None
    seen = inspect(facts)
    if seen.card is CardView.VERIFIED and seen.card_record is not None:
        _saw(home, config.relay_origin, address, seen.card_record.issued_at)
    print(safe_json(to_json(seen)) if args.json else render(seen))
    return 0
