"""Every command explains itself with an example, and help stays free of Twisted and crypto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentcall.cli.main import COMMANDS, main

REPO = Path(__file__).resolve().parents[2]
PERSON_COMMANDS = [
    ["setup"],
    ["config"],
    ["config", "get"],
    ["config", "set"],
    ["config", "unset"],
    ["uninstall"],
    ["call"],
    ["listen"],
    ["invite"],
    ["invite", "create"],
    ["invite", "list"],
    ["invite", "revoke"],
    ["members"],
    ["members", "list"],
    ["members", "remove"],
    ["members", "role"],
    ["inspect"],
    ["card"],
    ["audit"],
    ["audit", "export"],
    ["audit", "hold"],
    ["audit", "hold", "set"],
    ["audit", "hold", "clear"],
    ["audit", "hold", "list"],
    ["block"],
    ["unblock"],
    ["access"],
    ["contacts"],
    ["contacts", "add"],
    ["contacts", "list"],
    ["contacts", "remove"],
]


def test_every_person_command_is_registered() -> None:
    """The commands of the command-line contract are all reachable from `agentcall`."""
    assert {argv[0] for argv in PERSON_COMMANDS} <= set(COMMANDS)


@pytest.mark.parametrize("argv", PERSON_COMMANDS, ids=" ".join)
def test_help_explains_with_an_example(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """--help exits 0 and shows at least one runnable example of the command."""
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert "example" in out
    assert f"agentcall {argv[0]}" in out.split("example", 1)[1]


def test_block_unblock_and_access_have_their_own_forms(capsys: pytest.CaptureFixture[str]) -> None:
    """One module serves three commands, each with its own arguments."""
    forms = {}
    for name in ("block", "unblock", "access"):
        with pytest.raises(SystemExit):
            main([name, "--help"])
        forms[name] = capsys.readouterr().out
    assert "HANDLE" in forms["block"] and "--default" not in forms["block"]
    assert "HANDLE" in forms["unblock"]
    assert "--default" in forms["access"] and "HANDLE" not in forms["access"].split("\n")[0]


@pytest.mark.slow
def test_help_and_version_load_no_twisted_or_crypto() -> None:
    """Building the whole parser (for help) imports no reactor, Twisted or crypto module."""
    probe = (
        "import sys, contextlib\n"
        "from agentcall.cli.main import main\n"
        "with contextlib.suppress(SystemExit):\n"
        "    main(['call', '--help'])\n"
        "main(['--version'])\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('twisted', 'cryptography', 'nacl', 'autobahn', 'OpenSSL')]\n"
        "print('HEAVY', heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO), "HOME": str(REPO)},
    )
    assert "HEAVY []" in done.stdout


def _subcommands(parser: object) -> set[str]:
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_running_one_command_builds_only_its_parser() -> None:
    """`agentcall call …` (every thin call) pays for one subparser, not one per command; the
    whole list is built only for the top-level help."""
    from agentcall.cli.main import build_parser

    assert _subcommands(build_parser("call")) == {"call"}
    assert _subcommands(build_parser()) == set(COMMANDS)


def test_a_command_s_own_errors_still_name_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["call", "ken"])  # no MESSAGE
    assert exited.value.code == 2
    assert "usage: agentcall call" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("environ", "width"),
    [({"COLUMNS": "60"}, 58), ({"COLUMNS": "200"}, 198), ({"COLUMNS": "x"}, None), ({}, None)],
)
def test_help_wraps_to_the_width_argparse_would_choose(
    environ: dict[str, str], width: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """COLUMNS (less 2) as argparse has it, else the terminal, else 80 - 2; without shutil."""
    import shutil

    from agentcall.cli.main import help_width

    monkeypatch.delenv("COLUMNS", raising=False)
    expected = width if width is not None else shutil.get_terminal_size().columns - 2
    assert help_width(environ) == expected


def test_the_call_help_is_wrapped_to_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "50")
    with pytest.raises(SystemExit):
        main(["call", "--help"])
    lines = capsys.readouterr().out.splitlines()
    options = lines[lines.index("options:") : lines.index("examples:")]  # the epilog is raw
    assert options and max(len(line) for line in options) <= 48
