"""``agentcall relay …``: commands for the person who runs a relay."""

from __future__ import annotations

import argparse
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="relay_command", metavar="SUBCOMMAND", required=True)
    boot = sub.add_parser(
        "bootstrap",
        help="Create the relay database and organisation if missing; print an admin invite.",
        description=(
            "Create (or upgrade) the relay's SQLite database and the organisation if they are "
            "missing, then print a fresh one-time admin invite on stdout. Hand the invite to the "
            "first administrator, who enrols with `agentcall setup --invite INVITE`. Running it "
            "again mints another admin invite; existing data is kept."
        ),
    )
    boot.add_argument("--database", required=True, metavar="FILE", help="SQLite file of the relay.")
    boot.add_argument("--org", required=True, metavar="ORG", help="Organisation name, e.g. acme.")
    boot.add_argument(
        "--url",
        required=True,
        metavar="PUBLIC_URL",
        help="The URL clients will use to reach the relay (the invite carries it).",
    )
    backup = sub.add_parser(
        "backup",
        help="Copy the relay database consistently, while the relay runs.",
        description=(
            "Copy the relay's SQLite database with SQLite's online backup API: one consistent "
            "state even while the relay writes. The copy is 0600 (it holds every token hash), "
            "written beside OUTPUT and renamed into place only once whole and checked, and "
            "never overwrites a file. To restore: stop the relay, put the copy at --database "
            "(0600, owned by the relay's user), start the relay."
        ),
        epilog="example:\n  agentcall relay backup --database /var/lib/agentcall/relay.sqlite "
        "--output /var/backups/relay-$(date +%F).sqlite",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    backup.add_argument("--database", required=True, metavar="FILE", help="the relay's database")
    backup.add_argument("--output", required=True, metavar="FILE", help="a new file for the copy")


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.main import CommandError
    from agentcall.errors import AgentCallError

    if args.relay_command == "bootstrap":
        from agentcall import ids
        from agentcall.relay.bootstrap import bootstrap
        from agentcall.relayurl import RelayUrl

        if not ids.is_new_org_name(args.org):
            raise CommandError(
                f"--org {args.org!r} is not a valid organisation name (2-20 characters: "
                "lowercase letters, digits and single hyphens between them, not at either end)"
            )
        try:
            RelayUrl.parse(args.url)
        except ValueError as exc:
            raise CommandError(f"--url: {exc}") from exc
        try:
            result = bootstrap(args.database, args.org, args.url, time.time())
        except AgentCallError as exc:
            raise CommandError(str(exc)) from exc
        print(result.invite_url)
        return 0
    if args.relay_command == "backup":
        from agentcall.relay.backup import backup_database

        try:
            done = backup_database(args.database, args.output)
        except AgentCallError as exc:
            raise CommandError(str(exc)) from exc
        except OSError as exc:
            raise CommandError(f"{args.output}: {exc.strerror or exc}") from exc
        print(
            f"backed up {args.database} (relay schema {done.schema_version}, {done.pages} pages) "
            f"to {done.output}"
        )
        return 0
    raise CommandError(f"unknown relay command {args.relay_command!r}")
