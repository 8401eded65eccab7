"""``agentcall members list|remove|role``: an organisation admin looks after who is in it.

Removing someone (they left, or a laptop was lost) kills their token at once, closes their
sockets (a call in progress ends), withdraws their published keys and ends their mailbox jobs.
Their handle stays reserved, so nobody else can take it and be mistaken for them, until an
admin frees it with ``--release``; whoever enrols with it next has new keys, which every caller
who pinned the old ones is told is a changed identity.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentcall.wire.http import MemberInfo

DESCRIPTION = """\
List the members of your organisation, remove someone who left, or change a member's role
(organisation admins only). An organisation always keeps at least one admin."""

EPILOG = """\
examples:
  agentcall members list
  agentcall members remove ken              # ken's token and keys stop working now
  agentcall members remove ken --release    # also free the handle for someone new
  agentcall members role ann admin"""


def _handle(text: str) -> str:
    """A handle, or an address of the form ``@org/handle`` (its organisation is checked once
    the installation is loaded)."""
    from agentcall import ids

    handle = text
    if text.startswith("@"):
        try:
            handle = ids.parse_address(text).handle
        except ids.AddressError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an address") from None
    if not ids.is_handle(handle):
        raise argparse.ArgumentTypeError(f"{text!r} is not a handle")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentcall.cli.main import add_subcommand

    sub = parser.add_subparsers(dest="members_command", metavar="SUBCOMMAND", required=True)
    listing = add_subcommand(
        sub,
        "list",
        "List the organisation's members.",
        "List every member with their role, status (active, or removed with the handle "
        "still reserved), when they enrolled, and when a socket of theirs last opened or "
        "closed (never whether they are online now).",
        "agentcall members list --json",
    )
    listing.add_argument("--json", action="store_true", help="print one JSON object")
    remove = add_subcommand(
        sub,
        "remove",
        "Remove a member: token, sockets, keys and jobs end now.",
        "Remove a member. Their token stops working at once, their sockets close (a call "
        "in progress ends), their published keys are withdrawn and their queued jobs end "
        "revoked. The handle stays reserved unless --release is given.",
        "agentcall members remove ken",
    )
    remove.add_argument("handle", metavar="HANDLE", type=_handle, help="a handle or @org/handle")
    remove.add_argument(
        "--release",
        action="store_true",
        help="also free the handle (also works on someone removed earlier); a later owner "
        "has new keys, so callers see a changed identity",
    )
    remove.add_argument("--json", action="store_true", help="print one JSON object")
    role = add_subcommand(
        sub,
        "role",
        "Make a member an admin, or an admin a member.",
        "Change a member's role. The organisation's last admin cannot step down.",
        "agentcall members role ann admin",
    )
    role.add_argument("handle", metavar="HANDLE", type=_handle, help="a handle or @org/handle")
    role.add_argument("role", choices=["admin", "member"], help="the new role")
    role.add_argument("--json", action="store_true", help="print one JSON object")


def _when(timestamp: int | None) -> str:
    from agentcall.cli.call import when

    return "never" if timestamp is None else when(timestamp)


def _rows(members: list[MemberInfo]) -> list[list[str]]:
    return [
        [
            info.handle,
            str(info.role),
            str(info.status),
            _when(info.enrolled_at),
            _when(info.last_seen),
            info.removed_by or "-",
        ]
        for info in members
    ]


def _own_handle(text: str, org: str) -> str:
    from agentcall import ids
    from agentcall.cli.main import CommandError

    if not text.startswith("@"):
        return text
    address = ids.parse_address(text)
    if address.org != org:
        raise CommandError(f"{text} is not in your organisation (@{org})")
    return address.handle


def _refusal(exc: Exception, handle: str) -> str:
    from agentcall.cli.render import safe_cell
    from agentcall.errors import ApiError, ApiErrorCode

    if isinstance(exc, ApiError):
        if exc.code is ApiErrorCode.FORBIDDEN:
            return "only an organisation admin may manage members"
        if exc.code is ApiErrorCode.NOT_FOUND and exc.status == 404 and handle:
            return f"no member {handle} in your organisation"
        return f"the relay refused: {safe_cell(exc.message)} ({exc.code})"
    return f"cannot reach the relay: {exc}"


def _said(info: MemberInfo, address: str) -> str:
    from agentcall.wire.http import MemberStatus

    if info.status is MemberStatus.RELEASED:
        return (
            f"removed {address} and released the handle: someone new may enrol with it "
            "(they will have new keys, so callers see a changed identity)"
        )
    return (
        f"removed {address}: their token no longer works, their sockets are closed, their "
        "keys are withdrawn and their queued jobs ended revoked. The handle stays reserved; "
        f"free it with `agentcall members remove {info.handle} --release`"
    )


def run(args: argparse.Namespace) -> int:
    from agentcall import ids
    from agentcall.cli.call import load_installation, relay_api, run_on_reactor
    from agentcall.cli.main import CommandError
    from agentcall.cli.render import safe_json
    from agentcall.client.api import RelayUnreachable
    from agentcall.errors import AgentCallError, ApiError
    from agentcall.wire import codec
    from agentcall.wire.http import MemberRole

    _home, config = load_installation()
    command = args.members_command
    handle = _own_handle(args.handle, config.org) if command != "list" else ""

    async def work(reactor: Any) -> Any:
        api = relay_api(reactor, config)
        if command == "remove":
            return await api.remove_member(handle, release=args.release)
        if command == "role":
            return await api.set_member_role(handle, MemberRole(args.role))
        members: list[MemberInfo] = []
        after = ""
        while True:  # one page at a time, by handle
            page = await api.list_members(after)
            members += page.members
            if page.next_after is None or not page.members:
                return members
            after = page.next_after

    try:
        answer = run_on_reactor(work)
    except (ApiError, RelayUnreachable) as exc:
        shown = ids.format_address(config.org, handle) if handle else ""
        raise CommandError(_refusal(exc, shown)) from None
    except AgentCallError as exc:
        raise CommandError(str(exc)) from None
    if command in ("remove", "role"):
        if args.json:
            print(safe_json(codec.converter.unstructure(answer)))
        elif command == "remove":
            print(_said(answer, ids.format_address(config.org, handle)))
        else:
            print(f"{ids.format_address(config.org, handle)} is now {answer.role}")
        return 0
    if args.json:
        print(safe_json({"members": [codec.converter.unstructure(m) for m in answer]}))
        return 0
    from agentcall.cli.contacts import table

    headers = ["HANDLE", "ROLE", "STATUS", "ENROLLED", "LAST SEEN", "REMOVED BY"]
    print(table(headers, _rows(answer)))
    return 0
