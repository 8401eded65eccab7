"""Routes, Host checks and Agent Cards of the A2A bridge."""

from __future__ import annotations

import pytest

from agentcall.a2a import cards


def _segments(path: str) -> list[bytes]:
    return [part.encode() for part in path.strip("/").split("/")]


def test_an_agent_and_its_card_are_routed() -> None:
    assert cards.route(_segments("/agents/acme/ken"), "acme") == cards.AgentRoute(
        "@acme/ken", card=False
    )
    assert cards.route(_segments("/agents/acme/ken/"), "acme") == cards.AgentRoute(
        "@acme/ken", card=False
    )
    assert cards.route(
        _segments("/agents/acme/ken/.well-known/agent-card.json"), "acme"
    ) == cards.AgentRoute("@acme/ken", card=True)


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/", "/agents/ORG/HANDLE"),
        ("/.well-known/agent-card.json", "/agents/ORG/HANDLE"),
        ("/agents/acme", "/agents/ORG/HANDLE"),
        ("/other/acme/ken", "/agents/ORG/HANDLE"),
        ("/agents/acme/ken/tasks", "no such path"),
        ("/agents/acme/ken/.well-known/other.json", "no such path"),
        ("/agents/acme/Ken", "not an AgentCall address"),
        ("/agents/a/ken", "not an AgentCall address"),
        ("/agents/acme/k", "not an AgentCall address"),
        ("/agents/other/ken", "outside your organisation"),
    ],
)
def test_other_paths_are_not_agents(path: str, reason: str) -> None:
    where = cards.route(_segments(path), "acme")
    assert isinstance(where, cards.NoRoute)
    assert reason in where.reason


def test_undecodable_segments_are_no_route() -> None:
    assert isinstance(cards.route([b"agents", b"\xff", b"ken"], "acme"), cards.NoRoute)


def test_agent_path() -> None:
    assert cards.agent_path("@acme/ken") == "/agents/acme/ken"


@pytest.mark.parametrize(
    ("header", "shown"),
    [
        ("127.0.0.1:8470", "127.0.0.1:8470"),
        ("localhost:8470", "localhost:8470"),
        ("LOCALHOST:8470", "localhost:8470"),
        ("[::1]:8470", "[::1]:8470"),
        (" 127.0.0.1:8470 ", "127.0.0.1:8470"),
        ("bridge.lan:8470", "bridge.lan:8470"),
    ],
)
def test_local_hosts_are_allowed(header: str, shown: str) -> None:
    assert cards.allowed_host(header, 8470, {"bridge.lan"}) == shown


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "127.0.0.1",  # no port: not what a client of this port sends
        "127.0.0.1:8471",
        "evil.example:8470",  # a rebinding page names its own host
        "127.0.0.1.evil.example:8470",
        "user@127.0.0.1:8470",
        "[::2]:8470",
        "127.0.0.1:8470/x",
    ],
)
def test_other_hosts_are_refused(header: str | None) -> None:
    assert cards.allowed_host(header, 8470, {"bridge.lan"}) is None


def test_the_card_names_its_json_rpc_url() -> None:
    card = cards.agent_card("http://127.0.0.1:8470/", "@acme/ken", "9.9")
    (interface,) = card["supportedInterfaces"]
    assert interface == {
        "url": "http://127.0.0.1:8470/agents/acme/ken",
        "protocolBinding": "JSONRPC",
        "protocolVersion": "1.0",
    }
    assert card["version"] == "9.9"
    assert card["capabilities"] == {"streaming": True, "pushNotifications": False}
    assert "@acme/ken" in card["name"]
    assert "not as instructions" in card["description"]
    assert [skill["id"] for skill in card["skills"]] == ["ask"]


def test_the_sdk_reads_the_card() -> None:
    """The official client parses the card without losing a field it needs."""
    resolver = pytest.importorskip("a2a.client.card_resolver")
    card = cards.agent_card("http://127.0.0.1:8470", "@acme/ken", "1.2.3")
    parsed = resolver.parse_agent_card(card)
    assert parsed.supported_interfaces[0].url == "http://127.0.0.1:8470/agents/acme/ken"
    assert parsed.capabilities.streaming
    assert parsed.skills[0].id == "ask"
    assert list(parsed.default_output_modes) == ["text/plain"]
