"""First start of a relay: create (or upgrade) its database, the organisation, and an admin
invite for the first person.

Running it again is safe: the organisation and every member stay as they are, and a fresh
one-time admin invite is minted each time (the earlier ones keep their own expiry).
"""

from __future__ import annotations

import os

import attrs

from agentcall import ids, limits
from agentcall.db import open_database
from agentcall.errors import StoreError
from agentcall.filetrust import PrivateFileError, prepare_database_file
from agentcall.invites import make_invite_url
from agentcall.relay.store import RELAY_SCHEMA, SqliteRegistry
from agentcall.relayurl import RelayUrl
from agentcall.wire.http import MemberRole

BOOTSTRAP_DESCRIPTION = "first admin (bootstrap)"


@attrs.frozen
class BootstrapResult:
    # The URL carries the one-time secret: shown once on stdout, never in a repr or log.
    invite_url: str = attrs.field(repr=False)
    invite_id: str
    org: str
    org_created: bool
    database_created: bool
    schema_version: int
    upgraded_from: int | None
    expires_at: int


def bootstrap(
    database_path: str | os.PathLike[str], org: str, public_url: str, now: float
) -> BootstrapResult:
    """Make ``database_path`` ready to serve ``org`` at ``public_url``; returns the admin invite.

    A bad organisation name or URL raises ``ValueError`` before the database is touched. A new
    database is created 0600; an existing one that group or others could write (or that is
    someone else's, or a symlink) raises :class:`StoreError` naming the fix.
    """
    if not ids.is_new_org_name(org):
        raise ValueError("not a valid organisation name")
    relay_url = str(RelayUrl.parse(public_url))
    try:
        # 0600 from the start: SQLite would create it (and its -wal) with the umask's mode.
        prepare_database_file(database_path)
    except PrivateFileError as exc:
        raise StoreError(f"relay database {exc}") from None
    opened = open_database(database_path, RELAY_SCHEMA)
    store = SqliteRegistry(opened.connection)
    try:
        org_created = store.ensure_org(org, now)
        secret, info = store.create_invite(
            org,
            created_by=None,
            role=MemberRole.ADMIN,
            expires_in_days=limits.INVITE_DEFAULT_DAYS,
            description=BOOTSTRAP_DESCRIPTION,
            now=now,
        )
    finally:
        store.close()
    return BootstrapResult(
        invite_url=make_invite_url(relay_url, org, secret),
        invite_id=info.id,
        org=org,
        org_created=org_created,
        database_created=opened.created,
        schema_version=opened.schema_version,
        upgraded_from=opened.upgraded_from,
        expires_at=info.expires_at,
    )
