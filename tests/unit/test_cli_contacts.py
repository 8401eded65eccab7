"""`agentcall contacts add|list|remove` on a private contacts.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcall.cli.main import main
from tests.unit.cli_helpers import install, isolate


@pytest.fixture
def home_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    return isolate(monkeypatch, tmp_path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["contacts", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_add_list_remove(home_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A contact added shows up in the table and is gone after remove."""
    assert run(capsys, "add", "Ken", "@acme/ken", "--note", "backend")[0] == 0
    code, out, _err = run(capsys, "list")
    assert code == 0
    assert out.splitlines() == ["NAME  ADDRESS    NOTE", "ken   @acme/ken  backend"]
    assert run(capsys, "remove", "KEN")[0] == 0
    assert run(capsys, "list", "--json")[1] == '{"contacts": []}\n'


def test_list_json_is_one_object(home_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json lists every contact, sorted, as one object."""
    run(capsys, "add", "zoe", "@acme/zoe")
    run(capsys, "add", "ann", "@acme/ann", "--note", "ops")
    body = json.loads(run(capsys, "list", "--json")[1])
    assert body == {
        "contacts": [
            {"name": "ann", "address": "@acme/ann", "note": "ops"},
            {"name": "zoe", "address": "@acme/zoe"},
        ]
    }


def test_a_bare_handle_means_your_own_org(
    home_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before setup a handle alone is refused; after it, it becomes @<org>/handle."""
    code, _out, err = run(capsys, "add", "ken", "ken")
    assert code == 1 and "write the full address" in err
    install(home_dir)
    assert run(capsys, "add", "ken", "ken")[0] == 0
    assert "@acme/ken" in run(capsys, "list")[1]


def test_other_orgs_and_bad_input_are_refused(
    home_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another org's address, a malformed address or a control character is one error line."""
    install(home_dir)
    for argv in (
        ["add", "ken", "@globex/ken"],
        ["add", "ken", "@acme"],
        ["add", "ken", "@acme/ken", "--note", "evil\x1b[2J"],
        ["add", "@ken", "@acme/ken"],
    ):
        code, _out, err = run(capsys, *argv)
        assert code == 1, argv
        assert err.count("\n") == 1 and err.startswith("agentcall: ")
    assert run(capsys, "list", "--json")[1] == '{"contacts": []}\n'


def test_removing_an_unknown_contact_fails(
    home_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """remove of a name that is not there exits 1 and says so."""
    code, _out, err = run(capsys, "remove", "nobody")
    assert code == 1 and "no contact named 'nobody'" in err


def test_a_corrupt_book_is_reported_not_reset(
    home_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Adding to a corrupt contacts.json fails and keeps the file as it was."""
    path = home_dir / ".agentcall" / "contacts.json"
    path.parent.mkdir(mode=0o700)
    path.write_text("{not json")
    path.chmod(0o600)
    code, _out, err = run(capsys, "add", "ken", "@acme/ken")
    assert code == 1 and "never reset" in err
    assert path.read_text() == "{not json"
