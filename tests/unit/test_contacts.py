"""contacts.json: adding, listing, removing, resolving call targets, and never losing data."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agentcall.local.contacts import Contact, ContactBook, ContactsError
from agentcall.local.home import Home, PrivateFileError


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home.from_environ({"HOME": str(tmp_path)})


@pytest.fixture
def book(home: Home) -> ContactBook:
    return ContactBook(home)


def read_json(home: Home) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(home.contacts_path.read_bytes())
    return body


def write_json(home: Home, body: object) -> None:
    home.write_private(home.contacts_path, json.dumps(body).encode())


def test_missing_file_is_an_empty_book(book: ContactBook, home: Home) -> None:
    """Before any contact is added there is nothing to list, and no file is made."""
    assert book.list() == []
    assert book.remove("ken") is False
    assert not home.contacts_path.exists()


def test_add_writes_a_private_file(book: ContactBook, home: Home) -> None:
    """The first add creates contacts.json 0600 in the documented shape."""
    book.add("ken", "@acme/ken", note="backend")
    assert os.stat(home.contacts_path).st_mode & 0o777 == 0o600
    assert read_json(home) == {
        "contacts": [{"name": "ken", "address": "@acme/ken", "note": "backend"}]
    }


def test_list_is_sorted_by_name(book: ContactBook) -> None:
    """Contacts come back in name order whatever the order they were added in."""
    book.add("zoe", "@acme/zoe")
    book.add("ann", "@acme/ann")
    book.add("mid", "@acme/mid")
    assert [c.name for c in book.list()] == ["ann", "mid", "zoe"]


def test_names_are_case_insensitive(book: ContactBook) -> None:
    """Ken, KEN and ken are one contact, stored in lower case."""
    book.add("Ken", "@acme/ken")
    book.add("KEN", "@acme/kenneth")
    assert book.list() == [Contact("ken", "@acme/kenneth")]
    assert book.get("kEn") == Contact("ken", "@acme/kenneth")
    assert book.remove("KEN") is True
    assert book.list() == []


def test_update_keeps_the_note_unless_given(book: ContactBook) -> None:
    """Re-adding without a note keeps the old one; with a note replaces it."""
    book.add("ken", "@acme/ken", note="backend lead")
    book.add("ken", "@acme/ken2")
    assert book.get("ken") == Contact("ken", "@acme/ken2", "backend lead")
    book.add("ken", "@acme/ken2", note="now frontend")
    assert book.get("ken") == Contact("ken", "@acme/ken2", "now frontend")


@pytest.mark.parametrize("name", ["", "-ken", "ken@acme", "ke n", "k" * 65, "\u212aen", "Ké"])
def test_bad_names_are_refused(book: ContactBook, name: str) -> None:
    """Names follow CONTACT_NAME_RE (ASCII only, no '@'), and nothing is written."""
    with pytest.raises(ContactsError, match="contact name"):
        book.add(name, "@acme/ken")
    assert book.list() == []


@pytest.mark.parametrize("address", ["ken", "acme/ken", "@Acme/ken", "ken@acme.example", "@a/ken"])
def test_bad_addresses_are_refused(book: ContactBook, address: str) -> None:
    """Only @org/handle is stored."""
    with pytest.raises(ContactsError, match="@org/handle"):
        book.add("ken", address)


@pytest.mark.parametrize("note", ["x" * 201, "bell\x07", "line\nbreak", "esc\x1b[31m"])
def test_bad_notes_are_refused(book: ContactBook, note: str) -> None:
    """Notes are short and free of control characters (they reach the terminal)."""
    with pytest.raises(ContactsError, match="note"):
        book.add("ken", "@acme/ken", note=note)


def test_resolve_full_address_in_own_org(book: ContactBook) -> None:
    """An address in the caller's org is taken literally."""
    assert book.resolve("@acme/ken", "acme") == "@acme/ken"


def test_resolve_refuses_another_org(book: ContactBook) -> None:
    """Calls never cross organisations, and the error says so."""
    with pytest.raises(ContactsError, match="only calls within its own organisation"):
        book.resolve("@globex/ken", "acme")


