"""The invite link: ``<relay>/invite/<org>#<secret>``, made by the relay, read by setup."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall import ids
from agentcall.invites import (
    InsecureHttpError,
    InviteLink,
    InviteLinkError,
    InviteOrgError,
    InvitePathError,
    InviteSecretError,
    NotAUrlError,
    SchemeError,
    make_invite_url,
    parse_invite_url,
)

SECRET = "s3cr3t-_" + "A" * 35  # 43 base64url characters, like ids.mint_token()


def test_make_invite_url_shape() -> None:
    """The relay URL without its trailing slash, /invite/<org>, then '#' and the secret."""
    assert (
        make_invite_url("https://relay.example.com/", "acme", SECRET)
        == f"https://relay.example.com/invite/acme#{SECRET}"
    )


@pytest.mark.parametrize(
    "relay_url",
    [
        "https://relay.example.com",
        "https://relay.example.com:8443",
        "https://example.com/agentcall",
        "http://localhost:8765",
        "http://127.0.0.1:8765",
    ],
)
def test_round_trip(relay_url: str) -> None:
    """Parsing a made link gives back the relay URL (with any path prefix), org and secret."""
    link = parse_invite_url(make_invite_url(relay_url, "acme", SECRET))
    assert link == InviteLink(relay_url=relay_url, org="acme", secret=SECRET)
    assert link.to_url() == make_invite_url(relay_url, "acme", SECRET)


def test_surrounding_whitespace_is_ignored() -> None:
    """A link pasted with a newline still parses."""
    link = parse_invite_url(f"  https://relay.example.com/invite/acme#{SECRET}\n")
    assert link.secret == SECRET


def test_repr_hides_the_secret() -> None:
    """Logging a parsed link cannot leak the secret."""
    link = parse_invite_url(f"https://relay.example.com/invite/acme#{SECRET}")
    assert SECRET not in repr(link)
    assert "acme" in repr(link)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", NotAUrlError),
        ("just words", NotAUrlError),
        (f"relay.example.com/invite/acme#{SECRET}", NotAUrlError),
        (f"https://relay.example.com:99999/invite/acme#{SECRET}", NotAUrlError),
        (f"https://user:pw@relay.example.com/invite/acme#{SECRET}", NotAUrlError),
        (f"https://Relay_Host!/invite/acme#{SECRET}", NotAUrlError),
        (f"ftp://relay.example.com/invite/acme#{SECRET}", SchemeError),
        (f"wss://relay.example.com/invite/acme#{SECRET}", SchemeError),
        (f"http://relay.example.com/invite/acme#{SECRET}", InsecureHttpError),
        (f"http://10.0.0.1/invite/acme#{SECRET}", InsecureHttpError),
        (f"https://relay.example.com/acme#{SECRET}", InvitePathError),
        (f"https://relay.example.com/invite/acme/#{SECRET}", InvitePathError),
        (f"https://relay.example.com/invite/acme?x=1#{SECRET}", InvitePathError),
        (f"https://relay.example.com/invite/#{SECRET}", InviteOrgError),
        (f"https://relay.example.com/invite/ACME#{SECRET}", InviteOrgError),
        (f"https://relay.example.com/invite/a#{SECRET}", InviteOrgError),
        ("https://relay.example.com/invite/acme", InviteSecretError),
        ("https://relay.example.com/invite/acme#", InviteSecretError),
        (f"https://relay.example.com/invite/acme#{SECRET[:-1]}", InviteSecretError),
        (f"https://relay.example.com/invite/acme#{SECRET[:-1]}!", InviteSecretError),
    ],
)
def test_each_problem_has_its_own_error(text: str, error: type[InviteLinkError]) -> None:
    """Every way a link can be wrong raises a distinct ValueError that never quotes the secret."""
    with pytest.raises(error) as exc:
        parse_invite_url(text)
    assert isinstance(exc.value, ValueError)
    assert SECRET[:-1] not in str(exc.value)


@pytest.mark.parametrize(
    ("relay_url", "org", "secret"),
    [
        ("http://relay.example.com", "acme", SECRET),
        ("https://relay.example.com", "Acme", SECRET),
        ("https://relay.example.com", "acme", "short"),
    ],
)
def test_make_refuses_what_parse_would_refuse(relay_url: str, org: str, secret: str) -> None:
    """The relay never mints a link that setup could not read."""
    with pytest.raises(ValueError) as exc:
        make_invite_url(relay_url, org, secret)
    assert SECRET not in str(exc.value)


@given(
    org=st.from_regex(ids.ORG_RE, fullmatch=True),
    secret=st.from_regex(ids.TOKEN_RE, fullmatch=True),
    prefix=st.sampled_from(["", "/relay", "/a/b"]),
)
def test_round_trip_property(org: str, secret: str, prefix: str) -> None:
    """Any valid org and secret survive make -> parse unchanged."""
    relay_url = f"https://relay.example.com{prefix}"
    link = parse_invite_url(make_invite_url(relay_url, org, secret))
    assert (link.relay_url, link.org, link.secret) == (relay_url, org, secret)
