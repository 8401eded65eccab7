"""``agentcall setup``: enrol this machine with an invite, publish its keys, start the listener.

The steps, in an order that never loses anything that cannot be made again:

1. resolve the agent (explicit, else ``claude`` then ``codex`` on PATH) before touching anything;
2. ask the relay for its origin, then mint the keys (before registering, so a key failure never
   spends the one-time invite);
3. register with the invite and save config.json at once: from here on the installation exists;
4. publish the identity record, then the encryption record;
5. install and start the systemd user unit (or say how to run the listener elsewhere);
6. make a real call to ourselves through the listener, unless ``--no-verify``.

A failure after step 3 leaves config and keys in place and says to run ``agentcall setup
--resume`` (or plain ``agentcall setup``), which repeats steps 4-6; each of them is idempotent.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from agentcall.cli.setup_finish import SetupDeps, finish, say

if TYPE_CHECKING:
    from agentcall.local.config import Config
    from agentcall.local.home import Home
    from agentcall.local.keystore import LocalKeys
    from agentcall.relayurl import RelayUrl
    from agentcall.wire.http import AgentKind, RegisterResponse

INVITE_ENV = "AGENTCALL_INVITE"
# What an installed machine can do instead of a second enrolment.
INSTALLED_HINT = (
    "change its agent, CA file or workdir with `agentcall config set KEY VALUE` (`agentcall "
    "config get` shows them); finish an interrupted setup with `agentcall setup --resume`; "
    "start over with `agentcall uninstall`; for a second identity set AGENTCALL_HOME to a new "
    "directory"
)
# The setup flags that became `agentcall config` settings once installed.
CONFIG_FLAGS = {
    "--agent": "agent",
    "--agent-command": "agent-command",
    "--ca-file": "ca-file",
}
AUTO_DETECT = ("claude", "codex")

DESCRIPTION = """\
Enrol this machine with an invite link, publish its keys, and start the listener that
answers calls with your coding agent.

The agent is `claude` or `codex` (found on PATH; --agent picks one), or any program with
--agent command --agent-command "CMD ARGS". --caller-only enrols without answering calls.
The listener is installed as a systemd user service when `systemctl --user` works; otherwise
(or with --skip-service) run `agentcall listen` under your own supervisor. A real test call
to yourself checks the whole path unless --no-verify.

