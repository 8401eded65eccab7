"""``agentcall config get|set|unset``: the settings a person changes after setup.

Four settings, each validated by the same code ``agentcall setup`` uses for its flag:

- ``agent``: ``claude`` or ``codex`` (must be on PATH), or ``command`` (keeps the current
  command, which must still be executable) — :func:`agentcall.cli.setup.resolve_agent`;
- ``agent-command``: ``"CMD ARGS"``, split like a shell would and made absolute; it makes the
  agent ``command`` — the same function;
- ``ca-file``: a file of PEM certificates to trust for a private relay —
  :func:`agentcall.cli.setup.ca_file_path`;
- ``workdir``: the directory calls run in and the first directory the agent may read (the
  first of config.json's ``read_roots``); an existing directory, never inside the state
  directory (keys and token) nor the tasks directory (which the guard refuses).

The new config is built with ``attrs.evolve``, so every field validator of
:class:`agentcall.local.config.Config` runs again, and saved by ``save_config`` (atomic, 0600);
the file is loaded without ``AGENTCALL_RELAY``, so an override is never written. The token is
never printed, whatever is asked.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from agentcall.local.config import Config
    from agentcall.local.home import Home

DESCRIPTION = """\
Show or change the settings you may change after setup, validated as setup validates them:

  agent          claude, codex (found on PATH) or command
  agent-command  "CMD ARGS": the program run for each call (makes the agent `command`)
  ca-file        a PEM file of CA certificates to trust for a private relay
  workdir        the directory calls run in, and the first one the agent may read

