"""Running the real agent CLIs the way the listener does, against the loopback mocks.

- :class:`Layout`: a throwaway owner: a HOME (the read root) with a fake SSH key and a
  ``.env``, a workdir inside it, a file outside every root, and the guard's ``tools.log``.
- :class:`GuardWiring`: the guard command, and the Claude settings, Codex hook value and
  guard environment :mod:`agentcall.listener.guardwire` builds for it. The command is a
  parameter: ``AGENTCALL_REAL_GUARD_CMD`` (a shell-quoted command line) replaces
  ``guardwire.guard_argv()``, to try another guard build.
- :func:`run_real`: the adapter's ``build(spec, prompt)`` run through ``run_agent`` with the
  listener's environment filter, then ``interpret`` on the result.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from twisted.internet import reactor as _reactor

from agentcall.confine.landlock import cached_abi
from agentcall.confine.rules import Confinement
from agentcall.listener import guardwire, planning
from agentcall.listener.agent_env import CALL_ID_ENV, agent_environment
from agentcall.listener.agents.base import (
    AgentAdapter,
    AgentParser,
    AgentSpec,
    Invocation,
    Outcome,
    decode_json_line,
)
from agentcall.listener.runner import AgentRun, RunResult, run_agent

GUARD_CMD_ENV = "AGENTCALL_REAL_GUARD_CMD"
RUN_TIMEOUT_S = 120.0
MOCK_KEY_ENV = "CODEX_MOCK_API_KEY"
DUMMY_ANTHROPIC_KEY = "sk-ant-dummy"

# Everything the Claude CLI would otherwise do on its own: retries that outlast a test,
# the updater, telemetry, error reports. Passed as the spec's extra env, like an owner's.
CLAUDE_QUIET_ENV: Mapping[str, str] = {
    "CLAUDE_CODE_MAX_RETRIES": "0",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "API_TIMEOUT_MS": "30000",
}


# --- the owner's machine -----------------------------------------------------------------------


@attrs.frozen
class Layout:
    """One throwaway owner. Every secret file holds a unique marker the tests look for."""

    root: Path
    home: Path
    workdir: Path
    outside: Path
    ssh_key: Path
    home_env: Path
    outside_file: Path
    notes: Path
    guard_log: Path
    tasks_dir: Path
    markers: Mapping[str, str]

    @classmethod
    def create(cls, base: Path) -> Layout:
        root = base.resolve()
        home = root / "home"
        workdir = home / "work"
        outside = root / "outside"
        guard_dir = root / "guard"
        for directory in (home / ".ssh", workdir, outside, guard_dir):
            directory.mkdir(parents=True)
        (home / ".ssh").chmod(0o700)
        markers = {
            name: f"AGENTCALL-{name.upper()}-{secrets.token_hex(8)}"
            for name in ("ssh_key", "home_env", "outside", "notes")
        }
        layout = cls(
            root=root,
            home=home,
            workdir=workdir,
            outside=outside,
            ssh_key=home / ".ssh" / "id_ed25519",
            home_env=home / ".env",
            outside_file=outside / "secret.txt",
            notes=workdir / "notes.txt",
            guard_log=guard_dir / "tools.log",
            tasks_dir=root / "tasks",
            markers=markers,
        )
        layout.ssh_key.write_text(
            "-----BEGIN OPENSSH PRIVATE KEY-----\n"
            f"{markers['ssh_key']}\n"
            "-----END OPENSSH PRIVATE KEY-----\n"
        )
        layout.ssh_key.chmod(0o600)
        layout.home_env.write_text(f"API_TOKEN={markers['home_env']}\n")
        layout.outside_file.write_text(f"not for callers: {markers['outside']}\n")
        layout.notes.write_text(f"public notes: {markers['notes']}\n")
        return layout

    @property
    def secret_markers(self) -> list[str]:
        """Markers of the files no caller may ever see."""
        return [self.markers[k] for k in ("ssh_key", "home_env", "outside")]

    def guard_records(self) -> list[dict[str, Any]]:
        """tools.log as JSON records (:func:`json_records`)."""
        return json_records(self.guard_log)

    def codex_config(self, mock_base_url: str) -> Path:
        """The owner's ``~/.codex/config.toml`` choosing the mock (:func:`write_codex_config`)."""
        return write_codex_config(self.home, mock_base_url)


