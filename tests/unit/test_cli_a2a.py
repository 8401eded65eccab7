"""`agentcall a2a serve`: its help, and the refusals before anything listens."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcall.cli import a2a
from agentcall.cli.main import main


@pytest.mark.parametrize("argv", [["a2a"], ["a2a", "serve"]], ids=" ".join)
def test_help_explains_with_an_example(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert "agentcall a2a serve" in out.split("example", 1)[1]
    assert "--listen" in out or "serve" in out


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
