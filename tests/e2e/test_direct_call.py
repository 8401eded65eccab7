"""`agentcall call` with no service on the caller's side, as real processes: the CLI dials the
relay (TLS, a private CA) itself and loads only what that needs.

ann is caller-only; ken answers with the fake agent. What a call process imported is read
from the process itself at exit, never guessed from its timing.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.e2e.installs import Install, World, two_people

pytestmark = pytest.mark.e2e

# Needed to dial at all (the probe sees the path was taken) ...
DIALLED = ("twisted.internet.reactor", "autobahn.websocket.protocol", "OpenSSL.SSL")
# ... and never needed by a call sealed with kept keys: the HTTP API (Twisted's web client),
# autobahn's WAMP layer, the urllib chain Twisted's compat module would pull in, and the
# listener's stores in the state database, the HTTP API's bodies (the config's enums and the
# key records are in modules of their own), all of asyncio but the four names Twisted's
# Deferred takes from it, and importlib.resources (the schema files are read from disk).
NOT_NEEDED = (
    "twisted.web.client",
    "autobahn.twisted.wamp",
    "autobahn.wamp.protocol",
    "urllib.request",
    "hyperlink._url",
    "agentcall.listener.journal",
    "agentcall.listener.contexts",
    "agentcall.wire.http",
    "asyncio.base_events",
    "importlib.resources",
)

_PROBE = (
    "import atexit, sys\n"
    f"watched = {DIALLED + NOT_NEEDED!r}\n"
    "atexit.register(lambda: print('LOADED=' + ','.join(m for m in watched if m in sys.modules),"
    " file=sys.stderr))\n"
    "from agentcall.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with two_people(tmp_path_factory.mktemp("direct")) as world:
        world.ken.start_listener()
        yield world


def _probed_call(
    person: Install, message: str
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, "call", "ken", message],
        env=person.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=person.root,
    )
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("LOADED=")][-1]
    return done, {name for name in line.removeprefix("LOADED=").split(",") if name}


def test_a_direct_call_with_kept_keys_loads_no_http_api_and_no_wamp(world: World) -> None:
    ann = world.ann
    assert not (ann.state_dir / "service.sock").exists()
    first, loaded = _probed_call(ann, "first?")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "FAKE-AGENT-ANSWER: first?\n"
    # The first call fetched ken's records over HTTP, so it needed the web client.
    assert "twisted.web.client" in loaded
    again, loaded = _probed_call(ann, "again?")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "FAKE-AGENT-ANSWER: again?\n"
    assert set(DIALLED) <= loaded
    assert loaded.isdisjoint(NOT_NEEDED), loaded & set(NOT_NEEDED)