@pytest.mark.parametrize("target", ["ken@acme", "@acme", "@acme/", "@acme/Ken", "a@b/c"])
def test_resolve_refuses_partial_addresses(book: ContactBook, target: str) -> None:
    """Anything containing '@' must be a complete @org/handle."""
    with pytest.raises(ContactsError, match="not a full address"):
        book.resolve(target, "acme")


def test_resolve_prefers_a_contact_over_a_handle(book: ContactBook) -> None:
    """A bare word that names a contact means that contact, case-insensitively."""
    book.add("boss", "@acme/ken")
    book.add("ann", "@acme/annabel")
    assert book.resolve("boss", "acme") == "@acme/ken"
    assert book.resolve("BOSS", "acme") == "@acme/ken"
    assert book.resolve("ann", "acme") == "@acme/annabel"


def test_resolve_refuses_a_contact_in_another_org(book: ContactBook) -> None:
    """A contact pointing outside the caller's org cannot be called either."""
    book.add("old", "@globex/ken")
    with pytest.raises(ContactsError, match="not yours"):
        book.resolve("old", "acme")


def test_resolve_bare_handle_in_own_org(book: ContactBook) -> None:
    """A bare word that is no contact is a handle in the caller's own org."""
    assert book.resolve("ken", "acme") == "@acme/ken"
    assert book.resolve("Ken", "acme") == "@acme/ken"


@pytest.mark.parametrize("target", ["k", "ken.smith", "-ken", "", "\u212aen"])
def test_resolve_refuses_what_is_neither(book: ContactBook, target: str) -> None:
    """A word that is neither a contact nor a valid handle is an error."""
    with pytest.raises(ContactsError, match="not a contact, a handle or an address"):
        book.resolve(target, "acme")


CORRUPT: list[bytes] = [
    b"",
    b"{",
    b"[]",
    b'{"contacts": {}}',
    b'{"contacts": [{"name": "ken"}]}',
    b'{"contacts": [{"name": "ken", "address": "@acme/ken", "colour": "red"}]}',
    b'{"contacts": [{"name": "ken", "address": "nope"}]}',
    b'{"contacts": [{"name": "ken", "address": "@acme/a1"}, '
    b'{"name": "KEN", "address": "@acme/a2"}]}',
    b'{"contacts": [], "contacts": []}',
]


@pytest.mark.parametrize("data", CORRUPT)
def test_corrupt_file_raises_and_is_never_reset(book: ContactBook, home: Home, data: bytes) -> None:
    """Every operation on a corrupt book fails, naming the file, and the bytes stay."""
    home.write_private(home.contacts_path, data)
    for operation in (
        book.list,
        lambda: book.add("ann", "@acme/ann"),
        lambda: book.remove("ken"),
        lambda: book.resolve("ken", "acme"),
    ):
        with pytest.raises(ContactsError, match=str(home.contacts_path)):
            operation()
    assert home.contacts_path.read_bytes() == data


def test_loose_file_is_refused(book: ContactBook, home: Home) -> None:
    """A contacts.json others can write is not trusted to say who to call."""
    book.add("ken", "@acme/ken")
    os.chmod(home.contacts_path, 0o666)
    with pytest.raises(PrivateFileError, match="chmod 600"):
        book.list()


def test_unknown_top_level_keys_are_preserved(book: ContactBook, home: Home) -> None:
    """Keys a newer version wrote survive an add and a remove by this one."""
    write_json(
        home,
        {
            "groups": {"team": ["ken"]},
            "contacts": [{"name": "ken", "address": "@acme/ken"}],
            "version": 7,
        },
    )
    book.add("ann", "@acme/ann")
    book.remove("ken")
    body = read_json(home)
    assert body["groups"] == {"team": ["ken"]}
    assert body["version"] == 7
    assert body["contacts"] == [{"name": "ann", "address": "@acme/ann"}]


def test_hand_written_mixed_case_names_load(book: ContactBook, home: Home) -> None:
    """A name typed in capitals by hand is read as its lower-case form."""
    write_json(home, {"contacts": [{"name": "Ken", "address": "@acme/ken", "note": None}]})
    assert book.list() == [Contact("ken", "@acme/ken")]
