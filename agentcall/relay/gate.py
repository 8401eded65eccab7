"""The relay's front-door arithmetic: which new connection or caller socket may stay.

Pure bookkeeping with no sockets and no clock. The Twisted glue (:mod:`agentcall.relay.door`)
asks :class:`ConnectionGate` at accept time and tells it when a request head is complete, when
a connection became an authenticated WebSocket, and when a connection is gone;
:class:`TurnedAwayTally` counts what was turned away, so a flood is logged as one event with
counts instead of one line per connection.

At the total or the handshake cap a newcomer is not simply refused: that would let a flood
spread over a few addresses lock everyone out for as long as it keeps the slots full. Instead
the oldest connection that has proven nothing yet makes room: the oldest still sending its
first request head, or (at the total cap) the oldest plain HTTP connection. Sockets that
became authenticated WebSockets are never evicted; each is bound to an identity with caps of
its own. A flood must then outpace every newcomer's own request to keep it out.

A connection the relay has accepted is never turned away at the handshake cap, however young
the heads it would push out. Sparing young heads (most likely honest clients half way through
TLS in a reconnect storm) is the accept valve's job (:class:`agentcall.relay.door.AcceptValve`):
it stops accepting, so newcomers wait in the kernel's queue instead. It cannot stop the accept
loop it runs in, though, and the newcomers that loop still takes must get a place: closing
them let a slow-connection flood reset honest newcomers.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable

import attrs

from agentcall import limits


class TurnedAway(enum.StrEnum):
    """Why a connection, socket or request was turned away (the field names of the log event)."""

    PER_SOURCE = "per_source"
    TOTAL = "total"
    CALLERS_PER_IDENTITY = "callers_per_identity"
    HEAD_TIMEOUT = "head_timeout"
    CALL_REQUEST_TIMEOUT = "call_request_timeout"
    # A WebSocket upgrade told to come back (503): too many were having their credentials checked.
    UPGRADES_BUSY = "upgrades_busy"
    REGISTER_THROTTLED = "register_throttled"
    AUTH_THROTTLED = "auth_throttled"
    # Refused HTTP API requests (404, 401, 400, ...): counted here rather than one line each.
    API_REFUSED = "api_refused"
    # Not turned away at the door but pushed out to make room for a newcomer.
    EVICTED_IN_HEAD = "evicted_in_head"
    EVICTED_PLAIN_HTTP = "evicted_plain_http"
    # Not a refusal: times the port stopped accepting at the head cap (agentcall.relay.door
    # .AcceptValve); the newcomers waited in the kernel's accept queue instead of being closed.
    ACCEPT_HELD = "accept_held"


def _at_least_one(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be at least 1, not {value}")


@attrs.frozen
class GateLimits:
    """The caps, each a relay option."""

    per_source: int = attrs.field(validator=_at_least_one)
    total: int = attrs.field(validator=_at_least_one)
    handshakes: int = attrs.field(validator=_at_least_one)
    callers_per_identity: int = attrs.field(validator=_at_least_one)
    upgrades: int = attrs.field(default=limits.MAX_UPGRADES_IN_FLIGHT, validator=_at_least_one)
    # At the head cap the accept valve stops accepting while the oldest connection in head is
    # younger than this (seconds), so newcomers wait rather than evict it; 0 never holds.
    head_grace_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))


@attrs.define(eq=False)
class Ticket:
    """One admitted connection. ``in_head`` until its first request head is complete;
    ``plain_http`` until it becomes an authenticated WebSocket."""

    source: str
    opened_at: float = 0.0
    in_head: bool = True
    plain_http: bool = True
    released: bool = False
    # Between its WebSocket upgrade request and ``ready`` (credentials being checked).
    upgrading: bool = False


@attrs.frozen
class LetIn:
    """A new connection's ticket, and the older connections to close to make room for it."""

    ticket: Ticket
    evicted: tuple[tuple[Ticket, TurnedAway], ...] = ()


