"""Bearer tokens and invite secrets: the relay keeps only their SHA-256 and compares in constant
time, so a copy of the database cannot be used to call anyone or to enrol."""

from __future__ import annotations

import hashlib
import hmac

from twisted.internet import defer
from twisted.internet.defer import Deferred

from agentcall.relay.store_interface import Member, RelayStore


def hash_secret(secret: str) -> str:
    """The lowercase hex SHA-256 of a secret's UTF-8 bytes (what the database stores)."""
    # surrogatepass: a malformed string from the wire hashes to something that never matches,
    # instead of raising where the caller expects a yes or no.
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def secret_matches(secret: str, stored_hex: str) -> bool:
    """True when ``secret`` hashes to ``stored_hex``; the time taken does not depend on where
    the two digests differ."""
    return hmac.compare_digest(hash_secret(secret).encode("ascii"), stored_hex.encode("ascii"))


def authenticate_headers(store: RelayStore, headers: dict[str, str]) -> Deferred[Member | None]:
    """Bearer token plus org and handle headers → the enrolled member, or None.

    Shared by the WebSocket upgrade and the HTTP API, so both read credentials the same way.
    """
    auth = headers.get("authorization", "")
    org = headers.get("x-agentcall-org", "")
    handle = headers.get("x-agentcall-handle", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token or not org or not handle:
        return defer.succeed(None)
    return store.authenticate(org, handle, token.strip())
