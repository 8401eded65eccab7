"""`agentcall a2a serve` and `agentcall a2a token`: their help, the token they make and
print, and the refusals before anything listens."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agentcall.cli import a2a
from agentcall.cli.main import main
from agentcall.local import a2atoken
from agentcall.local.home import Home
from tests.unit.cli_helpers import install, isolate


@pytest.mark.parametrize("argv", [["a2a"], ["a2a", "serve"]], ids=" ".join)
def test_help_explains_with_an_example(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert "agentcall a2a serve" in out.split("example", 1)[1]
    assert "--listen" in out or "serve" in out


def test_the_help_says_how_clients_authenticate(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["a2a", "serve", "--help"])
    serve = " ".join(capsys.readouterr().out.split())
    assert "Authorization: Bearer TOKEN" in serve
    assert "agentcall a2a token" in serve
    with pytest.raises(SystemExit):
        main(["a2a", "token", "--help"])
    token = " ".join(capsys.readouterr().out.split())
    assert "--rotate" in token
    assert "a2a.token" in token and "0600" in token
    assert "without a restart" in token
    assert "agentcall a2a token" in token.split("example", 1)[1]


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Home:
    home, _config, _keys = install(isolate(monkeypatch, tmp_path))
    return home


def test_token_makes_and_prints_the_token(
    installed: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the token on stdout (for `$(agentcall a2a token)`), the same each time."""
    assert main(["a2a", "token"]) == 0
    printed = capsys.readouterr()
    token = printed.out.strip()
    assert printed.out == token + "\n"
    assert a2atoken.is_token(token)
    path = installed.state_dir / "a2a.token"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert main(["a2a", "token"]) == 0
    assert capsys.readouterr().out.strip() == token


def test_rotate_prints_a_new_token_and_says_bridges_take_it(
    installed: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    old = a2atoken.ensure(installed)
    assert main(["a2a", "token", "--rotate"]) == 0
    printed = capsys.readouterr()
    new = printed.out.strip()
    assert new != old and a2atoken.read(installed) == new
    assert "running bridges take the new one" in printed.err
    assert new not in printed.err


@pytest.mark.parametrize("argv", [["a2a", "token"], ["a2a", "serve"]], ids=" ".join)
def test_a_broken_token_file_stops_with_the_fix(
    installed: Home, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """`serve` refuses to start rather than refusing every request later; neither command
    replaces the file by itself."""
    path = installed.state_dir / "a2a.token"
    path.write_text("k" * 43 + "\n")
    os.chmod(path, 0o644)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert str(path) in err
    assert "agentcall a2a token --rotate" in err
    assert "k" * 43 not in err
    assert path.read_text() == "k" * 43 + "\n"


@pytest.mark.parametrize("argv", [["a2a", "token"], ["a2a", "token", "--rotate"]], ids=" ".join)
def test_token_refuses_to_run_inside_an_answering_agent(
    installed: Home,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    monkeypatch.setenv("AGENTCALL_CALL_ID", "x" * 8)
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "inside an agent that is answering a call" in captured.err
    assert captured.out == ""
    assert not (installed.state_dir / "a2a.token").exists()


def test_token_needs_an_installation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    isolate(monkeypatch, tmp_path)
    assert main(["a2a", "token"]) == 1
    assert "setup" in capsys.readouterr().err


def test_it_refuses_to_run_inside_an_answering_agent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTCALL_CALL_ID", "x" * 8)
    assert main(["a2a", "serve"]) == 1
    assert "inside an agent that is answering a call" in capsys.readouterr().err


def test_it_needs_an_installation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AGENTCALL_CALL_ID", raising=False)
    monkeypatch.delenv("AGENTCALL_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["a2a", "serve"]) == 1
    assert "setup" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("description", "interface"),
    [
        ("tcp:8470:interface=127.0.0.1", "127.0.0.1"),
        ("tcp:port=8470:interface=Bridge.LAN", "bridge.lan"),
        ("tcp:8470", None),
        ("tcp:8470:interface=", None),
        ("unix:/tmp/x", None),
    ],
)
def test_the_interface_an_endpoint_names(description: str, interface: str | None) -> None:
    assert a2a._interface(description) == interface


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")
def test_the_bridge_finds_a_run_behind_a_connection() -> None:
    """The check `serve` composes, end to end on this machine: a process carrying a run's
    marker connects to a loopback port of ours, and the check names its pid."""
    from agentcall.a2a import peerpid

    child_code = (
        "import socket, sys\n"
        "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
        "print('connected', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        env = {**os.environ, "AGENTCALL_RUN_ID": "run-under-test"}
        with subprocess.Popen(
            [sys.executable, "-c", child_code, str(port)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as child:
            try:
                assert child.stdout is not None
                assert child.stdout.readline() == "connected\n"
                accepted, peer = listener.accept()
                with accepted:
                    here = accepted.getsockname()
                    found = a2a._run_peer()(
                        peerpid.endpoint(peer[0], peer[1]), peerpid.endpoint(here[0], here[1])
                    )
            finally:
                assert child.stdin is not None
                child.stdin.close()
                child.wait(timeout=30)
    assert found == child.pid
