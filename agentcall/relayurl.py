"""Where the relay is: a validated relay URL and the URLs built from it.

A relay URL is ``https://host[:port][/prefix]``, or ``http://`` to a loopback host only. The
loopback rule lives in the value object itself, so a :class:`RelayUrl` that would send a bearer
token in clear across a network cannot exist, and nothing can dial one.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from urllib.parse import SplitResult, urlencode, urlsplit

import attrs

from agentcall import ids
from agentcall.errors import AgentCallError

DEFAULT_PORTS = {"https": 443, "http": 80}
_WS_SCHEMES = {"https": "wss", "http": "ws"}
_LABEL_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
# Path prefixes are kept to characters that need no percent-encoding anywhere they are used.
_PREFIX_SEGMENT_RE = re.compile(r"[A-Za-z0-9._~-]+")


class InvalidRelayUrl(AgentCallError, ValueError):
    """A relay URL is malformed, or would talk in clear to a host that is not loopback."""


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` (written without brackets)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_host(host: str) -> None:
    if not host:
        raise InvalidRelayUrl("the relay URL has no host")
    if ":" in host:
        # The relay origin bound into every envelope is host[:port]; an IPv6 literal cannot be
        # written in that grammar, so refuse it rather than bind an ambiguous origin.
        raise InvalidRelayUrl("IPv6 address literals are not supported; use a host name")
    if host != host.lower():
        raise InvalidRelayUrl(f"host {host!r} must be lowercase")
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL_RE.fullmatch(label) for label in labels):
        raise InvalidRelayUrl(
            f"host {host!r} is not a valid host name (ASCII letters, digits, '-' and '.'; "
            "write international names in their xn-- form)"
        )
    last = labels[-1]
    if last.isdigit() or last.startswith("0x"):
        # Resolvers read "127.1" or "0x7f.1" as IPv4; only the plain dotted quad is accepted,
        # so the loopback rule and certificate checks see the address that will be dialled.
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise InvalidRelayUrl(f"host {host!r} is not a valid IPv4 address") from None


def _check_prefix(prefix: str) -> None:
    if prefix == "":
        return
    segments = prefix.split("/")
    if segments[0] != "" or not all(_PREFIX_SEGMENT_RE.fullmatch(s) for s in segments[1:]):
        raise InvalidRelayUrl(f"path prefix {prefix!r} is not a plain path like /relay")
    if any(s in {".", ".."} for s in segments[1:]):
        raise InvalidRelayUrl(f"path prefix {prefix!r} may not contain . or .. segments")


@attrs.frozen
class RelayUrl:
    """A relay's public URL, normalised: lowercase host, explicit port, prefix without '/'."""

    scheme: str
    host: str
    port: int
    prefix: str = ""

    def __attrs_post_init__(self) -> None:
        if self.scheme not in DEFAULT_PORTS:
            raise InvalidRelayUrl(f"scheme must be https or http, not {self.scheme!r}")
        _check_host(self.host)
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise InvalidRelayUrl("port must be an integer")
        if not 1 <= self.port <= 65535:
            raise InvalidRelayUrl(f"port {self.port} is outside 1..65535")
        _check_prefix(self.prefix)
        if self.scheme == "http" and not is_loopback_host(self.host):
            raise InvalidRelayUrl(
                f"refusing plain http to {self.host}: the relay must use https unless it is "
                "on this machine (localhost, 127.0.0.0/8)"
            )
        if ids.RELAY_ORIGIN_RE.match(self.origin) is None:
            raise InvalidRelayUrl(f"{self.origin!r} cannot be used as a relay origin")

    @classmethod
    def parse(cls, text: str) -> RelayUrl:
        """Parse and validate a relay URL; any problem raises :class:`InvalidRelayUrl`."""
        if not isinstance(text, str) or not text.isascii() or not text.isprintable():
            raise InvalidRelayUrl("the relay URL must be printable ASCII")
        try:
            parts: SplitResult = urlsplit(text.strip())
            port = parts.port
        except ValueError as exc:
            raise InvalidRelayUrl(f"not a valid URL: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise InvalidRelayUrl(
                f"the relay URL must start with https:// (or http:// on loopback): {text!r}"
            )
        if parts.username is not None or parts.password is not None:
            raise InvalidRelayUrl("the relay URL may not carry a user name or password")
        if parts.query or parts.fragment or text.rstrip().endswith(("?", "#")):
            raise InvalidRelayUrl("the relay URL may not carry a query or a fragment")
        if parts.netloc.startswith("[") or (parts.hostname or "").count(":"):
            raise InvalidRelayUrl("IPv6 address literals are not supported; use a host name")
        host = (parts.hostname or "").lower()
        return cls(
            scheme=scheme,
            host=host,
            port=DEFAULT_PORTS[scheme] if port is None else port,
            prefix=parts.path.rstrip("/"),
        )

    @property
    def secure(self) -> bool:
        return self.scheme == "https"

    @property
    def netloc(self) -> str:
        """``host`` or ``host:port``, the port left out when it is the scheme's default."""
        if self.port == DEFAULT_PORTS[self.scheme]:
            return self.host
        return f"{self.host}:{self.port}"

    @property
    def origin(self) -> str:
        """The relay origin that envelopes and key records bind (``ids.RELAY_ORIGIN_RE``)."""
        return self.netloc

    def http(self, path: str) -> str:
        """The URL of an API path such as ``/v1/me`` under this relay."""
        if not path.startswith("/"):
            raise ValueError(f"an API path starts with '/': {path!r}")
        return f"{self.scheme}://{self.netloc}{self.prefix}{path}"

    def ws(self, query: Mapping[str, str] | str = "") -> str:
        """The WebSocket URL (``wss://`` or ``ws://``) of ``/v1/ws`` with a query."""
        text = query if isinstance(query, str) else urlencode(dict(query))
        base = f"{_WS_SCHEMES[self.scheme]}://{self.netloc}{self.prefix}/v1/ws"
        return f"{base}?{text}" if text else base

    def __str__(self) -> str:
        return f"{self.scheme}://{self.netloc}{self.prefix}"
