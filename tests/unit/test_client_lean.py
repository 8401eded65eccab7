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

from agentcall.client.lean import without_collections

REPO = Path(__file__).resolve().parents[2]
# Loaded by importing the WebSocket client as it stands, and needed by no client socket.
SKIPPED = (
    "urllib.request",
    "http.client",
    "hyperlink._url",
    "autobahn.twisted.wamp",
    "autobahn.wamp.protocol",
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
print(json.dumps({{"loaded": loaded, "session": ApplicationSession.__name__,
                  "jar": type(jar).__name__, "wamp_now": "autobahn.twisted.wamp" in sys.modules}}))
"""


def probe(mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _PROBE, mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


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
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _RUN_ONCE],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
    )
    body = json.loads(done.stdout)
    assert body["value"] == 42
    # Tens of thousands of objects (Twisted alone); none at all without the freeze.
    assert body["frozen"] > 10_000
