"""Step 6 of an inbound call (docs/architecture.md): the prompt and the process to run.

Only here does the caller's message go into a prompt. The plan carries the task's tools (as
admission and the admin ceiling left them), its working directory, the tool guard's settings
and environment, the conversation's session, and the task's connectors (written to a private
file, never to argv).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Final

import attrs

from agentcall.confine import needs
from agentcall.confine.rights import NET_ABI, is_port
from agentcall.confine.rules import Confinement
from agentcall.confine.support import isolation_gaps
from agentcall.errors import CallErrorCode
from agentcall.listener import connectors, guardwire
from agentcall.listener.admission import Admitted
from agentcall.listener.agent_env import agent_environment
from agentcall.listener.agents import AgentAdapter, AgentParser, adapter_for
from agentcall.listener.agents.base import AgentSpec, sanitize_detail
from agentcall.listener.callermessage import open_for_prompt
from agentcall.listener.ceiling import Ceiling
from agentcall.listener.contexts import Binding, session_plan
from agentcall.listener.prompt import PromptParts
from agentcall.listener.runner import AgentRun
from agentcall.local.config import Config
from agentcall.wire.http import AgentKind
from agentcall.wire.payloads import CallFailure

NOT_INSTALLED_DETAIL: Final = "the answering agent is not installed"
BOUNDARY_MISSING_DETAIL: Final = (
    "the administrator requires the kernel read boundary (Landlock), which this machine "
    "does not offer, so no agent may run"
)
ISOLATION_MISSING_DETAIL: Final = (
    "the administrator requires the agent to be isolated from the owner's other processes, "
    "which this machine's kernel cannot do, so no agent may run"
)
# More places (os.pathsep-separated, in the listener's environment) a confined agent may read
# and write, such as a build cache its tools need; the denylist still applies.
CONFINE_EXTRA_ENV: Final = "AGENTCALL_CONFINE_EXTRA"
# More TCP ports (comma-separated) a confined Codex may connect to, such as a gateway its
# configuration does not name; an entry that is not a port is ignored (never widens).
CONFINE_PORTS_ENV: Final = "AGENTCALL_CONFINE_PORTS"

PromptBuilder = Callable[[PromptParts, str], str]
# (program name, PATH) -> absolute path of the executable, or None; shutil.which in service.
Which = Callable[[str, str], str | None]

TYPE_CHECKING = False
if TYPE_CHECKING:  # stages imports this module, so the type is only named here
    from agentcall.listener.stages import OpenedCall


@attrs.frozen
class RunPlan:
    """Everything needed to spawn one agent and read what it prints."""

    run: AgentRun = attrs.field(repr=False)  # its stdin holds the prompt
    adapter: AgentAdapter
    parser: AgentParser
    workdir: str
    # Files written for this run only (e.g. the MCP config); removed once it ends.
    private_files: tuple[str, ...] = ()
    # Run before the agent: the guard hook on a call it must refuse (Codex only, which runs
    # the tool when its hook crashes); see guardwire.preflight_problem.
    preflight: AgentRun | None = attrs.field(default=None, repr=False)


class DiscardOutput:
    """The output parser of a preflight run: its answer is judged from the whole result."""

    done = False

    def feed_line(self, line: bytes) -> None:
        pass


def resolve_program(
    config: Config, environ: Mapping[str, str], which: Which
) -> tuple[str, tuple[str, ...]] | None:
    """The agent's absolute program path and its extra arguments, or None if not found."""
    if config.agent_kind is AgentKind.COMMAND and config.agent_command is not None:
        program, *extra = config.agent_command
    elif config.agent_kind in (AgentKind.CLAUDE, AgentKind.CODEX):
        program, extra = str(config.agent_kind), []
    else:
        return None
    # Searched on the listener's PATH (a path with a slash is taken as it is). Symlinks are
    # not followed: a multi-call binary may choose its behaviour by the name it runs under.
    found = which(program, environ.get("PATH", os.defpath))
    if found is None:
        return None
    return os.path.abspath(found), tuple(extra)


@attrs.frozen
class GuardSetup:
    """Where the tool guard lives and logs, for this installation."""

    argv: tuple[str, ...]
    tools_log: str
    home: str
    extra_denied: tuple[str, ...]


def shell_allowed(ceiling: Ceiling | None) -> bool:
    """Whether the admin ceiling leaves ``exec`` to anyone (unmanaged machines: yes)."""
    return ceiling is None or ceiling.max_tools is None or "exec" in ceiling.max_tools


def boundary_required(ceiling: Ceiling | None) -> bool:
    """Whether the admin ceiling demands the kernel boundary for every agent."""
    return ceiling is not None and ceiling.require_kernel_boundary


def isolation_required(ceiling: Ceiling | None) -> bool:
    """Whether the admin ceiling demands that runs be kept from other processes too."""
    return ceiling is not None and ceiling.require_process_isolation


