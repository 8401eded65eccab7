"""``ListeningService`` hands the port it bound to the door's accept valve, and takes it back."""

from __future__ import annotations

from typing import Any

from twisted.internet.protocol import Factory
from twisted.internet.testing import MemoryReactorClock

from agentcall.relay.tap import ListeningService


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def attach(self, port: Any) -> None:
        self.calls.append(("attach", port))

    def detach(self) -> None:
        self.calls.append(("detach", None))


def test_the_bound_port_goes_to_the_valve_and_is_taken_back_before_it_closes() -> None:
    reactor = MemoryReactorClock()
    valve = Recorder()
    listening = ListeningService(reactor, "tcp:8765", Factory(), None, valve=valve)
    listening.startService()
    [(what, port)] = valve.calls
    assert what == "attach" and port.getHost().port == 8765
    listening.stopService()
    assert valve.calls[-1] == ("detach", None)


def test_a_tcp_or_ssl_endpoint_without_a_backlog_gets_a_long_one() -> None:
    from agentcall.relay.tap import LISTEN_BACKLOG, with_backlog

    assert LISTEN_BACKLOG == 1024
    assert (
        with_backlog("tcp:8765:interface=127.0.0.1") == "tcp:8765:interface=127.0.0.1:backlog=1024"
    )
    assert with_backlog("ssl:8443:privateKey=k.pem") == "ssl:8443:privateKey=k.pem:backlog=1024"
    assert with_backlog("tcp:8765:backlog=10") == "tcp:8765:backlog=10"
    assert with_backlog("unix:/run/relay.sock") == "unix:/run/relay.sock"


def test_the_port_is_bound_with_that_backlog() -> None:
    reactor = MemoryReactorClock()
    ListeningService(reactor, "tcp:8765", Factory(), None).startService()
    [(port, _factory, backlog, _interface)] = reactor.tcpServers
    assert (port, backlog) == (8765, 1024)
