"""``agentcall uninstall``: stop and remove the listener service, then (once asked) the keys and
state of this installation.

In an order that never strands anything: everything is checked and asked first, so a refusal
changes nothing; the service goes before the files, so no listener is left restarting over
deleted keys; and only the files agentcall itself writes are deleted, one by one — never the
directory tree — so a state directory that ``AGENTCALL_HOME`` points somewhere shared loses
nothing else. The owner's tasks (``~/AgentCall/tasks``) are theirs and stay.

What it cannot undo is said at the end: the membership and the published keys stay on the relay
until an organisation admin runs ``agentcall members remove HANDLE``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs

from agentcall.local.home import Home

if TYPE_CHECKING:
    from agentcall.local.config import Config
    from agentcall.service_unit import Systemctl

DESCRIPTION = """\
Remove agentcall from this machine: stop and remove the listener's systemd user service, then
delete this installation's keys and state (config.json with its token, keys.json, contacts,
pins, history and logs) from the state directory. It asks before deleting anything; without
a terminal it refuses unless --yes is given. --keep-keys removes only the service, so
`agentcall setup --resume` can bring it back. Your tasks in ~/AgentCall/tasks are kept. While
a listener still answers (an `agentcall listen` outside systemd), no key is deleted.

Your membership and your published keys stay on the relay: callers still find you until an
organisation admin runs `agentcall members remove HANDLE`, which also ends your token."""

EPILOG = """\
examples:
  agentcall uninstall
  agentcall uninstall --keep-keys
  agentcall uninstall --yes"""

# What agentcall writes in the state directory besides Home.private_paths(): the owner's
# policy, the key lock, the listener's socket and the recovery marker.
OTHER_FILES: Final = ("policy.json", "keys.lock", "config.lock", "service.sock")


def _stdin_is_terminal() -> bool:
    # Looked up at each call: sys.stdin may be replaced after import.
    return sys.stdin.isatty()


def _listener_answers(home: Home) -> bool:
    """True when a listener of this user still answers on the state directory's socket."""
    from agentcall.cli.viaservice import connect

    sock = connect(home)
    if sock is None:
        return False
    sock.close()
    return True


@attrs.frozen
class UninstallDeps:
    """What uninstall reaches outside the process with; tests pass fakes."""

    systemctl: Systemctl
    environ: Mapping[str, str] = attrs.field(factory=lambda: os.environ)
    is_terminal: Callable[[], bool] = _stdin_is_terminal
    ask: Callable[[str], str] = input
    listener_running: Callable[[Home], bool] = _listener_answers


# Tests set this; None means the real systemctl and terminal.
DEPS: UninstallDeps | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--yes", action="store_true", help="delete the keys and state without asking"
    )
    parser.add_argument(
        "--keep-keys",
        action="store_true",
        help="remove only the service; keep the keys and state (`agentcall setup --resume` "
        "reinstalls it)",
    )


def _real_deps() -> UninstallDeps:
    from agentcall import service_unit

    return UninstallDeps(systemctl=service_unit.run_systemctl)


def say(text: str) -> None:
    from agentcall.cli.render import safe_cell

    print(safe_cell(text), flush=True)


# --- the files -------------------------------------------------------------------------------


def state_files(home: Home) -> list[Path]:
    """Every file agentcall may have written in the state directory, the secrets first, and
    the temporaries of interrupted atomic writes."""
    named = [home.keys_path, home.config_path, *home.private_paths()]
    named += [home.state_dir / name for name in OTHER_FILES]
    ordered = list(dict.fromkeys(named))
    names = {path.name for path in ordered}
    try:
        entries = sorted(os.listdir(home.state_dir))
    except OSError:
        return ordered
    # atomicfile.replace_file's temporaries: ".<name>.<random>.tmp" beside <name>.
    temporaries = [
        home.state_dir / entry
        for entry in entries
        if entry.startswith(".")
        and entry.endswith(".tmp")
        and any(entry.startswith(f".{name}.") for name in names)
    ]
    return ordered + temporaries


def _delete(home: Home) -> tuple[list[Path], list[str]]:
    """Delete the state files, then the directory if nothing else is in it; (deleted, left)."""
    from agentcall.client import codecache

    deleted: list[Path] = []
    for path in state_files(home):
        try:
            # unlink removes a symlink itself, never what it points to.
            path.unlink()
        except FileNotFoundError:
            continue
        deleted.append(path)
    cache = codecache.remove(home.state_dir)
    if cache is not None:
        deleted.append(cache)
    try:
        left = sorted(os.listdir(home.state_dir))
    except FileNotFoundError:
        return deleted, []
    if home.state_dir.is_symlink():
        # The link is the person's own arrangement (dotfiles): its target stays, emptied.
        return deleted, [*left, f"(the symbolic link {home.state_dir} itself)"]
    if not left:
        home.state_dir.rmdir()
    return deleted, left


