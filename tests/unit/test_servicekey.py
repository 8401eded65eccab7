"""The service key as the thin client reads it: only a private file of ours, holding one key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentcall.local import servicekey
from agentcall.local.home import Home


@pytest.fixture
def home(tmp_path: Path) -> Home:
    made = Home.from_environ({"HOME": str(tmp_path)})
    made.ensure()
    return made


def test_the_key_the_service_wrote_is_read_back(home: Home) -> None:
    key = servicekey.make(home.service_key_path)
    assert servicekey.is_key(key) and servicekey.read(home) == key
    assert os.stat(home.service_key_path).st_mode & 0o777 == 0o600


def test_no_key_file_is_file_not_found(home: Home) -> None:
    with pytest.raises(FileNotFoundError):
        servicekey.read(home)


@pytest.mark.parametrize(
    "spoil",
    ["loose mode", "symlink", "not a key", "two keys", "loose directory"],
)
def test_a_key_file_that_cannot_be_trusted_is_not_used(home: Home, spoil: str) -> None:
    path = home.service_key_path
    key = servicekey.make(path)
    if spoil == "loose mode":
        path.chmod(0o644)
    elif spoil == "symlink":
        elsewhere = home.state_dir.parent / "elsewhere.key"
        elsewhere.write_text(key + "\n")
        elsewhere.chmod(0o600)
        path.unlink()
        path.symlink_to(elsewhere)
    elif spoil == "not a key":
        path.write_text("KEY " + key.upper() + "\n")
    elif spoil == "two keys":
        path.write_text(f"{key}\n{key}\n")
    else:
        home.state_dir.chmod(0o755)
    with pytest.raises(servicekey.ServiceKeyError):
        servicekey.read(home)
