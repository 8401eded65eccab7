"""``agentcall contacts add|list|remove``: short names for coworkers' agents.

Contacts live in contacts.json next to the config; ``agentcall call NAME …`` looks them up.
This module also holds the plain-text table the listing commands share.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

DESCRIPTION = """\
Keep short names for the agents you call, so `agentcall call ken "…"` works.

A contact maps a NAME (letters, digits, '.', '_', '-'; case does not matter) to an address
@org/handle in your organisation. Adding a name that exists updates it (keeping its note
unless --note is given)."""

EPILOG = """\
examples:
  agentcall contacts add ken @acme/ken --note "backend, payments"
  agentcall contacts add ana ana          # a bare handle means @<your org>/ana
  agentcall contacts list --json
  agentcall contacts remove ken"""


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces; cells must already be terminal-safe."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [headers, *rows]
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="contacts_command", metavar="SUBCOMMAND", required=True)
    add = sub.add_parser(
        "add",
        help="Add or update a contact.",
        description="Add a contact, or update the one with this name.",
        epilog="example:\n  agentcall contacts add ken @acme/ken --note 'backend'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add.add_argument("name", metavar="NAME", help="the short name, e.g. ken")
    add.add_argument(
        "target", metavar="TARGET", help="@org/handle, or a handle in your organisation"
    )
    add.add_argument("--note", metavar="TEXT", help="a reminder shown by `contacts list`")
    listing = sub.add_parser(
        "list",
        help="List contacts.",
        description="List contacts, sorted by name.",
        epilog="example:\n  agentcall contacts list --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.add_argument("--json", action="store_true", help="print one JSON object")
    remove = sub.add_parser(
        "remove",
        help="Forget a contact.",
        description="Forget a contact (the agent itself is not affected).",
        epilog="example:\n  agentcall contacts remove ken",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    remove.add_argument("name", metavar="NAME", help="the contact to forget")


def _own_org() -> str | None:
    """The organisation of this installation, or None before setup."""
    from agentcall.local.config import NotSetUp, load_config
    from agentcall.local.home import Home

    try:
        return load_config(Home.from_environ()).org
    except NotSetUp:
        return None


def _address(target: str, own_org: str | None) -> str:
    from agentcall import ids
    from agentcall.cli.main import CommandError

    if "@" not in target:
        if not ids.is_handle(target.lower()):
            raise CommandError(f"{target!r} is neither an address @org/handle nor a handle")
        if own_org is None:
            raise CommandError(
                f"write the full address (@org/{target.lower()}): this installation is not set "
                "up, so its organisation is unknown"
            )
        return ids.format_address(own_org, target.lower())
    try:
        address = ids.parse_address(target)
    except ids.AddressError:
        raise CommandError(f"{target!r} is not an address of the form @org/handle") from None
    if own_org is not None and address.org != own_org:
        raise CommandError(
            f"{address} is in organisation {address.org!r}, not yours ({own_org!r}); "
            "AgentCall only calls within its own organisation"
        )
    return str(address)


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.main import CommandError
    from agentcall.cli.render import safe_cell, safe_json
    from agentcall.local.contacts import ContactBook
    from agentcall.local.home import Home, LocalStateError

    try:
        book = ContactBook(Home.from_environ())
        if args.contacts_command == "add":
            address = _address(args.target, _own_org())
            contact = book.add(args.name, address, args.note)
            print(f"saved contact {contact.name} → {contact.address}")
            return 0
        if args.contacts_command == "remove":
            if not book.remove(args.name):
                raise CommandError(f"there is no contact named {safe_cell(args.name)!r}")
            print(f"removed contact {args.name.lower()}")
            return 0
        contacts = book.list()
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None
    if args.json:
        print(safe_json({"contacts": [contact.to_json() for contact in contacts]}))
        return 0
    if not contacts:
        print(
            "no contacts yet; add one with `agentcall contacts add NAME @org/handle`",
            file=sys.stderr,
        )
        return 0
    rows = [[c.name, c.address, safe_cell(c.note or "")] for c in contacts]
    print(table(["NAME", "ADDRESS", "NOTE"], rows))
    return 0