If setup stops after enrolling, run `agentcall setup --resume` to finish it. The invite may
also be given in the AGENTCALL_INVITE environment variable, which keeps it out of the
process list. Once set up, the agent, the CA file and the workdir are changed with
`agentcall config set`; `agentcall uninstall` removes the installation."""

EPILOG = """\
examples:
  agentcall setup --invite 'https://relay.example.com/invite/acme#…' --handle ken
  agentcall setup --invite "$INVITE" --handle ci-bot --caller-only
  agentcall setup --invite "$INVITE" --handle ken --agent command \\
      --agent-command "/opt/bin/my-agent --quiet" --skip-service
  agentcall setup --resume"""


def _handle(text: str) -> str:
    from agentcall import ids

    if not ids.is_handle(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid handle (2-31 lowercase letters, digits and single "
            "hyphens between them: not at the start or end, never two in a row)"
        )
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--invite", metavar="INVITE", help="the invite link from your admin")
    parser.add_argument("--handle", type=_handle, metavar="HANDLE", help="your name, e.g. ken")
    parser.add_argument(
        "--agent", choices=["claude", "codex", "command"], help="which agent answers calls"
    )
    parser.add_argument(
        "--agent-command",
        metavar='"CMD ARGS"',
        help="with --agent command: the program (and arguments) to run for each call",
    )
    parser.add_argument(
        "--caller-only", action="store_true", help="only place calls; never answer them"
    )
    parser.add_argument(
        "--skip-service", action="store_true", help="do not install the systemd user service"
    )
    parser.add_argument("--no-verify", action="store_true", help="skip the test call to yourself")
    parser.add_argument("--ca-file", metavar="FILE", help="trust this CA for a private relay")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted setup (publish keys, service, test call)",
    )


# Tests set this; None means the real network, reactor and systemctl.
DEPS: SetupDeps | None = None


def _real_deps() -> SetupDeps:
    from agentcall import service_unit
    from agentcall.caller import call as caller
    from agentcall.cli.call import run_on_reactor
    from agentcall.client.api import RelayApi

    return SetupDeps(
        make_api=RelayApi,
        run=run_on_reactor,
        place=caller.place,
        systemctl=service_unit.run_systemctl,
    )


# --- the agent -----------------------------------------------------------------------------------


@attrs.frozen
class AgentChoice:
    """Which agent answers calls, and the executable found for it (for the unit's PATH)."""

    kind: AgentKind | None
    command: tuple[str, ...] | None = None
    executable: str | None = None


def _executable(word: str, which: Callable[[str], str | None]) -> str | None:
    if os.sep in word:
        path = os.path.abspath(os.path.expanduser(word))
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    found = which(word)
    return os.path.abspath(found) if found else None


def resolve_agent(
    agent: str | None,
    agent_command: str | None,
    caller_only: bool,
    which: Callable[[str], str | None],
) -> AgentChoice:
    """The agent from the flags and PATH, or a CommandError that says what to pass instead."""
    from agentcall.cli.main import CommandError
    from agentcall.wire.http import AgentKind

    if caller_only:
        if agent is not None or agent_command is not None:
            raise CommandError("--caller-only answers no calls; drop --agent/--agent-command", 2)
        return AgentChoice(kind=None)
    if agent_command is not None and agent not in (None, "command"):
        raise CommandError(f"--agent-command goes with --agent command, not --agent {agent}", 2)
    if agent == "command" or agent_command is not None:
        if not agent_command:
            raise CommandError('--agent command needs --agent-command "CMD ARGS"', 2)
        try:
            argv = shlex.split(agent_command)
        except ValueError as exc:
            raise CommandError(f"cannot split --agent-command: {exc}", 2) from None
        if not argv:
            raise CommandError("--agent-command is empty", 2)
        program = _executable(argv[0], which)
        if program is None:
            raise CommandError(f"--agent-command: {argv[0]!r} is not an executable program")
        return AgentChoice(AgentKind.COMMAND, (program, *argv[1:]), program)
    if agent is not None:
        found = _executable(agent, which)
        if found is None:
            raise CommandError(
                f"`{agent}` was not found on PATH; install it, or choose another --agent"
            )
        return AgentChoice(AgentKind(agent), executable=found)
    for name in AUTO_DETECT:
        found = _executable(name, which)
        if found is not None:
            return AgentChoice(AgentKind(name), executable=found)
    raise CommandError(
        "no coding agent found on PATH (looked for claude, then codex); install one, or pass "
        '--agent command --agent-command "CMD ARGS" to answer with another program, or '
        "--caller-only to only place calls"
    )


def ca_file_path(text: str) -> str:
    """The CA file to trust, as an absolute path; ValueError when it is not a readable file of
    PEM certificates (found now, not at the first connection that would fail over it).

    Shared with ``agentcall config set ca-file`` so both accept exactly the same files."""
    from agentcall.client.tls import CaFileError, load_ca_certificates

    path = os.path.abspath(os.path.expanduser(text))
    if not os.path.isfile(path):
        raise ValueError(f"{path} is not a file")
    try:
        load_ca_certificates(path)
    except CaFileError as exc:
        raise ValueError(str(exc)) from None
    return path


def _agent_of(config: Config, which: Callable[[str], str | None]) -> str | None:
    """The agent executable of an existing installation, for the unit's PATH."""
    if config.agent_command is not None:
        return config.agent_command[0]
    if config.agent_kind is None:
        return None
    return _executable(str(config.agent_kind), which)


# --- entry ---------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.main import CommandError
    from agentcall.local.home import Home, LocalStateError

    deps = DEPS or _real_deps()
    try:
        home = Home.from_environ(deps.environ)
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None
    invite = args.invite or deps.environ.get(INVITE_ENV) or None
    if args.resume or (invite is None and os.path.lexists(home.config_path)):
        extra = [
            flag
            for flag, value in (
                ("--invite", args.invite),
                ("--handle", args.handle),
                ("--agent", args.agent),
                ("--agent-command", args.agent_command),
                ("--caller-only", args.caller_only),
                ("--ca-file", args.ca_file),
            )
            if value
        ]
        if extra and not args.resume:
            settable = [flag for flag in extra if flag in CONFIG_FLAGS]
            if settable:
                # An installed machine asked for another agent or CA: that is a setting now.
                raise CommandError(
                    f"already set up here ({home.config_path} exists): {settable[0]} is "
                    f"changed with `agentcall config set {CONFIG_FLAGS[settable[0]]} VALUE` "
                    "(`agentcall config get` shows the settings)",
                    2,
                )
            raise CommandError(
                f"already set up here ({home.config_path} exists); " + INSTALLED_HINT, 2
            )
        if extra:
            raise CommandError(
                f"--resume finishes the existing setup and takes no {extra[0]}; "
                "it accepts only --skip-service and --no-verify; settings are changed with "
                "`agentcall config set KEY VALUE`",
                2,
            )
        return _resume(args, home, deps)
    return _enrol(args, home, deps, invite)


def _resume(args: argparse.Namespace, home: Home, deps: SetupDeps) -> int:
    from agentcall.cli.main import CommandError
    from agentcall.local.config import load_config
    from agentcall.local.home import LocalStateError
    from agentcall.local.keystore import load_keys

    try:
        config = load_config(home)
        keys = load_keys(home)
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None
    if keys.address != config.address:
        raise CommandError(
            f"keys.json belongs to {keys.address} but config.json to {config.address}; "
            "restore the matching files from a backup"
        )
    say(f"finishing the setup of {config.address} on {config.relay_url}")

    executable = _agent_of(config, deps.which)

    async def work(reactor: Any) -> int:
        return await finish(reactor, args, home, config, keys, deps, executable)

    code: int = deps.run(work)
    return code


def _enrol(args: argparse.Namespace, home: Home, deps: SetupDeps, invite_text: str | None) -> int:
    from agentcall import ids
    from agentcall.cli.main import CommandError
    from agentcall.invites import InviteLinkError, parse_invite_url
    from agentcall.local.config import load_config
    from agentcall.local.home import LocalStateError
    from agentcall.relayurl import RelayUrl

    if invite_text is None:
        raise CommandError(
            "--invite INVITE is required (the link your admin gave you); "
            "to finish an interrupted setup run `agentcall setup --resume`",
            2,
        )
    if args.handle is None:
        raise CommandError("--handle HANDLE is required: the name others will call you by", 2)
    if os.path.lexists(home.config_path):
        try:
            config = load_config(home, apply_override=False)
            who = f"{config.address} on {config.relay_url}"
        except LocalStateError:
            who = f"someone ({home.config_path} exists but cannot be read)"
        raise CommandError(f"already set up as {who}; " + INSTALLED_HINT)
    try:
        invite = parse_invite_url(invite_text)
    except InviteLinkError as exc:
        raise CommandError(f"--invite: {exc}") from None
    agent = resolve_agent(args.agent, args.agent_command, args.caller_only, deps.which)
    ca_file = None
    if args.ca_file:
        try:
            ca_file = ca_file_path(args.ca_file)
        except ValueError as exc:
            raise CommandError(f"--ca-file: {exc}") from None
    address = ids.format_address(invite.org, args.handle)
    relay = RelayUrl.parse(invite.relay_url)

    async def work(reactor: Any) -> int:
        config, keys = await _register(reactor, home, deps, invite, args.handle, agent, ca_file)
        say(f"enrolled as {config.address} ({config.role}) on {config.relay_url}")
        return await finish(reactor, args, home, config, keys, deps, agent.executable)

    say(f"enrolling {address} with the relay at {relay}")
    code: int = deps.run(work)
    return code


def _keys_for(home: Home, origin: str, address: str, now: float) -> tuple[LocalKeys, bool]:
    """Keys for ``address``: fresh, or those a failed earlier attempt left (True if fresh)."""
    from agentcall.cli.main import CommandError
    from agentcall.local.keystore import create_keys, load_keys

    if not os.path.lexists(home.keys_path):
        return create_keys(home, origin, address, now), True
    keys = load_keys(home)
    if (keys.address, keys.relay_origin) != (address, origin):
        raise CommandError(
            f"{home.keys_path} holds keys for {keys.address} at {keys.relay_origin}, left by an "
            "earlier setup that never finished; move it away, then run this command again"
        )
    return keys, False


async def _register(
    reactor: Any,
    home: Home,
    deps: SetupDeps,
    invite: Any,
    handle: str,
    agent: AgentChoice,
    ca_file: str | None,
) -> tuple[Config, LocalKeys]:
    from agentcall import ids
    from agentcall.cli.main import CommandError
    from agentcall.client.api import RelayUnreachable
    from agentcall.errors import AgentCallError, ApiError
    from agentcall.relayurl import RelayUrl
    from agentcall.wire.http import RegisterRequest

    relay = RelayUrl.parse(invite.relay_url)
    address = ids.format_address(invite.org, handle)
    try:
        api = deps.make_api(reactor, relay, None, ca_file)
        status = await api.status()
    except AgentCallError as exc:
        raise CommandError(f"cannot reach the relay at {relay}: {exc}") from None
    keys, fresh = _keys_for(home, status.relay_origin, address, reactor.seconds())
    request = RegisterRequest(
        org=invite.org, invite=invite.secret, handle=handle, agent_kind=agent.kind
    )
    try:
        registered = await api.register(request)
    except ApiError as exc:
        if fresh:
            # Never enrolled, so never published: the next attempt starts clean.
            home.keys_path.unlink(missing_ok=True)
        from agentcall.cli.render import safe_cell

        raise CommandError(f"the relay refused the enrolment: {safe_cell(exc.message)}") from None
    except RelayUnreachable as exc:
        raise CommandError(
            f"no answer to the enrolment ({exc}); run the same command again — if it says the "
            "invite was already used, ask your admin for a new one"
        ) from None
    if (registered.address, registered.relay_origin) != (address, status.relay_origin):
        raise CommandError(
            f"the relay enrolled {registered.address} at {registered.relay_origin}, not "
            f"{address} at {status.relay_origin}; not saving this enrolment"
        )
    return save_enrolment(home, relay, registered, agent, ca_file), keys


def save_enrolment(
    home: Home,
    relay: RelayUrl,
    registered: RegisterResponse,
    agent: AgentChoice,
    ca_file: str | None,
) -> Config:
    """config.json for an identity the relay just enrolled (or a recovery just reclaimed)."""
    from agentcall.local.config import Config, save_config

    config = Config(
        relay_url=str(relay),
        relay_origin=registered.relay_origin,
        org=registered.org,
        handle=registered.handle,
        role=registered.role,
        token=registered.token,
        agent_kind=agent.kind,
        agent_command=agent.command,
        ca_file=ca_file,
        read_roots=(str(home.user_home),),
    )
    save_config(home, config)
    return config