`config get` with no key prints every setting; `set` writes config.json atomically (0600)
and says whether the running listener picks the change up or needs a restart. `unset`
takes back ca-file (trust the system's roots) or workdir (back to your home directory).
Your address, organisation, role and token are not settings: they come from enrolment."""

EPILOG = """\
examples:
  agentcall config get
  agentcall config get agent
  agentcall config get --json
  agentcall config set agent codex
  agentcall config set agent-command "/opt/bin/my-agent --quiet"
  agentcall config set ca-file ~/acme-ca.pem
  agentcall config set workdir ~/src/project
  agentcall config unset ca-file"""

KEYS: Final = ("agent", "agent-command", "ca-file", "workdir")
UNSETTABLE: Final = ("ca-file", "workdir")
# config.json's own names, so someone who just read the file is understood.
ALIASES: Final = {
    "agent_kind": "agent",
    "agent_command": "agent-command",
    "ca_file": "ca-file",
}
# Fields of config.json that are not settings, and where each one is changed instead.
NOT_SETTINGS: Final = {
    "token": "the token is never shown; it is replaced with `agentcall token rotate`",
    "handle": "your address comes from enrolment; for another identity set AGENTCALL_HOME "
    "to a new directory and run `agentcall setup`",
    "org": "your organisation comes from enrolment; for another one set AGENTCALL_HOME to a "
    "new directory and run `agentcall setup`",
    "role": "an organisation admin changes it with `agentcall members role HANDLE admin|member`",
    "relay_url": "the relay comes from your invite; AGENTCALL_RELAY points one command elsewhere",
    "relay_origin": "the relay's origin is bound into your keys at enrolment",
    "read_roots": "`workdir` sets the first of them",
}
RESTART: Final = "systemctl --user restart agentcall-listener"


@attrs.frozen
class ConfigDeps:
    """What ``config`` reaches outside the process with; tests pass fakes."""

    which: Callable[[str], str | None] = shutil.which
    environ: Mapping[str, str] = attrs.field(factory=lambda: os.environ)


# Tests set this; None means the real PATH and environment.
DEPS: ConfigDeps | None = None


def _key(text: str) -> str:
    key = ALIASES.get(text, text)
    if key in KEYS:
        return key
    if key in NOT_SETTINGS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a setting: {NOT_SETTINGS[key]}")
    raise argparse.ArgumentTypeError(
        f"unknown setting {text!r}; the settings are {', '.join(KEYS)}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentcall.cli.main import add_subcommand

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    get = add_subcommand(
        sub,
        "get",
        "Print one setting, or all of them.",
        "Print the value of KEY (nothing when it is not set), or every setting as "
        "`key: value` lines; --json prints one object instead (null where not set).",
        "agentcall config get --json",
    )
    get.add_argument("key", nargs="?", type=_key, metavar="KEY", help=", ".join(KEYS))
    get.add_argument("--json", action="store_true", help="print one JSON object")
    put = add_subcommand(
        sub,
        "set",
        "Change one setting.",
        "Validate VALUE as setup would, write config.json atomically (0600), and say whether "
        "the running listener picks it up or needs a restart.",
        "agentcall config set agent codex",
    )
    put.add_argument("key", type=_key, metavar="KEY", help=", ".join(KEYS))
    put.add_argument("value", metavar="VALUE", help="the new value")
    unset = add_subcommand(
        sub,
        "unset",
        "Take back ca-file or workdir.",
        "Remove ca-file (the relay is then checked against the system's roots, or "
        "SSL_CERT_FILE) or reset workdir to your home directory, as setup left it.",
        "agentcall config unset ca-file",
    )
    unset.add_argument("key", type=_key, metavar="KEY", help=", ".join(UNSETTABLE))


# --- reading ---------------------------------------------------------------------------------


def settings(config: Config) -> dict[str, str | None]:
    """Every setting as it is now; None where it is not set. Never the token."""
    command = config.agent_command
    return {
        "agent": None if config.agent_kind is None else str(config.agent_kind),
        "agent-command": None if command is None else shlex.join(command),
        "ca-file": config.ca_file,
        "workdir": config.read_roots[0] if config.read_roots else None,
    }


def _shown(key: str, value: str | None) -> str:
    if value is not None:
        return value
    return "none (caller-only: answers no calls)" if key == "agent" else "(not set)"


# --- changing --------------------------------------------------------------------------------


def _inside(path: str, base: str) -> bool:
    return path == base or os.path.commonpath([path, base]) == base


def workdir_path(text: str, home: Home) -> str:
    """The workdir as an absolute path; ValueError naming what is wrong with it."""
    if not text or "\0" in text:
        raise ValueError("expected a directory")
    path = os.path.abspath(os.path.expanduser(text))
    if not os.path.isdir(path):
        raise ValueError(f"{path} is not an existing directory")
    # Symlinks resolved first: a link must not lead the agent into what it may never read.
    real = os.path.realpath(path)
    for base, what in (
        (home.state_dir, "the state directory, which holds your keys and token"),
        (home.tasks_dir, "your tasks directory, which the agent is never let read"),
    ):
        if _inside(real, os.path.realpath(base)):
            raise ValueError(f"{path} is inside {base}, {what}")
    return path


def _agent(config: Config, key: str, value: str, deps: ConfigDeps) -> Config:
    from agentcall.cli.main import CommandError
    from agentcall.cli.setup import resolve_agent

    if key == "agent":
        if value not in ("claude", "codex", "command"):
            raise CommandError(
                f"agent: {value!r} is not one of claude, codex, command (a caller-only "
                "installation is chosen at setup: `agentcall uninstall`, then `agentcall "
                "setup --caller-only`)",
                2,
            )
        command = None
        if value == "command":
            if config.agent_command is None:
                raise CommandError(
                    'agent command needs its program: `agentcall config set agent-command "CMD '
                    'ARGS"` sets both',
                    2,
                )
            # The current command is checked again: it must still be an executable program.
            command = shlex.join(config.agent_command)
        choice = resolve_agent(value, command, False, deps.which)
    else:
        if not value.strip():
            raise CommandError('agent-command: expected "CMD ARGS", the program to run', 2)
        choice = resolve_agent(None, value, False, deps.which)
    return attrs.evolve(config, agent_kind=choice.kind, agent_command=choice.command)


def changed(config: Config, home: Home, key: str, value: str | None, deps: ConfigDeps) -> Config:
    """``config`` with one setting changed (``value`` None: unset); CommandError if it is bad.

    Every field validator of :class:`Config` runs again on the result."""
    from agentcall.cli.main import CommandError
    from agentcall.cli.setup import ca_file_path
    from agentcall.local.config import ConfigError

    try:
        if key in ("agent", "agent-command"):
            if value is None:
                raise CommandError(f"{key} cannot be unset; set another agent instead", 2)
            return _agent(config, key, value, deps)
        if key == "ca-file":
            return attrs.evolve(config, ca_file=None if value is None else ca_file_path(value))
        first = str(home.user_home) if value is None else workdir_path(value, home)
        # The workdir replaces the first read root; the others stay readable, once each.
        rest = tuple(root for root in config.read_roots[1:] if root != first)
        return attrs.evolve(config, read_roots=(first, *rest))
    except ValueError as exc:
        raise CommandError(f"{key}: {exc}") from None
    except ConfigError as exc:
        raise CommandError(f"{key}: {exc.problem}") from None


def listener_effect(
    old: Config, new: Config, key: str, home: Home, environ: Mapping[str, str]
) -> str:
    """What the running listener does about the change, as one sentence for the person."""
    from agentcall.service_unit import unit_path

    if old.caller_only:
        return (
            "this installation had no listener: `agentcall setup --resume` installs and starts "
            "one that answers with the new agent"
        )
    if unit_path(home, environ).exists():
        restart = f"`{RESTART}`"
    else:
        restart = "stop and start `agentcall listen` where you run it"
    if key == "ca-file":
        return (
            "the running listener uses it from its next connection to the relay; to use it now, "
            f"restart it: {restart}"
        )
    return f"a running listener keeps the old value until it is restarted: {restart}"


def _task_warnings(old: Config, new: Config, home: Home) -> list[str]:
    """Tasks that loaded with the old read roots and do not with the new ones."""
    if old.read_roots == new.read_roots:
        return []
    from agentcall.listener.policy import PolicyError
    from agentcall.listener.tasks import load_tasks

    try:
        before = {str(p) for p in load_tasks(home.tasks_dir, old.read_roots).problems}
        after = load_tasks(home.tasks_dir, new.read_roots).problems
    except PolicyError:
        return []  # the tasks directory itself is broken either way; lint and doctor say so
    return [
        f"warning: {problem} (`agentcall lint` checks again)"
        for problem in after
        if str(problem) not in before
    ]


# --- entry ------------------------------------------------------------------------------------


def _load(home: Home) -> Config:
    from agentcall.cli.main import CommandError
    from agentcall.local.config import load_config
    from agentcall.local.home import LocalStateError

    try:
        # Without AGENTCALL_RELAY: a temporary override must never be written to the file.
        return load_config(home, apply_override=False)
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.main import CommandError
    from agentcall.cli.render import safe_cell, safe_json
    from agentcall.local.config import config_lock, save_config
    from agentcall.local.home import Home, LocalStateError

    deps = DEPS or ConfigDeps()
    try:
        home = Home.from_environ(deps.environ)
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None
    config = _load(home)
    values = settings(config)
    if args.action == "get":
        if args.json:
            print(safe_json(values if args.key is None else {args.key: values[args.key]}))
        elif args.key is not None:
            value = values[args.key]
            if value is not None:
                print(safe_cell(value))
        else:
            for key, value in values.items():
                print(f"{key}: {safe_cell(_shown(key, value))}")
        return 0
    if args.action == "unset" and args.key not in UNSETTABLE:
        raise CommandError(
            f"{args.key} cannot be unset (only {', '.join(UNSETTABLE)}); set another value", 2
        )
    try:
        with config_lock(home):
            # Read again under the lock: a token rotated meanwhile is kept, not undone.
            config = _load(home)
            values = settings(config)
            new = changed(config, home, args.key, getattr(args, "value", None), deps)
            now = settings(new)
            if now == values:
                print(f"{args.key}: {safe_cell(_shown(args.key, values[args.key]))} (unchanged)")
                return 0
            save_config(home, new)
    except (LocalStateError, OSError) as exc:
        raise CommandError(f"config.json was not changed: {exc}") from None
    for key in KEYS:
        if now[key] != values[key]:
            was = safe_cell(_shown(key, values[key]))
            print(f"{key}: {safe_cell(_shown(key, now[key]))} (was {was})")
    for warning in _task_warnings(config, new, home):
        print(safe_cell(warning))
    print(safe_cell(listener_effect(config, new, args.key, home, deps.environ)))
    return 0
