"""`agentcall install [--remove] claude|codex`: idempotent, says what it changed, undoes exactly."""

from __future__ import annotations

import json
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from agentcall.cli import install as cli_install
from agentcall.cli.install import InstallDeps, InstallError, install, installed, remove
from agentcall.cli.main import main
from agentcall.install import edits

PROGRAM = ("/opt/py/bin/python", "-m", "agentcall")


class FakeClaude:
    """`claude mcp add-json|remove --scope user agentcall`, editing ~/.claude.json as it does."""

    def __init__(self, config: Path, fail: bool = False) -> None:
        self.config = config
        self.fail = fail
        self.argvs: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.argvs.append(list(argv))
        if self.fail:
            return subprocess.CompletedProcess(argv, 1, "", "Error: something broke\n")
        text = self.config.read_text() if self.config.exists() else None
        entry = json.loads(argv[6]) if argv[2] == "add-json" else None
        self.config.write_text(edits.set_claude_server(text, entry) or "{}\n")
        return subprocess.CompletedProcess(argv, 0, "done\n", "")


def deps_for(home: Path, *, claude: FakeClaude | None = None, **env: str) -> InstallDeps:
    environ = {"HOME": str(home), **env}
    return InstallDeps(
        environ=environ,
        which=lambda name: "/usr/bin/claude" if claude is not None and name == "claude" else None,
        program=PROGRAM,
        run=claude or (lambda argv: pytest.fail(f"ran {argv}")),
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


OWNER_TOML = '# mine\nmodel = "gpt-5"  # keep\n\n[mcp_servers.docs]\ncommand = "d"\n'


def test_codex_install_then_remove_leaves_the_files_as_they_were(home: Path) -> None:
    codex = home / ".codex"
    codex.mkdir()
    (codex / "config.toml").write_text(OWNER_TOML)
    (codex / "AGENTS.md").write_text("# My rules\n")
    deps = deps_for(home, AGENTCALL_HOME=str(home / "state"))

    report = install("codex", deps)
    assert report.changes == (
        f"added the agentcall MCP server in {codex / 'config.toml'}",
        f"added the AgentCall instructions to {codex / 'AGENTS.md'}",
    )
    entry = edits.codex_server((codex / "config.toml").read_text())
    assert entry == edits.codex_entry(PROGRAM, {"AGENTCALL_HOME": str(home / "state")})
    assert (codex / "AGENTS.md").read_text().startswith("# My rules\n\n" + edits.BEGIN)
    record = home / "state" / "installs.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert stat.S_IMODE(record.parent.stat().st_mode) == 0o700

    again = install("codex", deps)
    assert again.changes == () and again.notes == ("already installed: nothing changed",)

    undone = remove("codex", deps)
    assert len(undone.changes) == 2
    assert (codex / "config.toml").read_text() == OWNER_TOML
    assert (codex / "AGENTS.md").read_text() == "# My rules\n"
    assert not record.exists()
    assert remove("codex", deps).notes == (
        "nothing to remove: `agentcall install codex` has not been run here",
    )


def test_codex_home_is_respected_and_what_install_made_goes_with_remove(home: Path) -> None:
    codex_home = home / "elsewhere" / "codex"
    deps = deps_for(home, CODEX_HOME=str(codex_home))
    install("codex", deps)
    assert (codex_home / "config.toml").exists() and (codex_home / "AGENTS.md").exists()
    assert stat.S_IMODE((codex_home / "config.toml").stat().st_mode) == 0o600
    undone = remove("codex", deps)
    assert not codex_home.exists()
    assert undone.changes[-1] == f"removed the directory {codex_home}, which install had created"
    assert (home / "elsewhere").exists()


def test_an_entry_install_replaced_is_put_back(home: Path) -> None:
    codex = home / ".codex"
    codex.mkdir()
    mine = '[mcp_servers.agentcall]\ncommand = "my-own-agentcall"\n'
    (codex / "config.toml").write_text(mine)
    deps = deps_for(home)
    report = install("codex", deps)
    assert report.changes[0].startswith("replaced the agentcall MCP server")
    # A second install must not forget what the first replaced.
    install("codex", deps)
    undone = remove("codex", deps)
    assert (
        undone.changes[0] == f"put back the earlier agentcall MCP server in {codex / 'config.toml'}"
    )
    assert edits.codex_server((codex / "config.toml").read_text()) == {
        "command": "my-own-agentcall"
    }


def test_an_entry_changed_since_install_is_left_alone(home: Path) -> None:
    deps = deps_for(home)
    install("codex", deps)
    config = home / ".codex" / "config.toml"
    config.write_text(str(edits.set_codex_server(config.read_text(), {"command": "edited"})))
    undone = remove("codex", deps)
    assert undone.notes == (
        f"left the agentcall MCP server in {config} as it is: it changed since",
    )
    assert edits.codex_server(config.read_text()) == {"command": "edited"}


def test_an_instructions_file_install_created_is_deleted_unless_written_to(home: Path) -> None:
    deps = deps_for(home)
    install("codex", deps)
    agents = home / ".codex" / "AGENTS.md"
    agents.write_text("# added later by the owner\n\n" + agents.read_text())
    remove("codex", deps)
    # Install wrote the block alone; the owner's lines, blank one included, are theirs.
    assert agents.read_text() == "# added later by the owner\n\n"


def test_a_codex_file_that_is_not_toml_is_refused_untouched(home: Path) -> None:
    (home / ".codex").mkdir()
    config = home / ".codex" / "config.toml"
    config.write_text("model = = 1\n")
    with pytest.raises(InstallError, match="not valid TOML") as caught:
        install("codex", deps_for(home))
    assert caught.value.code == "config_unreadable"
    assert config.read_text() == "model = = 1\n"


def test_claude_without_its_cli_edits_the_user_config(home: Path) -> None:
    (home / ".claude.json").write_text(json.dumps({"numStartups": 2}))
    deps = deps_for(home)
    report = install("claude", deps)
    assert report.changes[0] == (
        f"added the agentcall MCP server in {home / '.claude.json'} (user scope)"
    )
    doc = json.loads((home / ".claude.json").read_text())
    assert doc["numStartups"] == 2
    assert doc["mcpServers"]["agentcall"] == edits.claude_entry(PROGRAM, {})
    assert edits.has_block((home / ".claude" / "CLAUDE.md").read_text())
    remove("claude", deps)
    assert json.loads((home / ".claude.json").read_text()) == {"numStartups": 2}
    assert not (home / ".claude").exists()


def test_claude_with_its_cli_uses_claude_mcp(home: Path) -> None:
    claude = FakeClaude(home / ".claude.json")
    deps = deps_for(home, claude=claude)
    install("claude", deps)
    assert [argv[2] for argv in claude.argvs] == ["add-json"]
    assert claude.argvs[0][3:6] == ["--scope", "user", "agentcall"]
    install("claude", deps)
    assert len(claude.argvs) == 1  # nothing to change, nothing run
    remove("claude", deps)
    assert [argv[2] for argv in claude.argvs] == ["add-json", "remove"]
    assert edits.claude_server((home / ".claude.json").read_text()) is None


def test_claude_config_dir_is_respected(home: Path) -> None:
    config_dir = home / "cc"
    deps = deps_for(home, CLAUDE_CONFIG_DIR=str(config_dir))
    install("claude", deps)
    assert edits.claude_server((config_dir / ".claude.json").read_text()) is not None
    assert edits.has_block((config_dir / "CLAUDE.md").read_text())


def test_a_failing_claude_cli_is_reported(home: Path) -> None:
    deps = deps_for(home, claude=FakeClaude(home / ".claude.json", fail=True))
    with pytest.raises(InstallError, match="`claude mcp add-json` exited 1: Error: something"):
        install("claude", deps)


def test_a_claude_cli_that_writes_elsewhere_is_caught(home: Path) -> None:
    deps = deps_for(home, claude=FakeClaude(home / "other.json"))
    with pytest.raises(InstallError, match="did not leave the expected entry"):
        install("claude", deps)


def test_installed_says_whether_the_server_is_in_place(home: Path, tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    deps = InstallDeps(environ={"HOME": str(home)}, which=lambda _n: None, program=(str(python),))
    assert installed("codex", deps.environ) == (
        False,
        "not installed (run `agentcall install codex`)",
    )
    install("codex", deps)
    ok, line = installed("codex", deps.environ)
    assert ok and line == f"agentcall mcp registered in {home / '.codex' / 'config.toml'}"
    python.unlink()
    ok, line = installed("codex", deps.environ)
    assert not ok and "which is not there" in line
    (home / ".codex" / "config.toml").write_text("")
    assert installed("codex", deps.environ) == (
        False,
        f"the agentcall server is gone from {home / '.codex' / 'config.toml'}",
    )


def test_the_command_prints_its_changes_or_one_json_object(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_install, "DEPS", deps_for(home))
    assert main(["install", "codex"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("added the agentcall MCP server in ")
    assert out[-1] == "restart Codex to pick up the agentcall tools"
    assert main(["install", "codex", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body == {
        "ok": True,
        "agent": "codex",
        "action": "install",
        "changed": False,
        "changes": [],
        "notes": ["already installed: nothing changed"],
    }
    assert main(["install", "--remove", "codex", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["action"] == "remove" and body["changed"] is True


def test_a_failure_is_one_line_and_one_json_object(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / ".claude.json").write_text("[1]")
    monkeypatch.setattr(cli_install, "DEPS", deps_for(home))
    assert main(["install", "claude", "--json"]) == 1
    captured = capsys.readouterr()
    body = json.loads(captured.out)
    assert body["ok"] is False and body["code"] == "config_unreadable"
    assert captured.err.startswith("agentcall: ") and "not a JSON object" in captured.err


def test_an_unknown_agent_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["install", "vim"])
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# --- setup's offer and doctor's line ----------------------------------------------------------


def test_setup_offers_the_install_for_each_agent_it_finds(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentcall.cli.setup_finish import SetupDeps, offer_agent_tools

    found = {"codex": "/usr/bin/codex"}
    deps = SetupDeps(
        make_api=object,
        run=object,
        place=object,
        systemctl=object(),  # type: ignore[arg-type]
        which=found.get,
        environ={"HOME": str(home)},
    )
    assert offer_agent_tools(deps) == [
        "found Codex: `agentcall install codex` lets it call your coworkers' agents itself "
        "(an MCP server and a short instruction)"
    ]
    assert "agentcall install codex" in capsys.readouterr().err
    install("codex", InstallDeps(environ=deps.environ, which=lambda _n: None))
    assert offer_agent_tools(deps) == []


def test_doctor_has_a_line_per_installed_agent(home: Path, tmp_path: Path) -> None:
    from agentcall.cli import doctor_checks as dc

    python = tmp_path / "python"
    python.write_text("")
    doctor = dc.DoctorDeps(
        make_api=lambda _r, _c: None, run_network=object, environ={"HOME": str(home)}
    )
    assert dc.agent_tools(doctor) == []
    install(
        "claude", InstallDeps(environ=doctor.environ, which=lambda _n: None, program=(str(python),))
    )
    (line,) = dc.agent_tools(doctor)
    assert (line.name, line.status) == ("claude tools", dc.OK)
    python.unlink()
    (line,) = dc.agent_tools(doctor)
    assert (line.status, line.hint) == (
        dc.FAIL,
        "run `agentcall install claude` again (or `--remove` it)",
    )
