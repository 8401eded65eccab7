"""The listener as a systemd user service: the unit text, and installing it with systemctl.

``agentcall setup`` writes ``~/.config/systemd/user/agentcall-listener.service`` (0600) and asks
the user's own service manager (``systemctl --user``) to run it. The unit runs this very Python
with ``-m agentcall listen``, so it uses the same installation of the package as the setup did.

Every value written into the unit comes from the environment (paths, ``PATH``), so it is made
inert before it goes in: each value is double-quoted with ``\\`` and ``"`` escaped, ``%``
(systemd's specifier prefix) is doubled, and in the arguments of ``ExecStart=`` ``$`` (variable
expansion) is doubled too; the program path itself gets no ``$`` expansion and may not contain
quotes or backslashes at all (systemd refuses them). A NUL or a line break could end the line
and start a new directive, so values with any control character are refused outright.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from agentcall.atomicfile import replace_file
from agentcall.errors import AgentCallError
from agentcall.local.home import Home

UNIT_NAME = "agentcall-listener.service"
# Where the service's output is read (the unit sends it to the journal).
JOURNAL_COMMAND = "journalctl --user -u agentcall-listener"
UNIT_FILE_MODE = 0o600
# The dirs an agent CLI usually needs besides its own (node for Claude Code, git, a shell).
BASE_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
# Variables passed into the unit when they are set where setup runs: they decide which
# identity, which trust roots and which package the listener uses.
PASSED_THROUGH = ("AGENTCALL_HOME", "SSL_CERT_FILE", "PYTHONPATH")
SYSTEMCTL_TIMEOUT_S = 30.0

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class ServiceUnitError(AgentCallError):
    """The unit cannot be written safely, or systemctl refused it (one-line reason)."""


# --- quoting -------------------------------------------------------------------------------------


def _refuse_controls(value: str, what: str) -> None:
    if _CONTROL_RE.search(value):
        raise ServiceUnitError(
            f"{what} contains a NUL, a line break or another control character; "
            "it cannot be written into a systemd unit"
        )


def _quoted(value: str) -> str:
    # systemd unquotes with C-style escapes, so the backslash is escaped before the quote.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'


def quote_exec_arg(value: str) -> str:
    """One ``ExecStart=`` argument: quoted, with specifiers and ``$`` expansion disabled."""
    _refuse_controls(value, "a command-line argument")
    return _quoted(value).replace("$", "$$")


def quote_exec_program(value: str) -> str:
    """The program of ``ExecStart=``: systemd expands no ``$`` there and refuses quotes."""
    _refuse_controls(value, "the program path")
    if any(char in value for char in "\\\"'"):
        raise ServiceUnitError(
            f"the program path {value!r} contains a quote or a backslash, which systemd refuses"
        )
    if not os.path.isabs(value):
        raise ServiceUnitError(f"the program path {value!r} is not absolute")
    return _quoted(value)


def quote_environment(name: str, value: str) -> str:
    """One ``Environment=`` assignment; systemd does not expand ``$`` there, only ``%``."""
    if _ENV_NAME_RE.match(name) is None:
        raise ServiceUnitError(f"{name!r} is not a valid environment variable name")
    _refuse_controls(value, f"the value of {name}")
    return _quoted(f"{name}={value}")


# --- the unit ------------------------------------------------------------------------------------


@attrs.frozen
class UnitSpec:
    """What the unit runs and with which environment; rendered by :func:`render_unit`."""

    argv: tuple[str, ...]
    environment: tuple[tuple[str, str], ...]


def unit_search_path(path_dirs: Sequence[str]) -> str:
    """``PATH`` for the service: the given dirs first, then the usual ones, no duplicates."""
    seen: list[str] = []
    for directory in [*path_dirs, *BASE_PATH]:
        if directory and os.path.isabs(directory) and directory not in seen:
            seen.append(directory)
    return os.pathsep.join(seen)


def listener_spec(
    home: Home,
    environ: Mapping[str, str],
    *,
    python: str,
    path_dirs: Sequence[str] = (),
) -> UnitSpec:
    """The listener unit for this installation, run by ``python -m agentcall listen``."""
    if not os.path.isabs(python):
        raise ServiceUnitError(f"the Python interpreter {python!r} is not an absolute path")
    environment = [("HOME", str(home.user_home)), ("PATH", unit_search_path(path_dirs))]
    environment += [(name, environ[name]) for name in PASSED_THROUGH if environ.get(name)]
    return UnitSpec(
        argv=(python, "-m", "agentcall", "listen"),
        environment=tuple(environment),
    )


def render_unit(spec: UnitSpec) -> str:
    """The text of the unit file; raises :class:`ServiceUnitError` for an unsafe value."""
    if not spec.argv:
        raise ServiceUnitError("the unit needs a program to run")
    program, *arguments = spec.argv
    exec_start = " ".join([quote_exec_program(program), *map(quote_exec_arg, arguments)])
    environment = [f"Environment={quote_environment(k, v)}" for k, v in spec.environment]
    lines = [
        "# Written by `agentcall setup`; `agentcall setup --resume` rewrites it.",
        "[Unit]",
        "Description=AgentCall listener",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={exec_start}",
        "Restart=always",
        "RestartSec=2",
        # `agentcall listen` exits 78 when another listener for the identity took over at the
        # relay (agentcall.cli.listen.EXIT_REPLACED); restarting would take it back, forever.
        "RestartPreventExitStatus=78",
        *environment,
        # The journal keeps, rotates and timestamps it: `journalctl --user -u agentcall-listener`.
        "StandardOutput=journal",
        "StandardError=journal",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def unit_path(home: Home, environ: Mapping[str, str]) -> Path:
    """Where systemd looks for this user's units: ``$XDG_CONFIG_HOME`` or ``~/.config``."""
    config_home = environ.get("XDG_CONFIG_HOME", "")
    base = Path(config_home) if os.path.isabs(config_home) else home.user_home / ".config"
    return base / "systemd" / "user" / UNIT_NAME


