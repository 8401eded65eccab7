"""``agentcall token rotate``: replace this installation's bearer token.

The new token is minted here and written to ``token.next`` (0600) before the relay is asked to
take it, and config.json is rewritten once it has. A run interrupted anywhere in between loses
nothing: the next ``token rotate`` first finds out which of the two tokens the relay accepts and
finishes from there. The relay closes the member's sockets when the token changes; a running
listener re-reads config.json before it reconnects, so it needs no restart. No token is ever
printed.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentcall.local.config import Config
    from agentcall.local.home import Home

DESCRIPTION = """\
Replace this installation's bearer token with a new one; the old one stops working at once.
Rotate when a token may have been exposed (a copied config.json, a backup, a shared screen)."""

EPILOG = """\
examples:
  agentcall token rotate
  agentcall token rotate --json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentcall.cli.main import add_subcommand

    sub = parser.add_subparsers(dest="token_command", metavar="SUBCOMMAND", required=True)
    rotate = add_subcommand(
        sub,
        "rotate",
        "Mint a new token; the old one dies.",
        "Mint a new bearer token and make the relay take it; the old one stops working at "
        "once, every socket opened with it is closed, and a running listener reconnects with "
        "the new one by itself. Calls in progress on this installation end.",
        "agentcall token rotate",
    )
    rotate.add_argument("--json", action="store_true", help="print one JSON object")


def _with_token(config: Config, token: str) -> Config:
    import attrs

    return attrs.evolve(config, token=token)


def _finish(home: Home, token: str) -> None:
    """config.json holds ``token`` (read afresh under the lock, so a `config set` made
    meanwhile is kept); then the pending file goes."""
    from agentcall.local.config import config_lock, load_config, save_config

    with config_lock(home):
        saved = load_config(home, apply_override=False)  # AGENTCALL_RELAY is never saved
        save_config(home, _with_token(saved, token))
    home.pending_token_path.unlink(missing_ok=True)


def _pending(home: Home) -> str | None:
    from agentcall import ids

    try:
        text = home.read_private(home.pending_token_path).decode("ascii", "replace").strip()
    except FileNotFoundError:
        return None
    return text if ids.TOKEN_RE.match(text) else None


def run(args: argparse.Namespace) -> int:
    from agentcall import ids
    from agentcall.cli.call import load_installation, relay_api, run_on_reactor, when
    from agentcall.cli.main import CommandError
    from agentcall.cli.render import safe_cell, safe_json
    from agentcall.client.api import RelayUnreachable
    from agentcall.errors import AgentCallError, ApiError, ApiErrorCode

    home, config = load_installation()
    pending = _pending(home)

    async def work(reactor: Any) -> tuple[str, int | None]:
        if pending is not None:
            # An earlier run stopped after minting: did the relay take that token?
            try:
                await relay_api(reactor, _with_token(config, pending)).whoami()
            except ApiError as exc:
                if exc.code is not ApiErrorCode.UNAUTHORIZED:
                    raise
            else:
                _finish(home, pending)
                return "finished", None
        token = ids.mint_token()
        home.write_private(home.pending_token_path, token.encode("ascii") + b"\n")
        try:
            rotated = await relay_api(reactor, config).rotate_token(token)
        except ApiError:
            home.pending_token_path.unlink(missing_ok=True)  # definitely refused: not taken
            raise
        _finish(home, token)
        return "rotated", rotated.rotated_at

    try:
        outcome, at = run_on_reactor(work)
    except ApiError as exc:
        if exc.code is ApiErrorCode.UNAUTHORIZED:
            raise CommandError(
                "the relay does not accept this installation's token (rotated on another copy "
                "of it, or an admin removed you); ask an organisation admin"
            ) from None
        raise CommandError(f"the relay refused: {safe_cell(exc.message)} ({exc.code})") from None
    except RelayUnreachable as exc:
        raise CommandError(
            f"cannot reach the relay: {exc}; nothing is lost: run `agentcall token rotate` "
            "again and it finishes or retries"
        ) from None
    except AgentCallError as exc:
        raise CommandError(str(exc)) from None
    if args.json:
        print(safe_json({"address": config.address, "outcome": outcome, "rotated_at": at}))
        return 0
    if outcome == "finished":
        print(f"finished an interrupted rotation: {config.address} uses its new token now")
    else:
        print(
            f"rotated the token of {config.address} at {when(at or 0)}: the old one no longer "
            "works; a running listener reconnects with the new one by itself"
        )
    return 0