class ConnectionGate:
    """Open connections per source address and in total, connections still sending their
    first request head (which is where a WebSocket handshake happens), caller sockets per
    identity."""

    def __init__(self, caps: GateLimits) -> None:
        self.caps = caps
        self._by_source: Counter[str] = Counter()
        self._total = 0
        self._callers: Counter[str] = Counter()
        # Oldest first (dicts keep insertion order): who makes room when a cap is reached.
        self._heads: dict[Ticket, None] = {}
        self._plain: dict[Ticket, None] = {}
        self._upgrading = 0

    # --- connections ------------------------------------------------------------------------

    def admit(self, source: str, now: float = 0.0) -> LetIn | TurnedAway:
        """A ticket for a new connection from ``source`` opened at ``now`` and the connections
        to close for it (already released here), or why the newcomer must be closed at once.

        Only the newcomer's own source cap, or a total cap where every place holds an
        authenticated WebSocket, turns it away. At the head cap the oldest connection in head
        makes room, whatever its age (see the module's docstring for who spares young ones).
        """
        # A source's own cap is never eased by evicting: it would only evict itself.
        if self._by_source[source] >= self.caps.per_source:
            return TurnedAway.PER_SOURCE
        evicted: list[tuple[Ticket, TurnedAway]] = []
        # Total first: it protects the file descriptors everyone else needs.
        if self._total >= self.caps.total:
            if not self._plain:
                return TurnedAway.TOTAL
            evicted.append((self._evict(self._plain), TurnedAway.EVICTED_PLAIN_HTTP))
        # Checked after the total cap: its eviction may have freed a place in head already.
        if len(self._heads) >= self.caps.handshakes:
            evicted.append((self._evict(self._heads), TurnedAway.EVICTED_IN_HEAD))
        ticket = Ticket(source, opened_at=now)
        self._by_source[source] += 1
        self._total += 1
        self._heads[ticket] = None
        self._plain[ticket] = None
        return LetIn(ticket, tuple(evicted))

    def _evict(self, oldest_first: dict[Ticket, None]) -> Ticket:
        victim = next(iter(oldest_first))
        self.release(victim)
        return victim

    def head_done(self, ticket: Ticket) -> None:
        """The connection's first request head is complete; calling it again is harmless."""
        if ticket.in_head and not ticket.released:
            ticket.in_head = False
            del self._heads[ticket]

    def begin_upgrade(self, ticket: Ticket) -> bool:
        """The connection asks for a WebSocket upgrade: count it while its credentials are
        checked, or False (and no count) when ``caps.upgrades`` are already being checked."""
        if ticket.upgrading:
            return True
        if ticket.released or self._upgrading >= self.caps.upgrades:
            return False
        ticket.upgrading = True
        self._upgrading += 1
        return True

    def end_upgrade(self, ticket: Ticket) -> None:
        """The upgrade was answered (``ready`` or a refusal); calling it again is harmless."""
        if ticket.upgrading:
            ticket.upgrading = False
            self._upgrading -= 1

    def upgraded(self, ticket: Ticket) -> None:
        """The connection is now an authenticated WebSocket: never evicted to make room."""
        self.end_upgrade(ticket)
        self.head_done(ticket)
        if ticket.plain_http and not ticket.released:
            ticket.plain_http = False
            del self._plain[ticket]

    def release(self, ticket: Ticket) -> None:
        """The connection is gone; calling it again is harmless."""
        if ticket.released:
            return
        self.end_upgrade(ticket)
        self.head_done(ticket)
        self._plain.pop(ticket, None)
        ticket.released = True
        self._total -= 1
        self._by_source[ticket.source] -= 1
        if self._by_source[ticket.source] <= 0:
            del self._by_source[ticket.source]

    # --- caller sockets ---------------------------------------------------------------------

    def admit_caller(self, identity: str) -> bool:
        """Count one more caller socket for ``identity``; False (and no count) over the cap."""
        if self._callers[identity] >= self.caps.callers_per_identity:
            return False
        self._callers[identity] += 1
        return True

    def release_caller(self, identity: str) -> None:
        if self._callers[identity] <= 1:
            self._callers.pop(identity, None)
        else:
            self._callers[identity] -= 1

    # --- what the tests and the logs read ------------------------------------------------------

    @property
    def open_total(self) -> int:
        return self._total

    @property
    def in_head(self) -> int:
        return len(self._heads)

    @property
    def oldest_head_opened_at(self) -> float | None:
        """When the connection longest in its first head was opened (None: no head open)."""
        for ticket in self._heads:
            return ticket.opened_at
        return None

    @property
    def upgrades_in_flight(self) -> int:
        """WebSocket upgrades whose credentials are being checked."""
        return self._upgrading

    @property
    def plain_http(self) -> int:
        """Open connections that are not (yet) authenticated WebSockets."""
        return len(self._plain)

    def open_from(self, source: str) -> int:
        return self._by_source.get(source, 0)

    def callers_of(self, identity: str) -> int:
        return self._callers.get(identity, 0)

    @property
    def sources(self) -> int:
        """How many source addresses hold at least one connection (memory is bounded by this)."""
        return len(self._by_source)


class TurnedAwayTally:
    """Connections, sockets and requests turned away, counted by reason between two log
    flushes."""

    def __init__(self) -> None:
        self._counts: Counter[TurnedAway] = Counter()
        # Also told of each one as it happens (the relay's metrics, when it keeps them).
        self.on_note: Callable[[str], None] | None = None

    def note(self, reason: TurnedAway) -> None:
        self._counts[reason] += 1
        if self.on_note is not None:
            self.on_note(str(reason))

    def drain(self) -> dict[str, int]:
        """The counts since the last drain, by reason name (empty when nothing was refused)."""
        counts = {str(reason): n for reason, n in sorted(self._counts.items())}
        self._counts.clear()
        return counts


def busy_retry_after_s(
    random: Callable[[], float],
    low: int = limits.UPGRADE_RETRY_MIN_S,
    high: int = limits.UPGRADE_RETRY_MAX_S,
) -> int:
    """Whole seconds in ``low..high`` for the ``Retry-After`` of an upgrade told to come back,
    spread evenly by ``random()`` (in [0, 1)): a crowd turned away in one second does not all
    come back in the same second."""
    if not 1 <= low <= high:
        raise ValueError("need 1 <= low <= high")
    return low + min(high - low, int(random() * (high - low + 1)))


def total_cap(open_file_limit: int, reserve: int) -> int:
    """Connections allowed under an open-file limit, keeping ``reserve`` descriptors for the
    database, the logs, the listening socket and the accept-then-close of a refused
    connection. Raises ValueError when the limit leaves no room at all."""
    if reserve < 0:
        raise ValueError("the descriptor reserve cannot be negative")
    room = open_file_limit - reserve
    if room < 1:
        raise ValueError(
            f"an open-file limit of {open_file_limit} leaves no room for connections after "
            f"a reserve of {reserve}; raise LimitNOFILE (ulimit -n)"
        )
    return room
