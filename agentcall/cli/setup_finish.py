"""The steps of ``agentcall setup`` after enrolment; each is safe to repeat.

Publishing the keys, installing the listener service and the self-check call run both right
after enrolment and under ``agentcall setup --resume``, so each of them first looks at what is
already done: published records are not sent again, an unchanged running unit is not
restarted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from agentcall.service_unit import JOURNAL_COMMAND

if TYPE_CHECKING:
    from agentcall.local.config import Config
    from agentcall.local.home import Home
    from agentcall.local.keystore import LocalKeys
    from agentcall.service_unit import Systemctl

SELF_CHECK_MESSAGE = (
    "This is the AgentCall setup check, a test call from your own machine. "
    "Reply with one short sentence saying you received it."
)


# --- dependencies (replaced in tests) ------------------------------------------------------------


@attrs.frozen
class SetupDeps:
    """Everything setup reaches outside the process with; tests pass fakes."""

    make_api: Callable[..., Any]  # (reactor, RelayUrl, Credentials | None, ca_file) -> RelayApi
    run: Callable[..., Any]  # run_on_reactor
    place: Callable[..., Any]  # agentcall.caller.call.place
    systemctl: Systemctl
    which: Callable[[str], str | None] = shutil.which
    platform: str = sys.platform
    launchctl: Callable[..., Any] | None = None  # agentcall.service_unit.run_launchctl
    environ: Mapping[str, str] = attrs.field(factory=lambda: os.environ)
    python: str = sys.executable
    presence_wait_s: float = 30.0
    poll_interval_s: float = 0.5


def say(text: str) -> None:
    """Progress for the person, on stderr (stdout carries only the final summary)."""
    print(text, file=sys.stderr, flush=True)


def _resume_hint(config: Config, what: str, exc: object) -> str:
    return (
        f"enrolled as {config.address}, but {what} failed: {exc}; "
        "fix that and run `agentcall setup --resume` to finish"
    )


async def finish(
    reactor: Any,
    args: argparse.Namespace,
    home: Home,
    config: Config,
    keys: LocalKeys,
    deps: SetupDeps,
    agent_executable: str | None = None,
) -> int:
    from agentcall.caller import call as caller
    from agentcall.cli.main import CommandError
    from agentcall.client.api import Credentials
    from agentcall.crypto.keys import fingerprint
    from agentcall.errors import AgentCallError

    credentials = Credentials(config.org, config.handle, config.token)
    try:
        api = deps.make_api(reactor, config.relay, credentials, config.ca_file)
        published = await caller.ensure_published(api, keys, reactor.seconds())
    except AgentCallError as exc:
        raise CommandError(_resume_hint(config, "publishing the keys", exc)) from None
    say("published " + ", ".join(published) if published else "keys already published")

    listener_started = False
    if config.caller_only:
        say("caller-only: this installation places calls and never answers them")
    elif args.skip_service:
        say(_run_yourself("--skip-service was given"))
    else:
        listener_started = _install_service(home, config, deps, agent_executable)

    summary = f"address: {config.address}\nfingerprint: {fingerprint(keys.identity_record.record)}"
    offer_agent_tools(deps)
    if not listener_started or args.no_verify:
        print(summary)
        return 0
    failure = await _self_check(reactor, api, home, config, keys, deps)
    print(summary)
    if failure is not None:
        raise CommandError(failure)
    return 0


AGENT_NAMES = {"claude": "Claude Code", "codex": "Codex"}


def offer_agent_tools(deps: SetupDeps) -> list[str]:
    """For each coding agent on PATH that ``agentcall install`` has not set up, say how to
    let it place calls itself (setup asks nothing: it also runs from scripts)."""
    from agentcall.cli.install import installed

    offers = []
    for agent, name in AGENT_NAMES.items():
        if deps.which(agent) is None or installed(agent, deps.environ)[0]:
            continue
        offers.append(
            f"found {name}: `agentcall install {agent}` lets it call your coworkers' agents "
            "itself (an MCP server and a short instruction)"
        )
    for line in offers:
        say(line)
    return offers


def _service_path(deps: SetupDeps, agent_executable: str | None) -> list[str]:
    """The directories the service's PATH starts with: the agent's, node's, Python's."""
    dirs = [os.path.dirname(agent_executable)] if agent_executable else []
    node = deps.which("node")
    if node:
        # Claude Code and Codex are node programs started through `#!/usr/bin/env node`.
        dirs.append(os.path.dirname(os.path.abspath(node)))
    return [*dirs, os.path.dirname(deps.python)]


def _install_launchd(
    home: Home, config: Config, deps: SetupDeps, agent_executable: str | None
) -> bool:
    """macOS: a launchd agent in ~/Library/LaunchAgents, loaded into the login session."""
    from agentcall import service_unit
    from agentcall.cli.main import CommandError

    launchctl = deps.launchctl or service_unit.run_launchctl
    try:
        spec = service_unit.listener_spec(
            home, deps.environ, python=deps.python, path_dirs=_service_path(deps, agent_executable)
        )
        path = service_unit.launchd_path(home)
        log = service_unit.launchd_log_path(home)
        plist = service_unit.render_launchd_plist(spec, log)
        service_unit.install_launchd(path, plist, launchctl, os.getuid())
    except service_unit.ServiceUnitError as exc:
        raise CommandError(
            _resume_hint(config, "installing the listener agent", exc)
            + " (or run `agentcall listen` yourself)"
        ) from None
    say(f"listener agent loaded: {path} (log: {log})")
    return True


def _run_yourself(why: str) -> str:
    return (
        f"{why}: to answer calls, run `agentcall listen` (or `twistd -n agentcall-listen`) "
        "under your own supervisor (launchd, a container, tmux)"
    )


def _install_service(
    home: Home, config: Config, deps: SetupDeps, agent_executable: str | None
) -> bool:
    """Install and start the user unit; False when systemd is not there to do it."""
    from agentcall import service_unit
    from agentcall.cli.main import CommandError

    if deps.platform == "darwin":
        return _install_launchd(home, config, deps, agent_executable)
    if not service_unit.systemd_available(deps.systemctl):
        say(_run_yourself("no systemd user manager answers here"))
        return False
    try:
        spec = service_unit.listener_spec(
            home, deps.environ, python=deps.python, path_dirs=_service_path(deps, agent_executable)
        )
        path = service_unit.unit_path(home, deps.environ)
        started = service_unit.install(path, service_unit.render_unit(spec), deps.systemctl)
    except service_unit.ServiceUnitError as exc:
        raise CommandError(
            _resume_hint(config, "installing the listener service", exc)
            + " (or run `agentcall listen` yourself)"
        ) from None
    say(
        f"listener service {'started' if started else 'already running'}: {path} "
        f"(log: `{JOURNAL_COMMAND}`)"
    )
    return True


async def _self_check(
    reactor: Any, api: Any, home: Home, config: Config, keys: LocalKeys, deps: SetupDeps
) -> str | None:
    """Call ourselves through the new listener; None when it answered, else why not."""
    from twisted.internet import task

    from agentcall.cli.render import describe_error, safe_cell
    from agentcall.errors import AgentCallError

    waited = 0.0
    while True:
        try:
            presence = await api.presence()
            if presence.online:
                break
        except AgentCallError:
            pass  # the relay may be briefly unreachable; the deadline below decides
        if waited >= deps.presence_wait_s:
            return (
                f"the listener did not connect to the relay within {deps.presence_wait_s:g} s; "
                f"see `{JOURNAL_COMMAND}` and `systemctl --user status agentcall-listener`"
            )
        await task.deferLater(reactor, deps.poll_interval_s, lambda: None)
        waited += deps.poll_interval_s
    say(f"test call to {config.address}…")
    # The self-check proves the listener answers now: a queued job would prove nothing.
    result = await deps.place(
        reactor,
        home,
        config,
        keys,
        config.address,
        SELF_CHECK_MESSAGE,
        None,
        lambda _s: None,
        queue=False,
    )
    if result.ok:
        say(f"test call answered in {result.elapsed_s:.1f}s: the listener works")
        return None
    detail = f" ({safe_cell(result.detail)[:200]})" if result.detail else ""
    return (
        f"setup is complete, but the test call failed: {describe_error(result.code)}{detail}; "
        f"check `{JOURNAL_COMMAND}`, then try `agentcall call {config.address} hello`"
    )
