"""What ``agentcall inspect`` says about an address: a pure decision over what was read.

The adapter (:mod:`agentcall.cli.inspect`) gathers the facts — the records and the card the
relay serves, the local pin, the contact, this installation's own presence — and
:func:`inspect` decides what they mean. Nothing here creates or replaces a pin: inspecting is
looking, and the one command that would change trust is only named (:attr:`Inspection.next`).

Trust for the card follows the pin: a card is ``verified`` only against a key this
installation already trusts (its pin, a key the pin vouched for by a recovery, or its own key
for its own address); against the key
the relay serves for an address never called it is ``unpinned`` (shown, and said to be
unconfirmed); when the identity changed, or the card does not verify, or it is older than a
card verified before (a replay), it is ``refused`` and its contents are never shown as the
owner's.
"""

from __future__ import annotations

import enum

import attrs

from agentcall.crypto import keys, records, recovery
from agentcall.crypto.card import verify_card
from agentcall.crypto.pins import Pin
from agentcall.errors import CardInvalid, CryptoError
from agentcall.wire.http import CardRecord, KeysResponse, SignedCardRecord


class PinView(enum.StrEnum):
    """Where this installation stands with the identity the relay serves for an address."""

    UNSEEN = "unseen"  # never pinned: a first call would pin the served key
    PINNED = "pinned"  # the served key is the pinned one
    CHANGED = "changed"  # the served key differs from the pin: calls fail until a reset
    # The served key differs from the pin, but the recovery key pinned with the old identity
    # vouched for it (crypto/recovery.walk): the next call moves the pin by itself.
    RECOVERED = "recovered"
    OWN = "own"  # this installation's own address, checked against its own key


class CardView(enum.StrEnum):
    VERIFIED = "verified"  # signed by the key this installation trusts for the address
    UNPINNED = "unpinned"  # signed by the served key, which is not pinned yet
    REFUSED = "refused"  # does not verify, or the identity changed: not shown as genuine
    NONE = "none"  # no card published
    UNAVAILABLE = "unavailable"  # the relay could not be asked


