"""``agentcall recovery issue|redeem``: an address that survives a lost ``~/.agentcall``.

``issue`` makes an offline recovery key, publishes its public half in this identity's record
(re-signed by the identity key, so whoever pinned the identity trusts it through that) and
shows the key once, as a code, on the terminal; nothing keeps it. Issuing again retires the
previous code. ``redeem`` on a new machine reads the code from the terminal, makes new keys,
and has the relay move the address to them: a new token, the old installation cut off. Peers
who pinned the old identity accept the new one because the recovery key vouches for it, and
are told once; anyone else gets the usual changed-identity refusal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

DESCRIPTION = """\
Make a recovery code for this identity (issue), or reclaim your address with one on a new
machine (redeem). The code is shown once and kept nowhere: write it down and store it offline."""

EPILOG = """\
examples:
  agentcall recovery issue
  agentcall recovery redeem --relay https://relay.acme.example --org acme --handle ken"""

REFUSED = (
    "the relay refused the recovery: the code is wrong, already used, or retired by a newer "
    "one, or the handle has no recovery key (it may have been removed)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentcall.cli.main import add_subcommand

    sub = parser.add_subparsers(dest="recovery_command", metavar="SUBCOMMAND", required=True)
    add_subcommand(
        sub,
        "issue",
        "Show a new recovery code once (on a terminal only).",
        "Make a recovery key, publish its public half with your identity and show the key "
        "once as a code. Only on a terminal, so it never lands in a log. A newer code retires "
        "the older one.",
        "agentcall recovery issue",
    )
    redeem = add_subcommand(
        sub,
        "redeem",
        "Reclaim your address on a new machine with your code.",
        "On a new machine (no ~/.agentcall yet): read the recovery code from the terminal, "
        "make new keys and reclaim the address with a new token. The old installation stops "
        "working. Callers who knew you accept your new key and are told once.",
        "agentcall recovery redeem --relay https://relay.acme.example --org acme --handle ken",
    )
    redeem.add_argument("--relay", required=True, metavar="URL", help="your relay's URL")
    redeem.add_argument("--org", required=True, metavar="ORG", help="your organisation")
    redeem.add_argument("--handle", required=True, metavar="HANDLE", help="your handle")
    redeem.add_argument(
        "--agent", choices=["claude", "codex", "command"], help="which agent answers calls"
    )
    redeem.add_argument(
        "--agent-command", metavar='"CMD ARGS"', help="with --agent command: the program to run"
    )
    redeem.add_argument(
        "--caller-only", action="store_true", help="only place calls; never answer them"
    )
    redeem.add_argument("--ca-file", metavar="FILE", help="trust this CA for a private relay")
    redeem.add_argument(
        "--skip-service", action="store_true", help="do not install the systemd user service"
    )
    redeem.add_argument("--no-verify", action="store_true", help="skip the test call to yourself")


def _on_a_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def run(args: argparse.Namespace) -> int:
    if args.recovery_command == "issue":
        return _issue()
    return _redeem(args)


# --- issue ----------------------------------------------------------------------------------------


def _issue() -> int:
    import time

    from agentcall.cli.call import load_installation, relay_api, run_on_reactor, when
    from agentcall.cli.main import CommandError
    from agentcall.cli.render import safe_cell
    from agentcall.crypto import recovery
    from agentcall.crypto.keys import IdentityKey
    from agentcall.errors import AgentCallError, ApiError
    from agentcall.local.keystore import load_keys, replace_identity_record

    if not _on_a_terminal():
        raise CommandError(
            "recovery issue shows the code only on a terminal (never into a pipe, file or "
            "log); run it in a terminal of your own"
        )
    home, config = load_installation()
    try:
        keys = load_keys(home)
    except AgentCallError as exc:
        raise CommandError(str(exc)) from None
    issued_at = int(time.time())
    key = IdentityKey.generate()
    record = recovery.with_recovery_key(
        keys.identity, keys.identity_record.record, key.public_b64, issued_at
    )

    async def publish(reactor: Any) -> None:
        await relay_api(reactor, config).put_identity_key(record)

    try:
        run_on_reactor(publish)
    except ApiError as exc:
        raise CommandError(
            f"the relay refused the recovery key: {safe_cell(exc.message)} ({exc.code}); "
            "no code was issued"
        ) from None
    except AgentCallError as exc:
        raise CommandError(f"cannot reach the relay: {exc}; no code was issued") from None
    # The relay holds it now: the code works, so it is shown even if saving here fails.
    warning = None
    try:
        replace_identity_record(home, record)
        marker = {"issued_at": issued_at, "recovery_key": key.key_id}
        home.write_private(home.recovery_marker_path, json.dumps(marker).encode() + b"\n")
    except (AgentCallError, OSError) as exc:
        warning = f"could not record it locally ({exc}); `agentcall setup --resume` repairs it"
    code = recovery.encode_code(key.seed_bytes())
    print(
        f"Recovery code for {config.address} (issued {when(issued_at)}):\n\n    {code}\n\n"
        "Write it down and keep it offline. It is shown once and kept nowhere. With it, "
        "`agentcall recovery redeem` reclaims this address on a new machine; anyone holding it "
        "can do the same. Issuing a new code retires this one."
    )
    if warning is not None:
        print(f"agentcall: warning: {warning}", file=sys.stderr)
    return 0


# --- redeem ---------------------------------------------------------------------------------------


def _read_code() -> bytes:
    import getpass

    from agentcall.cli.main import CommandError
    from agentcall.crypto import recovery

    if not sys.stdin.isatty():
        raise CommandError("recovery redeem reads the code from a terminal; run it in one")
    try:
        text = getpass.getpass("recovery code: ")
    except (EOFError, KeyboardInterrupt):
        raise CommandError("no recovery code given") from None
    try:
        return recovery.decode_code(text)
    except recovery.RecoveryCodeInvalid as exc:
        raise CommandError(str(exc)) from None


def _redeem(args: argparse.Namespace) -> int:
    from agentcall import ids
    from agentcall.cli import setup
    from agentcall.cli.main import CommandError
    from agentcall.cli.setup_finish import finish, say
    from agentcall.local.home import Home, LocalStateError
    from agentcall.relayurl import InvalidRelayUrl, RelayUrl

    deps = setup.DEPS or setup._real_deps()
    try:
        home = Home.from_environ(deps.environ)
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None
    if not ids.is_org(args.org) or not ids.is_handle(args.handle):
        raise CommandError("--org and --handle must name an address like @acme/ken", 2)
    if os.path.lexists(home.config_path):
        raise CommandError(
            f"this machine is already set up ({home.config_path} exists); recover on a machine "
            "without one, or set AGENTCALL_HOME to a new directory"
        )
    try:
        relay = RelayUrl.parse(args.relay)
    except InvalidRelayUrl as exc:
        raise CommandError(f"--relay: {exc}") from None
    agent = setup.resolve_agent(args.agent, args.agent_command, args.caller_only, deps.which)
    ca_file = None
    if args.ca_file:
        ca_file = os.path.abspath(os.path.expanduser(args.ca_file))
        if not os.path.isfile(ca_file):
            raise CommandError(f"--ca-file: {ca_file} is not a file")
    seed = _read_code()
    address = ids.format_address(args.org, args.handle)

    async def work(reactor: Any) -> int:
        config, keys = await _reclaim(reactor, home, deps, relay, address, seed, agent, ca_file)
        say(f"recovered {config.address} on {config.relay_url} with new keys")
        return await finish(reactor, args, home, config, keys, deps, agent.executable)

    say(f"recovering {address} at the relay {relay}")
    code: int = deps.run(work)
    return code


async def _reclaim(
    reactor: Any,
    home: Any,
    deps: Any,
    relay: Any,
    address: str,
    seed: bytes,
    agent: Any,
    ca_file: str | None,
) -> tuple[Any, Any]:
    from agentcall import ids
    from agentcall.cli.main import CommandError
    from agentcall.cli.setup import _keys_for, save_enrolment
    from agentcall.crypto import recovery
    from agentcall.crypto.keys import IdentityKey
    from agentcall.errors import AgentCallError, ApiError
    from agentcall.wire.http import RecoverRequest

    try:
        api = deps.make_api(reactor, relay, None, ca_file)
        status = await api.status()
    except AgentCallError as exc:
        raise CommandError(f"cannot reach the relay at {relay}: {exc}") from None
    # Fresh keys, or those an attempt with no answer left (the relay may have taken them).
    keys, fresh = _keys_for(home, status.relay_origin, address, reactor.seconds())
    statement = recovery.make_statement(
        IdentityKey.from_seed(seed),
        status.relay_origin,
        address,
        keys.identity.public_b64,
        int(reactor.seconds()),
    )
    parsed = ids.parse_address(address)
    request = RecoverRequest(
        org=parsed.org,
        handle=parsed.handle,
        identity=keys.identity_record,
        statement=statement,
        agent_kind=agent.kind,
    )
    try:
        registered = await api.recover(request)
    except ApiError:
        if fresh:
            home.keys_path.unlink(missing_ok=True)  # never took effect: the next try is clean
        raise CommandError(REFUSED) from None
    except AgentCallError as exc:
        raise CommandError(
            f"no answer to the recovery ({exc}); run the same command again: it reuses the new "
            "keys it made, which the relay may already hold"
        ) from None
    if registered.address != address:
        raise CommandError(f"the relay answered for {registered.address}, not {address}")
    return save_enrolment(home, relay, registered, agent, ca_file), keys
