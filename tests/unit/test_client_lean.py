"""agentcall.client.lean: a one-call process does not load what its socket never uses, and
everything it skipped still works when something does use it.

Each case runs in a fresh interpreter: the point is what a new process imports.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentcall.client.lean import without_collections

REPO = Path(__file__).resolve().parents[2]
# Loaded by importing the WebSocket client as it stands, and needed by no client socket.
SKIPPED = (
    "urllib.request",
    "http.client",
    "hyperlink._url",
    "autobahn.twisted.wamp",
    "autobahn.wamp.protocol",
    # Twisted's endpoints and TLS layer, and what they bring: service-identity and x509.
    "twisted.plugin",
    "twisted.internet._sslverify",
    "service_identity",
    "cryptography.x509.name",
    # All of asyncio, where Twisted's Deferred takes four names from it.
    "asyncio.base_events",
    "asyncio.streams",
)

_PROBE = f"""
import json, sys
if sys.argv[1] == "lean":
    from agentcall.client.lean import lean_imports
    lean_imports()
import agentcall.client.ws
import twisted.internet.reactor
loaded = sorted(name for name in {SKIPPED!r} if name in sys.modules)
# Whatever was skipped is still there on first use.
from autobahn.twisted import ApplicationSession
import http.cookiejar
jar = http.cookiejar.CookieJar()
import hyperlink
assert hyperlink.URL.from_text("https://relay.example/v1").host == "relay.example"
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet import ssl
from cryptography import x509
assert x509.Name([]).rfc4514_string() == "" and callable(ssl.optionsForClientTLS)
assert HostnameEndpoint.__name__ == "HostnameEndpoint"
assert "twisted.internet._sslverify" in sys.modules and "service_identity" in sys.modules
import asyncio
from twisted.internet import defer
assert asyncio.Future is defer.Future and asyncio.iscoroutine is defer.iscoroutine
assert asyncio.run(asyncio.sleep(0, "slept")) == "slept"
print(json.dumps({{"loaded": loaded, "session": ApplicationSession.__name__,
                  "jar": type(jar).__name__, "wamp_now": "autobahn.twisted.wamp" in sys.modules}}))
"""


def run_script(code: str, *args: str) -> dict[str, Any]:
    """What ``code``, run in a fresh interpreter from the checkout, prints as JSON."""
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def probe(mode: str) -> dict[str, Any]:
    return run_script(_PROBE, mode)


def test_lean_imports_skip_what_a_client_socket_never_uses() -> None:
    # Without it, the client's imports load all of them (else this test proves nothing).
    assert probe("plain")["loaded"] == sorted(SKIPPED)
    lean = probe("lean")
    assert lean["loaded"] == []
    assert (lean["session"], lean["jar"], lean["wamp_now"]) == (
        "ApplicationSession",
        "CookieJar",
        True,
    )


def test_no_collections_inside_and_as_before_after() -> None:
    assert gc.isenabled()
    with without_collections():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with without_collections():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


_RUN_ONCE = """
import gc, json
from agentcall.cli.call import run_on_reactor

async def work(reactor):
    return 42

value = run_on_reactor(work)
print(json.dumps({"value": value, "frozen": gc.get_freeze_count()}))
"""


def test_after_the_reactor_ran_what_is_left_is_frozen_for_a_quick_exit() -> None:
    """The interpreter's last collection at exit would scan every object Twisted and the
    rest built; run_on_reactor freezes them once the reactor has stopped."""
    body = run_script(_RUN_ONCE)
    assert body["value"] == 42
    # Tens of thousands of objects (Twisted alone); none at all without the freeze.
    assert body["frozen"] > 10_000


# A socket to a relay named by its address: a server on loopback answers the upgrade with a ready
# frame; at that moment the client reports what it had loaded and whether a thread pool (the
# resolver's) was started.
_SOCKET_PROBE = """
import json, sys
from agentcall.client.lean import lean_imports
lean_imports()
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet import reactor
from agentcall.client.common import Credentials
from agentcall.client.ws import open_socket
from agentcall.relayurl import RelayUrl
from agentcall.wire import codec
from agentcall.wire.frames import Ready, Role

class Relay(WebSocketServerProtocol):
    def onOpen(self):
        ready = Ready(role=Role.LISTEN, address="@acme/ann", relay_origin="relay.acme.test")
        self.sendMessage(codec.encode(ready), isBinary=False)

factory = WebSocketServerFactory()
factory.protocol = Relay
port = reactor.listenTCP(0, factory, interface="127.0.0.1").getHost().port
seen = {}

def opened(socket):
    seen["loaded"] = sorted(name for name in sys.argv[1:] if name in sys.modules)
    seen["thread_pool"] = reactor.threadpool is not None
    socket.close()
    reactor.callLater(0.1, reactor.stop)

def failed(failure):
    seen["failed"] = str(failure.value)
    reactor.stop()

creds = Credentials(org="acme", handle="ann", token=sys.stdin.read().strip())
opening = open_socket(reactor, RelayUrl.parse(f"http://127.0.0.1:{port}"), creds, Role.LISTEN,
                      on_frame=lambda frame: None, on_close=lambda info: None)
opening.addCallbacks(opened, failed)
reactor.callLater(30, reactor.stop)
reactor.run()
print(json.dumps(seen))
"""
# What dialling an address needs none of: Twisted's endpoints and TLS layer, and what they bring.
NOT_FOR_AN_ADDRESS = (
    "twisted.plugin",
    "twisted.internet._sslverify",
    "service_identity",
    "cryptography.x509.name",
)


def test_a_socket_to_a_relay_named_by_its_address_needs_no_tls_stack_and_no_resolver() -> None:
    from tests.unit.test_client_ws import TOKEN

    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _SOCKET_PROBE, *NOT_FOR_AN_ADDRESS],
        input=TOKEN,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
    )
    assert json.loads(done.stdout) == {"loaded": [], "thread_pool": False}, done.stderr


_CLICK_PROBE = """
import json, sys
from agentcall.client.lean import lean_imports
lean_imports()
import agentcall.client.ws
import autobahn.util
loaded = "click" in sys.modules
coloured = autobahn.util.hl("text") != "text"
import click  # still importable for anything that asks for it
print(json.dumps({"loaded": loaded, "coloured": coloured, "style": click.style("x", bold=True)}))
"""


def test_autobahn_is_imported_without_click_which_stays_importable() -> None:
    import importlib.util

    if importlib.util.find_spec("click") is None:
        pytest.skip("click is not installed here: there is nothing to leave out")
    result = run_script(_CLICK_PROBE)
    assert result["loaded"] is False
    # autobahn took click as not installed: its debug lines are plain text.
    assert result["coloured"] is False
    assert result["style"] == "\x1b[1mx\x1b[0m"