def owner_ports(environ: Mapping[str, str]) -> tuple[int, ...]:
    """The ports in :data:`CONFINE_PORTS_ENV`, those that are ports."""
    words = (w.strip() for w in environ.get(CONFINE_PORTS_ENV, "").split(","))
    return tuple(int(w) for w in words if is_port(w))


def network_ports(
    kind: str,
    *,
    may_fetch: bool,
    home: str,
    env: Mapping[str, str],
    environ: Mapping[str, str],
    kernel_abi: int,
) -> tuple[int, ...] | None:
    """The TCP ports a confined run may connect to, or None for a network left alone.

    Only Codex's network is restricted by the kernel: inside the boundary it runs without its
    own sandbox (which cut its commands off the network), so a task without ``fetch`` gets
    the ports Codex needs for its model and nothing else. Claude's Bash keeps the network it
    always had (the guard records it). Below ABI 4 the kernel has no network rules.
    """
    if kind != AgentKind.CODEX or may_fetch or kernel_abi < NET_ABI:
        return None
    return tuple(sorted({*needs.agent_ports(kind, home, env), *owner_ports(environ)}))


def confinement(
    *,
    kind: str,
    roots: tuple[str, ...],
    workdir: str,
    may_write: bool,
    guard: GuardSetup,
    env: Mapping[str, str],
    environ: Mapping[str, str],
    required: bool,
    command_args: tuple[str, ...] = (),
    connect_ports: tuple[int, ...] | None = None,
) -> Confinement:
    """What the kernel lets one agent run use: the task's roots and workdir, its write root,
    the agent's own configuration, the guard's log (append only) and the owner's extras;
    ``connect_ports`` as :func:`network_ports` gives them."""
    home = env.get("HOME") or guard.home
    extra = tuple(
        p for p in environ.get(CONFINE_EXTRA_ENV, "").split(os.pathsep) if os.path.isabs(p)
    )
    state_dirs, state_files = needs.agent_state(kind, home, env, os.getuid())
    return Confinement(
        read_roots=tuple(dict.fromkeys((*roots, workdir))),
        write_roots=(workdir,) if may_write else (),
        home=guard.home,
        agent_state=tuple(state_dirs),
        agent_files=tuple(state_files),
        append_files=(guard.tools_log,),
        extra=extra,
        required=required,
        denied_extra=guard.extra_denied,
        # A custom agent command's absolute arguments (`python /opt/agent/main.py`) are part
        # of its installation.
        runtime=tuple(needs.command_paths(command_args)),
        # Without its CA files an agent behind a company's proxy cannot authenticate.
        trust=tuple(needs.trust_paths(env)),
        connect_ports=connect_ports,
    )


