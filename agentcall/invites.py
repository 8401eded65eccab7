"""The invite link shared by the relay (which mints it) and the CLI (which redeems it).

``https://relay.example.com/invite/acme#<secret>``: the relay's public URL, the organisation,
and after ``#`` the one-time secret. Browsers never send the fragment to a server, so a link
opened by mistake does not leak the secret into access logs. ``setup --invite`` needs nothing
else to enrol.

No error message or repr here ever contains the secret, nor the link text that holds it.
"""

from __future__ import annotations

import re
import urllib.parse

import attrs

from agentcall import ids
from agentcall.relayurl import InvalidRelayUrl, RelayUrl, is_loopback_host

_PATH_RE = re.compile(r"^(?P<prefix>(?:/[^/]+)*)/invite/(?P<org>[^/]*)$")


class InviteLinkError(ValueError):
    """The text is not a usable invite link."""


class NotAUrlError(InviteLinkError):
    """The text is not an absolute URL with a host."""


class SchemeError(InviteLinkError):
    """The link uses a scheme other than https (or http to this machine)."""


class InsecureHttpError(InviteLinkError):
    """Plain http to another machine would expose the secret and the token that follows it."""


class InvitePathError(InviteLinkError):
    """The path does not end in ``/invite/<org>``."""


class InviteOrgError(InviteLinkError):
    """The organisation in the path is not a valid organisation name."""


class InviteSecretError(InviteLinkError):
    """The secret after ``#`` is missing or is not a well-formed invite secret."""


@attrs.frozen
class InviteLink:
    relay_url: str
    org: str
    secret: str = attrs.field(repr=False)

    def to_url(self) -> str:
        return make_invite_url(self.relay_url, self.org, self.secret)


def make_invite_url(relay_url: str, org: str, secret: str) -> str:
    """The link handed to the invited person: ``<relay_url>/invite/<org>#<secret>``.

    ``relay_url`` is normalised as :class:`~agentcall.relayurl.RelayUrl` does (no
    trailing slash, lowercase host, default port left out); a URL it refuses raises its error.
    """
    base = str(RelayUrl.parse(relay_url))
    if not ids.is_org(org):
        raise InviteOrgError("not a valid organisation name")
    if ids.TOKEN_RE.match(secret) is None:
        raise InviteSecretError("not a well-formed invite secret")
    return f"{base}/invite/{org}#{secret}"


def parse_invite_url(text: str) -> InviteLink:
    """Split an invite link into relay URL, organisation and secret, refusing anything unsafe."""
    parts = _split(text)
    if parts.query:
        raise InvitePathError("an invite link has no query string")
    match = _PATH_RE.match(parts.path)
    if match is None:
        raise InvitePathError("the link's path does not end in /invite/<org>")
    org = match.group("org")
    if not ids.is_org(org):
        raise InviteOrgError("the organisation in the link is not a valid name")
    secret = parts.fragment
    if not secret:
        raise InviteSecretError("the link has no secret after '#'")
    if ids.TOKEN_RE.match(secret) is None:
        raise InviteSecretError("the secret after '#' is not well formed (truncated when copied?)")
    try:
        relay = RelayUrl.parse(f"{parts.scheme}://{parts.netloc}{match.group('prefix')}")
    except InvalidRelayUrl as exc:
        # The text given to RelayUrl stops before the '#', so its message holds no secret.
        raise NotAUrlError(f"the link does not name a usable relay: {exc}") from exc
    return InviteLink(relay_url=str(relay), org=org, secret=secret)


def _split(text: str) -> urllib.parse.SplitResult:
    """Parse and vet scheme and host; messages never quote the text, which may hold a secret."""
    if not isinstance(text, str):
        raise NotAUrlError("expected text")
    text = text.strip()
    if not text or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise NotAUrlError("not a URL (empty, or contains spaces or control characters)")
    try:
        parts = urllib.parse.urlsplit(text)
        host = parts.hostname
        _port = parts.port  # reading it validates the port number
    except ValueError as exc:
        raise NotAUrlError("not a URL (bad host or port)") from exc
    if not parts.scheme or not parts.netloc or not host:
        raise NotAUrlError("not an absolute URL with a host")
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise SchemeError("the link must start with https://")
    if scheme == "http" and not is_loopback_host(host):
        raise InsecureHttpError("plain http is only allowed to this machine (localhost); use https")
    return parts._replace(scheme=scheme)
