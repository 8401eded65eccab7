"""The per-call pipeline end to end in memory: frames in, frames out, a fake runner, a Clock.

Outcomes are opened with the caller's key, as the caller would, so every test checks what the
caller actually gets.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import LogLevel, capturedLogs
from zope.interface import implementer

from agentcall import limits
from agentcall.crypto import envelope as crypto_envelope
from agentcall.crypto.pins import MemoryPinStorage, PinBook
from agentcall.crypto.replay import MemoryReplayStorage, ReplayWindow
from agentcall.errors import CallErrorCode
from agentcall.listener import core, effects, planning, stages
from agentcall.listener.calllog import CallRecord, CallStatus
from agentcall.listener.ceiling import Ceiling, CeilingError
from agentcall.listener.contexts import Binding, Conversations, IContextStore
from agentcall.listener.policy import Access, CallerRule, Policy, PolicyError
from agentcall.listener.prompt import PromptParts, build_prompt
from agentcall.listener.redact import REDACTED
from agentcall.listener.runner import AgentRun, OutputParser, RunResult
from agentcall.listener.service import ListenerStartError, make_listener_service
from agentcall.listener.tasks import TaskSet
from agentcall.local.config import Config, save_config
from agentcall.local.home import Home
from agentcall.local.keystore import create_keys, rotate_if_needed
from agentcall.wire.frames import (
    CallAccepted,
    CallCancelled,
    CallNotCancelled,
    CallOutcome,
    CallRejected,
    CallStarted,
    CancelCall,
    CancelPhase,
    Frame,
    IncomingCall,
    NotCancelledReason,
    Ready,
    Role,
    Terminal,
)
from agentcall.wire.payloads import CallFailure, Reply
from tests.unit.crypto_helpers import NOW, ORIGIN, rotate
from tests.unit.test_listener_stages import (
    ANN,
    CALL_ID,
    KEN,
    MALLORY,
    MESSAGE,
    OTHER_CALL_ID,
    TOKEN,
    FakeDirectory,
    call_from,
    clock_at,
    incoming,
    keys_of,
    make_config,
    run_result,
    seal_from,
)

T = TypeVar("T")
THIRD_CALL_ID = "2d8a2e3a-9c73-4d73-ac5f-4b2f8b3e1a33"


class FakeRun:
    """A spawned agent that never runs: the test decides its result."""

    def __init__(self, run: AgentRun, parser: OutputParser) -> None:
        self.run = run
        self.parser = parser
        self.done: defer.Deferred[RunResult] = defer.Deferred()
        self.cancels = 0

    def cancel(self) -> None:
        self.cancels += 1

    def finish(self, result: RunResult) -> None:
        for line in result.stdout.splitlines():
            self.parser.feed_line(line)
        self.done.callback(result)


@implementer(IContextStore)
class MemoryContextStore:
    """Conversations kept in a dict, so a test can seed and inspect them."""

    def __init__(self) -> None:
        self.bindings: dict[str, Binding] = {}

    def get(self, context_id: str) -> Binding | None:
        return self.bindings.get(context_id)

    def put(self, binding: Binding) -> None:
        self.bindings[binding.context_id] = binding

    def delete(self, context_id: str) -> bool:
        return self.bindings.pop(context_id, None) is not None

    def prune(self, now: float) -> int:
        return 0


GUARD_ARGV = ("/usr/bin/python3", "-I", "-m", "agentcall.guard")


@attrs.define
class Harness:
    config: Config = attrs.field(factory=make_config)
    clock: Clock = attrs.field(factory=clock_at)
    directory: FakeDirectory = attrs.field(factory=lambda: FakeDirectory(ANN, MALLORY))
    pins: MemoryPinStorage = attrs.field(factory=MemoryPinStorage)
    replay: MemoryReplayStorage = attrs.field(factory=MemoryReplayStorage)
    policy: Policy = attrs.field(factory=Policy)
    ceiling: Ceiling | None = None
    tasks: TaskSet = attrs.field(factory=TaskSet)
    # Raised by the admission loader in place of reading the files (a policy or ceiling error).
    admission_error: Exception | None = None
    existing: set[str] = attrs.field(factory=lambda: {"/srv/shared"})
    tools_log: str = "/nonexistent/agentcall/tools.log"
    guard_argv: tuple[str, ...] = GUARD_ARGV
    contexts: MemoryContextStore = attrs.field(factory=MemoryContextStore)
    connected: bool = True
    installed: bool = True
    spawn_error: OSError | None = None
    prompt_error: Exception | None = None
    sent: list[Frame] = attrs.field(factory=list)
    runs: list[FakeRun] = attrs.field(factory=list)
    prompts: list[tuple[PromptParts, str]] = attrs.field(factory=list)
    records: list[CallRecord] = attrs.field(factory=list)
    placed: dict[str, IncomingCall] = attrs.field(factory=dict)
    admissions: int = 0
    keys_stale: int = 0  # times the pipeline asked for keys.json to be read again
    pipeline: core.CallPipeline = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        fx = effects.Effects(
            clock=self.clock,
            send=self.send,
            fetch_keys=self.directory.fetch,
            pins=PinBook(self.pins),
            replay=ReplayWindow(storage=self.replay),
            load_admission=self.load_admission,
            conversations=Conversations(self.contexts),
            guard=planning.GuardSetup(
                argv=self.guard_argv,
                tools_log=self.tools_log,
                home="/home/ken",
                extra_denied=("/home/ken/AgentCall/tasks",),
            ),
            spawn=self.spawn,
            call_log=self,
            environ={"PATH": "/usr/bin", "HOME": "/home/ken", "AGENTCALL_HOME": "/elsewhere"},
            which=self.which,
            is_dir=lambda path: path in self.existing,
            build_prompt=self.build_prompt,
            keys_stale=self.note_keys_stale,
        )
        self.pipeline = core.CallPipeline(self.config, keys_of(KEN), fx)

    def note_keys_stale(self) -> None:
        self.keys_stale += 1

    # effects

    def send(self, frame: Frame) -> bool:
        if self.connected:
            self.sent.append(frame)
        return self.connected

    def load_admission(self) -> stages.AdmissionInputs:
        self.admissions += 1
        if self.admission_error is not None:
            raise self.admission_error
        return stages.AdmissionInputs(policy=self.policy, ceiling=self.ceiling, tasks=self.tasks)

    def which(self, program: str, _path: str) -> str | None:
        if not self.installed:
            return None
        return program if program.startswith("/") else f"/usr/local/bin/{program}"

    def spawn(
        self, run: AgentRun, parser: OutputParser
    ) -> tuple[defer.Deferred[RunResult], FakeRun]:
        if self.spawn_error is not None:
            raise self.spawn_error
        fake = FakeRun(run, parser)
        self.runs.append(fake)
        return fake.done, fake

    def build_prompt(self, parts: PromptParts, message: str) -> str:
        self.prompts.append((parts, message))
        if self.prompt_error is not None:
            raise self.prompt_error
        return build_prompt(parts, message)

    def append(self, record: CallRecord) -> bool:
        self.records.append(record)
        return True

    # driving

    def types(self) -> list[type[Frame]]:
        return [type(frame) for frame in self.sent]

    def outcome(self, index: int = -1) -> Reply | CallFailure:
        """Open a sealed outcome as the caller does (it binds the request it answers)."""
        frame = self.sent[index]
        assert isinstance(frame, CallOutcome)
        request = crypto_envelope.open_request(
            self.placed[frame.call_id].envelope,
            my_key=KEN.enc_key,
            my_record=KEN.enc_record,
            relay_origin=ORIGIN,
            expected_from="@acme/ann",
            expected_to="@acme/ken",
            sender_identity_pub=ANN.identity_pub,
            now=NOW,
        )
        payload = crypto_envelope.open_response(
            frame.envelope,
            my_key=ANN.enc_key,
            my_record=ANN.enc_record,
            request=request,
            responder_identity_pub=KEN.identity_pub,
            now=self.clock.seconds(),
        )
        return payload.outcome

    def place(self, **kw: Any) -> defer.Deferred[None]:
        call_id = kw.pop("call_id", CALL_ID)
        call = call_from(ANN, call_id=call_id, **kw)
        self.placed[call_id] = call
        return self.pipeline.handle_incoming(call)


def fired(d: defer.Deferred[Any]) -> bool:
    results: list[object] = []
    d.addBoth(results.append)
    return bool(results)


# --- the happy path and the order ------------------------------------------------------------


def test_an_admitted_call_is_accepted_started_run_and_answered() -> None:
    """accepted, started, then the sealed reply; calls.log says ok and holds no message."""
    h = Harness()
    done = h.place()
    assert h.types() == [CallAccepted, CallStarted]
    assert not fired(done)
    [run] = h.runs
    assert MESSAGE in run.run.stdin.decode()
    run.finish(run_result(stdout=b"Because the cache is stale."))
    assert fired(done)
    assert h.types() == [CallAccepted, CallStarted, CallOutcome]
    assert h.sent[-1].terminal is Terminal.COMPLETED  # type: ignore[union-attr]
    assert h.outcome() == Reply(text="Because the cache is stale.", task="ask")
    [record] = h.records
    assert (record.status, record.caller, record.task) == (CallStatus.OK, "@acme/ann", "ask")
    assert MESSAGE not in repr(record)
    assert h.pipeline.running_call_id is None


def test_a_blocked_callers_message_never_reaches_a_prompt_or_a_process() -> None:
    """THE ORDER: refused before the prompt is built; no accepted, nothing spawned."""
    h = Harness(policy=Policy(callers=[CallerRule("ann", Access.BLOCKED)]))
    h.place()
    assert h.prompts == []
    assert h.runs == []
    assert h.types() == [CallOutcome]
    outcome = h.outcome()
    assert isinstance(outcome, CallFailure) and outcome.code is CallErrorCode.BLOCKED
    [record] = h.records
    assert record.status is CallStatus.BLOCKED
    assert "blocked_caller_attempt" in record.flags


def test_an_unknown_task_is_refused_before_any_prompt() -> None:
    h = Harness()
    h.place(task="deploy")
    assert (h.prompts, h.runs) == ([], [])
    outcome = h.outcome()
    assert isinstance(outcome, CallFailure) and outcome.code is CallErrorCode.TASK_UNKNOWN
    assert h.records[0].status is CallStatus.TASK_UNKNOWN


@pytest.mark.parametrize(
    "case", ["tampered", "replayed", "pin changed", "forged sender", "keys unavailable"]
)
def test_a_request_that_does_not_open_is_rejected_and_spawns_nothing(case: str) -> None:
    """call_rejected, calls.log protocol_error, no prompt, no process."""
    h = Harness()
    sealed, _ = seal_from(ANN)
    call = incoming(sealed)
    if case == "tampered":
        ct = sealed.ct
        call = incoming(
            attrs.evolve(sealed, ct=ct[:-3] + ("A" if ct[-3] != "A" else "B") + ct[-2:])
        )
    elif case == "replayed":
        first = Harness(replay=h.replay, directory=h.directory, pins=h.pins)
        first.pipeline.handle_incoming(incoming(sealed, call_id=OTHER_CALL_ID))
    elif case == "pin changed":
        # ann's address pinned to another identity key; the relay serves ann's real one.
        pin = PinBook(h.pins).check_and_pin(
            "@acme/mallory", MALLORY.identity, MALLORY.encryption, NOW
        )
        h.pins.put(attrs.evolve(pin, address="@acme/ann"))
    elif case == "forged sender":
        call = incoming(seal_from(MALLORY, claimed_from="@acme/ann")[0])
    else:
        h.directory.served.clear()
    h.pipeline.handle_incoming(call)
    assert h.sent == [CallRejected(call_id=CALL_ID)]
    assert (h.prompts, h.runs) == ([], [])
    assert [r.status for r in h.records] == [CallStatus.PROTOCOL_ERROR]
    assert h.keys_stale == 0  # none of these is about our own keys


def test_a_request_sealed_to_an_epoch_not_loaded_asks_for_the_keys_to_be_read_again() -> None:
    """Another writer (a call this installation placed) may have minted the epoch the caller
    sealed to: the call is rejected, and the listener is told to read keys.json again."""
    h = Harness()
    sealed, _ = seal_from(ANN, to=rotate(KEN))
    h.pipeline.handle_incoming(incoming(sealed))
    assert h.sent == [CallRejected(call_id=CALL_ID)]
    assert (h.prompts, h.runs) == ([], [])
    assert h.keys_stale == 1


@pytest.mark.parametrize(
    "error",
    [
        PolicyError("policy.json", "is not valid JSON"),
        CeilingError("/etc/agentcall/policy.json", "is writable by group or others"),
    ],
    ids=["policy", "ceiling"],
)
def test_a_malformed_policy_answers_policy_error_and_spawns_nothing(error: Exception) -> None:
    """Read at call time: a policy or ceiling that broke after startup still refuses the call."""
    h = Harness(admission_error=error)
    h.place()
    assert h.admissions == 1
    assert (h.prompts, h.runs) == ([], [])
    assert h.types() == [CallOutcome]
    outcome = h.outcome()
    assert outcome == CallFailure(
        code=CallErrorCode.AGENT_ERROR, detail="a local policy error prevented this call"
    )
    assert h.records[0].status is CallStatus.POLICY_ERROR


def test_an_unknown_conversation_id_is_answered_context_unknown() -> None:
    h = Harness()
    h.place(context_id="ctx_" + "b" * 22)
    outcome = h.outcome()
    assert isinstance(outcome, CallFailure) and outcome.code is CallErrorCode.CONTEXT_UNKNOWN
    assert (h.prompts, h.runs) == ([], [])
    assert h.records[-1].status is CallStatus.CONTEXT_UNKNOWN


def test_a_blocked_caller_is_blocked_even_with_a_conversation_id() -> None:
    """Admission comes first: a conversation id never gets a blocked caller further."""
    h = Harness(policy=Policy(callers=[CallerRule("ann", Access.BLOCKED)]))
    h.place(context_id="ctx_" + "b" * 22)
    outcome = h.outcome()
    assert isinstance(outcome, CallFailure) and outcome.code is CallErrorCode.BLOCKED
    assert h.records[-1].status is CallStatus.BLOCKED
    assert (h.prompts, h.runs) == ([], [])


# --- one at a time -------------------------------------------------------------------------------


def test_a_second_call_while_one_runs_is_busy() -> None:
    """One running, none waiting; the slot frees once the first is answered."""
    h = Harness()
    h.place()
    h.place(call_id=OTHER_CALL_ID)
    assert len(h.runs) == 1
    busy = h.outcome()
    assert isinstance(busy, CallFailure) and busy.code is CallErrorCode.BUSY
    assert h.records[-1].status is CallStatus.BUSY
    h.runs[0].finish(run_result(stdout=b"first"))
    h.place(call_id=THIRD_CALL_ID)
    assert len(h.runs) == 2
    assert h.sent[-2:] == [CallAccepted(call_id=THIRD_CALL_ID), CallStarted(call_id=THIRD_CALL_ID)]


# --- cancels -------------------------------------------------------------------------------------


def test_cancelling_the_running_call_stops_the_agent_then_reports_it() -> None:
    """cancel() at once; call_cancelled(running) only after the process is gone."""
    h = Harness()
    h.place()
    h.pipeline.on_frame(CancelCall(call_id=CALL_ID))
    [run] = h.runs
    assert run.cancels == 1
    assert h.types() == [CallAccepted, CallStarted]
    run.finish(run_result(exit_code=None, signal=15, cancelled=True))
    assert h.sent[-1] == CallCancelled(call_id=CALL_ID, phase=CancelPhase.RUNNING)
    assert h.records[-1].status is CallStatus.CANCELED
    assert h.pipeline.running_call_id is None


def test_cancelling_a_call_still_being_opened_spawns_nothing() -> None:
    h = Harness()
    h.directory.hold = True
    h.place()
    h.pipeline.on_frame(CancelCall(call_id=CALL_ID))
    h.directory.release()
    assert h.sent == [CallCancelled(call_id=CALL_ID, phase=CancelPhase.PENDING)]
    assert (h.prompts, h.runs) == ([], [])


def test_cancelling_an_unknown_or_finished_call_is_not_cancelled() -> None:
    h = Harness()
    h.pipeline.on_frame(CancelCall(call_id=OTHER_CALL_ID))
    assert h.sent == [CallNotCancelled(call_id=OTHER_CALL_ID, reason=NotCancelledReason.UNKNOWN)]
    h.place()
    h.runs[0].finish(run_result(stdout=b"done"))
    h.pipeline.on_frame(CancelCall(call_id=CALL_ID))
    assert h.sent[-1] == CallNotCancelled(
        call_id=CALL_ID, reason=NotCancelledReason.ALREADY_TERMINAL
    )


# --- results -------------------------------------------------------------------------------------


def test_the_kill_timer_is_a_timeout_failure() -> None:
    h = Harness()
    h.place()
    h.runs[0].finish(run_result(exit_code=None, signal=15, timed_out=True))
    outcome = h.outcome()
    assert outcome == CallFailure(
        code=CallErrorCode.TIMEOUT, detail="the agent did not answer within 120 s"
    )
    assert h.sent[-1].terminal is Terminal.FAILED  # type: ignore[union-attr]
    assert h.records[-1].status is CallStatus.TIMEOUT


def test_the_reply_is_redacted_of_credentials_and_our_token() -> None:
    h = Harness()
    h.place()
    text = f"use ghp_{'A' * 36} or {TOKEN}"
    h.runs[0].finish(run_result(stdout=text.encode()))
    outcome = h.outcome()
    assert isinstance(outcome, Reply)
    assert outcome.text == f"use {REDACTED} or {REDACTED}"
    assert TOKEN not in repr(h.records)


def test_a_reply_is_cut_to_the_reply_limit() -> None:
    h = Harness()
    h.place()
    h.runs[0].finish(run_result(stdout=("ü" * limits.MAX_REPLY_BYTES).encode()))
    outcome = h.outcome()
    assert isinstance(outcome, Reply)
    assert len(outcome.text.encode()) == limits.MAX_REPLY_BYTES


def test_a_missing_agent_is_an_agent_error_after_started() -> None:
    h = Harness(installed=False)
    h.place()
    assert h.runs == []
    assert h.types() == [CallAccepted, CallStarted, CallOutcome]
    assert h.outcome() == CallFailure(
        code=CallErrorCode.AGENT_ERROR, detail="the answering agent is not installed"
    )


def test_an_agent_that_cannot_be_spawned_is_an_agent_error() -> None:
    h = Harness(spawn_error=OSError(2, "No such file or directory"))
    h.place()
    outcome = h.outcome()
    assert isinstance(outcome, CallFailure) and outcome.code is CallErrorCode.AGENT_ERROR
    assert h.pipeline.running_call_id is None


# --- the relay comes and goes ------------------------------------------------------------------


def test_an_outcome_without_a_relay_is_kept_and_sent_after_reconnecting() -> None:
    """Progress frames are dropped while away; the outcome waits for the next ready."""
    h = Harness()
    h.place()
    h.connected = False
    h.runs[0].finish(run_result(stdout=b"late answer"))
    assert [type(f) for f in h.pipeline.kept_frames] == [CallOutcome]
    h.connected = True
    h.pipeline.relay_ready()
    assert h.types() == [CallAccepted, CallStarted, CallOutcome]
    assert h.outcome() == Reply(text="late answer", task="ask")
    assert h.pipeline.kept_frames == ()


def test_a_kept_outcome_is_dropped_after_the_call_deadline() -> None:
    h = Harness(connected=False)
    h.place()
    h.runs[0].finish(run_result(stdout=b"too late"))
    h.clock.advance(limits.CALL_DEADLINE_S)
    h.connected = True
    h.pipeline.relay_ready()
    assert h.sent == []
    assert h.pipeline.kept_frames == ()


def test_a_lost_relay_socket_stops_a_live_calls_agent_and_keeps_nothing() -> None:
    """The relay ends the call (callee_gone) when our socket closes, so no answer can reach
    the caller: the agent is stopped as for a cancel, and nothing waits for a reconnect."""
    h = Harness()
    h.place()
    h.connected = False
    h.pipeline.relay_lost()
    [run] = h.runs
    assert run.cancels == 1
    run.finish(run_result(exit_code=None, signal=15, cancelled=True))
    assert h.pipeline.kept_frames == ()
    assert h.records[-1].status is CallStatus.CANCELED
    assert h.pipeline.running_call_id is None
    h.connected = True
    h.pipeline.relay_ready()
    assert h.types() == [CallAccepted, CallStarted]


def test_a_lost_relay_socket_ends_a_call_still_being_opened_before_any_run() -> None:
    h = Harness()
    h.directory.hold = True  # the caller's keys are still being fetched
    h.place()
    h.pipeline.relay_lost()
    h.connected = False
    h.directory.release()
    assert (h.runs, h.prompts) == ([], [])
    assert h.pipeline.kept_frames == ()
    assert h.records[-1].status is CallStatus.CANCELED


# --- robustness ----------------------------------------------------------------------------------


def test_an_exception_in_a_stage_is_contained_and_the_next_call_works() -> None:
    """The call is rejected and logged; the Deferred succeeds; the slot is free again."""
    h = Harness(prompt_error=RuntimeError("bug"))
    with capturedLogs() as events:
        done = h.place()
    assert fired(done)
    assert h.sent[-1] == CallRejected(call_id=CALL_ID)
    assert h.records[-1].status is CallStatus.PROTOCOL_ERROR
    assert any(e.get("event") == "call_failed" for e in events)
    assert h.pipeline.running_call_id is None
    h.prompt_error = None
    h.place(call_id=OTHER_CALL_ID)
    assert len(h.runs) == 1


def test_log_events_never_carry_the_message_or_the_reply() -> None:
    h = Harness()
    with capturedLogs() as events:
        h.place()
        h.runs[0].finish(run_result(stdout=b"SECRET-REPLY-TEXT"))
    names = [e.get("event") for e in events]
    for name in ("call_received", "agent_started", "agent_finished", "call_answered"):
        assert name in names
    # One info line per call, at its end; the steps are at debug.
    assert [e["event"] for e in events if e.get("log_level") is LogLevel.info] == ["call_ended"]
    (ended,) = [e for e in events if e.get("event") == "call_ended"]
    assert (ended["call_id"], ended["caller"], ended["status"]) == (CALL_ID, "ann", "ok")
    flat = repr(events)
    assert MESSAGE not in flat and "SECRET-REPLY-TEXT" not in flat and TOKEN not in flat


def test_ready_frames_are_ignored_by_the_pipeline() -> None:
    h = Harness()
    h.pipeline.on_frame(Ready(role=Role.LISTEN, address="@acme/ken", relay_origin=ORIGIN))
    assert h.sent == [] and h.records == []


# --- stopping ------------------------------------------------------------------------------------


def test_shutdown_stops_the_running_agent_and_answers_before_firing() -> None:
    """The cut run is answered indeterminate_execution: the agent may have acted already."""
    h = Harness()
    h.place()
    stopped = h.pipeline.shutdown(5.0)
    assert h.runs[0].cancels == 1
    assert not fired(stopped)
    h.place(call_id=OTHER_CALL_ID)  # new work is refused while stopping
    refused = h.outcome()
    assert isinstance(refused, CallFailure) and refused.code is CallErrorCode.BUSY
    h.runs[0].finish(run_result(exit_code=None, signal=15, cancelled=True))
    assert fired(stopped)
    outcome = h.outcome()
    assert h.sent[-1].call_id == CALL_ID  # type: ignore[union-attr]
    assert outcome == CallFailure(
        code=CallErrorCode.INDETERMINATE_EXECUTION, detail=core.STOPPED_DETAIL
    )
    assert h.records[-1].status is CallStatus.CANCELED
    assert h.records[-1].error == core.STOPPED_DETAIL


def test_shutdown_gives_up_waiting_after_the_grace() -> None:
    h = Harness()
    h.place()
    stopped = h.pipeline.shutdown(5.0)
    h.clock.advance(4.9)
    assert not fired(stopped)
    h.clock.advance(0.2)
    assert fired(stopped)
    h.runs[0].finish(run_result(cancelled=True))  # a late exit is still harmless


def test_shutdown_with_nothing_running_is_immediate() -> None:
    assert fired(Harness().pipeline.shutdown(5.0))


# --- starting the service ------------------------------------------------------------------------


def install(tmp_path: Path, **changes: Any) -> dict[str, str]:
    """An installation of @acme/ken under tmp_path; the environ that names it."""
    environ = {"HOME": str(tmp_path), "PATH": "/usr/bin"}
    home = Home.from_environ(environ)
    save_config(home, make_config(read_roots=[str(tmp_path)], **changes))
    create_keys(home, ORIGIN, "@acme/ken", NOW)
    return environ


def start_error(environ: dict[str, str]) -> str:
    with pytest.raises(ListenerStartError) as caught:
        make_listener_service(MemoryReactorClock(), environ)
    return str(caught.value)


def test_the_service_refuses_to_start_without_an_installation(tmp_path: Path) -> None:
    assert "not set up" in start_error({"HOME": str(tmp_path)})


def test_the_service_refuses_a_caller_only_installation(tmp_path: Path) -> None:
    environ = install(tmp_path, agent_kind=None, agent_command=None)
    assert "set up with --caller-only" in start_error(environ)


def test_the_service_refuses_a_policy_it_cannot_read(tmp_path: Path) -> None:
    environ = install(tmp_path)
    policy = Home.from_environ(environ).policy_path
    policy.write_text('{"version": 1, "callers": {"ann": {"access": "maybe"}}}')
    message = start_error(environ)
    assert "policy" in message and str(policy) in message


def test_the_service_refuses_keys_of_another_identity(tmp_path: Path) -> None:
    environ = install(tmp_path, handle="kim")
    assert "keys.json belongs to @acme/ken" in start_error(environ)


def test_the_service_reads_its_keys_again_when_told_they_may_have_changed(
    tmp_path: Path,
) -> None:
    """A call the service places for a thin client may mint the next epoch in keys.json; the
    pipeline must then hold it too, or it cannot open requests sealed to it."""
    environ = install(tmp_path)
    reactor = MemoryReactorClock()
    reactor.advance(time.time())
    built = make_listener_service(reactor, environ)
    loaded = [entry.epoch for entry in built.core.keys.epochs]
    # Another writer rotates on disk (as place() does when an epoch is near its end).
    on_disk = rotate_if_needed(
        Home.from_environ(environ), built.core.keys, reactor.seconds() + 25 * 86_400
    )
    assert on_disk is not None and len(on_disk.epochs) == len(loaded) + 1
    assert [entry.epoch for entry in built.core.keys.epochs] == loaded
    built.keys_may_have_changed()
    reactor.advance(0)
    assert [entry.epoch for entry in built.core.keys.epochs] == [e.epoch for e in on_disk.epochs]
    assert fired(built.stopService())


def test_a_good_installation_builds_the_service(tmp_path: Path) -> None:
    """Config, keys, policy and state database check out; nothing is dialled yet."""
    environ = install(tmp_path)
    built = make_listener_service(MemoryReactorClock(), environ)
    assert built.core.keys.address == "@acme/ken"
    assert built.connection.parent is built
    assert not built.link.connected
    # Wherever AGENTCALL_HOME puts it, the state directory is denied to every run.
    state_dir = Home.from_environ(environ).state_dir
    assert str(state_dir) in built.core._fx.guard.extra_denied
    stopped = built.stopService()  # closes the state database
    assert fired(stopped)
