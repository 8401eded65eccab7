"""Structured log events: the level gate, the level from the environment, and autobahn's
per-connection option dump kept out of the relay's and the clients' sockets."""

from __future__ import annotations

from typing import Any

import pytest
from autobahn.twisted.websocket import (
    WebSocketClientFactory,
    WebSocketClientProtocol,
    WebSocketServerFactory,
    WebSocketServerProtocol,
)
from autobahn.websocket import protocol as autobahn_protocol
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import LogLevel, capturedLogs

from agentcall import logevents
from agentcall.logevents import Logger, without_option_dump

log = Logger(namespace="tests.logevents")


class Exploding:
    def __repr__(self) -> str:
        raise AssertionError("formatted although its level is off")


def test_every_level_is_written_until_a_program_chooses() -> None:
    with capturedLogs() as events:
        log.debug("detail_line", n=1)
        log.info("info_line", n=2)
    assert [(e["event"], e["log_level"]) for e in events] == [
        ("detail_line", LogLevel.debug),
        ("info_line", LogLevel.info),
    ]


def test_at_info_a_debug_line_reaches_no_observer() -> None:
    logevents.set_level(LogLevel.info)
    with capturedLogs() as events:
        log.debug("detail_line", field=Exploding())
        log.info("info_line", n=2)
        log.warn("warn_line")
    assert [e["event"] for e in events] == ["info_line", "warn_line"]
    assert logevents.lowest_level() is LogLevel.info
    assert not logevents.level_enabled(LogLevel.debug)


def test_the_level_can_be_lowered_again() -> None:
    logevents.set_level(LogLevel.error)
    logevents.set_level(LogLevel.debug)
    with capturedLogs() as events:
        log.debug("detail_line")
    assert [e["event"] for e in events] == ["detail_line"]


def test_failures_obey_the_gate_by_their_level() -> None:
    logevents.set_level(LogLevel.critical)
    with capturedLogs() as events:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.failure("broke")
        log.error("quiet")
    assert [e["event"] for e in events] == ["broke"]


@pytest.mark.parametrize(
    ("value", "level"),
    [
        (None, LogLevel.info),
        ("", LogLevel.info),
        ("debug", LogLevel.debug),
        (" DEBUG ", LogLevel.debug),
        ("warning", LogLevel.warn),
        ("warn", LogLevel.warn),
        ("error", LogLevel.error),
    ],
)
def test_the_level_from_the_environment(value: str | None, level: Any) -> None:
    environ = {} if value is None else {logevents.LEVEL_ENV: value}
    assert logevents.level_from_environ(environ) is level
    assert logevents.configure_from_environ(environ) is level
    assert logevents.lowest_level() is level


def test_an_unknown_level_is_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match="AGENTCALL_LOG_LEVEL='verbose' is not a log level"):
        logevents.configure_from_environ({logevents.LEVEL_ENV: "verbose"})


