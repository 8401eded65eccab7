"""A relay composed exactly as ``twistd agentcall-relay`` composes it, over memory transports."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import attrs
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from agentcall import limits
from agentcall.relay.composition import Relay, RelaySettings, compose
from agentcall.relay.door import DoorConfig
from agentcall.relay.gate import GateLimits
from agentcall.relay.mailbox import MailboxLimits
from agentcall.relay.store import SqliteRelayStore, open_relay_store
from agentcall.relay.store_interface import RelayStore
from agentcall.wire.frames import Direction, SealedEnvelope
from agentcall.wire.http import MemberRole

ORIGIN = "relay.example"

T = TypeVar("T")


def fired(deferred: Deferred[T]) -> T:
    """The result of a Deferred that has already fired; its failure is raised here.

    The SQLite store answers at once, so tests read its answers like return values (and
    ``pytest.raises`` its refusals); a Deferred still pending is a test failure.
    """
    results: list[object] = []
    deferred.addBoth(results.append)
    assert results, "the Deferred has not fired"
    result = results[0]
    if isinstance(result, Failure):
        result.raiseException()
    return result  # type: ignore[return-value]


class Fired:
    """A store whose every method hands back its Deferred's result (see :func:`fired`)."""

    def __init__(self, store: SqliteRelayStore) -> None:
        self.wrapped = store

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.wrapped, name)
        if name == "close":
            return method
        return lambda *args, **kwargs: fired(method(*args, **kwargs))


def sealed_looking(
    direction: Direction, from_: str, to: str, origin: str = ORIGIN
) -> SealedEnvelope:
    """An envelope with a real routing header and a ciphertext that is not one: the relay
    routes on the header and never opens the rest."""
    return SealedEnvelope(
        v=1,
        direction=direction,
        relay_origin=origin,
        from_=from_,
        to=to,
        key_id="ab" * 16,
        epoch=1,
        ct="Q2lwaGVydGV4dC10aGF0LXRoZS1yZWxheS1uZXZlci1vcGVucw",
    )


def roomy_door() -> DoorConfig:
    """Caps and throttles far above anything these tests do."""
    return DoorConfig(
        caps=GateLimits(per_source=100, total=100, handshakes=100, callers_per_identity=10),
        head_timeout_s=10.0,
        call_request_timeout_s=10.0,
        register_per_minute=100,
        auth_failures_per_minute=100,
    )


@attrs.define
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@attrs.define
class MemoryRelay:
    reactor: MemoryReactorClock
    store: SqliteRelayStore
    relay: Relay

    def enrol(self, handle: str, role: MemberRole = MemberRole.MEMBER) -> str:
        """Enrol ``@acme/<handle>`` straight through the store; its bearer token."""
        now = self.reactor.seconds()
        secret, _ = fired(
            self.store.create_invite(
                "acme", created_by=None, role=role, expires_in_days=7, description=None, now=now
            )
        )
        _, token = fired(self.store.register("acme", secret, handle, None, now))
        return token

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        token: str | None = None,
        handle: str = "",
        host: str = "10.0.0.1",
    ) -> Answer:
        """One request on a fresh connection through the whole front door and Site; with a
        ``token``, the credentials of ``@acme/<handle>``."""
        return self.send(raw_request(method, path, body=body, token=token, handle=handle), host)

    def connect(self, host: str = "10.0.0.1") -> tuple[Any, StringTransport]:
        """A fresh connection from ``host`` through the front door: (protocol, transport)."""
        address = IPv4Address("TCP", host, 40000)
        protocol = self.relay.factory.buildProtocol(address)
        transport = StringTransport(peerAddress=address)
        protocol.makeConnection(transport)
        return protocol, transport

    def send(self, raw: bytes, host: str = "10.0.0.1") -> Answer:
        """``raw`` bytes on a fresh connection; the answer once the relay has replied."""
        protocol, transport = self.connect(host)
        protocol.dataReceived(raw)
        if transport.disconnecting:
            # A memory transport only records the close; deliver it as the reactor would.
            protocol.connectionLost(Failure(ConnectionDone()))
        return parse_answer(transport.value())


