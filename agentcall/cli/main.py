"""``agentcall``: the entry point. Parses the command line and runs one command.

Command modules are imported only when their command runs, so ``agentcall --version`` and
``--help`` stay fast (no Twisted, no crypto at start-up). ``agentcall guard`` (the tool guard,
run by the agent CLI before every tool call) skips even argparse.
"""

from __future__ import annotations

import importlib
import os
import sys

from agentcall import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence

# command name → (module, one-line summary). Each module has `add_arguments(parser)` and
# `run(args) -> int`, and may name its help's DESCRIPTION and EPILOG (printed as written);
# nested commands use their own subparsers inside add_arguments.
COMMANDS: dict[str, tuple[str, str]] = {
    "setup": (
        "agentcall.cli.setup",
        "Enrol this machine with an invite, publish its keys and start the listener.",
    ),
    "config": (
        "agentcall.cli.config",
        "Show or change the agent, CA file and workdir after setup.",
    ),
    "uninstall": (
        "agentcall.cli.uninstall",
        "Stop and remove the listener service, then (asked first) the keys and state.",
    ),
    "call": ("agentcall.cli.call", "Call a coworker's agent and print its answer."),
    "jobs": ("agentcall.cli.jobs", "List, fetch or cancel calls the relay kept as jobs."),
    "listen": ("agentcall.cli.listen", "Answer calls here (the listener, in the foreground)."),
    "invite": ("agentcall.cli.invite", "Create, list or revoke invites (organisation admins)."),
    "token": ("agentcall.cli.token", "Replace this installation's bearer token."),
    "recovery": (
        "agentcall.cli.recovery",
        "Make a recovery code, or reclaim your address with one on a new machine.",
    ),
    "members": (
        "agentcall.cli.members",
        "List, remove or change the role of members (organisation admins).",
    ),
    "audit": (
        "agentcall.cli.audit",
        "Export the audit trail or set legal holds (organisation admins).",
    ),
    "block": ("agentcall.cli.access", "Refuse calls from one person."),
    "unblock": ("agentcall.cli.access", "Take back a block."),
    "access": ("agentcall.cli.access", "Show or change who may call you by default."),
    "task": ("agentcall.cli.task", "Create a task (a SKILL.md) for callers to run."),
    "offer": ("agentcall.cli.policy", "Offer a task to every allowed caller."),
    "unoffer": ("agentcall.cli.policy", "Stop offering a task to everyone by default."),
    "allow": ("agentcall.cli.policy", "Give one caller a task."),
    "revoke": ("agentcall.cli.policy", "Take back a task given to one caller."),
    "policy": ("agentcall.cli.policy", "Show the effective policy as callers meet it."),
    "lint": ("agentcall.cli.policy", "Check tasks, policy, admin ceiling and assertions."),
    "contacts": ("agentcall.cli.contacts", "Short names for the agents you call."),
    "card": ("agentcall.cli.card", "Show or publish what callers see of this installation."),
    "inspect": ("agentcall.cli.inspect", "Look at a coworker before calling: pin, card, note."),
    "doctor": ("agentcall.cli.doctor", "Check that this installation can place and answer calls."),
    "history": ("agentcall.cli.history", "Show recent inbound calls and tool attempts."),
    "trust": ("agentcall.cli.trust", "Forget a pinned identity after checking it out of band."),
    "mcp": ("agentcall.cli.mcp", "Serve AgentCall's tools to a coding agent (MCP, on stdio)."),
    "install": (
        "agentcall.cli.install",
        "Register AgentCall with Claude Code or Codex (or --remove it).",
    ),
    "a2a": ("agentcall.cli.a2a", "Serve your coworkers' agents to local A2A clients."),
    "completion": ("agentcall.cli.completion", "Print a shell completion script."),
    "relay": (
        "agentcall.cli.relay",
        "Operate a relay: bootstrap its database and first admin invite.",
    ),
}


