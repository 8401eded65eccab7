"""The environment an answering agent runs with: a filtered copy of the listener's own.

The listener's environment may hold credentials that have nothing to do with answering a call
(a cloud key, a database URL, a CI token). An agent that can run a shell could read and quote
them to a caller, so only what an agent CLI needs to start, find its tools, reach its vendor
and authenticate is kept; everything else is dropped.

Kept:

- the basics of a login session: ``PATH``, ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``,
  ``TERM``, ``TMPDIR``, ``TZ``, ``LANG`` and every ``LC_*``;
- where per-user configuration lives (``XDG_*``), so the CLI finds its own login;
- proxies (``http_proxy`` … ``NO_PROXY``) and extra CA bundles, so a CLI behind a corporate
  proxy still reaches its vendor;
- the vendors' own variables: ``ANTHROPIC_*``, ``CLAUDE_*``, ``OPENAI_*``, ``CODEX_*`` (API keys,
  base URLs, model choices: the owner chose them for their agent);
- ``FAKE_AGENT_*``: the test suite's fake ``claude``/``codex`` reads its scenario and its log
  path from these. They mean nothing to a real agent and nobody sets them outside the tests.

Never kept, whatever else says so: any ``AGENTCALL_*`` from outside, and the addresses of the
owner's desktop session (:data:`SESSION_NAMES`: the SSH agent, the D-Bus session bus, X11 and
Wayland), which would let the agent act as the owner. The kernel boundary refuses the sockets
themselves too; this keeps the agent from even being told where they are.

Added last, so nothing can override it: ``AGENTCALL_CALL_ID``, which makes ``agentcall call``
refuse to run inside an answering agent (nested calls are not supported).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

CALL_ID_ENV: Final = "AGENTCALL_CALL_ID"

_KEEP_NAMES: Final = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "TMPDIR",
        "TZ",
        "LANG",
        "LANGUAGE",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "NODE_EXTRA_CA_CERTS",
    }
)
_KEEP_PREFIXES: Final = (
    "LC_",
    "XDG_",
    "ANTHROPIC_",
    "CLAUDE_",
    "OPENAI_",
    "CODEX_",
    "FAKE_AGENT_",
)
_NEVER_PREFIX: Final = "AGENTCALL_"
SESSION_NAMES: Final = frozenset(
    {
        "SSH_AUTH_SOCK",
        "SSH_AGENT_PID",
        "GPG_AGENT_INFO",
        "DBUS_SESSION_BUS_ADDRESS",
        "DISPLAY",
        "WAYLAND_DISPLAY",
        "XAUTHORITY",
    }
)


def _never(name: str) -> bool:
    return name.startswith(_NEVER_PREFIX) or name in SESSION_NAMES


def _kept(name: str) -> bool:
    if _never(name):
        return False
    return name in _KEEP_NAMES or name.startswith(_KEEP_PREFIXES)


def agent_environment(
    environ: Mapping[str, str], call_id: str, additions: Mapping[str, str]
) -> dict[str, str]:
    """The whole environment of one agent run.

    ``additions`` are the adapter's own variables (retry limits and the like); they may not
    set an ``AGENTCALL_*`` variable nor a session address, and ``AGENTCALL_CALL_ID`` is always
    ``call_id``.
    """
    env = {name: value for name, value in environ.items() if _kept(name)}
    env.update((name, value) for name, value in additions.items() if not _never(name))
    env[CALL_ID_ENV] = call_id
    return env
