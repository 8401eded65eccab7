"""Reading a request's bearer token: what is allowed, what is missing, what is refused."""

from __future__ import annotations

import hmac

import pytest

from agentcall.a2a import auth
from agentcall.a2a.auth import Verdict

TOKEN = "Ab3_-" + "x" * 38  # the alphabet and length of token_urlsafe(32)


@pytest.mark.parametrize(
    "header",
    [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"Bearer   {TOKEN}"],
)
def test_the_token_is_allowed(header: str) -> None:
    """The scheme is case-insensitive and one or more spaces may follow it (RFC 6750)."""
    assert auth.judge([header.encode()], TOKEN) is Verdict.ALLOWED


@pytest.mark.parametrize(
    "values",
    [None, [], [b"Basic dXNlcjpwYXNz"], [b"Digest username=x"], [TOKEN.encode()], [b""]],
    ids=["no header", "empty list", "basic", "digest", "bare token", "empty value"],
)
def test_no_bearer_credentials_is_missing(values: list[bytes] | None) -> None:
    assert auth.judge(values, TOKEN) is Verdict.MISSING


@pytest.mark.parametrize(
    "header",
    [
        "Bearer",  # no token
        "Bearer ",
        f"Bearer\t{TOKEN}",  # a tab is not the space RFC 6750 allows
        f"Bearer {TOKEN} ",  # what follows the token (HTTP strips it; a reader here must not)
        f"Bearer {TOKEN}\t",
        f" Bearer {TOKEN}",
        f"Bearer {TOKEN} extra",
        f"Bearer {TOKEN},Bearer {TOKEN}",
        f"Bearer {TOKEN}x",  # one character more
        f"Bearer {TOKEN[:-1]}",  # one less
        f"Bearer {TOKEN.upper()}",  # the token is case-sensitive
        "Bearer " + "y" * 43,
        f"Bearer\u00a0{TOKEN}",
        f"Bearer {TOKEN}\u200b",
    ],
)
def test_anything_but_the_token_is_invalid(header: str) -> None:
    assert auth.judge([header.encode("utf-8")], TOKEN) is not Verdict.ALLOWED


@pytest.mark.parametrize(
    "header",
    [f"Bearer\t{TOKEN}", f"Bearer {TOKEN} extra", "Bearer " + "y" * 43, "Bearer"],
)
def test_bearer_credentials_that_are_not_the_token_are_invalid(header: str) -> None:
    """Bearer credentials that fail are INVALID (the 401 says invalid_token), not MISSING."""
    assert auth.judge([header.encode()], TOKEN) is Verdict.INVALID


def test_two_authorization_headers_are_invalid_even_if_one_is_right() -> None:
    """Which of the two a proxy would have used is anybody's guess; neither is taken."""
    both = [f"Bearer {TOKEN}".encode(), b"Bearer other"]
    assert auth.judge(both, TOKEN) is Verdict.INVALID
    assert auth.judge(list(reversed(both)), TOKEN) is Verdict.INVALID


def test_non_ascii_and_huge_values_are_invalid() -> None:
    assert auth.judge([b"Bearer \xff" + TOKEN.encode()], TOKEN) is Verdict.INVALID
    huge = b"Bearer " + b"a" * auth.MAX_HEADER_CHARS
    assert auth.judge([huge], TOKEN) is Verdict.INVALID


def test_the_comparison_takes_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The token is compared with hmac.compare_digest, both sides as bytes, and its answer
    is the verdict (not a faster == first)."""
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    assert auth.judge([f"Bearer {TOKEN}".encode()], TOKEN) is Verdict.ALLOWED
    assert auth.judge([b"Bearer " + b"y" * 43], TOKEN) is Verdict.INVALID
    assert seen == [(TOKEN.encode(), TOKEN.encode()), (b"y" * 43, TOKEN.encode())]
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: False)
    assert auth.judge([f"Bearer {TOKEN}".encode()], TOKEN) is Verdict.INVALID


def test_challenges_and_refusals_say_what_to_do_and_never_the_token() -> None:
    assert auth.challenge(Verdict.MISSING) == 'Bearer realm="agentcall-a2a"'
    assert auth.challenge(Verdict.INVALID) == 'Bearer realm="agentcall-a2a", error="invalid_token"'
    for verdict in (Verdict.MISSING, Verdict.INVALID):
        assert "agentcall a2a token" in auth.refusal(verdict)
        assert TOKEN not in auth.refusal(verdict) + auth.challenge(verdict)
