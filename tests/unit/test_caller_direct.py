"""place() as the CLI runs it with no service: no injected key directory, no injected dial.

What it must not do twice or at all: build the relay's HTTP API for a call sealed with kept
keys (that API is Twisted's web client, a large import for a short-lived process), or read the
CA file once for the HTTP fetch and again for the socket. And a relay that turns the upgrade
away busy (503 with a Retry-After) is dialled again after that wait, a bounded number of times.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer

from agentcall.caller.call import BUSY_RETRIES, BUSY_WAIT_MAX_S, CallResult, place
from agentcall.client import api as api_module
from agentcall.client import tls, ws
from agentcall.client.api import RelayUnreachable
from agentcall.client.ws import RelayBusy
from agentcall.local.config import Config
from agentcall.local.home import Home
from agentcall.local.keystore import LocalKeys
from agentcall.testing.tlsca import make_ca
from agentcall.wire.frames import CallRequest
from agentcall.wire.keyrecords import KeysResponse
from tests.unit.cli_helpers import NOW, ORIGIN, install, run_with_clock
from tests.unit.crypto_helpers import DAY, make_party
from tests.unit.test_caller_keycache import BOB, Bob, CountingDirectory, records

Ann = tuple[Home, Config, LocalKeys]


@pytest.fixture
def ann(tmp_path: Path) -> Ann:
    return install(tmp_path / "ann")


class Made:
    """Stands in for RelayApi: records each one built and answers as a key directory."""

    def __init__(self, served: dict[str, KeysResponse]) -> None:
        self.directory = CountingDirectory(served)
        self.built: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **kw: Any) -> CountingDirectory:
        self.built.append(kw)
        return self.directory


def place_alone(ann: Ann, dial: Any, now: float = NOW) -> CallResult:
    """place() with no key directory given, as the CLI's direct path calls it."""
    home, config, keys = ann

    async def work(reactor: Any) -> CallResult:
        kw = {} if dial is None else {"dial": dial}
        return await place(reactor, home, config, keys, BOB, "hi", None, lambda _s: None, **kw)

    return run_with_clock(work, now=now)


