"""Benchmark setup: a fresh relay database holding N enrolled identities with published keys.

Seeding goes straight through the synchronous :class:`SqliteRegistry` (invites in batches under
the active invite cap, one registration per invite, real signed identity and encryption
records): it is setup, not the thing measured, and the HTTP path would only make it slower.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from agentcall import ids, limits
from agentcall.client.api import Credentials
from agentcall.crypto import records
from agentcall.crypto.keys import EncryptionKey, IdentityKey
from agentcall.relay.store import open_relay_store
from agentcall.wire.http import MemberRole, SignedEncryptionKeyRecord, SignedIdentityRecord

# Stay below the store's cap on active invites, with room for anything else in the org.
INVITE_BATCH = limits.MAX_ACTIVE_INVITES_PER_ORG - 1
_KEY_VALIDITY_S = 7 * 86_400


@attrs.define(repr=False)
class Identity:
    """One enrolled identity: its credentials and the key material behind its records."""

    org: str
    handle: str
    token: str
    identity: IdentityKey
    encryption: EncryptionKey
    identity_record: SignedIdentityRecord
    encryption_record: SignedEncryptionKeyRecord

    def __repr__(self) -> str:  # never show the token or keys
        return f"<Identity @{self.org}/{self.handle}>"

    @property
    def address(self) -> str:
        return ids.format_address(self.org, self.handle)

    @property
    def credentials(self) -> Credentials:
        return Credentials(org=self.org, handle=self.handle, token=self.token)


def seed_identities(
    database: Path, org: str, relay_origin: str, handles: Sequence[str]
) -> list[Identity]:
    """Create ``database`` (if needed), ``org``, and one enrolled identity per handle."""
    store = open_relay_store(database).registry
    enrolled: list[Identity] = []
    try:
        store.ensure_org(org, time.time())
        for start in range(0, len(handles), INVITE_BATCH):
            batch = handles[start : start + INVITE_BATCH]
            now = time.time()
            secrets = [
                store.create_invite(
                    org,
                    created_by=None,
                    role=MemberRole.MEMBER,
                    expires_in_days=limits.INVITE_MIN_DAYS,
                    description="bench",
                    now=now,
                )[0]
                for _ in batch
            ]
            for handle, secret in zip(batch, secrets, strict=True):
                _member, token = store.register(org, secret, handle, None, now)
                identity = _with_keys(org, handle, token, relay_origin)
                store.publish_identity(org, handle, identity.identity_record, now)
                store.publish_encryption(org, handle, identity.encryption_record, now)
                enrolled.append(identity)
    finally:
        store.close()
    return enrolled


def _with_keys(org: str, handle: str, token: str, relay_origin: str) -> Identity:
    identity_key = IdentityKey.generate()
    encryption_key = EncryptionKey.generate()
    address = ids.format_address(org, handle)
    now = int(time.time())
    identity_record = records.make_identity_record(identity_key, relay_origin, address)
    encryption_record = records.make_encryption_record(
        identity_key,
        encryption_key,
        relay_origin,
        address,
        epoch=1,
        not_before=now - 60,
        not_after=now + _KEY_VALIDITY_S,
        previous=None,
    )
    return Identity(
        org=org,
        handle=handle,
        token=token,
        identity=identity_key,
        encryption=encryption_key,
        identity_record=identity_record,
        encryption_record=encryption_record,
    )
