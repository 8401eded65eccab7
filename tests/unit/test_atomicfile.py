"""Replacing a file in one step: the mode, the exclusive variant, and nothing left behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agentcall.atomicfile import replace_file


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_replaces_the_contents_and_leaves_only_the_target(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    target.write_bytes(b"old")
    replace_file(target, b"new")
    assert target.read_bytes() == b"new"
    assert mode_of(target) == 0o600
    assert os.listdir(tmp_path) == ["config.json"]


@pytest.mark.parametrize("durable", [True, False])
def test_the_mode_asked_for(tmp_path: Path, durable: bool) -> None:
    target = tmp_path / "unit.service"
    replace_file(target, b"[Unit]\n", mode=0o644, durable=durable)
    assert mode_of(target) == 0o644
    assert target.read_bytes() == b"[Unit]\n"


def test_exclusive_never_replaces_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "keys.json"
    replace_file(target, b"first", exclusive=True)
    with pytest.raises(FileExistsError):
        replace_file(target, b"second", exclusive=True)
    assert target.read_bytes() == b"first"
    assert os.listdir(tmp_path) == ["keys.json"]


def test_a_missing_directory_is_an_error_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        replace_file(tmp_path / "nope" / "policy.json", b"{}")
    assert os.listdir(tmp_path) == []
