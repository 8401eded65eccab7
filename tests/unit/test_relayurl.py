"""Relay URLs: parsing, normalisation, the loopback rule, the origin and the URL builders."""

from __future__ import annotations

import attrs
import pytest

from agentcall import ids
from agentcall.relayurl import InvalidRelayUrl, RelayUrl, is_loopback_host


def test_https_with_port_and_prefix() -> None:
    """Every part of a full https URL is kept, normalised."""
    url = RelayUrl.parse("https://Relay.Acme.TEST:8443/agentcall/")
    assert (url.scheme, url.host, url.port, url.prefix) == (
        "https",
        "relay.acme.test",
        8443,
        "/agentcall",
    )
    assert url.secure
    assert str(url) == "https://relay.acme.test:8443/agentcall"


def test_default_ports_are_filled_in_and_left_out_of_the_origin() -> None:
    """The default port is explicit on the object and omitted from origin and URLs."""
    https = RelayUrl.parse("https://relay.acme.test")
    http = RelayUrl.parse("http://localhost/")
    assert (https.port, https.origin) == (443, "relay.acme.test")
    assert (http.port, http.origin) == (80, "localhost")
    assert https.http("/v1/me") == "https://relay.acme.test/v1/me"


def test_non_default_port_is_part_of_the_origin() -> None:
    """An explicit port, even :443 on http, belongs to the origin."""
    assert RelayUrl.parse("https://relay.acme.test:8443").origin == "relay.acme.test:8443"
    assert RelayUrl.parse("http://127.0.0.1:443").origin == "127.0.0.1:443"
    assert RelayUrl.parse("https://relay.acme.test:443").origin == "relay.acme.test"


@pytest.mark.parametrize(
    "text",
    [
        "https://relay.acme.test",
        "https://relay.acme.test:8443/x",
        "http://127.0.0.1:8765",
        "http://localhost:1",
        "https://10.1.2.3:65535",
    ],
)
def test_origin_matches_the_grammar_envelopes_bind(text: str) -> None:
    """Every accepted URL yields an origin that ids.RELAY_ORIGIN_RE accepts."""
    assert ids.RELAY_ORIGIN_RE.match(RelayUrl.parse(text).origin)


@pytest.mark.parametrize(
    "text",
    [
        "http://127.0.0.1:8765",
        "http://127.9.8.7",
        "http://localhost:8765/prefix",
        "http://LOCALHOST:8765",
    ],
)
def test_plain_http_to_loopback_is_allowed(text: str) -> None:
    """http is fine when the relay is on this machine."""
    assert not RelayUrl.parse(text).secure


@pytest.mark.parametrize(
    "text",
    [
        "http://relay.acme.test",
        "http://10.0.0.1:8765",
        "http://0.0.0.0:8765",
        "http://localhost.evil.test",
        "http://127.0.0.1.nip.io",
        "http://127.1:8765",
        "http://2130706433",
        "http://0x7f.1",
    ],
)
def test_plain_http_to_anything_else_is_refused(text: str) -> None:
    """http to a host that is not (plainly) loopback raises before anything is dialled."""
    with pytest.raises(InvalidRelayUrl):
        RelayUrl.parse(text)


def test_the_loopback_rule_holds_for_directly_built_values() -> None:
    """No RelayUrl with http to a remote host can exist, however it is built."""
    local = RelayUrl.parse("http://127.0.0.1:8765")
    with pytest.raises(InvalidRelayUrl, match="refusing plain http"):
        attrs.evolve(local, host="relay.acme.test")
    with pytest.raises(InvalidRelayUrl):
        RelayUrl("http", "relay.acme.test", 80)


def test_the_refusal_is_also_a_value_error() -> None:
    """Option parsers that catch ValueError report a bad URL as a usage error."""
    with pytest.raises(ValueError, match="https"):
        RelayUrl.parse("http://relay.acme.test")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "relay.acme.test",
        "ftp://relay.acme.test",
        "wss://relay.acme.test",
        "https://",
        "https://user:pw@relay.acme.test",
        "https://token@relay.acme.test",
        "https://relay.acme.test/?role=call",
        "https://relay.acme.test/#frag",
        "https://relay.acme.test:0",
        "https://relay.acme.test:70000",
        "https://relay.acme.test:port",
        "https://relay_acme.test",
        "https://relay.acme.test.",
        "https://-relay.acme.test",
        "https://relay.acme.test/a/../b",
        "https://relay.acme.test/a b",
        "https://relay.acme.test/%2e%2e",
        "https://relay.acme.test//x",
        "https://rélay.acme.test",
        "https://relay.acme.test\n",
        "https://[::1]:8443",
        "http://[::1]:8765",
        "https://300.1.2.3",
    ],
)
def test_malformed_urls_are_refused(text: str) -> None:
    """Anything that is not https://host[:port][/prefix] (or loopback http) is refused."""
    with pytest.raises(InvalidRelayUrl):
        RelayUrl.parse(text)


def test_url_builders_keep_the_prefix_and_switch_schemes() -> None:
    """API and WebSocket URLs sit under the prefix; https becomes wss, http becomes ws."""
    secure = RelayUrl.parse("https://relay.acme.test:8443/relay")
    local = RelayUrl.parse("http://127.0.0.1:8765")
    assert secure.http("/v1/keys/ken") == "https://relay.acme.test:8443/relay/v1/keys/ken"
    assert secure.ws({"role": "listen"}) == "wss://relay.acme.test:8443/relay/v1/ws?role=listen"
    assert local.ws({"role": "call", "to": "ken"}) == "ws://127.0.0.1:8765/v1/ws?role=call&to=ken"
    assert local.ws("") == "ws://127.0.0.1:8765/v1/ws"


def test_query_values_are_encoded() -> None:
    """A query value cannot smuggle another parameter into the URL."""
    url = RelayUrl.parse("https://relay.acme.test")
    assert url.ws({"role": "call", "to": "a&role=listen"}).endswith("to=a%26role%3Dlisten")


def test_api_paths_must_be_absolute() -> None:
    """A relative path is a programming error, not a URL to guess at."""
    with pytest.raises(ValueError, match="starts with '/'"):
        RelayUrl.parse("https://relay.acme.test").http("v1/me")


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.255.0.9", True),
        ("::1", True),
        ("128.0.0.1", False),
        ("::2", False),
        ("localhost.example", False),
        ("example.com", False),
    ],
)
def test_is_loopback_host(host: str, expected: bool) -> None:
    """localhost, 127.0.0.0/8 and ::1 are loopback; nothing else is."""
    assert is_loopback_host(host) is expected
