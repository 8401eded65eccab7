"""``twistd agentcall-listen``: parse options, compose the listener service. Nothing else."""

from __future__ import annotations

from twisted.application.service import IService
from twisted.python import usage


class Options(usage.Options):
    synopsis = ""
    longdesc = (
        "Answer AgentCall calls on this machine: hold one connection to the relay and, for "
        "each call the owner's policy admits, run a fresh one-shot agent (claude -p, codex "
        "exec or the configured command) and send back its sealed, signed answer. The "
        "installation is found through AGENTCALL_HOME (default $HOME/.agentcall); set it up "
        "with `agentcall setup` first. AGENTCALL_RELAY overrides the relay URL for this run; "
        "AGENTCALL_LOG_LEVEL=debug also writes the per-call detail (default info)."
    )
    optFlags = [
        [
            "test-ceiling-override",
            None,
            "TESTS ONLY: let AGENTCALL_TEST_CEILING_PATH replace the administrator's policy "
            "ceiling. Never used by `agentcall listen` or the installed service.",
        ],
    ]


def makeService(config: Options) -> IService:
    from twisted.internet import reactor

    from agentcall.listener.service import (
        ListenerStartError,
        listener_environ,
        make_listener_service,
    )
    from agentcall.logevents import configure_from_environ

    try:
        configure_from_environ()
    except ValueError as exc:
        raise SystemExit(f"agentcall-listen: {exc}") from None
    try:
        return make_listener_service(
            reactor, listener_environ(), test_ceiling=bool(config["test-ceiling-override"])
        )
    except ListenerStartError as exc:
        # twistd prints this and exits non-zero before anything is started.
        raise SystemExit(f"agentcall-listen: {exc}") from None