def raw_request(
    method: str, path: str, *, body: bytes | None = None, token: str | None = None, handle: str = ""
) -> bytes:
    """The bytes of one HTTP/1.1 request (see :meth:`MemoryRelay.request`)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: relay.example", "Connection: close"]
    if token is not None:
        lines += [
            f"Authorization: Bearer {token}",
            "X-AgentCall-Org: acme",
            f"X-AgentCall-Handle: {handle}",
        ]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")
    return raw


def parse_answer(data: bytes) -> Answer:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(lines[0].split()[1]), headers, body)


def memory_relay(
    tmp_path: Path,
    *,
    now: float,
    reactor: MemoryReactorClock | None = None,
    door: DoorConfig | None = None,
    wrap: Callable[[SqliteRelayStore], RelayStore] | None = None,
    metrics: Callable[[Any], Any] | None = None,
    mailbox: MailboxLimits | None = None,
) -> MemoryRelay:
    """A relay for organisation ``acme`` on a fresh database, its clock at ``now``; with
    ``wrap``, the relay reaches its store through what ``wrap`` makes of it; ``mailbox``
    replaces the mailbox's default caps."""
    reactor = reactor or MemoryReactorClock()
    reactor.advance(now - reactor.seconds())
    store = open_relay_store(tmp_path / "relay.sqlite")
    fired(store.ensure_org("acme", reactor.seconds()))
    settings = RelaySettings(
        relay_origin=ORIGIN,
        ws_url=f"ws://{ORIGIN}/v1/ws",
        public_url=f"https://{ORIGIN}",
        call_deadline_s=limits.CALL_DEADLINE_S,
        calls_per_hour=limits.CALLS_PER_HOUR_PER_PAIR,
        door=door or roomy_door(),
        mailbox=mailbox or MailboxLimits(),
    )
    seen_by_relay = store if wrap is None else wrap(store)
    return MemoryRelay(reactor, store, compose(settings, seen_by_relay, reactor, metrics=metrics))


class HeldStore:
    """A store whose named methods answer only when :meth:`release` is called, as a remote
    database would; every other method goes straight to the wrapped store."""

    def __init__(self, store: RelayStore, *holding: str) -> None:
        self._store = store
        self._holding = set(holding)
        self.pending: list[tuple[Deferred[Any], Callable[[], Deferred[Any]]]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if name not in self._holding:
            return method

        def later(*args: Any, **kwargs: Any) -> Deferred[Any]:
            answer: Deferred[Any] = Deferred()
            self.pending.append((answer, lambda: method(*args, **kwargs)))
            return answer

        return later

    def release(self) -> None:
        """Answer every held call, in the order they were made."""
        pending, self.pending = self.pending, []
        for answer, call in pending:
            call().chainDeferred(answer)

    def fail(self, exc: Exception) -> None:
        """Fail every held call with ``exc``."""
        pending, self.pending = self.pending, []
        for answer, _call in pending:
            answer.errback(exc)


def holding(*names: str) -> Callable[[SqliteRelayStore], RelayStore]:
    """For ``memory_relay(wrap=...)``: hold the named store methods (see :class:`HeldStore`)."""
    return lambda store: cast(RelayStore, HeldStore(store, *names))


class FillingConnection:
    """A store's SQLite connection on a disk that can fill: while :attr:`full`, every statement
    that writes fails exactly as SQLite does on a full disk (``SQLITE_FULL``), and reads go on.

    Install it with :func:`fill_disk_of`; a real full filesystem is the e2e tier's."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.wrapped = conn
        self.full = False

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self._check(sql)
        return self.wrapped.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        self._check(sql)
        return self.wrapped.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def _check(self, sql: str) -> None:
        if self.full and sql.lstrip().split(None, 1)[0].upper() in _WRITES:
            error = sqlite3.OperationalError("database or disk is full")
            error.sqlite_errorcode = 13
            error.sqlite_errorname = "SQLITE_FULL"
            raise error


_WRITES = frozenset({"INSERT", "UPDATE", "DELETE", "REPLACE"})


def fill_disk_of(store: SqliteRelayStore) -> FillingConnection:
    """Put ``store``'s registry on a :class:`FillingConnection` (empty until told ``full``)."""
    registry = store.registry
    filling = FillingConnection(registry._conn)
    registry._conn = cast(sqlite3.Connection, filling)
    return filling