# --- systemctl -----------------------------------------------------------------------------------

# Runs `systemctl --user ARGS…` and returns the finished process (never raises for a non-zero
# exit). Tests pass a recording fake.
Systemctl = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run_systemctl(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """The real ``systemctl --user``; a missing binary or a hang reads as a failure."""
    try:
        return subprocess.run(
            ["systemctl", "--user", *args],
            capture_output=True,
            text=True,
            timeout=SYSTEMCTL_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        return subprocess.CompletedProcess(args, 127, "", "systemctl: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", "systemctl did not answer in time")


def systemd_available(systemctl: Systemctl) -> bool:
    """True when a systemd user manager answers (not in most containers, nor over plain su)."""
    return systemctl(["show-environment"]).returncode == 0


def _checked(systemctl: Systemctl, *args: str) -> subprocess.CompletedProcess[str]:
    done = systemctl(list(args))
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        raise ServiceUnitError(f"`systemctl --user {' '.join(args)}` failed: {reason[:200]}")
    return done


def _write_unit(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    replace_file(path, text.encode("utf-8"), mode=UNIT_FILE_MODE, durable=False)


def install(path: Path, text: str, systemctl: Systemctl) -> bool:
    """Write the unit, enable it and make sure it runs; True when it was (re)started.

    An unchanged unit that is already active is left running, so finishing a setup again does
    not kill a call the listener is answering.
    """
    try:
        unchanged = path.read_text(encoding="utf-8") == text
    except FileNotFoundError:
        unchanged = False
    except OSError as exc:
        raise ServiceUnitError(f"cannot read {path}: {exc.strerror or exc}") from None
    if unchanged and systemctl(["is-active", "--quiet", UNIT_NAME]).returncode == 0:
        return False
    try:
        _write_unit(path, text)
    except OSError as exc:
        raise ServiceUnitError(f"cannot write {path}: {exc.strerror or exc}") from None
    _checked(systemctl, "daemon-reload")
    _checked(systemctl, "enable", UNIT_NAME)
    _checked(systemctl, "restart", UNIT_NAME)
    return True


def uninstall(path: Path, systemctl: Systemctl) -> None:
    """Stop and disable the unit, remove its file, and forget any failed state."""
    if path.exists():
        _checked(systemctl, "disable", "--now", UNIT_NAME)
        path.unlink()
    _checked(systemctl, "daemon-reload")
    # Only clears a remembered failure; nothing to reset is not an error.
    systemctl(["reset-failed", UNIT_NAME])


# --- launchd (macOS) ------------------------------------------------------------------------------

LAUNCHD_LABEL = "com.agentcall.listener"

# Runs `launchctl ARGS…` and returns the finished process (never raises). Tests pass a fake.
Launchctl = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def launchd_path(home: Home) -> Path:
    """Where launchd looks for this user's agents."""
    return home.user_home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


def launchd_log_path(home: Home) -> Path:
    """launchd has no journal: the agent's output goes here (Console.app shows it)."""
    return home.user_home / "Library" / "Logs" / "agentcall-listener.log"


def render_launchd_plist(spec: UnitSpec, log_path: Path) -> bytes:
    """The launchd agent for ``spec``, as an XML property list.

    launchd starts it at login and again only if it crashed: a listener that exits (another one
    took over its identity at the relay, or its configuration is broken) stays stopped, as the
    systemd unit's RestartPreventExitStatus keeps it, instead of flapping.
    """
    import plistlib

    if not spec.argv:
        raise ServiceUnitError("the agent needs a program to run")
    for value in (*spec.argv, *(v for _k, v in spec.environment)):
        _refuse_controls(value, "a value of the launchd agent")
    agent = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": list(spec.argv),
        "EnvironmentVariables": dict(spec.environment),
        "RunAtLoad": True,
        "KeepAlive": {"Crashed": True},
        "ThrottleInterval": 10,
        "ProcessType": "Background",
        "StandardOutPath": str(log_path),
        "StandardErrorPath": str(log_path),
    }
    return plistlib.dumps(agent, fmt=plistlib.FMT_XML, sort_keys=False)


def run_launchctl(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["launchctl", *args],
            capture_output=True,
            text=True,
            timeout=SYSTEMCTL_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        return subprocess.CompletedProcess(args, 127, "", "launchctl: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", "launchctl did not answer in time")


def install_launchd(path: Path, plist: bytes, launchctl: Launchctl, uid: int) -> None:
    """Write the agent and (re)load it into the user's GUI session."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_file(path, plist, mode=UNIT_FILE_MODE, durable=False)
    except OSError as exc:
        raise ServiceUnitError(f"cannot write {path}: {exc.strerror or exc}") from None
    domain = f"gui/{uid}"
    # Not loaded yet is not an error: bootout only makes the bootstrap below load the new file.
    launchctl(["bootout", f"{domain}/{LAUNCHD_LABEL}"])
    done = launchctl(["bootstrap", domain, str(path)])
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        raise ServiceUnitError(f"`launchctl bootstrap {domain} {path}` failed: {reason[:200]}")
