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
