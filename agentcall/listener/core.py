"""The listener's per-call pipeline: frames from the relay in, frames to the relay out.

:class:`CallPipeline` never touches a socket, a process or the global reactor. It is handed
decoded frames (``incoming_call``, ``cancel_call``) and a set of
:class:`~agentcall.listener.effects.Effects`: a clock, a
function that sends a frame if the relay is connected, the caller-key directory, the pin book
and replay window, the policy loader, the agent spawner and the calls.log writer. The stages
themselves live in :mod:`agentcall.listener.stages`; this module runs them in their fixed
order, keeps the one-call slot, handles cancels, and keeps terminal frames that could not be
sent until the relay is back (:mod:`agentcall.listener.outbox`).

A mailbox job runs through exactly the same steps (:meth:`CallPipeline.run_job`, driven by
:mod:`agentcall.listener.mailboxdesk`): its slot is claimed before it is opened, its frames go to
a :class:`CallSink` instead of the relay, and its answer is sealed for the mailbox's lifetime.

Each call runs on its own Deferred; whatever goes wrong in one is caught, logged, answered
with ``call_rejected`` if nothing was answered yet, and never reaches the service.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable
from typing import Final

import attrs
from twisted.internet import defer
from twisted.python.failure import Failure as TwistedFailure

from agentcall import ids, limits
from agentcall.errors import CallErrorCode
from agentcall.listener import guardwire, planning, stages
from agentcall.listener.admission import ASK_TASK, Admitted
from agentcall.listener.agents.base import detail_with_tail
from agentcall.listener.calllog import CallRecord, CallStatus
from agentcall.listener.contexts import Binding, ContextRefusal
from agentcall.listener.effects import CallSink, Cancellable, Effects
from agentcall.listener.guardwire import cross_check
from agentcall.listener.outbox import Outbox
from agentcall.listener.runner import AgentRun, RunResult
from agentcall.local.config import Config
from agentcall.local.keystore import LocalKeys
from agentcall.logevents import Logger
from agentcall.wire.frames import (
    CallAccepted,
    CallCancelled,
    CallNotCancelled,
    CallRejected,
    CallStarted,
    CancelCall,
    CancelPhase,
    Frame,
    IncomingCall,
    NotCancelledReason,
)
from agentcall.wire.payloads import CallFailure, Reply

_log = Logger(namespace="agentcall.listener.core")

BUSY_DETAIL: Final = "the agent is answering another call; try again in a few minutes"
STOPPING_DETAIL: Final = "the owner's listener is stopping; try again later"
STOPPED_DETAIL: Final = "the owner's listener stopped before the agent finished"
SPAWN_FAILED_DETAIL: Final = "the answering agent could not be started"
GUARD_PREFLIGHT_DETAIL: Final = "the owner's tool guard failed its check, so the agent did not run"
# Ids of recently finished calls, so a late cancel is told "already terminal".
MAX_REMEMBERED_CALLS: Final = 256


def _remove(paths: tuple[str, ...]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            _log.warn("private_file_not_removed", reason=exc.strerror)


@attrs.define
class _Call:
    """One inbound call while the pipeline works on it."""

    call_id: str
    caller_handle: str
    received_at: float
    task: str | None = None
    cancel_requested: bool = False
    answered: bool = False
    run: Cancellable | None = None
    # The relay socket it came on closed: the relay ended it, so nothing of it is kept to send.
    relay_lost: bool = False
    # A mailbox job: its frames go here, not to the relay, and its answer lives longer.
    sink: CallSink | None = None
    answer_validity_s: float = limits.CALL_DEADLINE_S


class CallPipeline:
    """Runs every inbound call through the stages; one agent at a time, none waiting."""

    def __init__(self, config: Config, keys: LocalKeys, effects: Effects) -> None:
        # Both may be replaced by the service (key rotation, config re-read on reconnect).
        self.config = config
        self.keys = keys
        self._fx = effects
        self._secrets: set[str] = {config.token}
        self._calls: dict[str, _Call] = {}
        self._running: _Call | None = None
        self._stopping = False
        self._idle_waiters: list[defer.Deferred[None]] = []
        self._outbox = Outbox(effects.clock, effects.send)
        self._finished: collections.deque[str] = collections.deque(maxlen=MAX_REMEMBERED_CALLS)

    # --- state, for the service and tests -------------------------------------------------

    @property
    def running_call_id(self) -> str | None:
        return None if self._running is None else self._running.call_id

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def kept_frames(self) -> tuple[Frame, ...]:
        return self._outbox.kept

    def add_secret(self, secret: str) -> None:
        """Another exact secret to redact from replies and logs (a re-read relay token)."""
        self._secrets.add(secret)

    # --- frames in --------------------------------------------------------------------------

    def on_frame(self, frame: Frame) -> None:
        """A decoded frame from the relay (the connection has dropped ``ready`` already)."""
        if isinstance(frame, IncomingCall):
            self.handle_incoming(frame)
        elif isinstance(frame, CancelCall):
            self.handle_cancel(frame)
        else:
            _log.debug("relay_frame_ignored", frame_type=frame.type)

    def handle_incoming(self, incoming: IncomingCall) -> defer.Deferred[None]:
        """Start one call; the Deferred fires (never fails) once it is over."""
        if incoming.call_id in self._calls or incoming.call_id in self._finished:
            _log.warn("call_duplicate", call_id=incoming.call_id)
            return defer.succeed(None)
        return self._begin(incoming, _Call(incoming.call_id, incoming.from_, self._now()))

    def run_job(self, incoming: IncomingCall, sink: CallSink) -> defer.Deferred[None]:
        """Run a mailbox job as the call ``incoming``, its frames to ``sink``; the Deferred
        fires (never fails) once it is over.

        The one-call slot is the job's from now on, before the request is even opened, so a
        live call arriving meanwhile is ``busy``. The caller checks :meth:`can_take_job` in the
        same reactor turn; a taken slot here is a programming error.
        """
        if not self.can_take_job() or incoming.call_id in self._finished:
            raise RuntimeError("the one-call slot is taken, or the job ran here already")
        call = _Call(
            incoming.call_id,
            incoming.from_,
            self._now(),
            sink=sink,
            answer_validity_s=limits.MAX_ENVELOPE_VALIDITY_S,
        )
        self._running = call
        return self._begin(incoming, call)

    def can_take_job(self) -> bool:
        return self._running is None and not self._stopping

    def _begin(self, incoming: IncomingCall, call: _Call) -> defer.Deferred[None]:
        self._calls[call.call_id] = call
        _log.debug(
            "call_received",
            call_id=call.call_id,
            caller=incoming.from_,
            correlation_id=incoming.correlation_id,
            job=call.sink is not None,
            caller_keys_attached=incoming.caller_keys is not None,
        )
        d = defer.Deferred.fromCoroutine(self._pipeline(incoming, call))
        d.addErrback(self._unexpected, call)
        d.addBoth(self._forget, call)
        return d

    def handle_cancel(self, frame: CancelCall) -> None:
        call = self._calls.get(frame.call_id)
        if call is not None and call.sink is not None:
            call = None  # a job is cancelled by cancel_job only (cancel_running_job)
        if call is None:
            known = frame.call_id in self._finished
            reason = NotCancelledReason.ALREADY_TERMINAL if known else NotCancelledReason.UNKNOWN
            _log.debug("call_not_cancelled", call_id=frame.call_id, reason=str(reason))
            self._outbox.deliver(CallNotCancelled(call_id=frame.call_id, reason=reason), keep=False)
            return
        self._request_cancel(call)

    def cancel_running_job(self, job_id: str) -> bool:
        """Cancel the mailbox job ``job_id`` exactly like a live call; False if it is not
        running here. Its sink gets ``call_cancelled`` once the agent is gone."""
        call = self._calls.get(job_id)
        if call is None or call.sink is None:
            return False
        self._request_cancel(call)
        return True

    def relay_lost(self) -> None:
        """The relay socket closed: the relay ends every live call that came over it
        (``callee_gone``), so their agents are stopped now, as for a cancel, since no answer
        can reach the caller any more. Mailbox jobs go on: their results wait in the journal."""
        for call in tuple(self._calls.values()):
            if call.sink is None and not call.answered:
                _log.info("call_orphaned", call_id=call.call_id, running=call.run is not None)
                call.relay_lost = True
                self._request_cancel(call)

    def _request_cancel(self, call: _Call) -> None:
        if call.cancel_requested:
            return
        call.cancel_requested = True
        _log.debug("call_cancel_requested", call_id=call.call_id, running=call.run is not None)
        if call.run is not None:
            # call_cancelled goes out once the process is gone (see _pipeline).
            call.run.cancel()

    # --- the pipeline (ORDER IS THE SECURITY INVARIANT) ------------------------------------

    async def _pipeline(self, incoming: IncomingCall, call: _Call) -> None:
        fx = self._fx
        # Step 2 (docs/architecture.md): open. Keys (attached, else fetched) pinned, envelope
        # verified, id reserved.
        try:
            opened = await stages.open_envelope(
                incoming,
                org=self.config.org,
                keys=self.keys,
                fetch_keys=fx.fetch_keys,
                pins=fx.pins,
                replay=fx.replay,
                clock=fx.clock,
            )
        except stages.EnvelopeRejected as exc:
            _log.debug("call_rejected", call_id=call.call_id, reason=exc.reason)
            if exc.reason == "unknown_recipient_key":
                # The caller resends once with fresh records; let it find the epoch loaded.
                fx.keys_stale()
            self._terminal(call, CallRejected(call_id=call.call_id))
            self._record(call, CallStatus.PROTOCOL_ERROR, error=exc.reason)
            return
        # Admission and the conversation check see the facts only; the message stays closed.
        facts = opened.facts
        call.task = facts.requested_task or ASK_TASK
        if call.cancel_requested:
            self._cancelled(call, CancelPhase.PENDING)
            return
        # Step 3: admission, from the verified caller and local files; the message is not an input.
        loaded: list[stages.AdmissionInputs] = []

        def load_admission() -> stages.AdmissionInputs:
            loaded.append(fx.load_admission())
            return loaded[-1]

        decision = stages.admit_call(
            load_admission, facts.caller_handle, facts.requested_task, facts.groups
        )
        if isinstance(decision, stages.RefusalAnswer):
            self._refuse(call, opened, decision)
            return
        call.task = decision.task_id
        # Step 4: the conversation, if one is named: it can only narrow an admitted call.
        workdir = stages.choose_workdir(self.config, decision.task, fx.is_dir)
        if isinstance(workdir, CallFailure):
            self._answer(call, opened, workdir, CallStatus.AGENT_ERROR, error=workdir.detail)
            return
        binding = fx.conversations.admit(
            facts.context_id,
            caller=facts.caller_address,
            task=decision.task_id,
            agent_kind=str(self.config.agent_kind),
            workdir=workdir,
            threadable=decision.task.threadable,
            now=fx.clock.seconds(),
        )
        if isinstance(binding, ContextRefusal):
            _log.debug("context_refused", call_id=call.call_id, reason=str(binding.reason))
            self._refuse(call, opened, stages.context_refusal())
            return
        # Step 5: one running, none waiting (a job holds the slot from before step 2).
        if (self._running is not None and self._running is not call) or self._stopping:
            _log.debug("call_busy", call_id=call.call_id, running=self.running_call_id)
            detail = STOPPING_DETAIL if self._stopping else BUSY_DETAIL
            busy = CallFailure(code=CallErrorCode.BUSY, detail=detail)
            self._answer(call, opened, busy, CallStatus.BUSY)
            return
        self._running = call
        # Step 6: accepted, started, and only now does the message go into a prompt.
        self._progress(call, CallAccepted(call_id=call.call_id))
        self._progress(call, CallStarted(call_id=call.call_id))
        ceiling = loaded[-1].ceiling if loaded else None
        plan = planning.plan_run(
            self.config,
            opened,
            decision,
            workdir,
            binding,
            guard=fx.guard,
            shell_allowed=planning.shell_allowed(ceiling),
            kernel_abi=fx.kernel_abi(),
            boundary_required=planning.boundary_required(ceiling),
            isolation_required=planning.isolation_required(ceiling),
            environ=fx.environ,
            which=fx.which,
            is_dir=fx.is_dir,
            build_prompt=fx.build_prompt,
        )
        if isinstance(plan, CallFailure):
            self._answer(call, opened, plan, CallStatus.AGENT_ERROR, error=plan.detail)
            return
        # Step 6, Codex: it runs a tool whose hook crashed, so the hook must refuse a test call.
        if plan.preflight is not None and await self._guard_preflight(call, opened, plan.preflight):
            _remove(plan.private_files)
            return
        if call.sink is not None:
            # A job's journal says "started" before its agent can do anything.
            call.sink.agent_starting()
        try:
            done, control = fx.spawn(plan.run, plan.parser)
        except OSError as exc:
            _remove(plan.private_files)
            failure = CallFailure(code=CallErrorCode.AGENT_ERROR, detail=SPAWN_FAILED_DETAIL)
            self._answer(call, opened, failure, CallStatus.AGENT_ERROR, error=exc.strerror)
            return
        call.run = control
        _log.debug("agent_started", call_id=call.call_id, agent=str(self.config.agent_kind))
        try:
            result = await done
        finally:
            _remove(plan.private_files)
        # Step 7: what the run means, then the sealed answer.
        if call.cancel_requested:
            self._agent_finished(call, CallStatus.CANCELED, result)
            self._cancelled(call, CancelPhase.RUNNING)
            return
        if self._stopping and result.cancelled:
            self._agent_finished(call, CallStatus.CANCELED, result)
            self._stopped(call, opened)
            return
        verdict = stages.judge_run(
            plan.adapter,
            result,
            plan.parser,
            secrets=self._secrets,
            timeout_s=plan.run.timeout_s,
            task_id=decision.task_id,
            unguarded=self._unguarded(call.call_id),
        )
        self._agent_finished(call, verdict.status, result)
        outcome = self._converse(facts, decision, workdir, binding, verdict)
        self._answer(
            call, opened, outcome, verdict.status, error=verdict.error, flags=verdict.flags
        )

    async def _guard_preflight(self, call: _Call, opened: stages.OpenedCall, run: AgentRun) -> bool:
        """Run the guard hook once as the agent would; True if that answered the call (the
        hook did not refuse, or the call was cancelled or stopped meanwhile)."""
        result: RunResult | None = None
        try:
            done, control = self._fx.spawn(run, planning.DiscardOutput())
        except OSError as exc:
            problem: str | None = f"the tool guard could not be started ({exc.strerror})"
        else:
            call.run = control
            result = await done
            problem = guardwire.preflight_problem(result)
        if call.cancel_requested:
            self._cancelled(call, CancelPhase.RUNNING)
            return True
        if self._stopping and result is not None and result.cancelled:
            self._stopped(call, opened)
            return True
        if problem is None:
            return False
        _log.warn("guard_preflight_failed", call_id=call.call_id, reason=problem)
        failure = CallFailure(
            code=CallErrorCode.AGENT_ERROR, detail=f"{GUARD_PREFLIGHT_DETAIL}: {problem}"
        )
        # The owner's log also gets the end of what the hook printed on stderr.
        error = problem if result is None else detail_with_tail(problem, result.stderr)
        self._answer(call, opened, failure, CallStatus.AGENT_ERROR, error=error)
        return True

    def _refuse(
        self, call: _Call, opened: stages.OpenedCall, refusal: stages.RefusalAnswer
    ) -> None:
        _log.debug(
            "call_refused",
            call_id=call.call_id,
            caller=opened.facts.caller_handle,
            code=str(refusal.failure.code),
        )
        self._answer(call, opened, refusal.failure, refusal.status, flags=refusal.flags)

    def _unguarded(self, call_id: str) -> Callable[[tuple[str, ...]], list[str]] | None:
        """Claude's tool-call ids equal the guard's; Codex's do not, so only Claude is checked."""
        if str(self.config.agent_kind) != "claude":
            return None
        log = self._fx.guard.tools_log
        return lambda used: cross_check(used, log, call_id)

    def _converse(
        self,
        facts: stages.CallFacts,
        admitted: Admitted,
        workdir: str,
        binding: Binding | None,
        verdict: stages.Verdict,
    ) -> Reply | CallFailure:
        """Mint or roll the conversation after an answer; forget one the agent lost."""
        talks = self._fx.conversations
        if verdict.resume_failed and binding is not None:
            talks.end(binding)
        if not isinstance(verdict.outcome, Reply):
            return verdict.outcome
        kept = talks.keep(
            binding,
            verdict.session,
            caller=facts.caller_address,
            task=admitted.task_id,
            agent_kind=str(self.config.agent_kind),
            workdir=workdir,
            threadable=admitted.task.threadable,
            now=self._fx.clock.seconds(),
        )
        if kept.error is not None:
            _log.debug("context_not_kept", call_id=facts.call_id, reason=kept.error)
        return attrs.evolve(verdict.outcome, context_id=kept.context_id)

    # --- answers ------------------------------------------------------------------------------

    def _answer(
        self,
        call: _Call,
        opened: stages.OpenedCall,
        outcome: Reply | CallFailure,
        status: CallStatus,
        *,
        error: str | None = None,
        flags: tuple[str, ...] = (),
    ) -> None:
        """Seal, send (or keep) and log one outcome."""
        frame = stages.seal_outcome(
            self.keys, opened, outcome, self._now(), validity_s=call.answer_validity_s
        )
        self._terminal(call, frame)
        text = outcome.text if isinstance(outcome, Reply) else (outcome.detail or "")
        self._record(call, status, text=text, error=error, flags=flags)
        _log.debug(
            "call_answered",
            call_id=call.call_id,
            status=str(status),
            terminal=str(frame.terminal),
        )

    def _stopped(self, call: _Call, opened: stages.OpenedCall) -> None:
        """The listener's shutdown cut the run: the agent may have acted, and will not go on.

        A live call gets a sealed ``indeterminate_execution``; a job's sink is told, and its
        result is the journal's ``indeterminate_execution`` rather than a sealed answer, as for
        a listener that died (docs/mailbox.md).
        """
        if call.sink is None:
            failure = CallFailure(code=CallErrorCode.INDETERMINATE_EXECUTION, detail=STOPPED_DETAIL)
            self._answer(call, opened, failure, CallStatus.CANCELED, error=STOPPED_DETAIL)
            return
        call.answered = True
        call.sink.stopped()
        self._record(call, CallStatus.CANCELED, text=STOPPED_DETAIL, error=STOPPED_DETAIL)

    def _cancelled(self, call: _Call, phase: CancelPhase) -> None:
        _log.debug("call_cancelled", call_id=call.call_id, phase=str(phase))
        self._terminal(call, CallCancelled(call_id=call.call_id, phase=phase))
        self._record(call, CallStatus.CANCELED)

    def _terminal(self, call: _Call, frame: Frame) -> None:
        call.answered = True
        if call.sink is not None:
            call.sink.frame(frame)
        else:
            # Kept for the next connection only while the relay may still wait for it.
            self._outbox.deliver(frame, keep=not call.relay_lost)

    def _progress(self, call: _Call, frame: Frame) -> None:
        if call.sink is not None:
            call.sink.frame(frame)
        else:
            # Progress frames only matter while the call is live; the outcome says the rest.
            self._outbox.deliver(frame, keep=False)

    def relay_ready(self) -> None:
        """A relay connection became usable: send what was kept for it, in order."""
        self._outbox.relay_ready()

    def _now(self) -> float:
        return self._fx.clock.seconds()

    def _record(
        self,
        call: _Call,
        status: CallStatus,
        *,
        text: str = "",
        error: str | None = None,
        flags: tuple[str, ...] = (),
    ) -> None:
        now = self._fx.clock.seconds()
        duration_ms = max(0, int((now - call.received_at) * 1000))
        # The call's one info line (the steps before it are at debug); never its text.
        _log.info(
            "call_ended",
            call_id=call.call_id,
            caller=call.caller_handle,
            status=str(status),
            duration_ms=duration_ms,
            job=call.sink is not None,
        )
        self._fx.call_log.append(
            CallRecord(
                at=now,
                call_id=call.call_id,
                caller=ids.format_address(self.config.org, call.caller_handle),
                task=call.task,
                status=status,
                duration_ms=duration_ms,
                outcome_text=text,
                error=error,
                flags=flags,
            )
        )

    def _agent_finished(self, call: _Call, status: CallStatus, result: RunResult) -> None:
        _log.debug(
            "agent_finished",
            call_id=call.call_id,
            status=str(status),
            duration_s=round(result.duration_s, 3),
            exit_code=result.exit_code,
        )

    # --- failures and bookkeeping -------------------------------------------------------------

    def _unexpected(self, failure: TwistedFailure, call: _Call) -> None:
        try:
            _log.failure("call_failed", failure=failure, call_id=call.call_id)
            if call.run is not None:
                call.run.cancel()
            if not call.answered:
                self._terminal(call, CallRejected(call_id=call.call_id))
                self._record(call, CallStatus.PROTOCOL_ERROR, error="internal error")
        except Exception:
            # Whatever happens here stays here: the service keeps listening.
            _log.failure("call_cleanup_failed", call_id=call.call_id)

    def _forget(self, _result: object, call: _Call) -> None:
        self._calls.pop(call.call_id, None)
        self._finished.append(call.call_id)
        if self._running is call:
            self._running = None
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.called:  # it may have timed out already
                    waiter.callback(None)

    # --- stopping -----------------------------------------------------------------------------

    def shutdown(self, grace_s: float) -> defer.Deferred[None]:
        """Refuse new work, stop the running agent, and fire once it is gone (or after
        ``grace_s``), its answer sent if the relay is still there."""
        self._stopping = True
        running = self._running
        if running is None:
            return defer.succeed(None)
        _log.info("listener_stopping_agent", call_id=running.call_id)
        if running.run is not None:
            running.run.cancel()
        waiter: defer.Deferred[None] = defer.Deferred()
        self._idle_waiters.append(waiter)
        waiter.addTimeout(grace_s, self._fx.clock)

        def gave_up(failure: TwistedFailure) -> None:
            failure.trap(defer.TimeoutError)
            _log.warn("listener_stop_timeout", call_id=running.call_id, grace_s=grace_s)

        waiter.addErrback(gave_up)
        return waiter