class Presence(enum.StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"
    UNDISCLOSED = "undisclosed"  # anyone else's: presence is private
    UNKNOWN = "unknown"  # one's own, when the relay could not say


@attrs.frozen
class Facts:
    """What the adapter read. ``served`` None: the relay has no published keys for the
    address; ``card`` None: no card; ``card_error``: the card could not be fetched."""

    address: str
    relay_origin: str
    own_address: str
    own_identity_pub: str
    served: KeysResponse | None
    pin: Pin | None
    card: SignedCardRecord | None = None
    card_error: str | None = None
    contact_name: str | None = None
    note: str | None = None
    online: bool | None = None  # own address only
    # The issue time of the newest card of this address verified before (a replay is older).
    card_seen: int | None = None


@attrs.frozen
class Inspection:
    address: str
    pin: PinView
    recovered_at: int | None  # when the identity was recovered (the recovered view only)
    fingerprint: str | None  # of the identity the relay serves
    pinned_fingerprint: str | None
    card: CardView
    card_record: CardRecord | None  # set only when the card view is verified or unpinned
    card_problem: str | None
    presence: Presence
    contact_name: str | None
    note: str | None
    keys_problem: str | None
    # The exact command that would create or replace the pin, and why; None when nothing would.
    next: str | None
    next_why: str | None


def pin_view(facts: Facts, served_pub: str | None) -> tuple[PinView, int | None]:
    """Compare the pin (or, for one's own address, the own key) with the served key; for a
    recovered identity, also when it was recovered."""
    if facts.address == facts.own_address:
        own = served_pub in (None, facts.own_identity_pub)
        return (PinView.OWN if own else PinView.CHANGED), None
    if facts.pin is None:
        return PinView.UNSEEN, None
    if served_pub is None or served_pub == facts.pin.identity_pub:
        return PinView.PINNED, None
    assert facts.served is not None  # served_pub came from it
    try:
        at = recovery.walk(facts.pin.identity_pub, facts.served.identity, facts.served.recovered)
    except CryptoError:
        return PinView.CHANGED, None
    return PinView.RECOVERED, at


def _served_identity(facts: Facts) -> tuple[str | None, str | None, str | None]:
    """(identity_pub, fingerprint, problem) of the served identity record, checked."""
    if facts.served is None:
        return None, None, "no published keys (not a member, or removed)"
    identity = facts.served.identity
    record = identity.record
    if record.address != facts.address or record.relay_origin != facts.relay_origin:
        return None, None, "the relay served an identity record for another address or relay"
    try:
        records.verify_identity_record(identity)
    except CryptoError:
        return None, None, "the relay served an identity record that does not verify"
    return record.identity_pub, keys.fingerprint(record), None


def _card(
    facts: Facts, view: PinView, served_pub: str | None
) -> tuple[CardView, CardRecord | None, str | None]:
    if facts.card_error is not None:
        return CardView.UNAVAILABLE, None, facts.card_error
    if facts.card is None:
        return CardView.NONE, None, None
    if view is PinView.CHANGED:
        return CardView.REFUSED, None, "the identity changed: the card is not shown as genuine"
    if view is PinView.OWN:
        trusted, shown = facts.own_identity_pub, CardView.VERIFIED
    elif view is PinView.PINNED and facts.pin is not None:
        trusted, shown = facts.pin.identity_pub, CardView.VERIFIED
    elif view is PinView.RECOVERED and served_pub is not None:
        # The pinned identity vouched for this key through its recovery key.
        trusted, shown = served_pub, CardView.VERIFIED
    elif served_pub is not None:
        trusted, shown = served_pub, CardView.UNPINNED
    else:
        return CardView.REFUSED, None, "no identity key to check the card against"
    try:
        verify_card(
            facts.card,
            address=facts.address,
            relay_origin=facts.relay_origin,
            identity_pub=trusted,
            newer_than=facts.card_seen,
        )
    except CardInvalid as exc:
        return CardView.REFUSED, None, str(exc)
    return shown, facts.card.record, None


def _next(facts: Facts, view: PinView, served_pub: str | None) -> tuple[str | None, str | None]:
    target = facts.address
    if view is PinView.CHANGED and facts.address != facts.own_address:
        return (
            f"agentcall trust --reset {target}",
            "forgets the old pin after you checked the new fingerprint with its owner out of "
            "band; the next call then pins the new key",
        )
    if view is PinView.RECOVERED:
        return (
            f'agentcall call {target} "hello"',
            "the next call moves the pin to the recovered identity by itself (the recovery key "
            "pinned with the old one signed the move) and says so once",
        )
    if view is PinView.UNSEEN and served_pub is not None:
        return (
            f'agentcall call {target} "hello"',
            "a first call pins the identity shown above; compare the fingerprint with its "
            "owner first",
        )
    return None, None


def inspect(facts: Facts) -> Inspection:
    served_pub, fingerprint, keys_problem = _served_identity(facts)
    view, recovered_at = pin_view(facts, served_pub)
    card_view, card_record, card_problem = _card(facts, view, served_pub)
    command, why = _next(facts, view, served_pub)
    if facts.address != facts.own_address:
        presence = Presence.UNDISCLOSED
    elif facts.online is None:
        presence = Presence.UNKNOWN
    else:
        presence = Presence.ONLINE if facts.online else Presence.OFFLINE
    return Inspection(
        address=facts.address,
        pin=view,
        recovered_at=recovered_at,
        fingerprint=fingerprint,
        pinned_fingerprint=None if facts.pin is None else facts.pin.fingerprint,
        card=card_view,
        card_record=card_record,
        card_problem=card_problem,
        presence=presence,
        contact_name=facts.contact_name,
        note=facts.note,
        keys_problem=keys_problem,
        next=command,
        next_why=why,
    )
