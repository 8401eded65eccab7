"""The gate in front of the bridge: the bearer token, the public card, an answering agent's
run refused, and no ``Server`` header on any answer. A real Site on memory transports."""

from __future__ import annotations

import ipaddress

import pytest
from twisted.logger import capturedLogs

from agentcall.a2a import gate
from tests.unit.test_a2a_web import PORT, TOKEN, Harness, _answer, _rpc, _send, parse

CARD = "/agents/acme/ken/.well-known/agent-card.json"
KEN = "/agents/acme/ken"
LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


@pytest.fixture
def bridge() -> Harness:
    return Harness()


def _no_token() -> dict[str, str]:
    return {"Authorization": ""}


def test_the_card_needs_no_token(bridge: Harness) -> None:
    answer = bridge.request("GET", CARD, headers=_no_token())
    assert answer.status == 200
    assert answer.json()["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == (
        "Bearer"
    )
    head = bridge.request("HEAD", CARD, headers=_no_token())
    assert head.status == 200
    assert bridge.run_peer.asked == []  # a card costs no /proc walk


def test_a_request_without_the_token_is_401(bridge: Harness) -> None:
    answer = bridge.request("POST", KEN, _rpc("SendMessage", _send()), headers=_no_token())
    assert answer.status == 401
    assert answer.headers["www-authenticate"] == 'Bearer realm="agentcall-a2a"'
    assert answer.headers["content-type"] == "application/json"
    assert "agentcall a2a token" in answer.json()["error"]
    assert bridge.placer.calls == []
    assert TOKEN.encode() not in answer.body


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer " + "W" * 43,  # a wrong token
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer\t{TOKEN}",
        f"Bearer {TOKEN} {TOKEN}",
        f"Bearer {TOKEN},",
        f"Bearer\u00a0{TOKEN}",
        "Bearer",
    ],
)
def test_a_wrong_or_mangled_token_is_401(bridge: Harness, authorization: str) -> None:
    answer = bridge.request(
        "POST", KEN, _rpc("SendMessage", _send()), headers={"Authorization": authorization}
    )
    assert answer.status == 401
    assert 'error="invalid_token"' in answer.headers["www-authenticate"]
    assert bridge.placer.calls == []
    assert TOKEN.encode() not in answer.body


@pytest.mark.parametrize(
    "authorization", [f"Basic {TOKEN}", TOKEN, f"Token {TOKEN}", f"Bearer-{TOKEN}"]
)
def test_another_scheme_is_401_as_missing(bridge: Harness, authorization: str) -> None:
    answer = bridge.request(
        "POST", KEN, _rpc("SendMessage", _send()), headers={"Authorization": authorization}
    )
    assert answer.status == 401
    assert answer.headers["www-authenticate"] == 'Bearer realm="agentcall-a2a"'
    assert bridge.placer.calls == []


def test_space_around_the_value_is_http_s_and_does_not_matter(bridge: Harness) -> None:
    """HTTP strips the space around a header's value before anyone reads it."""
    raw = (
        f"POST {KEN} HTTP/1.0\r\nHost: 127.0.0.1:{PORT}\r\nA2A-Version: 1.0\r\n"
        "Content-Type: application/json\r\n"
        f"Authorization: \t Bearer {TOKEN} \t\r\n"
        "Content-Length: {length}\r\n\r\n"
    )
    body = _rpc("GetTask", {"id": "nope"})
    answer = parse(bridge.open_raw(raw.replace("{length}", str(len(body))).encode() + body))
    assert answer.status == 200
    assert answer.json()["error"]["code"] == -32001


def test_two_authorization_headers_are_401(bridge: Harness) -> None:
    raw = (
        f"POST {KEN} HTTP/1.0\r\nHost: 127.0.0.1:{PORT}\r\nA2A-Version: 1.0\r\n"
        "Content-Type: application/json\r\n"
        f"Authorization: Bearer {TOKEN}\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Length: {length}\r\n\r\n"
    )
    body = _rpc("SendMessage", _send())
    answer = parse(bridge.open_raw(raw.replace("{length}", str(len(body))).encode() + body))
    assert answer.status == 401
    assert bridge.placer.calls == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", KEN),  # the JSON-RPC URL (405 with the token)
        ("GET", "/"),  # no such path (404 with the token)
        ("GET", "/agents/acme/ken/tasks"),
        ("PUT", KEN),  # a method nothing answers (405 with the token)
        ("DELETE", CARD),  # only reading the card is public
        ("POST", CARD),
    ],
)
def test_everything_but_reading_a_card_needs_the_token(
    bridge: Harness, method: str, path: str
) -> None:
    without = bridge.request(method, path, b"{}", headers=_no_token())
    assert without.status == 401
    with_token = bridge.request(method, path, b"{}")
    assert with_token.status in (404, 405)


def test_a_foreign_host_is_refused_before_the_token_is_asked_for(bridge: Harness) -> None:
    answer = bridge.request("GET", KEN, headers=_no_token(), host=f"evil.example:{PORT}")
    assert answer.status == 403
    assert "www-authenticate" not in answer.headers


