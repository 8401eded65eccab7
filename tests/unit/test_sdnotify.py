"""systemd's notify protocol over a real datagram socket."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from agentcall.sdnotify import address_of, notify


def test_ready_reaches_the_socket_named_by_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(path))
        assert notify({"READY": "1", "STATUS": "listening"}, {"NOTIFY_SOCKET": str(path)}) is None
        assert manager.recv(4096) == b"READY=1\nSTATUS=listening\n"


def test_an_abstract_name_is_addressed_in_the_abstract_namespace() -> None:
    name = f"agentcall-test-{id(object())}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(b"\0" + name.encode())
        assert notify({"STOPPING": "1"}, {"NOTIFY_SOCKET": "@" + name}) is None
        assert manager.recv(4096) == b"STOPPING=1\n"


def test_without_a_manager_nothing_is_sent_and_nothing_fails(tmp_path: Path) -> None:
    assert notify({"READY": "1"}, {}) is None
    assert notify({"READY": "1"}, {"NOTIFY_SOCKET": ""}) is None
    gone = notify({"READY": "1"}, {"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    assert gone is not None and "cannot notify" in gone
    assert notify({"READY": "1"}, {"NOTIFY_SOCKET": "relative"}) is not None
    assert address_of("@") is None


@pytest.mark.parametrize("state", [{"ready": "1"}, {"READY": "a\nMAINPID=1"}, {"A=B": "1"}])
def test_a_field_that_could_smuggle_another_is_refused(state: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        notify(state, {"NOTIFY_SOCKET": "/nonexistent"})
