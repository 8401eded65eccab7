"""`agentcall listen`: runs the tap's service in the foreground, stops it on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from twisted.internet.testing import MemoryReactorClock

from agentcall import service_unit
from agentcall.cli.listen import EXIT_REPLACED
from agentcall.cli.main import main
from agentcall.compose import listen as tap
from agentcall.errors import AgentCallError
from agentcall.listener.service import make_listener_service
from agentcall.local.home import Home
from tests.unit.test_listener_core import fired, install

REPO = Path(__file__).resolve().parents[2]

# A stand-in for agentcall.compose.listen, installed before `agentcall listen` imports it.
FAKE_TAP = """
import sys, types
from twisted.application import service
from twisted.python import usage

class Options(usage.Options):
    pass

class Recorder(service.Service):
    replaced = False

    def startService(self):
        if "--refuse" in sys.argv:
            raise RuntimeError("relay URL is not https")
        super().startService()
        print("STARTED", flush=True)
        if "--replaced" in sys.argv:
            # What ListenerService does when the relay says another listener took over.
            from twisted.internet import reactor
            self.replaced = True
            reactor.callLater(0, reactor.stop)

    def stopService(self):
        print("STOPPED", flush=True)
        return super().stopService()

fake = types.ModuleType("agentcall.compose.listen")
fake.Options = Options
fake.makeService = lambda options: Recorder()
sys.modules["agentcall.compose.listen"] = fake
from agentcall.cli.main import main
sys.exit(main(["listen"]))
"""


def start(*extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", FAKE_TAP, *extra],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "HOME": str(REPO), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_sigterm_stops_the_service_and_exits_zero() -> None:
    """The service starts on the reactor; SIGTERM runs stopService and exits cleanly."""
    process = start()
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if "STARTED" in line:
            process.send_signal(signal.SIGTERM)
            break
    rest, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert "STOPPED" in rest


@pytest.mark.slow
def test_a_service_that_refuses_to_start_is_one_line() -> None:
    """startService raising ends the command with exit 1 and the reason."""
    process = start("--refuse")
    _out, err = process.communicate(timeout=20)
    assert process.returncode == 1
    assert err.strip().splitlines()[-1] == (
        "agentcall: the listener refused to start: relay URL is not https"
    )


@pytest.mark.parametrize(
    "refusal",
    [SystemExit("agentcall-listen: not set up here"), AgentCallError("not set up here")],
)
def test_a_tap_that_cannot_build_the_service_is_one_line(
    refusal: BaseException, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """makeService refusing (not set up, bad config) is reported before the reactor runs."""

    def refuse(_options: object) -> object:
        raise refusal

    monkeypatch.setattr(tap, "makeService", refuse)
    assert main(["listen"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("agentcall: the listener cannot start:") and "not set up here" in err


@pytest.mark.slow
def test_a_listener_replaced_by_another_exits_with_the_no_restart_status() -> None:
    """Another listener took over: the service is stopped and the exit status is 78."""
    process = start("--replaced")
    out, err = process.communicate(timeout=20)
    assert process.returncode == EXIT_REPLACED == 78, err
    assert "STOPPED" in out


def test_the_systemd_unit_does_not_restart_a_replaced_listener(tmp_path: Path) -> None:
    home = Home.from_environ({"HOME": str(tmp_path)})
    spec = service_unit.listener_spec(home, {}, python=sys.executable)
    unit = service_unit.render_unit(spec).splitlines()
    assert "Restart=always" in unit
    assert f"RestartPreventExitStatus={EXIT_REPLACED}" in unit


def test_the_listener_service_stops_the_process_once_replaced(tmp_path: Path) -> None:
    """The connection's replaced notice reaches the service, which stops the reactor."""
    reactor = MemoryReactorClock()
    built = make_listener_service(reactor, install(tmp_path))
    built.startService()
    assert not built.replaced
    built.connection._replaced_elsewhere()
    assert built.replaced
    assert reactor.hasStopped
    assert not built.connection.client.running
    assert fired(built.stopService())
