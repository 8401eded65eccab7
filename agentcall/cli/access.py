"""``agentcall block|unblock HANDLE`` and ``agentcall access``: who may call this agent.

All three edit policy.json through :func:`agentcall.cli.owner.edit_policy`: the existing file is
read with the listener's strict parser first (a file it cannot read is reported, never
replaced), and the result is saved only if every owner and admin assertion still holds. The
running listener reads policy.json for every call, so a change applies to the next call.

``access --offline enabled|disabled`` is the one setting kept at the relay rather than in
policy.json: the relay decides whether to keep a call while this agent is offline or busy, so
the change is sent there at once (the listener need not be running), and ``access`` asks the
relay for it when it shows the policy.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from agentcall import limits

if TYPE_CHECKING:
    from agentcall.listener.policy import Policy

BLOCK_DESCRIPTION = """\
Refuse calls from one person in your organisation. An individual block always wins over the
default and over any other grant. The running listener picks it up on the next call."""

UNBLOCK_DESCRIPTION = """\
Take back a block. With the default `allowed` the person's individual rule is removed; with
the default `blocked` they are explicitly allowed."""

ACCESS_DESCRIPTION = f"""\
Show or change who may call this agent by default, and whether the relay keeps calls for you
while you are offline or busy. Without options, prints the current policy and the offline
delivery setting (asked of the relay). `--default blocked` refuses everyone without an
individual rule; `agentcall unblock HANDLE` then lets one person in.

`--offline enabled` asks the relay to keep calls to you while your listener is offline or
busy, for up to {limits.MAILBOX_TTL_S / 3600:g} hours, sealed (the relay cannot read them);
your listener takes them one at a time when it is back, and admits each exactly like a live
call. `--offline disabled` (the default) makes such calls fail as offline or busy. The
setting is sent to the relay at once; it fails with a clear error when the relay cannot be
reached."""

OFFLINE_ON = (
    "offline delivery: enabled (the relay keeps calls for you while you are offline or busy, "
    f"up to {limits.MAILBOX_TTL_S / 3600:g} h)"
)
OFFLINE_OFF = "offline delivery: disabled (calls while you are offline or busy fail)"


def _handle(text: str) -> str:
    from agentcall import ids

    value = text.lower() if text.isascii() else text
    if value.startswith("@") and "/" in value:
        # Accept a full address of one's own org for convenience; the org is checked in run.
        return value
    if not ids.is_handle(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a handle (e.g. ken)")
    return value


def _add(parser: argparse.ArgumentParser, command: str, description: str, example: str) -> None:
    parser.description = description
    parser.epilog = f"example:\n  {example}"
    parser.set_defaults(access_command=command)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One module serves three commands; the name they were registered under picks the form."""
    command = parser.prog.rsplit(" ", 1)[-1]
    if command == "block":
        _add(parser, "block", BLOCK_DESCRIPTION, "agentcall block mallory")
        parser.add_argument("handle", metavar="HANDLE", type=_handle, help="who to refuse")
    elif command == "unblock":
        _add(parser, "unblock", UNBLOCK_DESCRIPTION, "agentcall unblock mallory")
        parser.add_argument("handle", metavar="HANDLE", type=_handle, help="who to let call again")
    else:
        _add(parser, "access", ACCESS_DESCRIPTION, "agentcall access --default blocked")
        parser.epilog = (
            "examples:\n  agentcall access --default blocked\n"
            "  agentcall access --offline enabled\n  agentcall access"
        )
        parser.add_argument(
            "--default",
            choices=["allowed", "blocked"],
            help="whether callers without an individual rule may call",
        )
        parser.add_argument(
            "--offline",
            choices=["enabled", "disabled"],
            help="whether the relay keeps calls for you while you are offline or busy "
            "(sent to the relay at once)",
        )