def test_the_relay_tap_refuses_an_unknown_level(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentcall.relay import tap

    monkeypatch.setenv(logevents.LEVEL_ENV, "loud")
    options = tap.Options()
    options.parseOptions(["--database", "/nonexistent/relay.db", "--url", "http://127.0.0.1:1"])
    with pytest.raises(SystemExit, match="agentcall-relay: AGENTCALL_LOG_LEVEL='loud'"):
        tap.makeService(options, reactor=MemoryReactorClock())


# --- autobahn's option dump ---------------------------------------------------------------------


@pytest.fixture
def dumps(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """What autobahn's _connectionMade hands to pformat for its debug line."""
    seen: list[object] = []

    def recording(value: object) -> str:
        seen.append(value)
        return ""

    monkeypatch.setattr(autobahn_protocol, "pformat", recording)
    return seen


class Plain(WebSocketServerProtocol):
    pass


@without_option_dump
class Quiet(WebSocketServerProtocol):
    pass


@without_option_dump
class QuietClient(WebSocketClientProtocol):
    pass


def connect(factory: Any) -> Any:
    protocol = factory.buildProtocol(None)
    protocol.makeConnection(StringTransport())
    return protocol


def server_factory(protocol: type[Any]) -> WebSocketServerFactory:
    factory = WebSocketServerFactory("ws://relay.example/v1/ws", reactor=MemoryReactorClock())
    factory.protocol = protocol
    factory.setProtocolOptions(autoPingInterval=17, maxMessagePayloadSize=12345)
    return factory


def test_autobahn_alone_formats_every_option_per_connection(dumps: list[object]) -> None:
    """The control: what the decorator is there to stop."""
    connect(server_factory(Plain))
    assert len(dumps) == 1 and len(dumps[0]) > 20  # type: ignore[arg-type]


def test_a_decorated_server_protocol_copies_the_options_without_the_dump(
    dumps: list[object],
) -> None:
    protocol = connect(server_factory(Quiet))
    assert dumps == [[]]
    assert protocol.autoPingInterval == 17
    assert protocol.maxMessagePayloadSize == 12345
    # Every option autobahn copies is there, from the factory.
    for name in Plain.CONFIG_ATTRS:
        assert getattr(protocol, name) == getattr(protocol.factory, name), name


def test_an_option_set_on_the_protocol_itself_is_kept(dumps: list[object]) -> None:
    class Own(Quiet):
        autoPingInterval = 3

    protocol = connect(server_factory(Own))
    assert protocol.autoPingInterval == 3


def test_a_decorated_client_protocol_copies_the_options_without_the_dump(
    dumps: list[object],
) -> None:
    factory = WebSocketClientFactory("ws://relay.example/v1/ws", reactor=MemoryReactorClock())
    factory.protocol = QuietClient
    factory.setProtocolOptions(openHandshakeTimeout=9, utf8validateIncoming=False)
    protocol = connect(factory)
    # (A client also formats its transport details when it starts the handshake: a dict,
    # once per dial, on the client's side only.)
    assert [d for d in dumps if isinstance(d, list)] == [[]]
    assert protocol.openHandshakeTimeout == 9 and protocol.utf8validateIncoming is False
    for name in WebSocketClientProtocol.CONFIG_ATTRS:
        assert getattr(protocol, name) == getattr(factory, name), name


def test_the_relay_and_client_sockets_are_all_decorated() -> None:
    from agentcall.client.ws import _RelayClientProtocol
    from agentcall.listener.connection import _ListenerProtocol
    from agentcall.relay.protocol import RelayWebSocket

    for cls in (RelayWebSocket, _RelayClientProtocol, _ListenerProtocol):
        assert cls.CONFIG_ATTRS == [], cls


class NoDelayTransport(StringTransport):
    """A TCP-like transport that records what TCP_NODELAY it was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.no_delay: list[bool] = []

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay.append(enabled)


def _connect_over(factory: Any, transport: StringTransport) -> Any:
    protocol = factory.buildProtocol(None)
    protocol.makeConnection(transport)
    return protocol


def test_autobahn_alone_never_sets_no_delay() -> None:
    """The control: autobahn asks before the options are copied, and swallows the error."""
    transport = NoDelayTransport()
    _connect_over(server_factory(Plain), transport)
    assert transport.no_delay == []


@pytest.mark.parametrize("wanted", [True, False])
def test_a_decorated_protocol_sets_no_delay_as_its_option_says(wanted: bool) -> None:
    server = server_factory(Quiet)
    server.setProtocolOptions(tcpNoDelay=wanted)
    client = WebSocketClientFactory("ws://relay.example/v1/ws", reactor=MemoryReactorClock())
    client.protocol = QuietClient
    client.setProtocolOptions(tcpNoDelay=wanted)
    for factory in (server, client):
        transport = NoDelayTransport()
        _connect_over(factory, transport)
        assert transport.no_delay == [wanted]


def test_a_transport_that_refuses_no_delay_is_left_as_it_is() -> None:
    class Unix(StringTransport):
        def setTcpNoDelay(self, enabled: bool) -> None:
            raise OSError(22, "Invalid argument")

    protocol = _connect_over(server_factory(Quiet), Unix())
    assert protocol.autoPingInterval == 17  # connected all the same


def test_a_class_with_its_own_option_has_it_applied_once() -> None:
    """autobahn applies an option the class carries itself; it is not set a second time."""

    class Carried(Quiet):
        tcpNoDelay = True

    transport = NoDelayTransport()
    _connect_over(server_factory(Carried), transport)
    assert transport.no_delay == [True]
