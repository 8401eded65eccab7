"""Pinned Claude Code and Codex CLIs from the npm registry, installed once into a cache.

Each package version gets its own npm prefix under the cache directory
(``AGENTCALL_REAL_AGENTS_CACHE``, default ``~/.cache/agentcall/real-agents``). An install is
done under an exclusive file lock, so parallel test runs wait for each other instead of
writing the same tree, and it counts as complete only once a marker file exists; the marker is
written after the installed binary printed the pinned version. A prefix without the marker is
wiped and installed again.

A registry that cannot be reached is not a failure of the code under test:
:class:`RegistryUnreachable` lets the tier skip. Every other problem raises
:class:`InstallFailed`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

CACHE_ENV = "AGENTCALL_REAL_AGENTS_CACHE"
DEFAULT_CACHE = Path("~/.cache/agentcall/real-agents")
MARKER = ".agentcall-install-complete"
NPM_TIMEOUT_S = 900.0
VERSION_TIMEOUT_S = 60.0
# npm error codes and phrases that mean "no route to the registry", not "bad package".
_NETWORK_ERRORS = re.compile(
    r"\b(?:ENOTFOUND|ETIMEDOUT|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ENETUNREACH|EHOSTUNREACH"
    r"|ENETDOWN|ESOCKETTIMEDOUT|ERR_SOCKET_TIMEOUT|UNABLE_TO_GET_ISSUER_CERT_LOCALLY"
    r"|SELF_SIGNED_CERT_IN_CHAIN)\b"
    r"|network request to \S+ failed"
    r"|request to \S+ failed, reason:",
)


class RegistryUnreachable(Exception):
    """npm could not reach the registry (or there is no npm): the tier cannot run here."""


class InstallFailed(Exception):
    """npm reached the registry, but the install or its version check went wrong."""


@attrs.frozen
class AgentPackage:
    """One pinned npm package and where its command lands inside the prefix."""

    package: str
    version: str
    command: str

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def dirname(self) -> str:
        # "@anthropic-ai/claude-code@2.1.332" -> "anthropic-ai__claude-code@2.1.332"
        return self.package.lstrip("@").replace("/", "__") + "@" + self.version


@attrs.frozen
class InstalledAgent:
    """A verified install: the command to run and what ``--version`` printed."""

    package: AgentPackage
    prefix: Path
    binary: Path
    version_output: str


CLAUDE_VERSION_ENV = "AGENTCALL_REAL_CLAUDE_VERSION"
CODEX_VERSION_ENV = "AGENTCALL_REAL_CODEX_VERSION"
DEFAULT_CLAUDE_VERSION = "2.1.332"
DEFAULT_CODEX_VERSION = "0.171.0"


def claude_package() -> AgentPackage:
    version = os.environ.get(CLAUDE_VERSION_ENV) or DEFAULT_CLAUDE_VERSION
    return AgentPackage("@anthropic-ai/claude-code", version, "claude")


def codex_package() -> AgentPackage:
    version = os.environ.get(CODEX_VERSION_ENV) or DEFAULT_CODEX_VERSION
    return AgentPackage("@openai/codex", version, "codex")


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_CACHE.expanduser()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _quiet_env(scratch_home: Path) -> dict[str, str]:
    """An environment for ``--version``: no updater, no telemetry, nothing of the real HOME."""
    scratch_home.mkdir(parents=True, exist_ok=True)
    env = {
        key: value
        for key, value in os.environ.items()
        if key in ("PATH", "LANG", "LC_ALL", "TMPDIR", "TERM")
    }
    env.update(
        HOME=str(scratch_home),
        CODEX_HOME=str(scratch_home / ".codex"),
        DISABLE_AUTOUPDATER="1",
        DISABLE_TELEMETRY="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    return env


def check_version(package: AgentPackage, binary: Path, scratch_home: Path) -> str:
    """Run ``<binary> --version``; the pinned version must be a whole token of the output."""
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            check=False,
            env=_quiet_env(scratch_home),
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallFailed(f"{binary} --version did not run: {exc}") from exc
    output = (done.stdout + done.stderr).strip()
    pinned = re.compile(rf"(?<![\w.]){re.escape(package.version)}(?![\w.])")
    if done.returncode != 0 or not pinned.search(done.stdout):
        raise InstallFailed(
            f"{binary} --version exited {done.returncode} and printed {output!r}; "
            f"expected version {package.version}"
        )
    return done.stdout.strip()


def _npm_install(package: AgentPackage, prefix: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RegistryUnreachable("npm is not on PATH, so the agent CLIs cannot be installed")
    argv = [
        npm,
        "install",
        "--prefix",
        str(prefix),
        "--no-audit",
        "--no-fund",
        "--ignore-scripts=false",
        # 2.1.198+ declares engines.node >= 22; the native binary runs on any Node, and an
        # owner's engine-strict setting must not turn the pin into an error.
        "--engine-strict=false",
        package.spec,
    ]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise RegistryUnreachable(
            f"npm install {package.spec} did not finish within {NPM_TIMEOUT_S:.0f}s "
            "(registry unreachable or too slow)"
        ) from exc
    if done.returncode == 0:
        return
    output = (done.stdout + "\n" + done.stderr).strip()
    tail = "\n".join(output.splitlines()[-15:])
    if _NETWORK_ERRORS.search(output):
        raise RegistryUnreachable(
            f"the npm registry cannot be reached to install {package.spec}:\n{tail}"
        )
    raise InstallFailed(f"npm install {package.spec} exited {done.returncode}:\n{tail}")


def ensure_installed(package: AgentPackage, cache: Path | None = None) -> InstalledAgent:
    """The verified install of ``package`` in the cache, installing it first if needed."""
    root = cache if cache is not None else cache_dir()
    prefix = root / package.dirname
    binary = prefix / "node_modules" / ".bin" / package.command
    marker = prefix / MARKER
    scratch_home = root / ".version-check-home"
    with _locked(root / f"{package.dirname}.lock"):
        if not (marker.is_file() and binary.exists()):
            if prefix.exists():
                # An earlier attempt died half-way: start from nothing.
                shutil.rmtree(prefix)
            prefix.mkdir(parents=True)
            _npm_install(package, prefix)
            if not binary.exists():
                raise InstallFailed(f"npm install {package.spec} left no {binary}")
            output = check_version(package, binary, scratch_home)
            marker.write_text(json.dumps({"spec": package.spec, "version_output": output}))
        # Checked on every run too: a cache edited by hand must not pass as the pin.
        output = check_version(package, binary, scratch_home)
    return InstalledAgent(package, prefix, binary, output)