# --- the service -----------------------------------------------------------------------------


def _remove_service(home: Home, deps: UninstallDeps) -> str:
    """Stop, disable and remove the user unit; one line saying what happened."""
    from agentcall import service_unit
    from agentcall.cli.main import CommandError

    unit = service_unit.unit_path(home, deps.environ)
    if not service_unit.systemd_available(deps.systemctl):
        if unit.exists():
            unit.unlink()
            return (
                f"no systemd user manager answers here, so nothing was stopped; removed {unit}. "
                "If you run `agentcall listen` under your own supervisor, stop it there"
            )
        return (
            "no systemd user service here; if you run `agentcall listen` under your own "
            "supervisor (launchd, a container, tmux), stop it there"
        )
    if not unit.exists():
        return f"no listener service was installed ({unit} does not exist)"
    try:
        service_unit.uninstall(unit, deps.systemctl)
    except service_unit.ServiceUnitError as exc:
        raise CommandError(
            f"could not remove the listener service: {exc}; nothing was deleted — fix that and "
            "run `agentcall uninstall` again"
        ) from None
    return f"stopped and removed the listener service ({unit})"


# --- entry -----------------------------------------------------------------------------------


def _who(home: Home) -> Config | None:
    from agentcall.local.config import load_config
    from agentcall.local.home import LocalStateError

    try:
        return load_config(home, apply_override=False)
    except LocalStateError:
        return None


def _relay_note(config: Config | None) -> str:
    if config is None:
        return (
            "on the relay, your membership and published keys stay; an organisation admin "
            "removes them with `agentcall members remove HANDLE`"
        )
    return (
        f"on the relay at {config.relay_url}, your membership {config.address} and your "
        "published keys stay: callers still find you (their calls fail as offline, or wait "
        "in your mailbox if offline delivery is on) and your token still works there, until "
        f"an organisation admin runs `agentcall members remove {config.handle}`"
    )


def run(args: argparse.Namespace) -> int:
    from agentcall.cli.main import CommandError
    from agentcall.local.home import Home, LocalStateError
    from agentcall.service_unit import unit_path

    deps = DEPS or _real_deps()
    try:
        home = Home.from_environ(deps.environ)
    except LocalStateError as exc:
        raise CommandError(str(exc)) from None
    present = [path for path in state_files(home) if os.path.lexists(path)]
    if not present and not unit_path(home, deps.environ).exists():
        say(f"nothing to uninstall: no installation in {home.state_dir} and no listener service")
        return 0
    config = _who(home)
    delete = bool(present) and not args.keep_keys
    if delete:
        try:
            # A state directory others can use may hold files that are not ours: refused
            # before anything is stopped, so a refusal changes nothing.
            home.check_state_dir()
        except LocalStateError as exc:
            raise CommandError(f"not deleting anything: {exc}") from None
        who = config.address if config is not None else "this installation"
        if not args.yes:
            if not deps.is_terminal():
                raise CommandError(
                    "uninstall deletes your keys and asks first, but there is no terminal to "
                    "ask on; pass --yes to delete them, or --keep-keys to remove only the "
                    "service",
                    2,
                )
            try:
                answer = deps.ask(
                    f"Delete the keys and state of {who} in {home.state_dir}? This cannot be "
                    "undone: this address can then be used again only with a new invite. [y/N] "
                )
            except EOFError:
                answer = ""  # Ctrl-D at the prompt is a no
            if answer.strip().lower() not in ("y", "yes"):
                say("nothing was changed (--keep-keys removes only the service)")
                return 1
    say(_remove_service(home, deps))
    if not delete:
        if present:
            say(
                f"kept the keys and state in {home.state_dir}; `agentcall setup --resume` "
                "reinstalls the service"
            )
    else:
        if deps.listener_running(home):
            # It holds the keys in memory and would keep answering, then fail at its restart.
            raise CommandError(
                f"a listener still answers on {home.service_socket_path} (an `agentcall "
                "listen` outside systemd?): stop it, then run `agentcall uninstall` again; "
                "nothing was deleted",
            )
        deleted, left = _delete(home)
        say(f"deleted {len(deleted)} file(s) of {who} from {home.state_dir}")
        if left:
            say(f"left in {home.state_dir} (not written by agentcall): {', '.join(left)}")
    if home.tasks_dir.exists():
        say(f"your tasks in {home.tasks_dir} are kept")
    say(_relay_note(config))
    return 0
