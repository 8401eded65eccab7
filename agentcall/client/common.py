"""What every connection to the relay shares: who we are, and why talking to it failed.

:mod:`agentcall.client.api` (the HTTP routes) and :mod:`agentcall.client.ws` (the sockets) both
use these. They live apart from either so that a call placed with kept keys, which needs only a
socket, imports neither Twisted's web client nor (for a plain ``http`` relay) the TLS
libraries' verification: :func:`describe_failure` imports those only when a failure is worded.
The bearer token goes into request headers and nowhere else.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import attrs
from twisted.internet import defer, error
from twisted.python.failure import Failure

from agentcall import __version__, ids
from agentcall.errors import AgentCallError
from agentcall.relayurl import RelayUrl

USER_AGENT = f"agentcall/{__version__}"


class RelayUnreachable(AgentCallError):
    """No answer from the relay: the message says what failed, never with a credential."""


def _hidden(_value: str) -> str:
    return "'<hidden>'"


def _check_token(_inst: object, _attribute: attrs.Attribute[str], value: str) -> None:
    # The message must not echo the value: it is a secret.
    if not isinstance(value, str) or ids.TOKEN_RE.match(value) is None:
        raise ValueError("token: not a valid bearer token")


def _check(
    regex: re.Pattern[str], what: str
) -> Callable[[object, attrs.Attribute[str], str], None]:
    def check(_inst: object, _attribute: attrs.Attribute[str], value: str) -> None:
        if not isinstance(value, str) or regex.match(value) is None:
            raise ValueError(f"not a valid {what}: {value!r}")

    return check


@attrs.frozen
class Credentials:
    """Who we are at the relay. Validated so nothing odd can reach a header line."""

    org: str = attrs.field(validator=_check(ids.ORG_RE, "organisation"))
    handle: str = attrs.field(validator=_check(ids.HANDLE_RE, "handle"))
    token: str = attrs.field(repr=_hidden, validator=_check_token)

    def headers(self) -> dict[bytes, bytes]:
        return {
            b"Authorization": b"Bearer " + self.token.encode("ascii"),
            b"X-AgentCall-Org": self.org.encode("ascii"),
            b"X-AgentCall-Handle": self.handle.encode("ascii"),
        }


def parse_retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` in whole seconds (the form the relay sends), or None for anything else
    (absent, an HTTP date, junk)."""
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 6:
        return None
    return float(int(text))


# --- why a connection failed, in words ----------------------------------------------------------


def _leaves(exc: BaseException) -> list[BaseException]:
    """Twisted wraps transport failures (ResponseNeverReceived and friends); unwrap them."""
    reasons = getattr(exc, "reasons", None)
    if not isinstance(reasons, list) or not reasons:
        return [exc]
    found: list[BaseException] = []
    for reason in reasons:
        inner = reason.value if isinstance(reason, Failure) else reason
        if isinstance(inner, BaseException):
            found.extend(_leaves(inner))
    return found or [exc]


def _ssl_detail(exc: Exception) -> str:
    parts = [
        str(item[2])
        for item in (exc.args[0] if exc.args and isinstance(exc.args[0], list) else [])
        if isinstance(item, tuple) and len(item) == 3 and item[2]
    ]
    return "; ".join(parts) or "handshake failed"


def describe_failure(
    failure: Failure | BaseException, relay_url: RelayUrl, timeout_s: float | None = None
) -> str:
    """A one-line reason why talking to the relay failed, safe to show and to log."""
    # pyOpenSSL and service-identity are needed only to word a failure (and, for an https
    # relay, by the TLS connection itself); a call over plain http never loads them.
    from OpenSSL import SSL
    from service_identity import VerificationError

    value = failure.value if isinstance(failure, Failure) else failure
    top = value if value is not None else Exception()
    leaves = _leaves(top)
    where = relay_url.netloc
    # Most specific first: a TLS verdict explains the connection loss that follows it.
    for exc in leaves:
        if isinstance(exc, VerificationError):
            return f"the TLS certificate of {where} is not valid for {relay_url.host}"
        if isinstance(exc, SSL.Error):
            detail = _ssl_detail(exc)
            if "certificate verify failed" in detail:
                return (
                    f"the TLS certificate of {where} is not trusted ({detail}); "
                    "a private relay needs --ca-file or SSL_CERT_FILE"
                )
            return f"TLS handshake with {where} failed ({detail})"
    for exc in leaves:
        if isinstance(exc, error.ConnectionRefusedError):
            return f"{where} refused the connection"
        if isinstance(exc, error.DNSLookupError):
            return f"cannot resolve {relay_url.host}"
        if isinstance(exc, (defer.TimeoutError, error.TimeoutError, error.TCPTimedOutError)):
            within = f" within {timeout_s:g} s" if timeout_s is not None else ""
            return f"no answer from {where}{within}"
        if isinstance(exc, defer.CancelledError):
            return f"the exchange with {where} was cancelled"
        if isinstance(exc, (error.ConnectionLost, error.ConnectionDone)):
            return f"{where} closed the connection before answering"
        if isinstance(exc, error.ConnectError):
            return f"cannot connect to {where}: {exc.__class__.__name__}"
    return f"cannot talk to {where}: {top.__class__.__name__}"