def test_a_call_with_kept_keys_builds_no_http_api(
    ann: Ann, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first call fetches bob's records through the HTTP API (built then, once); the next
    one seals with the kept records and builds no API at all."""
    bob = Bob(make_party(BOB, origin=ORIGIN), ann[2])
    made = Made({"bob": records(bob.party)})
    monkeypatch.setattr(api_module, "RelayApi", made)
    assert place_alone(ann, bob.dial).text == "epoch 1"
    assert len(made.built) == 1 and made.directory.fetched == ["bob"]
    assert place_alone(ann, bob.dial, NOW + DAY).text == "epoch 1"
    assert len(made.built) == 1 and made.directory.fetched == ["bob"]


def test_the_ca_file_is_read_once_for_the_fetch_and_the_socket(
    ann: Ann, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One call that must fetch and then dial an https relay with a private CA: the file is
    read once, and the HTTP API and the socket verify against that same trust."""
    home, config, keys = ann
    ca = make_ca(tmp_path / "ca")
    config = attrs.evolve(config, ca_file=str(ca.cert_file))
    reads: list[str] = []
    load = tls.load_ca_certificates

    def counted(path: str) -> Any:
        reads.append(path)
        return load(path)

    monkeypatch.setattr(tls, "load_ca_certificates", counted)
    bob = make_party(BOB, origin=ORIGIN)
    served = {"bob": records(bob)}
    policies: list[object] = []
    made = api_module.RelayApi.__init__

    def making(self: api_module.RelayApi, *args: Any, **kw: Any) -> None:
        policies.append(kw.get("tls_policy"))
        made(self, *args, **kw)

    def get_keys(_self: api_module.RelayApi, handle: str) -> defer.Deferred[KeysResponse]:
        return defer.succeed(served[handle])

    monkeypatch.setattr(api_module.RelayApi, "__init__", making)
    monkeypatch.setattr(api_module.RelayApi, "get_keys", get_keys)
    endpoints: list[Any] = []

    def no_relay(factory: Any, endpoint: Any, _clock: Any) -> defer.Deferred[Any]:
        endpoints.append(endpoint)
        return defer.fail(RelayUnreachable("no relay in this test"))

    monkeypatch.setattr(ws._RelayClientFactory, "dial", no_relay)
    result = place_alone((home, config, keys), None)
    assert result.code == "connection_failed"
    assert len(policies) == 1 and len(endpoints) == 1
    assert reads == [str(ca.cert_file)]
    assert isinstance(policies[0], tls.RelayTlsPolicy)


# --- a relay that says it is busy ---------------------------------------------------------------


@attrs.define
class BusyFirst:
    """The relay answers the first ``busy`` upgrades 503 with ``retry_after``, then bob's
    listener answers; records when each dial came and what it carried."""

    bob: Bob
    busy: int
    retry_after: float = 3.0
    dials: list[tuple[float, CallRequest]] = attrs.Factory(list)

    def dial(self, reactor: Any, *args: Any, **kw: Any) -> defer.Deferred[Any]:
        self.dials.append((reactor.seconds(), args[3]))
        if len(self.dials) <= self.busy:
            return defer.fail(RelayBusy("relay.example is busy", self.retry_after))
        return self.bob.dial(reactor, *args, **kw)


def place_noting(ann: Ann, dial: Any, notes: list[str], timeout_s: float = 420.0) -> CallResult:
    home, config, keys = ann

    async def work(reactor: Any) -> CallResult:
        return await place(
            reactor,
            home,
            config,
            keys,
            BOB,
            "hi",
            None,
            lambda _s: None,
            api=CountingDirectory({"bob": records(bob_party)}),
            dial=dial,
            on_note=notes.append,
            timeout_s=timeout_s,
        )

    return run_with_clock(work, step=0.25)


bob_party = make_party(BOB, origin=ORIGIN)


def test_a_busy_relay_is_dialled_again_after_its_retry_after(ann: Ann) -> None:
    """Twice busy, then through: the same request (nothing was sent) goes a third time, each
    dial no sooner than the wait the relay asked for, and the person is told why it paused."""
    relay = BusyFirst(Bob(bob_party, ann[2]), busy=2)
    notes: list[str] = []
    result = place_noting(ann, relay.dial, notes)
    assert result.ok and result.text == "epoch 1"
    (t1, f1), (t2, f2), (t3, f3) = relay.dials
    assert t2 - t1 >= 3.0 and t3 - t2 >= 3.0
    assert f1 == f2 == f3
    assert len(notes) == 2 and all("busy" in n and "3 s" in n for n in notes)


def test_a_relay_busy_every_time_ends_the_call_after_bounded_tries(ann: Ann) -> None:
    relay = BusyFirst(Bob(bob_party, ann[2]), busy=99)
    result = place_noting(ann, relay.dial, [])
    assert result.code == "connection_failed"
    assert len(relay.dials) == BUSY_RETRIES + 1
    assert (
        result.detail is not None and "busy" in result.detail and "tried 3 times" in result.detail
    )


@pytest.mark.parametrize(
    ("retry_after", "timeout_s"),
    [(BUSY_WAIT_MAX_S + 1, 420.0), (5.0, 4.0)],
    ids=["longer-than-any-busy-wait", "past-the-callers-timeout"],
)
def test_a_busy_wait_the_call_cannot_afford_is_not_waited(
    ann: Ann, retry_after: float, timeout_s: float
) -> None:
    relay = BusyFirst(Bob(bob_party, ann[2]), busy=99, retry_after=retry_after)
    notes: list[str] = []
    result = place_noting(ann, relay.dial, notes, timeout_s=timeout_s)
    assert result.code == "connection_failed" and len(relay.dials) == 1 and notes == []
    assert result.detail is not None and "busy" in result.detail
