"""The listener service: ``twistd -n agentcall-listen``, and the same for ``agentcall listen``.

:func:`make_listener_service` checks everything that would make every call fail before it
connects anywhere (config, caller-only, keys, policy, state database, CA file) and refuses to
start with one clear sentence (:class:`ListenerStartError`). It rotates the encryption key if
due; publishing a new epoch happens once the relay is connected, and a failed publish is
retried on the next connection instead of stopping the listener.

:class:`ListenerService` composes the relay connection, the call pipeline, the mailbox desk
(queued jobs, run through the same pipeline, journalled in ``state.sqlite``) and a periodic key
check. Before it dials, the desk's journal marks every job that may have run before a crash as
``indeterminate_execution``; whenever a relay connection becomes ready, the desk tells a relay
that asks which jobs it holds (``jobs_held``), says ``job_accepted`` again for the job running
here (the relay may have lost the first) and sends again every result the relay has not
acknowledged.

Stopping it (SIGTERM under twistd) refuses new calls and jobs, stops a running agent and waits
for it (bounded by the kill grace plus a little), sends what can still be sent, and closes the
socket normally. A run it cut ends ``indeterminate_execution`` (a live call's sealed failure,
a job's journalled result). A relay socket that drops stops the agent of a live call that came
on it: the relay has ended that call for its caller (``callee_gone``).

When the relay says another listener for the same identity took over (close code 4000), the
service stops the whole process the same way, and :attr:`ListenerService.replaced` tells
``agentcall listen`` to exit with :data:`agentcall.cli.listen.EXIT_REPLACED`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from twisted.application import internet, service
from twisted.internet import defer, error

from agentcall import limits
from agentcall.client.api import Credentials, RelayApi
from agentcall.confine.undumpable import make_undumpable
from agentcall.crypto.pins import PinBook
from agentcall.crypto.replay import ReplayWindow
from agentcall.errors import AgentCallError, ApiError
from agentcall.listener import guardwire
from agentcall.listener.admission import check_assertions
from agentcall.listener.calllog import CallLog
from agentcall.listener.card import listener_card
from agentcall.listener.ceiling import Ceiling, CeilingError, load_ceiling
from agentcall.listener.connection import RelayConnection, RelayLink, RelaySettings
from agentcall.listener.contexts import Conversations
from agentcall.listener.core import CallPipeline
from agentcall.listener.effects import Effects
from agentcall.listener.localsocket import CallHandler, Handlers, LocalSocketService
from agentcall.listener.mailboxdesk import MailboxDesk
from agentcall.listener.orphans import LiveRuns
from agentcall.listener.outgoing import OutgoingCalls
from agentcall.listener.planning import GuardSetup
from agentcall.listener.policy import PolicyError, load_policy
from agentcall.listener.runner import AgentRun, OutputParser, RunHandle, RunResult, run_agent
from agentcall.listener.stages import AdmissionInputs
from agentcall.listener.tasks import load_tasks
from agentcall.local.config import Config, load_config
from agentcall.local.home import Home
from agentcall.local.keystore import LocalKeys, load_keys, rotate_if_needed
from agentcall.local.statedb import StateDb
from agentcall.logevents import Logger
from agentcall.wire.frames import Frame
from agentcall.wire.http import KeysResponse

_log = Logger(namespace="agentcall.listener")

# Beyond the kill grace: the runner's own drain and the sending of the last answer.
STOP_MARGIN_S: Final = 2.0
# Keys are valid for 30 days and rotated in their last 7; checking a few times a day is plenty.
KEY_CHECK_INTERVAL_S: Final = 6 * 3600.0
CALLER_ONLY_MESSAGE: Final = (
    "this installation was set up with --caller-only: it places calls but does not answer "
    "them (run `agentcall setup` again without --caller-only to answer calls)"
)


class ListenerStartError(AgentCallError):
    """The listener cannot start; the message says why in one sentence."""


def _identity(config: Config) -> tuple[str, str]:
    return config.address, config.relay_origin


def _check_identity(config: Config, keys: LocalKeys) -> None:
    if _identity(config) != (keys.address, keys.relay_origin):
        raise ListenerStartError(
            f"config.json names {config.address} at {config.relay_origin}, but keys.json "
            f"belongs to {keys.address} at {keys.relay_origin}; restore the matching files"
        )


def admission_loader(
    home: Home, config: Config, *, test_ceiling: bool = False
) -> Callable[[], AdmissionInputs]:
    """Reads policy.json, the admin ceiling and the tasks afresh for every call.

    ``test_ceiling`` lets AGENTCALL_TEST_CEILING_PATH redirect the ceiling; only the test-only
    twistd flag sets it, never the CLI or the installed service.
    """

    def load() -> AdmissionInputs:
        ceiling: Ceiling | None = load_ceiling(allow_test_override=test_ceiling)
        return AdmissionInputs(
            policy=load_policy(home.policy_path),
            ceiling=ceiling,
            tasks=load_tasks(home.tasks_dir, config.read_roots),
        )

    return load


def _check_admission(load: Callable[[], AdmissionInputs]) -> None:
    """Policy, ceiling and assertions must all hold before the listener takes any call."""
    try:
        inputs = load()
    except CeilingError as exc:
        raise ListenerStartError(
            f"the administrator's policy ceiling cannot be used, so no agent may run: {exc}"
        ) from None
    except PolicyError as exc:
        raise ListenerStartError(
            f"the policy cannot be used, so no call could be answered: {exc}"
        ) from None
    for problem in inputs.tasks.problems:
        _log.warn("task_skipped", problem=str(problem))
    failures = check_assertions(inputs.policy, inputs.ceiling, inputs.tasks)
    if failures:
        raise ListenerStartError(
            f"a policy assertion fails ({failures[0]}); run `agentcall lint` for details"
        )


# Given the service, what placing a thin client's call (and running its `agentcall jobs`)
# means (agentcall.compose.listen).
LocalCallsFactory = Callable[["ListenerService"], CallHandler | Handlers]


def make_listener_service(
    reactor: Any,
    environ: Mapping[str, str],
    *,
    test_ceiling: bool = False,
    local_calls: LocalCallsFactory | None = None,
) -> ListenerService:
    """Check the installation named by ``environ`` and build its listener service.

    With ``local_calls``, the service also serves thin ``agentcall call`` processes on its
    local socket (:mod:`agentcall.listener.localsocket`) and places their calls with it.

    :raises ListenerStartError: with a one-line reason, when it must not start.
    """
    # Before anything secret is loaded: from here on the owner's other processes (an
    # answering agent among them) cannot read this one's environment or memory.
    make_undumpable()
    try:
        home = Home.from_environ(environ)
        config = load_config(home)
    except AgentCallError as exc:
        raise ListenerStartError(str(exc)) from None
    if config.caller_only:
        raise ListenerStartError(CALLER_ONLY_MESSAGE)
    try:
        keys = load_keys(home)
    except AgentCallError as exc:
        raise ListenerStartError(str(exc)) from None
    _check_identity(config, keys)
    # Before any new work: what a listener that died here left running is killed now.
    LiveRuns(home.live_runs_path).reap()
    # Validated now so a broken policy, ceiling or assertion stops startup; every call reads
    # them afresh.
    load_admission = admission_loader(home, config, test_ceiling=test_ceiling)
    _check_admission(load_admission)
    try:
        keys = rotate_if_needed(home, keys, reactor.seconds()) or keys
    except AgentCallError as exc:
        # The current keys still work; the periodic check tries again.
        _log.warn("key_rotation_failed", reason=str(exc))
    try:
        api = _relay_api(reactor, config)
        db = StateDb.open(home)
    except AgentCallError as exc:
        raise ListenerStartError(str(exc)) from None
    return ListenerService(
        reactor,
        home,
        environ,
        config,
        keys,
        db=db,
        api=api,
        load_admission=load_admission,
        local_calls=local_calls,
    )


def _relay_api(reactor: Any, config: Config) -> RelayApi:
    credentials = Credentials(org=config.org, handle=config.handle, token=config.token)
    return RelayApi(reactor, config.relay, credentials, config.ca_file)


class ListenerService(service.MultiService):
    """The relay connection, the call pipeline and the key check, started and stopped together."""

    def __init__(
        self,
        reactor: Any,
        home: Home,
        environ: Mapping[str, str],
        config: Config,
        keys: LocalKeys,
        *,
        db: StateDb,
        api: RelayApi,
        load_admission: Callable[[], AdmissionInputs],
        local_calls: LocalCallsFactory | None = None,
    ) -> None:
        super().__init__()
        self._reactor = reactor
        self._home = home
        self._config = config
        self._db = db
        self._api = api
        self._running: set[int] = set()
        self._live = LiveRuns(home.live_runs_path)
        self.link = RelayLink()
        self.core = CallPipeline(
            config,
            keys,
            Effects(
                clock=reactor,
                send=self.link.send,
                fetch_keys=self._fetch_keys,
                pins=PinBook(db.pins),
                replay=ReplayWindow(storage=db.replay),
                load_admission=load_admission,
                conversations=Conversations(db.contexts),
                guard=GuardSetup(
                    argv=tuple(guardwire.guard_argv()),
                    tools_log=str(home.tools_log_path),
                    home=str(home.user_home),
                    extra_denied=tuple(
                        guardwire.default_extra_denied(home.tasks_dir, home.state_dir)
                    ),
                ),
                spawn=self._spawn,
                call_log=CallLog(home.calls_log_path, secrets=[config.token]),
                environ=dict(environ),
                keys_stale=self.keys_may_have_changed,
            ),
        )
        self.desk = MailboxDesk(self.core, db.journal, send=self.link.send, clock=reactor)
        # The owner's own calls ride the same socket (``self.outgoing.dial`` for place()).
        self.outgoing = OutgoingCalls(self.link, reactor)
        self.connection = RelayConnection(
            reactor,
            load_settings=self._reload_settings,
            link=self.link,
            on_frame=self._on_frame,
            on_ready=self._relay_ready,
            on_replaced=self._replaced_elsewhere,
            on_lost=self._relay_lost,
        )
        self.connection.setServiceParent(self)
        internet.TimerService(KEY_CHECK_INTERVAL_S, self._check_keys).setServiceParent(self)
        # The signed card: published once the relay is ready, then whenever it changes.
        self.card = listener_card(
            load_inputs=load_admission,
            agent_kind=config.agent_kind,
            identity=lambda: self.core.keys.identity,
            relay_origin=config.relay_origin,
            address=config.address,
            clock=reactor,
            api=lambda: self._api,
            connected=lambda: self.link.connected,
        )
        internet.TimerService(limits.CARD_CHECK_INTERVAL_S, self.card.check).setServiceParent(self)
        # How this installation's own outgoing calls reach the relay (thin clients' calls,
        # placed by the local socket's handler): on this service's own relay socket, several at
        # once, or on a socket of their own while it is down. Same shape as
        # agentcall.client.ws.place_call.
        self.call_dial: Callable[..., Any] = self.outgoing.dial
        self.local: LocalSocketService | None = None
        if local_calls is not None:
            self.local = LocalSocketService(
                reactor,
                home.service_socket_path,
                local_calls(self),
                key_path=home.service_key_path,
                run_leaders=self.running_agents,
            )
            self.local.setServiceParent(self)

    # --- what the local socket's calls are placed with --------------------------------------

    @property
    def reactor(self) -> Any:
        return self._reactor

    @property
    def home(self) -> Home:
        return self._home

    @property
    def config(self) -> Config:
        """config.json as the relay connection last loaded it."""
        return self._config

    @property
    def api(self) -> RelayApi:
        """The relay's HTTP API as this installation (rebuilt when the settings change)."""
        return self._api

    # --- effects ----------------------------------------------------------------------------

    def _fetch_keys(self, handle: str) -> defer.Deferred[KeysResponse]:
        # Only for a call the relay sent without its caller's records (an older relay).
        _log.info("caller_keys_fetched", caller=handle)
        return self._api.get_keys(handle)

    def _spawn(
        self, run: AgentRun, parser: OutputParser
    ) -> tuple[defer.Deferred[RunResult], RunHandle]:
        result, handle = run_agent(self._reactor, run, parser)
        pid, run_id = handle.pid, handle.run_id
        # Each run leads its own session: the local socket refuses clients from it. Its
        # marker is kept where a listener started after a crash of this one finds it.
        if pid is not None:
            self._running.add(pid)
        self._live.started(run_id)

        def ended(outcome: RunResult) -> RunResult:
            self._running.discard(pid or 0)
            self._live.ended(run_id)
            return outcome

        result.addBoth(ended)
        return result, handle

    def running_agents(self) -> frozenset[int]:
        """The pids of the agent runs going now (each its session's leader)."""
        return frozenset(self._running)

    def _reload_settings(self) -> RelaySettings:
        """Called before every connection attempt: config.json as it is now."""
        config = load_config(self._home)
        if _identity(config) != _identity(self._config) or config.caller_only:
            raise ListenerStartError(
                "config.json now names another identity or no agent; restart the listener"
            )
        if (config.relay_url, config.token, config.ca_file) != (
            self._config.relay_url,
            self._config.token,
            self._config.ca_file,
        ):
            self._api = _relay_api(self._reactor, config)
            self.core.add_secret(config.token)
            self._config = config
            _log.info("listener_settings_reloaded", relay=config.relay.netloc)
        return RelaySettings(
            relay_url=config.relay,
            credentials=Credentials(org=config.org, handle=config.handle, token=config.token),
            ca_file=config.ca_file,
        )

    @property
    def replaced(self) -> bool:
        """True once another listener for this identity took over the relay session."""
        return self.connection.replaced

    def _replaced_elsewhere(self) -> None:
        # The connection has logged why and stopped redialling; a process that stays up but
        # answers nothing would look healthy to its supervisor, so the process ends (a running
        # call is stopped as on SIGTERM: its answer could not be delivered any more).
        with contextlib.suppress(error.ReactorNotRunning):
            self._reactor.stop()

    def _on_frame(self, frame: Frame) -> None:
        if not self.outgoing.on_frame(frame) and not self.desk.on_frame(frame):
            self.core.on_frame(frame)

    def _relay_ready(self) -> None:
        self.core.relay_ready()
        self.desk.relay_ready(report_held=self.link.takes_jobs_held)
        defer.Deferred.fromCoroutine(self._publish_if_behind())
        self.card.check()

    def _relay_lost(self) -> None:
        # What rode the socket is over: our own outgoing calls, and the live calls we answer
        # (the relay ends those callee_gone). Jobs carry on under their journal.
        self.outgoing.socket_lost()
        self.core.relay_lost()

    # --- keys -------------------------------------------------------------------------------

    def keys_may_have_changed(self) -> None:
        """Read keys.json again on the next turn: another writer may have minted an epoch.

        The calls this service places for thin clients rotate keys.json when it is due
        (``caller.call.place``), and so may an ``agentcall call`` that dials by itself; until
        the listener loads the new epoch it cannot open requests sealed to it.
        """
        self._reactor.callLater(0, self._check_keys)

    def _check_keys(self) -> None:
        # A periodic job never raises: TimerService would stop calling it.
        try:
            updated = rotate_if_needed(self._home, self.core.keys, self._reactor.seconds())
        except Exception:
            _log.failure("key_rotation_failed")
            return
        if updated is None:
            return
        self.core.keys = updated
        _log.info("key_rotated", epoch=updated.current_record.record.epoch)
        if self.link.connected:
            defer.Deferred.fromCoroutine(self._publish_if_behind())

    async def _publish_if_behind(self) -> None:
        """Publish our current encryption epoch if the relay serves an older one."""
        current = self.core.keys.current_record
        try:
            served: KeysResponse = await self._api.get_keys(self._config.handle)
            served_epoch = 0 if served.encryption is None else served.encryption.record.epoch
            if served_epoch >= current.record.epoch:
                return
            await self._api.put_encryption_key(current)
        except ApiError as exc:
            _log.warn("key_publish_failed", reason=str(exc.code), retry="next connection")
            return
        except Exception as exc:
            _log.warn("key_publish_failed", reason=type(exc).__name__, retry="next connection")
            return
        _log.info("key_published", epoch=current.record.epoch)

    # --- start and stop ---------------------------------------------------------------------

    def startService(self) -> None:
        # Before the first connection: no job can be delivered before the journal's restart.
        self.desk.start()
        super().startService()
        _log.info(
            "listener_started",
            address=self._config.address,
            agent=str(self._config.agent_kind),
            relay=self._config.relay.netloc,
            epoch=self.core.keys.current_record.record.epoch,
        )

    def stopService(self) -> defer.Deferred[None]:
        if not self.running:
            self._closed(None)
            return defer.succeed(None)
        if self.local is not None:
            # First, so a thin client waiting on a call hears at once that it is over.
            self.local.stopService()
        grace = self._config.kill_grace_s + STOP_MARGIN_S
        stopping = self.core.shutdown(grace)
        stopping.addBoth(lambda _: super(ListenerService, self).stopService())
        stopping.addBoth(self._closed)
        return stopping

    def _closed(self, result: object) -> None:
        # Before the database closes: a re-send now would read a closed journal.
        self.desk.stop()
        try:
            self._db.close()
        except Exception:
            _log.failure("state_db_close_failed")
        _log.info("listener_stopped")


def listener_environ() -> dict[str, str]:
    """A snapshot of this process's environment, for :func:`make_listener_service`."""
    return dict(os.environ)
