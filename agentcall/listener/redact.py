"""Outbound redaction: credential shapes never leave the callee's machine in a reply or a log.

The agent may read a file holding a key and quote it; the owner's rules ask it not to, but the
answer is not trusted to obey. Every reply, every logged excerpt and every error detail goes
through :func:`redact` before it is sealed, written or cut. Redacting first matters: a key cut
in half no longer has the shape the patterns recognise, and its first half would leak.

``[redacted]`` matches none of the patterns, so redacting twice changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

REDACTED: Final = "[redacted]"

# Exact secrets shorter than this are ignored: redacting every "abc" in a reply would mangle
# innocent text, and a secret that short is not worth protecting this way.
MIN_EXACT_SECRET_CHARS: Final = 16

_SHAPES = re.compile(
    "|".join(
        [
            # OpenAI and Anthropic API keys: sk-..., sk-proj-..., sk-ant-api03-...
            r"\bsk-[A-Za-z0-9_-]{16,}",
            # GitHub personal, OAuth, user-to-server, server-to-server and refresh tokens.
            r"\bgh[pousr]_[A-Za-z0-9]{36,}",
            r"\bgithub_pat_[A-Za-z0-9_]{22,}",
            # AWS access key ids (long-term AKIA, temporary ASIA).
            r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b",
            # JWTs: base64url header (always '{"' -> eyJ), payload, optional signature.
            r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",
        ]
    )
)

# The scheme word stays so the reader can tell what was removed.
_BEARER = re.compile(r"\b(?P<scheme>(?i:bearer))(?P<gap>[ \t]+)[A-Za-z0-9._~+/=-]{16,}")

_PEM_BEGIN = re.compile(r"-----BEGIN (?P<label>[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?)-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
# A real private key block is a few kilobytes; an END further away than this belongs to
# something else, and bounding the search keeps many BEGINs without END from going quadratic.
_PEM_MAX_BLOCK_CHARS = 16_384
# When the END line is missing (the agent quoted a key partially), the body lines that follow
# the BEGIN line still go: base64 lines and the RFC 1421 headers of an encrypted key.
_PEM_BODY_LINE = re.compile(
    r"(?:\r?\n[ \t]*(?:[A-Za-z0-9+/=]{8,}|(?:Proc-Type|DEK-Info|Comment):[^\r\n]*)[ \t]*)*"
)


def _redact_pem(text: str) -> str:
    pieces: list[str] = []
    position = 0
    while True:
        begin = _PEM_BEGIN.search(text, position)
        if begin is None:
            break
        end = _PEM_END.search(text, begin.end(), begin.end() + _PEM_MAX_BLOCK_CHARS)
        if end is not None:
            stop = end.end()
        else:
            body = _PEM_BODY_LINE.match(text, begin.end())
            stop = body.end() if body is not None else begin.end()
        pieces.append(text[position : begin.start()])
        pieces.append(REDACTED)
        position = stop
    pieces.append(text[position:])
    return "".join(pieces)


def _exact(secrets: Iterable[str]) -> re.Pattern[str] | None:
    # Longest first, so a secret that contains another is removed whole.
    usable = sorted(
        {secret for secret in secrets if len(secret) >= MIN_EXACT_SECRET_CHARS},
        key=lambda secret: (-len(secret), secret),
    )
    if not usable:
        return None
    return re.compile("|".join(re.escape(secret) for secret in usable))


def redact(text: str, *, secrets: Iterable[str] = ()) -> str:
    """Replace credential shapes and each exact secret (≥ 16 chars) with ``[redacted]``."""
    exact = _exact(secrets)
    if exact is not None:
        # Before the shapes: a shape match inside a secret would otherwise break it apart and
        # leave the rest of it unmatched.
        text = exact.sub(REDACTED, text)
    text = _redact_pem(text)
    text = _SHAPES.sub(REDACTED, text)
    return _BEARER.sub(lambda m: f"{m['scheme']}{m['gap']}{REDACTED}", text)


def redacted_excerpt(text: str, limit: int, *, secrets: Iterable[str] = ()) -> str:
    """At most ``limit`` characters of ``text``, redacted before it is cut."""
    if limit < 0:
        raise ValueError("limit must not be negative")
    return redact(text, secrets=secrets)[:limit]
