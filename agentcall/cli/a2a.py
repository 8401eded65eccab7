"""``agentcall a2a serve``: a local A2A v1.0 endpoint whose agents are your coworkers'.

Each address ``@ORG/HANDLE`` of your organisation is an A2A agent at ``/agents/ORG/HANDLE`` on
the bridge, with its Agent Card at ``/agents/ORG/HANDLE/.well-known/agent-card.json``. A message
sent to it becomes one AgentCall call placed as you (through the running listener service when
there is one, else dialled from this process), and the answer comes back as the task's text
artifact. The bridge itself is :mod:`agentcall.a2a`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Final

DEFAULT_LISTEN: Final = "tcp:8470:interface=127.0.0.1"

DESCRIPTION = f"""\
Serve your coworkers' agents to local A2A clients (A2A protocol 1.0, its JSON-RPC binding over
HTTP, with the header `A2A-Version: 1.0`). Runs in the foreground until Ctrl-C or SIGTERM.

Every address @ORG/HANDLE in your organisation is an agent whose base URL is
<bridge>/agents/ORG/HANDLE; its Agent Card is at <base>/.well-known/agent-card.json and names
that URL for JSON-RPC. SendMessage and SendStreamingMessage place one end-to-end encrypted
AgentCall call each, as you: through the running listener service when there is one, else
dialled from this process, exactly like `agentcall call`. The stream reports the call's
lifecycle as task status updates (ringing: SUBMITTED; answered, working: WORKING); the answer
is the task's text artifact, marked as written by another person's agent. A follow-up with the
same contextId continues the conversation the answer opened (like `agentcall call
--continue`); {{"agentcall": {{"task": "ID"}}}} in a message's metadata runs one of the callee's
named tasks (like --task). GetTask reads a task; CancelTask hangs up its call. Tasks are kept
in memory. See docs/a2a.md.

ENDPOINT is a Twisted server endpoint string (default {DEFAULT_LISTEN}).
The bridge places calls in your name, so it answers only requests whose Host names it on
loopback (or the interface ENDPOINT names); keep it on loopback. The first line on stdout says
where it listens: `a2a_listening url=http://127.0.0.1:8470`."""

EPILOG = """\
examples:
  agentcall a2a serve
  agentcall a2a serve --listen tcp:9000:interface=127.0.0.1
  curl -s http://127.0.0.1:8470/agents/acme/ken/.well-known/agent-card.json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentcall.cli.main import add_subcommand

    sub = parser.add_subparsers(dest="a2a_command", metavar="SUBCOMMAND", required=True)
    serve = add_subcommand(
        sub,
        "serve",
        "Run the A2A bridge in the foreground.",
        "Serve an A2A v1.0 endpoint (JSON-RPC over HTTP) with an Agent Card per address of "
        "your organisation at /agents/ORG/HANDLE/.well-known/agent-card.json; each message "
        "becomes an AgentCall call placed as you.",
        "agentcall a2a serve --listen tcp:8470:interface=127.0.0.1",
    )
    serve.add_argument(
        "--listen",
        metavar="ENDPOINT",
        default=DEFAULT_LISTEN,
        help=f"Twisted server endpoint string to listen on (default {DEFAULT_LISTEN})",
    )
    serve.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="log lines as text (default) or as JSON objects, on stdout",
    )


def _interface(description: str) -> str | None:
    """The ``interface=`` of an endpoint string, if it names one."""
    for part in description.split(":"):
        if part.startswith("interface="):
            return part.removeprefix("interface=").strip("[]").lower() or None
    return None


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.call import NESTED_CALL_ENV, load_installation
    from agentcall.cli.main import CommandError

    if NESTED_CALL_ENV in os.environ:
        raise CommandError(
            "the A2A bridge cannot run inside an agent that is answering a call "
            f"({NESTED_CALL_ENV} is set): it would place calls of its own"
        )
    home, config = load_installation()

    from twisted.internet import endpoints, reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver

    from agentcall.a2a.placing import CallPlacer
    from agentcall.a2a.web import Bridge, make_site
    from agentcall.logevents import JsonLinesObserver, Logger, configure_from_environ

    running: Any = reactor
    bridge = Bridge(running, CallPlacer(running, home), config.org)
    ports: list[Any] = []

    def port() -> int:
        return int(ports[0].getHost().port) if ports else -1

    interface = _interface(args.listen)
    names = frozenset({interface} if interface else set())
    site = make_site(bridge, port, names)
    try:
        endpoint = endpoints.serverFromString(running, args.listen)
    except (ValueError, TypeError, KeyError) as exc:
        raise CommandError(f"--listen {args.listen!r} is not a server endpoint: {exc}") from None

    observer = (
        JsonLinesObserver(sys.stdout)
        if args.log_format == "json"
        else textFileLogObserver(sys.stdout)
    )
    configure_from_environ()
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)
    log = Logger()
    refused: list[BaseException] = []

    def listening(listening_port: Any) -> None:
        ports.append(listening_port)
        address = listening_port.getHost()
        host = getattr(address, "host", "127.0.0.1")
        shown = f"[{host}]" if ":" in host else host
        scheme = "https" if args.listen.startswith(("ssl:", "tls:")) else "http"
        url = f"{scheme}://{shown}:{address.port}"
        # A line for people and scripts (tests wait for it), then the structured event.
        print(f"a2a_listening url={url}", flush=True)
        log.info("a2a_listening", url=url, org=config.org)

    def cannot(failure: Any) -> None:
        refused.append(failure.value)
        running.stop()

    def start() -> None:
        endpoint.listen(site).addCallbacks(listening, cannot)

    running.callWhenRunning(start)
    running.run()
    if refused:
        raise CommandError(f"the A2A bridge cannot listen on {args.listen}: {refused[0]}")
    return 0
