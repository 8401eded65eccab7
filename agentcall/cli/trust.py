"""``agentcall trust --reset ADDRESS``: forget a pinned identity after checking it out of band.

A peer's identity key is pinned the first time we meet it. When it changes (a reinstall, or an
attack), every call to or from that address stops with a hard error until its owner confirms
the new fingerprint through another channel and this command forgets the old pin.
"""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Forget the identity key pinned for ADDRESS, so the next call pins the key the relay serves then.

Do this only after checking the new fingerprint with its owner through another channel (in
person, on a call): a changed identity key can mean the relay is serving someone else's key."""

EPILOG = """\
example:
  agentcall trust --reset @acme/ken"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reset",
        required=True,
        metavar="ADDRESS",
        help="the @org/handle (or contact name, or handle) whose pin to forget",
    )


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.call import load_installation
    from agentcall.cli.main import CommandError
    from agentcall.crypto.pins import PinBook
    from agentcall.errors import AgentCallError
    from agentcall.local.contacts import ContactBook
    from agentcall.local.statedb import StateDb

    home, config = load_installation()
    try:
        address = ContactBook(home).resolve(args.reset, config.org)
        db = StateDb.open(home)
    except (AgentCallError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    try:
        forgotten = PinBook(db.pins).reset(config.relay_origin, address)
    except AgentCallError as exc:
        raise CommandError(str(exc)) from None
    finally:
        db.close()
    if forgotten:
        print(f"forgot the pinned identity of {address}; the next call pins the key served then")
    else:
        print(f"no identity was pinned for {address}; nothing changed")
    return 0
