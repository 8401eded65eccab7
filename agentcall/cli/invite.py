"""``agentcall invite create|list|revoke``: an organisation admin lets people in.

An invite is a one-time link that carries the relay URL, the organisation and a secret; the
invited person runs ``agentcall setup --invite LINK --handle HANDLE``. ``create`` prints the
link alone on stdout (so a script can capture it) and its id and expiry on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from agentcall import limits

if TYPE_CHECKING:
    from agentcall.client.api import RelayApi
    from agentcall.local.config import Config
    from agentcall.wire.http import InviteInfo

DESCRIPTION = """\
Create, list and revoke invites to your organisation (organisation admins only).

An invite is a one-time link; whoever has it can enrol one identity, so hand it over the way
you would hand over a password."""

EPILOG = """\
examples:
  agentcall invite create --description "Ken, backend" > ken-invite.txt
  agentcall invite create --role admin --expires-in-days 1
  agentcall invite list
  agentcall invite revoke 3f2a…(the 64-hex id from `invite list`)"""


def _days(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of days") from None
    if not limits.INVITE_MIN_DAYS <= value <= limits.INVITE_MAX_DAYS:
        raise argparse.ArgumentTypeError(
            f"must be {limits.INVITE_MIN_DAYS}..{limits.INVITE_MAX_DAYS} days"
        )
    return value


def _description(text: str) -> str:
    if len(text) > limits.MAX_INVITE_DESCRIPTION_CHARS or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"at most {limits.MAX_INVITE_DESCRIPTION_CHARS} printable characters"
        )
    return text


def _invite_id(text: str) -> str:
    from agentcall import ids

    if ids.HEX64_RE.match(text) is None:
        raise argparse.ArgumentTypeError("an invite id is 64 lowercase hex characters")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentcall.cli.main import add_subcommand

    sub = parser.add_subparsers(dest="invite_command", metavar="SUBCOMMAND", required=True)
    create = add_subcommand(
        sub,
        "create",
        "Mint a one-time invite link.",
        "Mint a one-time invite link. The link is printed alone on stdout; its id and expiry "
        "go to stderr.",
        'agentcall invite create --description "Ken, backend"',
    )
    create.add_argument(
        "--role", choices=["member", "admin"], default="member", help="default: member"
    )
    create.add_argument(
        "--expires-in-days",
        type=_days,
        default=limits.INVITE_DEFAULT_DAYS,
        metavar="N",
        help=f"{limits.INVITE_MIN_DAYS}..{limits.INVITE_MAX_DAYS}, "
        f"default {limits.INVITE_DEFAULT_DAYS}",
    )
    create.add_argument(
        "--description", type=_description, metavar="TEXT", help="who it is for (shown in list)"
    )
    listing = add_subcommand(
        sub,
        "list",
        "List the organisation's invites.",
        "List the organisation's invites with their status (active, used, revoked, expired).",
        "agentcall invite list --json",
    )
    listing.add_argument("--json", action="store_true", help="print one JSON object")
    revoke = add_subcommand(
        sub,
        "revoke",
        "Revoke an unused invite.",
        "Revoke an invite so its link can no longer be used.",
        "agentcall invite revoke ID",
    )
    revoke.add_argument("id", metavar="ID", type=_invite_id, help="the id from `invite list`")


def _when(timestamp: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


def _rows(invites: tuple[InviteInfo, ...]) -> list[list[str]]:
    from agentcall.cli.render import safe_cell

    return [
        [
            info.id,
            str(info.role),
            str(info.status),
            _when(info.expires_at),
            info.created_by or "-",
            info.used_by or "-",
            safe_cell(info.description or ""),
        ]
        for info in invites
    ]


def _api(reactor: Any, config: Config) -> RelayApi:
    from agentcall.client.api import Credentials, RelayApi

    credentials = Credentials(config.org, config.handle, config.token)
    return RelayApi(reactor, config.relay, credentials, config.ca_file)


def _refusal(exc: Exception) -> str:
    from agentcall.cli.render import safe_cell
    from agentcall.errors import ApiError, ApiErrorCode

    if isinstance(exc, ApiError):
        if exc.code is ApiErrorCode.FORBIDDEN:
            return "only an organisation admin may manage invites"
        return f"the relay refused: {safe_cell(exc.message)} ({exc.code})"
    return f"cannot reach the relay: {exc}"


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.call import load_installation, run_on_reactor
    from agentcall.cli.main import CommandError
    from agentcall.cli.render import safe_cell, safe_json
    from agentcall.client.api import RelayUnreachable
    from agentcall.errors import AgentCallError, ApiError
    from agentcall.wire import codec
    from agentcall.wire.http import InviteCreateRequest, MemberRole

    _home, config = load_installation()
    command = args.invite_command

    async def work(reactor: Any) -> Any:
        api = _api(reactor, config)
        if command == "create":
            request = InviteCreateRequest(
                role=MemberRole(args.role),
                expires_in_days=args.expires_in_days,
                description=args.description,
            )
            return await api.create_invite(request)
        if command == "revoke":
            return await api.revoke_invite(args.id)
        return await api.list_invites()

    try:
        answer = run_on_reactor(work)
    except (ApiError, RelayUnreachable) as exc:
        raise CommandError(_refusal(exc)) from None
    except AgentCallError as exc:
        raise CommandError(str(exc)) from None
    if command == "create":
        info = answer.info
        print(safe_cell(answer.invite))
        print(
            f"invite {info.id} ({info.role}) expires {_when(info.expires_at)}; "
            "it works once — hand it over privately",
            file=sys.stderr,
        )
        return 0
    if command == "revoke":
        print(f"revoked invite {answer.id} (status: {answer.status})")
        return 0
    if args.json:
        print(safe_json({"invites": [codec.converter.unstructure(i) for i in answer.invites]}))
        return 0
    if not answer.invites:
        print("no invites; create one with `agentcall invite create`", file=sys.stderr)
        return 0
    from agentcall.cli.contacts import table

    headers = ["ID", "ROLE", "STATUS", "EXPIRES", "CREATED BY", "USED BY", "DESCRIPTION"]
    print(table(headers, _rows(answer.invites)))
    return 0
