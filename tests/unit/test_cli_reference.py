"""Man pages and completions are made from the parser itself, and are valid for their tools."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agentcall.cli.main import COMMANDS, main
from agentcall.cli.reference import command_tree, completion, man_pages


def test_every_command_and_option_of_the_parser_is_in_its_man_page() -> None:
    pages = man_pages()
    tree = command_tree()
    assert {"agentcall.1", "agentcall-relay.8"} <= set(pages)
    assert {c.path[-1] for c in tree.subcommands} == set(COMMANDS)
    for command in tree.subcommands:
        page = pages[f"agentcall-{command.path[-1]}.1"]
        for node in command.walk():
            assert ".SH " + node.name.upper().replace("-", "\\-") in page
            for option in node.options:
                for flag in option.flags:
                    assert flag.replace("-", "\\-") in page, (node.name, flag)
    assert "\\-\\-members" not in pages["agentcall.1"]  # commands, not made-up flags
    assert "\\-\\-max\\-handshakes" in pages["agentcall-relay.8"]


@pytest.mark.skipif(shutil.which("groff") is None, reason="no groff here")
def test_the_man_pages_render_without_warnings(tmp_path: Path) -> None:
    for name, text in man_pages().items():
        done = subprocess.run(
            ["groff", "-man", "-Tutf8", "-ww", "-z"],
            input=text,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (done.returncode, done.stderr) == (0, ""), name


def _bash_complete(script: str, words: list[str]) -> list[str]:
    program = (
        script
        + f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
        + "_agentcall; printf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    done = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_bash_completes_commands_subcommands_and_options() -> None:
    script = completion("bash")
    assert "members" in _bash_complete(script, ["agentcall", "mem"])
    assert _bash_complete(script, ["agentcall", "members", "re"]) == ["remove"]
    assert "--release" in _bash_complete(script, ["agentcall", "members", "remove", "--re"])
    assert "--json" in _bash_complete(script, ["agentcall", "inspect", "--j"])


def test_zsh_and_fish_scripts_name_every_command() -> None:
    zsh, fish = completion("zsh"), completion("fish")
    assert "bashcompinit" in zsh
    for name in COMMANDS:
        assert f"-a {name} " in fish and f'"{name}")' in zsh
    with pytest.raises(ValueError):
        completion("powershell")


def test_the_completion_command_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == completion("bash")


def test_the_pages_can_be_written_for_packaging(tmp_path: Path) -> None:
    from agentcall.cli import reference

    assert reference.main(["man", str(tmp_path / "man")]) == 0
    assert (tmp_path / "man" / "agentcall-members.1").read_text().startswith(".TH")
    assert reference.main(["nonsense"]) == 2
