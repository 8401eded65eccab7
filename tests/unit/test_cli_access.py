"""`agentcall block|unblock|access`: policy.json edits that never lose the owner's file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from agentcall.cli.main import main
from agentcall.listener.policy import Access, load_policy
from tests.unit.cli_helpers import install, isolate


@pytest.fixture
def policy_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    return isolate(monkeypatch, tmp_path) / ".agentcall" / "policy.json"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def on_disk(path: Path) -> Any:
    return json.loads(path.read_text())


def test_block_writes_a_private_policy_and_says_when_it_applies(
    policy_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first block creates policy.json 0600 with one blocked caller."""
    code, out, _err = run(capsys, "block", "mallory")
    assert code == 0
    assert on_disk(policy_path)["callers"] == {"mallory": {"access": "blocked"}}
    assert stat.S_IMODE(os.stat(policy_path).st_mode) == 0o600
    assert "reads policy.json for every call" in out


def test_unblock_follows_the_default(policy_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With default allowed the rule goes away; with default blocked it becomes allowed."""
    run(capsys, "block", "mallory")
    run(capsys, "unblock", "mallory")
    assert load_policy(policy_path).rule_for("mallory") is None
    run(capsys, "access", "--default", "blocked")
    run(capsys, "unblock", "trent")
    rule = load_policy(policy_path).rule_for("trent")
    assert rule is not None and rule.access is Access.ALLOWED


def test_access_sets_and_shows_the_default(
    policy_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--default changes the default; with no option the current policy is printed."""
    assert run(capsys, "access", "--default", "blocked")[0] == 0
    assert load_policy(policy_path).default_access is Access.BLOCKED
    run(capsys, "block", "eve")
    code, out, _err = run(capsys, "access")
    assert code == 0
    assert "default: blocked" in out and "eve: blocked" in out


def test_a_malformed_policy_is_reported_and_left_alone(
    policy_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A policy the listener cannot read is never overwritten by an edit."""
    policy_path.parent.mkdir(mode=0o700)
    original = b'{"version": 1, "default_access": "maybe"}'
    policy_path.write_bytes(original)
    code, _out, err = run(capsys, "block", "mallory")
    assert code == 1
    assert "default_access" in err and "never overwritten" in err
    assert err.count("\n") == 1
    assert policy_path.read_bytes() == original


def test_an_address_in_your_own_org_is_accepted(
    policy_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """@acme/bob blocks bob for @acme members; another org's address is refused."""
    install(policy_path.parent.parent)
    assert run(capsys, "block", "@acme/bob")[0] == 0
    assert load_policy(policy_path).rule_for("bob") is not None
    code, _out, err = run(capsys, "block", "@globex/bob")
    assert code == 1 and "not in your organisation" in err


@pytest.mark.parametrize(
    "argv", [["block"], ["block", "-bad-"], ["access", "--default", "maybe"], ["unblock"]]
)
def test_usage_errors_exit_two(argv: list[str], policy_path: Path) -> None:
    """A missing or malformed handle, or an unknown default, is a usage error."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert not policy_path.exists()
