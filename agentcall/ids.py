"""Identifier grammar: regexes, address parsing and formatting, id minting.

An address is ``@org/handle``: a registry key, never a locator. The relay to dial comes from
configuration, not from the address, and calls never cross organisations.
"""

from __future__ import annotations

import re

from agentcall.frozen import Frozen

# secrets and uuid are imported by the functions that mint ids: the thin `agentcall call`
# imports this module for its regexes only, and each of the two costs milliseconds to import.

# Anchored with \Z, not $: Python's $ also matches before a trailing newline.
# Lowercase ASCII words joined by single hyphens: no leading, trailing or doubled hyphen, so
# `bob`, `bob-` and `bo--b` cannot be three different people (see docs/security.md).
_HANDLE = r"(?=[a-z0-9-]{2,31}\Z)[a-z0-9]+(?:-[a-z0-9]+)*"
# Organisations keep their old grammar (an existing relay's org must still parse);
# `agentcall relay bootstrap` holds new ones to the handle rule (is_new_org_name).
_ORG = r"[a-z0-9][a-z0-9-]{1,19}"
ORG_RE = re.compile(rf"^{_ORG}\Z")
NEW_ORG_RE = re.compile(r"^(?=[a-z0-9-]{2,20}\Z)[a-z0-9]+(?:-[a-z0-9]+)*\Z")
HANDLE_RE = re.compile(rf"^{_HANDLE}\Z")
TASK_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}\Z")
ADDRESS_RE = re.compile(rf"^@({_ORG})/({_HANDLE})\Z")
HEX32_RE = re.compile(r"^[0-9a-f]{32}\Z")
HEX64_RE = re.compile(r"^[0-9a-f]{64}\Z")
CORRELATION_ID_RE = re.compile(r"^(?!0{32}\Z)[0-9a-f]{32}\Z")
CONTEXT_ID_RE = re.compile(r"^ctx_[A-Za-z0-9_-]{22}\Z")
CALL_ID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z")
FINGERPRINT_RE = re.compile(r"^SHA256:[0-9a-f]{32}\Z")
ROSTER_ID_RE = re.compile(r"^[A-Za-z0-9_-]{16,64}\Z")
# host[:port] of the relay's public URL, lowercased; what envelopes bind as the relay origin.
RELAY_ORIGIN_RE = re.compile(r"^[a-z0-9.-]{1,253}(:[0-9]{1,5})?\Z")
CONTACT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")
# Invite secrets and bearer tokens: 32 random bytes, base64url without padding.
TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{43}\Z")


class AddressError(ValueError):
    """A string is not a valid ``@org/handle`` address."""


class Address(Frozen):
    """``@org/handle``, checked when made (a :class:`~agentcall.frozen.Frozen` value: this
    module is on the thin CLI path, which does not import attrs)."""

    _fields = ("org", "handle")
    __slots__ = _fields
    org: str
    handle: str

    def __init__(self, org: str, handle: str) -> None:
        if not isinstance(org, str) or not ORG_RE.match(org):
            raise AddressError(f"not a valid organisation name: {org!r}")
        if not isinstance(handle, str) or not HANDLE_RE.match(handle):
            raise AddressError(f"not a valid handle: {handle!r}")
        self._set(org=org, handle=handle)

    def __str__(self) -> str:
        return f"@{self.org}/{self.handle}"


def parse_address(text: str) -> Address:
    """Parse ``@org/handle``; anything else raises :class:`AddressError`."""
    match = ADDRESS_RE.match(text)
    if match is None:
        raise AddressError(f"not an address of the form @org/handle: {text!r}")
    return Address(match.group(1), match.group(2))


def format_address(org: str, handle: str) -> str:
    return str(Address(org, handle))


def is_handle(text: str) -> bool:
    return HANDLE_RE.match(text) is not None


def is_org(text: str) -> bool:
    return ORG_RE.match(text) is not None


def is_new_org_name(text: str) -> bool:
    """An organisation name a new relay may take: the handle rule (no hyphen at either end,
    none doubled) within the organisation's 2-20 characters."""
    return NEW_ORG_RE.match(text) is not None


def is_task_id(text: str) -> bool:
    return TASK_RE.match(text) is not None


def mint_hex32() -> str:
    """32 lowercase hex characters (16 random bytes); never all zeros."""
    import secrets

    while True:
        value = secrets.token_hex(16)
        if value != "0" * 32:
            return value


def mint_request_id() -> str:
    return mint_hex32()


def mint_correlation_id() -> str:
    return mint_hex32()


def mint_call_id() -> str:
    import uuid

    return str(uuid.uuid4())


# A mailbox job is named like a call (the relay mints both): the listener runs a delivered job
# through the same pipeline under its job id.
JOB_ID_RE = CALL_ID_RE


def mint_job_id() -> str:
    import uuid

    return str(uuid.uuid4())


def is_job_id(value: object) -> bool:
    return isinstance(value, str) and JOB_ID_RE.match(value) is not None


def mint_token() -> str:
    """A bearer token or invite secret: 32 random bytes as unpadded base64url (43 chars)."""
    import secrets

    return secrets.token_urlsafe(32)


def mint_context_id() -> str:
    import secrets

    return "ctx_" + secrets.token_urlsafe(16)