def plan_run(
    config: Config,
    opened: OpenedCall,
    admitted: Admitted,
    workdir: str,
    binding: Binding | None,
    *,
    guard: GuardSetup,
    shell_allowed: bool = True,
    environ: Mapping[str, str],
    which: Which,
    is_dir: Callable[[str], bool],
    build_prompt: PromptBuilder,
    kernel_abi: int = 0,
    boundary_required: bool = False,
    isolation_required: bool = False,
) -> RunPlan | CallFailure:
    """Build the prompt and the process to run, or the failure that says why not.

    With a Landlock ABI the agent runs confined (:mod:`agentcall.confine`); without one the
    guard is the only boundary, unless the admin ceiling requires the kernel's.
    """
    if boundary_required and kernel_abi < 1:
        return CallFailure(code=CallErrorCode.AGENT_ERROR, detail=BOUNDARY_MISSING_DETAIL)
    if isolation_required and isolation_gaps(kernel_abi):
        return CallFailure(code=CallErrorCode.AGENT_ERROR, detail=ISOLATION_MISSING_DETAIL)
    found = resolve_program(config, environ, which)
    if found is None:
        return CallFailure(code=CallErrorCode.AGENT_ERROR, detail=NOT_INSTALLED_DETAIL)
    program, extra_args = found
    task = admitted.task
    servers: dict[str, connectors.ServerConfig] = {}
    if task.connectors:
        # Only Claude takes the owner's MCP servers; another agent would answer without them.
        if config.agent_kind != AgentKind.CLAUDE:
            detail = "this task's connectors are only supported with Claude Code"
            return CallFailure(code=CallErrorCode.AGENT_ERROR, detail=detail)
        try:
            servers = connectors.task_servers(task.id, task.connectors, guard.home, environ)
        except connectors.ConnectorError as exc:
            # Fail closed: nothing is spawned. The message names files and names, no config.
            return CallFailure(code=CallErrorCode.AGENT_ERROR, detail=sanitize_detail(str(exc)))
    roots = tuple(os.path.realpath(r) for r in config.read_roots if is_dir(r))
    parts = PromptParts(
        owner_address=config.address,
        caller_address=opened.facts.caller_address,
        task_id=task.id,
        task_name=task.name,
        task_instructions=task.instructions or None,
        workdir=workdir,
        readable_roots=config.read_roots,
        threaded=binding is not None,
    )
    # The one place the caller's text is opened: the caller was admitted above.
    prompt = build_prompt(parts, open_for_prompt(opened.message))
    kind = str(config.agent_kind)
    adapter = adapter_for(kind)
    # Exactly what admission allowed: the ceiling's max_tools may have removed even read.
    tools = frozenset(admitted.effective_tools)
    sessions = session_plan(binding, threadable=task.threadable, agent_kind=kind)
    guard_argv = list(guard.argv)
    # The kernel boundary, where there is one, holds every agent (Codex without its own
    # sandbox, which cannot run inside it).
    confined = kernel_abi >= 1
    spec = AgentSpec(
        binary=program,
        workdir=workdir,
        tools=tools,
        read_roots=tuple(r for r in roots if r != workdir),
        settings_json=(
            guardwire.claude_guard_settings(guard_argv) if kind == AgentKind.CLAUDE else None
        ),
        codex_hook_config=(
            guardwire.codex_hook_value(guard_argv) if kind == AgentKind.CODEX else None
        ),
        resume_session=sessions.resume_session,
        keep_session=sessions.keep_session,
        mcp_servers=servers,
        mcp_config_file=_write_mcp_config(guard, opened.facts.call_id, servers),
        confined=confined,
    )
    invocation = adapter.build(spec, prompt)
    # The command adapter runs the program alone; the owner's configured arguments follow it.
    argv = invocation.argv + extra_args
    # Codex reads only through its shell, so its guard must let commands through (recorded,
    # flagged when they name a denied path); the kernel boundary (or, without one, Codex's
    # read-only sandbox) stops reads and writes outside the task. Where the admin ceiling
    # forbids exec, Codex gets no shell and answers from the prompt alone.
    codex_shell = kind == AgentKind.CODEX and shell_allowed
    guard_caps = tools | {"exec"} if codex_shell else tools
    env = dict(agent_environment(environ, opened.facts.call_id, invocation.env_additions))
    # Added after the filter, which drops every AGENTCALL_* variable from outside.
    env.update(
        guardwire.guard_env(
            roots=roots or (workdir,),
            write_root=workdir if "write" in tools else None,
            caps=guard_caps,
            call_id=opened.facts.call_id,
            log_path=guard.tools_log,
            home=guard.home,
            extra_denied=guard.extra_denied,
            mcp_servers=tuple(servers),
        )
    )
    confine = None
    if confined:
        ports = network_ports(
            kind,
            may_fetch="fetch" in tools,
            home=env.get("HOME") or guard.home,
            env=env,
            environ=environ,
            kernel_abi=kernel_abi,
        )
        confine = confinement(
            kind=kind,
            roots=roots,
            workdir=workdir,
            may_write="write" in tools,
            guard=guard,
            env=env,
            environ=environ,
            required=boundary_required,
            command_args=extra_args,
            connect_ports=ports,
        )
    timeout_s = config.agent_timeout_s
    if task.timeout_s is not None:
        timeout_s = min(timeout_s, float(task.timeout_s))
    run = AgentRun(
        argv=argv,
        cwd=invocation.cwd,
        env=env,
        stdin=invocation.stdin_bytes,
        timeout_s=timeout_s,
        kill_grace_s=config.kill_grace_s,
        confine=confine,
    )
    preflight = None
    if kind == AgentKind.CODEX:
        # The same command line, shell, cwd and environment the hook gets from Codex.
        command = guardwire.codex_hook_command(guard_argv)
        preflight = AgentRun(
            argv=guardwire.codex_hook_shell(command, env),
            cwd=invocation.cwd,
            env=env,
            stdin=guardwire.preflight_payload(invocation.cwd),
            timeout_s=guardwire.PREFLIGHT_TIMEOUT_S,
            kill_grace_s=guardwire.PREFLIGHT_KILL_GRACE_S,
        )
    return RunPlan(
        run=run,
        adapter=adapter,
        parser=adapter.new_parser(),
        workdir=workdir,
        private_files=(spec.mcp_config_file,) if spec.mcp_config_file else (),
        preflight=preflight,
    )


def _write_mcp_config(
    guard: GuardSetup, call_id: str, servers: Mapping[str, connectors.ServerConfig]
) -> str | None:
    """Write the task's MCP servers to a 0600 file in the state directory (which the guard
    refuses to the agent), so their tokens never appear in argv; the core removes it."""
    if not servers:
        return None
    path = os.path.join(os.path.dirname(guard.tools_log), f"mcp-{call_id}.json")
    data = json.dumps({"mcpServers": dict(servers)}, separators=(",", ":")).encode("utf-8")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return path
