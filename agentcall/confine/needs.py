"""What an agent needs in order to run under the kernel boundary: its installation, its
interpreter, the guard's Python and package, and its own configuration directory.

Reads a little of the file system (real paths, the first line of a script), never walks a tree.
Standard library only.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping

_SHEBANG_BYTES = 256


def install_root(real_program: str) -> str:
    """The directory that holds a program's installation.

    An npm package runs helpers from sibling packages (Codex's launcher starts the native
    binary of another package), so a program inside ``node_modules`` gets the outermost
    ``node_modules`` directory; anything else the directory it is in.
    """
    parts = real_program.split(os.sep)
    if "node_modules" in parts:
        return os.sep.join(parts[: parts.index("node_modules") + 1]) or os.sep
    return os.path.dirname(real_program)


def shebang_interpreter(first_line: bytes, search_path: str) -> str | None:
    """The interpreter a ``#!`` line names (through ``env``, looked up on ``search_path``)."""
    if not first_line.startswith(b"#!"):
        return None
    words = first_line[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None
    program, rest = words[0], words[1:]
    if os.path.basename(program) == "env":
        names = [w for w in rest if not w.startswith("-") and "=" not in w]
        if not names:
            return None
        return shutil.which(names[0], path=search_path)
    return program


def _venv_of(program: str) -> str | None:
    """The virtual environment a ``…/bin/python`` belongs to (Python reads its pyvenv.cfg)."""
    prefix = os.path.dirname(os.path.dirname(program))
    return prefix if os.path.isfile(os.path.join(prefix, "pyvenv.cfg")) else None


def program_paths(program: str, search_path: str) -> list[str]:
    """Installation directories of ``program`` and of the interpreter its script names."""
    found: list[str] = []
    for candidate in (program, _interpreter_of(program, search_path)):
        if candidate is None:
            continue
        real = os.path.realpath(candidate)
        found.append(install_root(real))
        venv = _venv_of(os.path.abspath(candidate))
        if venv is not None:
            found.append(venv)
    return found


def _interpreter_of(program: str, search_path: str) -> str | None:
    try:
        with open(program, "rb") as handle:
            first = handle.read(_SHEBANG_BYTES)
    except OSError:
        return None
    return shebang_interpreter(first, search_path)


def command_paths(args: tuple[str, ...]) -> list[str]:
    """The installations that the absolute paths among an agent command's words name."""
    found: list[str] = []
    for arg in args:
        if os.path.isabs(arg) and os.path.exists(arg):
            real = os.path.realpath(arg)
            found.append(real if os.path.isdir(real) else install_root(real))
    return found


def guard_runtime() -> tuple[list[str], list[str]]:
    """What the tool guard (``python -I -m agentcall.guard``, a child of the agent) reads:
    this Python's prefixes and the agentcall package (read), and the directory the package
    is found in (listed, for a package installed in development mode)."""
    import agentcall

    package = os.path.dirname(os.path.abspath(agentcall.__file__))
    read = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, package]
    read.append(install_root(os.path.realpath(sys.executable)))
    return list(dict.fromkeys(read)), [os.path.dirname(package)]


def agent_state(
    kind: str, home: str, environ: Mapping[str, str], uid: int
) -> tuple[list[str], list[str]]:
    """The agent's own configuration and session directories, and its files beside them,
    which it reads and writes."""
    if kind == "claude":
        configured = environ.get("CLAUDE_CONFIG_DIR", "")
        if configured:
            return [configured], []
        return [os.path.join(home, ".claude")], [os.path.join(home, ".claude.json")]
    if kind == "codex":
        codex_home = environ.get("CODEX_HOME", "") or os.path.join(home, ".codex")
        # Codex keeps the state of its sandbox helper in /tmp whatever TMPDIR says.
        return [codex_home, f"/tmp/codex-daemon-{uid}"], []  # noqa: S108
    return [], []


# Where an agent's HTTPS traffic may be sent instead of straight to its vendor.
PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)
_DEFAULT_PORTS = {"https": 443, "http": 80, "socks5": 1080, "socks5h": 1080, "socks4": 1080}
_MAX_CONFIG_BYTES = 1024 * 1024


def url_port(url: str) -> int | None:
    """The TCP port a URL (or a proxy's ``host:port``) names, or None when it names none."""
    from urllib.parse import urlsplit

    text = url.strip()
    if not text:
        return None
    if "://" not in text:
        text = "http://" + text  # a proxy variable may hold host:port alone
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    if port is None:
        port = _DEFAULT_PORTS.get(parts.scheme.lower())
    return port if port is not None and 0 < port < 65536 else None


def _config_urls(value: object, key: str = "") -> list[str]:
    """Every string under a key that names an endpoint (``base_url``, ``*_base_url``, ``url``)."""
    if isinstance(value, dict):
        return [url for k, v in value.items() for url in _config_urls(v, str(k))]
    if isinstance(value, list):
        return [url for item in value for url in _config_urls(item, key)]
    if isinstance(value, str) and (key == "url" or key.endswith("base_url")):
        return [value]
    return []


def codex_config_urls(codex_home: str) -> list[str]:
    """The endpoints the owner's ``config.toml`` names (model providers, MCP servers); none
    when it is missing or does not parse (Codex itself would then refuse to start)."""
    import tomllib

    try:
        with open(os.path.join(codex_home, "config.toml"), "rb") as handle:
            raw = handle.read(_MAX_CONFIG_BYTES + 1)
        if len(raw) > _MAX_CONFIG_BYTES:
            return []
        return _config_urls(tomllib.loads(raw.decode("utf-8")))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []


def agent_ports(kind: str, home: str, environ: Mapping[str, str]) -> tuple[int, ...]:
    """The TCP ports an agent connects to for its model and its owner's servers: HTTPS,
    the proxy's, and those its configuration names. Only Codex needs this (its commands are
    bounded by the kernel, not by its own sandbox); other agents: none."""
    if kind != "codex":
        return ()
    urls = [environ.get(name, "") for name in (*PROXY_VARIABLES, "OPENAI_BASE_URL")]
    urls += codex_config_urls(environ.get("CODEX_HOME", "") or os.path.join(home, ".codex"))
    ports = {443}
    ports.update(port for port in map(url_port, urls) if port is not None)
    return tuple(sorted(ports))


# The agent's own trust settings: a private CA (a company proxy's) often lives outside the
# system directories, and an agent that cannot read it cannot authenticate.
TRUST_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS")


def trust_paths(environ: Mapping[str, str]) -> list[str]:
    """The CA files and directories the agent's environment names (absolute paths only;
    ``SSL_CERT_DIR`` may list several, separated by ``os.pathsep``)."""
    found: list[str] = []
    for name in TRUST_VARIABLES:
        for path in environ.get(name, "").split(os.pathsep):
            if os.path.isabs(path):
                found.append(path)
    return found
