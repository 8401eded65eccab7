"""``agentcall a2a serve``: a local A2A v1.0 endpoint whose agents are your coworkers'.

``agentcall a2a token`` prints the bearer token every request but a card's must carry
(``--rotate`` replaces it; a running bridge takes the new one at its next request).

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
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from agentcall.a2a.gate import RunPeer

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
loopback (or the interface ENDPOINT names), and every request but an Agent Card must carry
`Authorization: Bearer TOKEN` with the token `agentcall a2a token` prints (kept in
a2a.token in the state directory, 0600; made on first use). A request without it is refused
(401), and so is one from an agent that is answering a call, token or not (403). The cards
declare the bearer scheme, so A2A clients learn it from there. Keep the bridge on loopback.
The first line on stdout says where it listens: `a2a_listening url=http://127.0.0.1:8470`."""

EPILOG = """\
examples:
  agentcall a2a serve
  agentcall a2a serve --listen tcp:9000:interface=127.0.0.1
  curl -s http://127.0.0.1:8470/agents/acme/ken/.well-known/agent-card.json
  agentcall a2a token | sed 's/^/Authorization: Bearer /' | curl -s -H @- \\
    -H 'A2A-Version: 1.0' -H 'Content-Type: application/json' \\
    http://127.0.0.1:8470/agents/acme/ken \\
    -d '{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "TASK_ID"}}'
  agentcall a2a token --rotate"""

BEARER_DESCRIPTION = """\
Print the A2A bridge's bearer token: every request to `agentcall a2a serve` but an Agent Card
must carry it as `Authorization: Bearer TOKEN`. It is kept in a2a.token in the state directory
(0600, in the 0700 directory), which no answering agent may read, and made on first use. With
--rotate, a new token replaces it: the old one stops working at once, and a running bridge
takes the new one at its next request, without a restart. A token file that is not yours
alone, not a regular file, or holds no token is refused (rotate to replace it)."""

ROTATED = (
    "a new bridge token replaced the old one, which no longer works; running bridges take "
    "the new one at their next request"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentcall.cli.main import add_subcommand

    sub = parser.add_subparsers(dest="a2a_command", metavar="SUBCOMMAND", required=True)
    serve = add_subcommand(
        sub,
        "serve",
        "Run the A2A bridge in the foreground.",
        "Serve an A2A v1.0 endpoint (JSON-RPC over HTTP) with an Agent Card per address of "
        "your organisation at /agents/ORG/HANDLE/.well-known/agent-card.json; each message "
        "becomes an AgentCall call placed as you. Every request but a card's must carry "
        "`Authorization: Bearer TOKEN` with the token `agentcall a2a token` prints (made "
        "on first use; the cards declare the scheme); others get 401, and an agent that is "
        "answering a call gets 403 even with the token.",
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
    token = add_subcommand(
        sub,
        "token",
        "Print the bridge's bearer token (--rotate: replace it).",
        BEARER_DESCRIPTION,
        "agentcall a2a token",
    )
    token.add_argument(
        "--rotate",
        action="store_true",
        help="replace the token with a new one (the old one stops working at once) and print it",
    )


def _interface(description: str) -> str | None:
    """The ``interface=`` of an endpoint string, if it names one."""
    for part in description.split(":"):
        if part.startswith("interface="):
            return part.removeprefix("interface=").strip("[]").lower() or None
    return None


def _refuse_inside_an_agent(what: str, because: str) -> None:
    from agentcall.cli.call import NESTED_CALL_ENV
    from agentcall.cli.main import CommandError

    if NESTED_CALL_ENV in os.environ:
        raise CommandError(
            f"{what} cannot run inside an agent that is answering a call "
            f"({NESTED_CALL_ENV} is set): {because}"
        )


def run(args: argparse.Namespace) -> int:
    if args.a2a_command == "token":
        return _token(args)
    return _serve(args)


def _token(args: argparse.Namespace) -> int:
    from agentcall.cli.call import load_installation
    from agentcall.cli.main import CommandError
    from agentcall.local import a2atoken
    from agentcall.local.home import LocalStateError

    # The state directory is closed to an answering agent anyway; this says so plainly.
    _refuse_inside_an_agent("`agentcall a2a token`", "the token is its owner's, not the agent's")
    home, _config = load_installation()
    try:
        token = a2atoken.rotate(home) if args.rotate else a2atoken.ensure(home)
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None
    # The token alone on stdout, for $(agentcall a2a token); what happened on stderr.
    print(token, flush=True)
    if args.rotate:
        print(ROTATED, file=sys.stderr)
    return 0


def _run_peer() -> RunPeer:
    """The check that refuses an answering agent's run: by its pid on Linux, else none."""
    import functools

    from agentcall.a2a import gate, peerpid
    from agentcall.local import runpeer

    if not os.path.isdir("/proc/self/fd"):
        return gate.no_run_peer
    return functools.partial(peerpid.run_pid, belongs=runpeer.belongs_to_run)


def _serve(args: argparse.Namespace) -> int:
    from agentcall.cli.call import load_installation
    from agentcall.cli.main import CommandError
    from agentcall.local import a2atoken
    from agentcall.local.home import LocalStateError

    _refuse_inside_an_agent("the A2A bridge", "it would place calls of its own")
    home, config = load_installation()
    try:
        # Made now, so the first client finds a token to read; checked now, so a broken
        # file stops the start with the fix rather than refusing every request.
        a2atoken.ensure(home)
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None

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
    site = make_site(bridge, port, names, a2atoken.TokenFile(home), _run_peer())
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
