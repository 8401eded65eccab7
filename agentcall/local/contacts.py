"""contacts.json: short names for coworkers, and how a call's TARGET becomes an address.

The file is ``{"contacts": [{"name", "address", "note"?}]}``, private (0600). Names are
case-insensitive and stored in lower case. A missing file is an empty book; a corrupt one is an
error and is never reset, because resetting would silently lose the user's contacts. Top-level
keys this version does not know are kept when the book is saved, for newer versions' sake.

Every operation reads the file afresh, so the CLI and the listener never act on a stale copy.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping
from typing import Any

import attrs

from agentcall import ids
from agentcall.errors import MalformedFrame
from agentcall.local.home import Home, LocalStateError
from agentcall.wire import codec

MAX_CONTACTS = 1_000
MAX_NOTE_CHARS = 200
MAX_CONTACTS_BYTES = 1024 * 1024


class ContactsError(LocalStateError):
    """contacts.json is corrupt, or a name, address or call target is not acceptable."""


def normalise_name(name: str) -> str:
    """The stored spelling of a contact name (lower case), or :class:`ContactsError`."""
    # Only ASCII is folded: str.lower() maps some non-ASCII letters (the Kelvin sign) to ASCII
    # ones, which would let a lookalike name stand for a real one.
    folded = name.lower() if isinstance(name, str) and name.isascii() else name
    if not isinstance(folded, str) or ids.CONTACT_NAME_RE.match(folded) is None:
        raise ContactsError(
            f"{name!r} is not a valid contact name (letters, digits, '.', '_', '-'; no '@')"
        )
    return folded


def _check_address(address: str) -> str:
    try:
        ids.parse_address(address)
    except (ids.AddressError, TypeError):
        raise ContactsError(f"{address!r} is not an address of the form @org/handle") from None
    return address


def _check_note(note: str | None) -> str | None:
    if note is None:
        return None
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
        raise ContactsError(f"a note is text of at most {MAX_NOTE_CHARS} characters")
    # Control characters would reach the terminal when the book is listed.
    if any(unicodedata.category(char) in {"Cc", "Cs"} for char in note):
        raise ContactsError("a note may not contain control characters")
    return note


@attrs.frozen
class Contact:
    name: str = attrs.field(converter=normalise_name)
    address: str = attrs.field(converter=_check_address)
    note: str | None = attrs.field(default=None, converter=_check_note)

    def to_json(self) -> dict[str, str]:
        body = {"name": self.name, "address": self.address}
        if self.note is not None:
            body["note"] = self.note
        return body


def _parse(data: bytes, path: str) -> tuple[dict[str, Contact], dict[str, Any]]:
    """The contacts by name, and the other top-level keys to keep as they are."""

    def corrupt(problem: str) -> ContactsError:
        return ContactsError(f"{path}: {problem}; fix or move the file (it is never reset)")

    try:
        raw = codec.parse_json(data, max_bytes=MAX_CONTACTS_BYTES)
    except MalformedFrame as exc:
        raise corrupt(f"not valid JSON ({exc})") from None
    if type(raw) is not dict:
        raise corrupt("expected a JSON object")
    entries = raw.get("contacts", [])
    if type(entries) is not list or len(entries) > MAX_CONTACTS:
        raise corrupt(f"contacts: expected a list of at most {MAX_CONTACTS} entries")
    book: dict[str, Contact] = {}
    for index, entry in enumerate(entries):
        if type(entry) is not dict or not {"name", "address"} <= set(entry) <= {
            "name",
            "address",
            "note",
        }:
            raise corrupt(f"contacts[{index}]: expected name, address and an optional note")
        try:
            contact = Contact(entry["name"], entry["address"], entry.get("note"))
        except ContactsError as exc:
            raise corrupt(f"contacts[{index}]: {exc}") from None
        if contact.name in book:
            raise corrupt(f"contacts[{index}]: the name {contact.name!r} appears twice")
        book[contact.name] = contact
    extra = {key: value for key, value in raw.items() if key != "contacts"}
    return book, extra


class ContactBook:
    """The contacts of one installation, backed by its contacts.json."""

    def __init__(self, home: Home) -> None:
        self._home = home

    @property
    def path(self) -> str:
        return str(self._home.contacts_path)

    def _load(self) -> tuple[dict[str, Contact], dict[str, Any]]:
        try:
            data = self._home.read_private(self._home.contacts_path)
        except FileNotFoundError:
            return {}, {}
        return _parse(data, self.path)

    def _save(self, book: Mapping[str, Contact], extra: Mapping[str, Any]) -> None:
        body = dict(extra)
        body["contacts"] = [book[name].to_json() for name in sorted(book)]
        text = json.dumps(body, indent=2, ensure_ascii=False) + "\n"
        self._home.write_private(self._home.contacts_path, text.encode("utf-8"))

    def list(self) -> list[Contact]:
        """Every contact, sorted by name."""
        book, _extra = self._load()
        return [book[name] for name in sorted(book)]

    def get(self, name: str) -> Contact | None:
        book, _extra = self._load()
        return book.get(normalise_name(name))

    def add(self, name: str, address: str, note: str | None = None) -> Contact:
        """Add a contact, or update the one with this name (keeping its note if none is given)."""
        book, extra = self._load()
        key = normalise_name(name)
        existing = book.get(key)
        if note is None and existing is not None:
            note = existing.note
        contact = Contact(key, address, note)
        if existing is None and len(book) >= MAX_CONTACTS:
            raise ContactsError(f"the contact book is full ({MAX_CONTACTS} contacts)")
        book[key] = contact
        self._save(book, extra)
        return contact

    def remove(self, name: str) -> bool:
        """Forget a contact; False if there was none by that name."""
        book, extra = self._load()
        if book.pop(normalise_name(name), None) is None:
            return False
        self._save(book, extra)
        return True

    def resolve(self, target: str, own_org: str) -> str:
        """The address a call's TARGET means, in the caller's own organisation.

        ``@org/handle`` is taken literally; a bare word is a contact name, else a handle in
        ``own_org``. Calls never cross organisations, so an address elsewhere is refused.
        """
        if "@" in target:
            try:
                address = ids.parse_address(target)
            except ids.AddressError:
                raise ContactsError(
                    f"{target!r} contains '@' but is not a full address like @{own_org}/handle"
                ) from None
            return _in_own_org(str(address), own_org)
        folded = target.lower() if target.isascii() else target
        if ids.CONTACT_NAME_RE.match(folded) is not None:
            contact = self._load()[0].get(folded)
            if contact is not None:
                return _in_own_org(contact.address, own_org)
        if ids.is_handle(folded):
            return ids.format_address(own_org, folded)
        raise ContactsError(
            f"{target!r} is not a contact, a handle or an address (@org/handle); "
            "see `agentcall contacts list`"
        )


def _in_own_org(address: str, own_org: str) -> str:
    org = ids.parse_address(address).org
    if org != own_org:
        raise ContactsError(
            f"{address} is in organisation {org!r}, not yours ({own_org!r}); "
            "AgentCall only calls within its own organisation"
        )
    return address