def json_records(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines log (tools.log, calls.log) as records; a line that is not a JSON object
    is kept as raw text. A missing file has none."""
    if not path.exists():
        return []
    records: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        value = decode_json_line(line.encode())
        records.append(value if isinstance(value, dict) else {"raw": line})
    return records


def write_codex_config(home: Path, mock_base_url: str) -> Path:
    """``<home>/.codex/config.toml`` choosing the mock as the model provider.

    A custom provider is configured where an owner would put it, so the argv stays the
    adapter's own. Its key is read from ``CODEX_MOCK_API_KEY``.
    """
    codex_home = home / ".codex"
    codex_home.mkdir(exist_ok=True)
    path = codex_home / "config.toml"
    path.write_text(
        'model_provider = "agentcall-mock"\n\n'
        "[model_providers.agentcall-mock]\n"
        'name = "agentcall-mock"\n'
        f"base_url = {json.dumps(mock_base_url + '/v1')}\n"
        f'env_key = "{MOCK_KEY_ENV}"\n'
        'wire_api = "responses"\n'
    )
    return path


# --- the guard ---------------------------------------------------------------------------------


@attrs.frozen
class GuardWiring:
    """The guard command, put into each CLI by :mod:`agentcall.listener.guardwire`."""

    argv: tuple[str, ...]

    @classmethod
    def from_environment(cls) -> GuardWiring:
        """``guardwire.guard_argv()``, or the command line in ``AGENTCALL_REAL_GUARD_CMD``."""
        override = os.environ.get(GUARD_CMD_ENV, "").strip()
        return cls(tuple(shlex.split(override)) if override else tuple(guardwire.guard_argv()))

    def claude_settings(self, argv: Sequence[str] | None = None) -> str:
        """The ``--settings`` JSON running ``argv`` (default: the guard) before every tool."""
        return guardwire.claude_guard_settings(list(self.argv if argv is None else argv))

    def codex_hook(self, argv: Sequence[str] | None = None) -> str:
        """The TOML value of ``hooks.PreToolUse`` (``AgentSpec.codex_hook_config``)."""
        return guardwire.codex_hook_value(list(self.argv if argv is None else argv))

    def env(
        self, layout: Layout, caps: Iterable[str], read_roots: Sequence[Path], call_id: str
    ) -> dict[str, str]:
        """The guard's configuration for one run: the workdir and ``read_roots`` readable,
        the workdir writable when ``write`` is granted, the log in ``layout.guard_log``."""
        cap_set = frozenset(caps)
        return guardwire.guard_env(
            roots=list(dict.fromkeys([str(layout.workdir), *map(str, read_roots)])),
            write_root=str(layout.workdir) if "write" in cap_set else None,
            caps=cap_set,
            call_id=call_id,
            log_path=layout.guard_log,
            home=layout.home,
            extra_denied=guardwire.default_extra_denied(layout.tasks_dir),
        )


def confinement(
    layout: Layout,
    kind: str,
    caps: Iterable[str],
    read_roots: Sequence[Path],
    environ: Mapping[str, str],
) -> Confinement | None:
    """The kernel boundary the listener's planning would give this run (its TCP ports too),
    or None where the kernel has no Landlock (then the guard is the only boundary, as in the
    listener)."""
    abi = cached_abi()
    if abi < 1:
        return None
    setup = planning.GuardSetup(
        argv=tuple(guardwire.guard_argv()),
        tools_log=str(layout.guard_log),
        home=str(layout.home),
        extra_denied=tuple(guardwire.default_extra_denied(layout.tasks_dir)),
    )
    cap_set = set(caps)
    return planning.confinement(
        kind=kind,
        roots=tuple(str(r) for r in read_roots),
        workdir=str(layout.workdir),
        may_write="write" in cap_set,
        guard=setup,
        env=environ,
        environ={},
        required=False,
        connect_ports=planning.network_ports(
            kind,
            may_fetch="fetch" in cap_set,
            home=str(layout.home),
            env=environ,
            environ={},
            kernel_abi=abi,
        ),
    )


# --- running ------------------------------------------------------------------------------------


@attrs.frozen
class RealRun:
    """One finished run of a real CLI: what was spawned, what came out, what it means."""

    invocation: Invocation
    env: Mapping[str, str]
    result: RunResult
    parser: AgentParser
    outcome: Outcome

    @property
    def call_id(self) -> str:
        return self.env[CALL_ID_ENV]

    def describe(self) -> str:
        """Enough of the run to debug a failing assertion."""
        return (
            f"exit={self.result.exit_code} signal={self.result.signal} "
            f"timed_out={self.result.timed_out} outcome={self.outcome!r}\n"
            f"argv={list(self.invocation.argv)!r}\n"
            f"stdout tail={self.result.stdout[-3000:].decode('utf-8', 'replace')}\n"
            f"stderr tail={self.result.stderr[-2000:].decode('utf-8', 'replace')}"
        )


def base_environ(layout: Layout, **extra: str) -> dict[str, str]:
    """What the listener's own environment would hold: PATH (node, python), HOME, locale."""
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(layout.home),
        "LANG": "C.UTF-8",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
    }
    environ.update(extra)
    return environ


async def run_real(
    adapter: AgentAdapter,
    spec: AgentSpec,
    prompt: str,
    *,
    environ: Mapping[str, str],
    guard_env: Mapping[str, str],
    call_id: str,
    timeout_s: float = RUN_TIMEOUT_S,
    confine: Confinement | None = None,
) -> RealRun:
    """``adapter.build`` run exactly through ``run_agent``, then ``adapter.interpret``.

    The environment is the listener's: :func:`agent_environment` over ``environ``, then the
    guard's own variables, which that filter would drop (they are ``AGENTCALL_*``).
    """
    invocation = adapter.build(spec, prompt)
    env = agent_environment(environ, call_id, invocation.env_additions)
    env.update(guard_env)
    run = AgentRun(
        argv=invocation.argv,
        cwd=invocation.cwd,
        env=env,
        stdin=invocation.stdin_bytes,
        timeout_s=timeout_s,
        kill_grace_s=5.0,
        confine=confine,
    )
    parser = adapter.new_parser()
    reactor: Any = _reactor
    finished, _handle = run_agent(reactor, run, parser)
    result = await finished
    return RealRun(invocation, env, result, parser, adapter.interpret(result, parser))
