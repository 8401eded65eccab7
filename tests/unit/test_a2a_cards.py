"""Routes, Host checks and Agent Cards of the A2A bridge."""

from __future__ import annotations

import asyncio

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


def test_the_card_requires_the_bridge_bearer_token() -> None:
    """A2A 1.0's shape: a named HTTP auth scheme "Bearer", required by the card, no scopes."""
    card = cards.agent_card("http://127.0.0.1:8470", "@acme/ken", "1.2.3")
    (name,) = card["securitySchemes"]
    scheme = card["securitySchemes"][name]
    assert list(scheme) == ["httpAuthSecurityScheme"]
    assert scheme["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert "agentcall a2a token" in scheme["httpAuthSecurityScheme"]["description"]
    assert card["securityRequirements"] == [{"schemes": {name: {"list": []}}}]


def test_the_sdk_sends_the_token_the_card_asks_for() -> None:
    """The official client's AuthInterceptor, given this card and a credential for its
    scheme, puts `Authorization: Bearer TOKEN` on the request."""
    pytest.importorskip("a2a.client")
    from a2a.client import AuthInterceptor, ClientCallContext, CredentialService
    from a2a.client.card_resolver import parse_agent_card
    from a2a.client.interceptors import BeforeArgs

    class OneToken(CredentialService):
        async def get_credentials(
            self, security_scheme_name: str, context: ClientCallContext | None
        ) -> str | None:
            return "tok" if security_scheme_name == "bearer" else None

    card = parse_agent_card(cards.agent_card("http://127.0.0.1:8470", "@acme/ken", "1.2.3"))
    args = BeforeArgs(input=None, method="SendMessage", agent_card=card)
    asyncio.run(AuthInterceptor(OneToken()).before(args))
    assert args.context is not None
    assert args.context.service_parameters == {"Authorization": "Bearer tok"}


@pytest.mark.parametrize(
    ("path", "public"),
    [
        ("/agents/acme/ken/.well-known/agent-card.json", True),
        ("/agents/acme/ken/.well-known/agent-card.json/", True),
        ("/agents/other/ken/.well-known/agent-card.json", True),  # a 404, but a card's path
        ("/agents/acme/ken", False),
        ("/agents/acme/ken/", False),
        ("/agents/acme/ken/.well-known", False),
        ("/agents/acme/ken/agent-card.json", False),
        ("/agents/acme/ken/.well-known/agent-card.json/x", False),
        ("/", False),
    ],
)
def test_which_paths_ask_for_a_card(path: str, public: bool) -> None:
    assert cards.is_card_path(_segments(path)) is public
