"""The signed card: making it, and deciding whether a card a relay hands us is genuine.

A card (:class:`~agentcall.wire.http.CardRecord`) says what every member of the organisation
may ask an installation for. The relay stores and serves it but is not trusted for it: the
identity key signs the card's canonical transcript (:func:`~agentcall.crypto.transcripts.
card_transcript`), which binds the address, the relay origin, the identity key itself and the
issue time. Whoever shows a card checks it against the key they trust — their pin, or their
own key — with :func:`verify_card`; the relay checks it against the identity the member
published before it stores it.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentcall.errors import CardInvalid, SignatureInvalid
from agentcall.wire import canonical
from agentcall.wire.http import AgentKind, CardRecord, CardTask, SignedCardRecord

from . import keys, transcripts
from .keys import IdentityKey


def make_card(
    identity_key: IdentityKey,
    relay_origin: str,
    address: str,
    *,
    issued_at: int,
    agent_kind: AgentKind | None,
    tasks: Sequence[CardTask],
    omitted: int = 0,
) -> SignedCardRecord:
    """Sign a card (tasks sorted by id; the record's own validators bound every field)."""
    record = CardRecord(
        v=1,
        relay_origin=relay_origin,
        address=address,
        identity_pub=identity_key.public_b64,
        issued_at=issued_at,
        agent_kind=agent_kind,
        tasks=tuple(sorted(tasks, key=lambda task: task.id)),
        omitted=omitted,
    )
    signature = identity_key.sign(canonical.encode(transcripts.card_transcript(record)))
    return SignedCardRecord(record=record, signature=signature)


def verify_card(
    signed: SignedCardRecord,
    *,
    address: str,
    relay_origin: str,
    identity_pub: str,
    newer_than: int | None = None,
) -> None:
    """Check that ``signed`` is the card ``address`` published on ``relay_origin`` with the
    identity key ``identity_pub`` (the one the checker trusts), and, given ``newer_than``,
    that it is not older than a card already seen (a relay replaying an old card).

    Raises :class:`CardInvalid` naming the failed check.
    """
    record = signed.record
    if record.address != address:
        raise CardInvalid("card names another address")
    if record.relay_origin != relay_origin:
        raise CardInvalid("card names another relay")
    if record.identity_pub != identity_pub:
        raise CardInvalid("card names another identity key")
    try:
        keys.verify_signature(
            identity_pub, canonical.encode(transcripts.card_transcript(record)), signed.signature
        )
    except (SignatureInvalid, ValueError):
        raise CardInvalid("card signature does not verify against the identity key") from None
    if newer_than is not None and record.issued_at < newer_than:
        raise CardInvalid("card is older than one already seen")


def same_offer(a: CardRecord, b: CardRecord) -> bool:
    """True when two cards say the same thing (their dates aside)."""
    return (a.agent_kind, a.tasks, a.omitted) == (b.agent_kind, b.tasks, b.omitted)