def _plain_handle(value: str) -> str:
    """A handle, from a handle or an address in this installation's organisation."""
    from agentcall import ids
    from agentcall.cli.main import CommandError

    if not value.startswith("@"):
        return value
    try:
        address = ids.parse_address(value)
    except ids.AddressError:
        raise CommandError(f"{value!r} is neither a handle nor an address @org/handle") from None
    from agentcall.local.config import NotSetUp, load_config
    from agentcall.local.home import Home, LocalStateError

    try:
        org = load_config(Home.from_environ()).org
    except NotSetUp:
        org = None
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None
    if org is not None and address.org != org:
        raise CommandError(f"{address} is not in your organisation ({org}); give a handle")
    return address.handle


def _describe(policy: Policy) -> str:
    lines = [f"default: {policy.default_access} (callers without an individual rule)"]
    for rule in policy.callers:
        said = str(rule.access or "follows the default")
        if rule.grants:
            said += f"; also gets {', '.join(rule.grants)}"
        lines.append(f"  {rule.handle}: {said}")
    if not policy.callers:
        lines.append("no individual rules")
    return "\n".join(lines)


def _offline_setting(enabled: bool | None) -> bool:
    """Send (``enabled`` given) or read the offline delivery setting at the relay."""
    from agentcall.cli import call as call_cli
    from agentcall.cli.main import CommandError
    from agentcall.cli.render import safe_cell
    from agentcall.client.api import RelayUnreachable
    from agentcall.errors import AgentCallError, ApiError

    _home, config = call_cli.load_installation()
    action = "change" if enabled is not None else "read"

    async def work(reactor: Any) -> bool:
        api = call_cli.relay_api(reactor, config)
        if enabled is None:
            return (await api.whoami()).offline_delivery
        return (await api.set_offline_delivery(enabled)).enabled

    try:
        return call_cli.run_on_reactor(work)
    except RelayUnreachable as exc:
        raise CommandError(
            f"cannot {action} offline delivery: cannot reach the relay ({exc})"
        ) from None
    except ApiError as exc:
        raise CommandError(
            f"cannot {action} offline delivery: the relay refused: {safe_cell(exc.message)} "
            f"({exc.code})"
        ) from None
    except AgentCallError as exc:
        raise CommandError(f"cannot {action} offline delivery: {exc}") from None


def _shown_offline_setting() -> str:
    """The offline delivery line of ``access``; it says why when the relay cannot tell."""
    from agentcall.cli.main import CommandError
    from agentcall.local.config import NotSetUp, load_config
    from agentcall.local.home import Home, LocalStateError

    try:
        load_config(Home.from_environ())
    except (NotSetUp, LocalStateError):
        return "offline delivery: unknown (this installation is not set up)"
    try:
        return OFFLINE_ON if _offline_setting(None) else OFFLINE_OFF
    except CommandError as exc:
        return f"offline delivery: unknown ({exc})"


def run(args: argparse.Namespace) -> int:
    from agentcall.cli import owner
    from agentcall.listener.policy import (
        Access,
        with_caller_access,
        with_default_access,
    )

    command = args.access_command
    if command == "access" and args.default is None and args.offline is None:
        print(_describe(owner.policy_or_fail(owner.home_or_fail(), "show the policy")))
        print(_shown_offline_setting())
        return 0
    if command == "access" and args.offline is not None:
        # The relay first: if it cannot be reached, nothing has changed anywhere.
        enabled = _offline_setting(args.offline == "enabled")
        print(OFFLINE_ON if enabled else OFFLINE_OFF)
        if args.default is None:
            return 0
    handle = "" if command == "access" else _plain_handle(args.handle)
    said: list[str] = []

    def change(policy: Policy, _layers: owner.Layers, _ceiling: object) -> Policy:
        if command == "access":
            said.append(f"default access is now {args.default}")
            return with_default_access(policy, Access(args.default))
        if command == "block":
            said.append(f"blocked {handle}: their calls are refused")
            return with_caller_access(policy, handle, Access.BLOCKED)
        if policy.default_access is Access.ALLOWED:
            said.append(f"unblocked {handle}: they may call you (the default is allowed)")
            return with_caller_access(policy, handle, None)
        said.append(f"unblocked {handle}: explicitly allowed (the default is blocked)")
        return with_caller_access(policy, handle, Access.ALLOWED)

    owner.edit_policy(change)
    print(*said, sep="\n")
    print(owner.APPLIES)
    return 0
