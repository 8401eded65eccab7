"""``twistd agentcall-listen`` (and ``agentcall listen``): parse options, compose the service.

The service is :class:`agentcall.listener.service.ListenerService`; this module adds its
caller's side: a call a thin ``agentcall call`` hands over the local socket is placed by
:func:`agentcall.caller.callflow.run_request`, exactly as the CLI would place it itself, with
the service's own relay API and its :attr:`~agentcall.listener.service.ListenerService.call_dial`;
a thin ``agentcall jobs`` is run by :func:`agentcall.caller.jobsflow.run_request`, as the CLI
would run it, with that relay API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.application.service import IService
from twisted.python import usage

if TYPE_CHECKING:
    from agentcall.listener.localsocket import CallHandler, EventSink, Handlers, JobsHandler
    from agentcall.listener.service import ListenerService
    from agentcall.wire.local import LocalCall, LocalEnded, LocalJobs, LocalJobsEnded


class Options(usage.Options):
    synopsis = ""
    longdesc = (
        "Answer AgentCall calls on this machine: hold one connection to the relay and, for "
        "each call the owner's policy admits, run a fresh one-shot agent (claude -p, codex "
        "exec or the configured command) and send back its sealed, signed answer. It also "
        "places this user's own calls for `agentcall call` (and runs `agentcall jobs`), which "
        "hands them over a private socket in the state directory. The installation is "
        "found through AGENTCALL_HOME "
        "(default $HOME/.agentcall); set it up with `agentcall setup` first. AGENTCALL_RELAY "
        "overrides the relay URL for this run; AGENTCALL_LOG_LEVEL=debug also writes the "
        "per-call detail (default info)."
    )
    optFlags = [
        [
            "test-ceiling-override",
            None,
            "TESTS ONLY: let AGENTCALL_TEST_CEILING_PATH replace the administrator's policy "
            "ceiling. Never used by `agentcall listen` or the installed service.",
        ],
    ]
    optParameters = [
        [
            "log-format",
            None,
            "text",
            "text (the default, for a terminal) or json: one JSON object per line (ts, level, "
            "event, then its fields) on stdout, for the journal and log shippers.",
        ],
    ]

    def postOptions(self) -> None:
        from agentcall.logevents import use_log_format

        use_log_format(self, self["log-format"])


def local_calls(svc: ListenerService) -> CallHandler:
    """What placing a thin client's call means for ``svc``."""
    from twisted.internet import defer

    from agentcall.caller import callflow
    from agentcall.wire.frames import CallStatus
    from agentcall.wire.local import LocalNote, LocalStatus

    def handle(request: LocalCall, send: EventSink) -> defer.Deferred[LocalEnded]:
        def on_status(frame: CallStatus) -> None:
            send(LocalStatus(str(frame.state), frame.call_id))

        def on_note(text: str) -> None:
            send(LocalNote(text))

        placed = defer.Deferred.fromCoroutine(
            callflow.run_request(
                svc.reactor,
                svc.home,
                svc.config,
                request,
                on_status,
                on_note,
                api=svc.api,
                dial=svc.call_dial,
            )
        )

        def placed_then(result: object) -> object:
            # Placing the call may have minted (and published) the next encryption epoch.
            svc.keys_may_have_changed()
            return result

        return placed.addBoth(placed_then)

    return handle


def local_jobs(svc: ListenerService) -> JobsHandler:
    """What running a thin client's ``agentcall jobs`` means for ``svc``: the same
    :func:`agentcall.caller.jobsflow.run_jobs` the CLI runs, with the service's relay API."""
    from twisted.internet import defer

    from agentcall.caller import jobsflow
    from agentcall.wire.local import LocalProgress

    def handle(request: LocalJobs, send: EventSink) -> defer.Deferred[LocalJobsEnded]:
        def on_progress(text: str) -> None:
            send(LocalProgress(text))

        return defer.Deferred.fromCoroutine(
            jobsflow.run_request(
                svc.reactor, svc.home, svc.config, request, on_progress, api=svc.api
            )
        )

    return handle


def local_service(svc: ListenerService) -> Handlers:
    """Everything the service does for thin clients on its local socket."""
    from agentcall.listener.localsocket import Handlers

    return Handlers(call=local_calls(svc), jobs=local_jobs(svc))


def makeService(config: Options) -> IService:
    from twisted.internet import reactor

    from agentcall.logevents import quiet_factories

    quiet_factories()
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
            reactor,
            listener_environ(),
            test_ceiling=bool(config["test-ceiling-override"]),
            local_calls=local_service,
        )
    except ListenerStartError as exc:
        # twistd prints this and exits non-zero before anything is started.
        raise SystemExit(f"agentcall-listen: {exc}") from None