def test_a_rotated_token_counts_from_the_next_request(bridge: Harness) -> None:
    old = bridge.tokens.token
    bridge.tokens.token = "N" * 43
    refused = bridge.request(
        "POST", KEN, _rpc("GetTask", {"id": "x"}), headers={"Authorization": f"Bearer {old}"}
    )
    assert refused.status == 401
    assert bridge.rpc("GetTask", {"id": "x"})["error"]["code"] == -32001  # the new one


def test_an_unusable_token_file_refuses_all_but_the_card(bridge: Harness) -> None:
    """Fail closed: 503, and the log says why once, not once per request."""
    bridge.tokens.problem = "is accessible by group or others (mode 0644)"
    with capturedLogs() as captured:
        for _ in range(3):
            answer = bridge.request("POST", KEN, _rpc("SendMessage", _send()))
            assert answer.status == 503
            assert "agentcall a2a token --rotate" in answer.json()["error"]
            assert "0644" not in answer.json()["error"]  # details go to the owner's log
    assert bridge.placer.calls == []
    logged = [e for e in captured if e.get("event") == "a2a_token_unusable"]
    assert len(logged) == 1
    assert "/state/a2a.token" in logged[0]["problem"]
    assert bridge.request("GET", CARD).status == 200
    bridge.tokens.problem = None
    assert bridge.rpc("GetTask", {"id": "x"})["error"]["code"] == -32001


# --- an answering agent's run ------------------------------------------------------------------


def test_a_client_of_a_run_is_refused_even_with_the_token(bridge: Harness) -> None:
    bridge.run_peer.runs[40001] = 4242
    with capturedLogs() as captured:
        answer = bridge.request("POST", KEN, _rpc("SendMessage", _send()), client_port=40001)
    assert answer.status == 403
    assert answer.json()["error"] == gate.FROM_A_RUN
    assert bridge.placer.calls == []
    assert bridge.run_peer.asked == [((LOOPBACK, 40001), (LOOPBACK, PORT))]
    assert [e["pid"] for e in captured if e.get("event") == "a2a_refused_run_peer"] == [4242]
    # Any other client with the token is served: its call is placed.
    bridge.open("POST", KEN, _rpc("SendMessage", _send()))
    assert len(bridge.placer.calls) == 1


def test_the_run_check_is_for_token_holders_only(bridge: Harness) -> None:
    """Without the token the answer is 401 and /proc is never walked for it."""
    bridge.run_peer.runs[40001] = 4242
    answer = bridge.request("POST", KEN, b"{}", headers=_no_token(), client_port=40001)
    assert answer.status == 401
    assert bridge.run_peer.asked == []


def test_the_run_check_is_made_once_per_connection(bridge: Harness) -> None:
    body = _rpc("GetTask", {"id": "x"})
    one = (
        f"POST {KEN} HTTP/1.1\r\nHost: 127.0.0.1:{PORT}\r\nA2A-Version: 1.0\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    transport = bridge.open_raw(one + one + one)
    assert transport.value().count(b"HTTP/1.1 200") == 3
    assert len(bridge.run_peer.asked) == 1
    bridge.request("POST", KEN, body)  # a new connection asks again
    assert len(bridge.run_peer.asked) == 2


def test_no_run_peer_finds_none() -> None:
    assert gate.no_run_peer((LOOPBACK, 1), (LOOPBACK, 2)) is None


# --- no Server header ------------------------------------------------------------------------


def _assert_anonymous(raw: bytes) -> None:
    head = raw.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.")
    assert b"\r\nserver:" not in head
    assert b"twisted" not in head


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("GET", CARD, {}, 200),
        ("HEAD", CARD, {}, 200),
        ("POST", KEN, {}, 200),  # a JSON-RPC answer
        ("POST", KEN, {"Authorization": ""}, 401),
        ("POST", KEN, {"Content-Type": "text/plain"}, 415),
        ("GET", "/nowhere", {}, 404),
        ("GET", KEN, {}, 405),
        ("PUT", KEN, {}, 405),
        ("BREW", KEN, {}, 405),
    ],
)
def test_no_answer_names_the_server(
    bridge: Harness, method: str, path: str, headers: dict[str, str], status: int
) -> None:
    transport = bridge.open(method, path, _rpc("GetTask", {"id": "x"}), headers=headers)
    assert parse(transport).status == status
    _assert_anonymous(transport.value())


def test_no_answer_names_the_server_when_refused_or_streaming(bridge: Harness) -> None:
    _assert_anonymous(bridge.open("GET", CARD, host="evil.example:1").value())  # 403
    bridge.run_peer.runs[40001] = 1
    _assert_anonymous(bridge.open("POST", KEN, b"{}", client_port=40001).value())  # 403
    bridge.tokens.problem = "is missing"
    _assert_anonymous(bridge.open("POST", KEN, b"{}").value())  # 503
    bridge.tokens.problem = None
    stream = bridge.open("POST", KEN, _rpc("SendStreamingMessage", _send()))
    bridge.placer.calls[0].done.callback(_answer())
    assert parse(stream).headers["content-type"] == "text/event-stream"
    _assert_anonymous(stream.value())
