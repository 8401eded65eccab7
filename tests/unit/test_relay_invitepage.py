"""An invite link opened in a browser gets a page with the command, never a bare 404."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentcall.relay.invitepage import CSP, page
from tests.unit.crypto_helpers import NOW
from tests.unit.relay_helpers import MemoryRelay, memory_relay


@pytest.fixture
def relay(tmp_path: Path) -> MemoryRelay:
    return memory_relay(tmp_path, now=NOW)


def test_the_invite_page_shows_the_command_and_lets_only_its_own_script_run(
    relay: MemoryRelay,
) -> None:
    for org in ("acme", "no-such-org"):  # the same page: it does not say which orgs exist
        answer = relay.request("GET", f"/invite/{org}")
        assert answer.status == 200
        assert answer.headers["content-type"] == "text/html; charset=utf-8"
        assert answer.headers["content-security-policy"] == CSP
        assert answer.headers["referrer-policy"] == "no-referrer"
        body = answer.body.decode()
        assert f"invited to {org}" in body and "agentcall setup --invite" in body
    assert "default-src 'none'" in CSP and "unsafe-inline" not in CSP


@pytest.mark.parametrize(
    "path", ["/invite", "/invite/", "/invite/ACME", "/invite/acme/x", "/invite/%3Cb%3E"]
)
def test_anything_else_under_invite_is_404(relay: MemoryRelay, path: str) -> None:
    answer = relay.request("GET", path)
    assert answer.status == 404
    assert b"<" not in answer.body


def test_the_page_escapes_what_it_shows() -> None:
    text = page('a"<b>').decode()
    assert "<b>" not in text.split("<body>")[1].split("<script>")[0]
    assert re.search(r"&lt;b&gt;", text)
