"""Who may use the bridge: its bearer token, read from a request's ``Authorization``: pure.

Every request but the public Agent Card must carry ``Authorization: Bearer TOKEN`` with the
token of ``agentcall a2a token`` (:mod:`agentcall.local.a2atoken`). :func:`judge` reads the
header's values as received (HTTP has already stripped the space around a value) and decides;
the token is compared with :func:`hmac.compare_digest`, so how long a wrong guess took says
nothing about how much of it was right. Nothing here ever puts the token, or what was sent,
into a message.

The credentials are read strictly (RFC 6750's ``Bearer`` with one or more spaces, then the
token, then nothing): a tab, a second token, a comma-separated list or two ``Authorization``
headers are refused rather than guessed at, since a lenient reader is where two parsers
disagree.
"""

from __future__ import annotations

import enum
import hmac
import re
from collections.abc import Sequence
from typing import Final

# The name the cards give the scheme, and the scheme itself (RFC 6750).
SCHEME_NAME: Final = "bearer"
SCHEME: Final = "Bearer"
REALM: Final = "agentcall-a2a"
# RFC 6750's b64token after the scheme and at least one space; the scheme is case-insensitive.
_CREDENTIALS: Final = re.compile(r"(?i:bearer) +([A-Za-z0-9._~+/-]+=*)\Z")
# An auth-scheme is an HTTP token (RFC 9110): whatever follows it decides nothing here.
_SCHEME: Final = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]*")
# A value longer than this is no token of ours (ours are 43 characters).
MAX_HEADER_CHARS: Final = 1024


class Verdict(enum.Enum):
    """What a request's ``Authorization`` says."""

    ALLOWED = "allowed"
    # No bearer credentials at all (no header, or another scheme such as Basic).
    MISSING = "missing"
    # Bearer credentials that are not this bridge's token, or not readable as one.
    INVALID = "invalid"


def judge(values: Sequence[bytes] | None, expected: str) -> Verdict:
    """The verdict on a request whose ``Authorization`` headers are ``values``."""
    if not values:
        return Verdict.MISSING
    if len(values) != 1:
        return Verdict.INVALID
    (raw,) = values
    if len(raw) > MAX_HEADER_CHARS:
        return Verdict.INVALID
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return Verdict.INVALID
    scheme = _SCHEME.match(text)
    if scheme is None or scheme[0].lower() != SCHEME_NAME:
        return Verdict.MISSING
    match = _CREDENTIALS.match(text)
    if match is None:
        return Verdict.INVALID
    if hmac.compare_digest(match[1].encode("ascii"), expected.encode("ascii")):
        return Verdict.ALLOWED
    return Verdict.INVALID


def challenge(verdict: Verdict) -> str:
    """The ``WWW-Authenticate`` value of a 401 for ``verdict`` (RFC 6750, section 3)."""
    if verdict is Verdict.INVALID:
        return f'{SCHEME} realm="{REALM}", error="invalid_token"'
    return f'{SCHEME} realm="{REALM}"'


def refusal(verdict: Verdict) -> str:
    """The sentence a refused client reads (never the token, nor what it sent)."""
    if verdict is Verdict.INVALID:
        return (
            "the bearer token is not this bridge's (it may have been rotated); "
            "`agentcall a2a token` prints the current one"
        )
    return (
        "this bridge needs the header `Authorization: Bearer TOKEN`; "
        "`agentcall a2a token` prints the token"
    )
