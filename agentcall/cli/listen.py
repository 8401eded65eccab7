"""``agentcall listen``: run the listener in the foreground, as ``twistd -n agentcall-listen``.

It is the very service the twistd plugin builds (``agentcall.compose.listen.makeService``), run
on the real reactor until SIGTERM or SIGINT. Log lines go to stdout, which the systemd unit
appends to listener.log.

When another listener for the same identity takes over at the relay, it logs
``listener_replaced`` and exits with :data:`EXIT_REPLACED`, which the systemd unit does not
restart on.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Final

# sysexits' EX_CONFIG: two installations answer for one identity, which only the owner can
# settle. The systemd unit lists it in RestartPreventExitStatus=.
EXIT_REPLACED: Final = 78

DESCRIPTION = """\
Answer calls on this machine: connect to the relay and run your coding agent for each call
your policy admits. Runs in the foreground until stopped (Ctrl-C or SIGTERM).

`agentcall setup` normally installs this as a systemd user service; run it yourself under
another supervisor (launchd, a container, tmux) when there is no systemd. It is the same
service as `twistd -n agentcall-listen`.

Only one listener per identity can hold the relay session: when another one for the same
identity connects, the relay hands the session to the newer one, and this one logs
`listener_replaced` and exits with status 78 (the systemd unit does not restart it on that
status). Start it again to take the session back."""

EPILOG = """\
examples:
  agentcall listen
  agentcall listen --log-format json >> ~/.agentcall/listener.log"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="log lines as text (default) or as JSON objects, on stdout",
    )


def _refusal(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        code = exc.code
        return str(code) if isinstance(code, str) else f"exit status {code}"
    return str(exc) or exc.__class__.__name__


def run(args: argparse.Namespace) -> int:
    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver
    from twisted.python import usage

    from agentcall.cli.main import CommandError
    from agentcall.compose import listen as tap
    from agentcall.errors import AgentCallError

    try:
        options = tap.Options()
        options.parseOptions([])
        service = tap.makeService(options)
    except (SystemExit, AgentCallError, usage.UsageError, OSError) as exc:
        raise CommandError(f"the listener cannot start: {_refusal(exc)}") from None

    from agentcall.logevents import JsonLinesObserver

    observer = (
        JsonLinesObserver(sys.stdout)
        if args.log_format == "json"
        else textFileLogObserver(sys.stdout)
    )
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)

    refused: list[BaseException] = []
    running: Any = reactor

    def start() -> None:
        try:
            service.privilegedStartService()
            service.startService()
        except Exception as exc:  # reported below as the one-line reason
            refused.append(exc)
            running.stop()
            return
        # Stopping the service may wait for a call to be cancelled and answered.
        running.addSystemEventTrigger("before", "shutdown", service.stopService)

    running.callWhenRunning(start)
    # The reactor's own handlers turn SIGTERM and SIGINT into a clean stop.
    running.run()
    if refused:
        raise CommandError(f"the listener refused to start: {_refusal(refused[0])}")
    # The listener_replaced log line already said why and what to do.
    return EXIT_REPLACED if getattr(service, "replaced", False) else 0