# What `cat` and other programs killed by SIGPIPE report to the shell (128 + 13), so
# `set -o pipefail` scripts see the same status from us as from them.
EXIT_OUTPUT_CLOSED = 141


class CommandError(Exception):
    """A failure to report to the person as one line, with a non-zero exit."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def add_subcommand(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    description: str,
    example: str,
) -> argparse.ArgumentParser:
    """One subcommand of a nested command (``invite create``, ``members remove``): its summary
    in the parent's list, its description wrapped once here (the formatter prints descriptions
    as written, so an example keeps its own lines), and one example."""
    import argparse
    import textwrap

    return sub.add_parser(
        name,
        help=summary,
        description=textwrap.fill(description, width=92),
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def help_width(environ: Mapping[str, str] = os.environ) -> int:
    """The width argparse would wrap help to, worked out as it does (``COLUMNS``, else the
    terminal on stdout, else 80; less 2) but without importing shutil, which costs every
    start of ``agentcall call`` milliseconds for help that is almost never printed."""
    try:
        columns = int(environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns if columns > 0 else 80) - 2


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, just that command (running one command imports
    one module, and builds one parser: the others would only be listed in the top-level help,
    which ``only`` never prints, and each costs the start-up of every command)."""
    import argparse
    import functools

    width = help_width()
    parser = argparse.ArgumentParser(
        prog="agentcall",
        formatter_class=functools.partial(argparse.HelpFormatter, width=width),
        description=(
            "Call a coworker's coding agent (Claude Code or Codex) on their machine and get an "
            "answer back, end-to-end encrypted through a relay."
        ),
        epilog=(
            "A command whose output is closed early (`agentcall history --json | head -n1`) "
            f"stops quietly with exit status {EXIT_OUTPUT_CLOSED}, like other Unix tools."
        ),
    )
    parser.add_argument("--version", action="version", version=f"agentcall {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, summary) in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        command = sub.add_parser(
            name,
            help=summary,
            description=getattr(module, "DESCRIPTION", summary),
            epilog=getattr(module, "EPILOG", None),
            formatter_class=functools.partial(argparse.RawDescriptionHelpFormatter, width=width),
        )
        module.add_arguments(command)
        command.set_defaults(_module=module_name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status. A closed stdout (`agentcall … | head -n1`) ends any
    command quietly with :data:`EXIT_OUTPUT_CLOSED` instead of a BrokenPipeError traceback."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    # The tool guard starts once per tool call of an answering agent: it takes its input
    # from stdin and its configuration from the environment, never from argparse. Its exit
    # status is its verdict, so it keeps its own handling of every error.
    if args_list[:1] == ["guard"]:
        from agentcall.guard.main import main as guard_main

        return guard_main(args_list[1:])
    try:
        try:
            return _main(args_list)
        finally:
            # Flushed here rather than at interpreter exit, so a reader that went away is
            # noticed inside this try (also after argparse's SystemExit for --help).
            sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_OUTPUT_CLOSED


def _discard_stdout() -> None:
    # Python flushes stdout once more at exit and would report the same broken pipe there;
    # pointing the descriptor at /dev/null gives that flush somewhere to go.
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test's capture): nothing is flushed at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _main(args_list: list[str]) -> int:
    # Fast path: no command modules are needed to print the version.
    if args_list in (["--version"], ["-V"]):
        print(f"agentcall {__version__}")
        return 0
    if args_list[:1] != ["listen"]:
        # Short-lived commands skip autobahn's native helpers: compiling them costs ~50 ms of
        # every start, and their speed matters only to long-running sockets (the listener).
        os.environ.setdefault("AUTOBAHN_USE_NVX", "0")
    # `agentcall call …` needs call's arguments only; anything else gets the whole parser.
    parser = build_parser(args_list[0] if args_list[:1] and args_list[0] in COMMANDS else None)
    args = parser.parse_args(args_list)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    module = importlib.import_module(args._module)
    try:
        code: int = module.run(args)
    except CommandError as exc:
        print(f"agentcall: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("agentcall: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
