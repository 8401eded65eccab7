"""The stages of one inbound call, each a function whose effects are passed in.

:mod:`agentcall.listener.core` runs them in the order of the listener's pipeline in
``docs/architecture.md``, which is the security invariant; the step numbers are that page's:

- step 2, :func:`open_envelope`: pin the caller's keys (those the relay attached to the call,
  or fetched when it attached none), open and verify the request, reserve its id against
  replay. Any failure is :class:`EnvelopeRejected`. What comes out is an
  :class:`OpenedCall`: the verified :class:`CallFacts`, and the caller's text closed in a
  :class:`~agentcall.listener.callermessage.CallerMessage` that only planning opens;
- step 3, :func:`admit_call`: may this caller run this task? Decided from the relay-verified
  caller, the requested task id and local files only; the message is not a parameter;
- step 7, :func:`judge_run` (the agent's result becomes a reply, made terminal-safe, redacted,
  then cut, or a failure) and :func:`seal_outcome` (signed and sealed to the caller's pinned
  encryption key).

Nothing here reads a clock or the environment of the process: time comes from a clock the
caller passes, and the environment is a mapping.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Final

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from agentcall import ids, limits
from agentcall.crypto.envelope import open_request
from agentcall.crypto.pins import PinBook
from agentcall.crypto.replay import ReplayWindow
from agentcall.errors import CallErrorCode, CryptoError, StoreError
from agentcall.listener.admission import ASK_TASK, AdmissionDenied, Admitted, resolve
from agentcall.listener.agents import AgentAdapter, AgentParser
from agentcall.listener.agents.base import (
    AgentAnswer,
    AgentFailure,
    FailureKind,
    cut_utf8,
    sanitize_detail,
)
from agentcall.listener.callermessage import CallerMessage, seal_answer
from agentcall.listener.calllog import CallStatus
from agentcall.listener.ceiling import Ceiling, CeilingError
from agentcall.listener.policy import Policy, PolicyError
from agentcall.listener.redact import redact
from agentcall.listener.runner import RunResult
from agentcall.listener.tasks import Task, TaskSet
from agentcall.local.config import Config
from agentcall.local.keystore import LocalKeys
from agentcall.safetext import safe_text
from agentcall.wire.frames import CallOutcome, IncomingCall, Terminal
from agentcall.wire.http import EncryptionKeyRecord, KeysResponse
from agentcall.wire.payloads import CallFailure, Reply

POLICY_ERROR_DETAIL: Final = "a local policy error prevented this call"
CONTEXT_UNKNOWN_DETAIL: Final = (
    "that conversation is not available (ended, expired, or not yours); start a new call"
)
GUARD_UNWIRED_DETAIL: Final = (
    "the owner's tool guard did not see every tool call of the agent, so the answer was withheld"
)
NOT_LOGGED_IN_DETAIL: Final = "the answering agent is not logged in"
# What a caller is told of a failed run. The agent's own words (its stderr, an error line on its
# stdout) can hold the owner's paths or text aimed at the caller's agent, so they go to calls.log
# only; the caller gets one of these, in which only numbers come from the run.
STOPPED_RUN_DETAIL: Final = "the agent was stopped before it answered"
TOO_MUCH_OUTPUT_DETAIL: Final = "the agent printed too much before answering"
CLI_TOO_OLD_DETAIL: Final = "the owner's agent CLI is too old for AgentCall"
NO_ANSWER_DETAIL: Final = "the agent ended without an answer"
NO_WORKDIR_DETAIL: Final = "none of the directories the owner shares exists on their machine"

KeyFetcher = Callable[[str], Deferred[KeysResponse]]


class EnvelopeRejected(Exception):
    """The request cannot be trusted, so the call ends before admission: answer
    ``call_rejected`` and spawn nothing.

    ``reason`` is a fixed identifier, safe to log: never key material or plaintext.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- 1. open ---------------------------------------------------------------------------------


@attrs.frozen
class CallFacts:
    """What an opened request established, without what the caller wrote: all that admission,
    the conversation check and the call log may know of a call."""

    call_id: str
    caller_handle: str
    caller_address: str
    sender_fingerprint: str
    caller_encryption: EncryptionKeyRecord
    # The task and conversation the caller asked for, as signed; not yet checked.
    requested_task: str | None
    context_id: str | None
    # Roster ids the relay attests both sides share (none until rosters exist).
    groups: frozenset[str] = frozenset()


@attrs.frozen
class OpenedCall:
    """A request that was opened, verified and reserved: its facts and its closed message."""

    facts: CallFacts
    message: CallerMessage


def _my_record(keys: LocalKeys, key_id: str, epoch: int) -> EncryptionKeyRecord | None:
    for entry in keys.epochs:
        if entry.epoch == epoch and entry.key_id == key_id:
            return entry.record.record
    return None


async def open_envelope(
    incoming: IncomingCall,
    *,
    org: str,
    keys: LocalKeys,
    fetch_keys: KeyFetcher,
    pins: PinBook,
    replay: ReplayWindow,
    clock: IReactorTime,
) -> OpenedCall:
    """Open ``incoming`` addressed to us from ``@org/<incoming.from_>``, or raise
    :class:`EnvelopeRejected`.

    The caller's records are ``incoming.caller_keys`` when the relay attached them, and are
    fetched with ``fetch_keys`` only when it did not. Either way they must name the caller and
    this relay, match the pin (or become it), carry a valid signature chain from the pinned
    identity, and be in their validity window: the relay is trusted for neither.
    """
    caller_address = ids.format_address(org, incoming.from_)
    # The records the relay attached, else (an older relay) fetched: believed only below, in
    # the same checks either way; attached records that fail them are refused, not refetched.
    served = incoming.caller_keys
    if served is None:
        try:
            served = await fetch_keys(incoming.from_)
        except Exception:
            raise EnvelopeRejected("caller_keys_unavailable") from None
    if served.encryption is None:
        raise EnvelopeRejected("caller_has_no_encryption_key")
    now = clock.seconds()
    try:
        # The relay we are connected to is the one whose records we accept.
        pin = pins.check_and_pin(
            caller_address,
            served.identity,
            served.encryption,
            now,
            relay_origin=keys.relay_origin,
            # A caller who recovered their identity elsewhere is believed the same way.
            recovered=served.recovered,
        )
    except CryptoError as exc:
        raise EnvelopeRejected(f"caller_keys_untrusted:{type(exc).__name__}") from None
    except StoreError:
        raise EnvelopeRejected("state_db_error") from None
    envelope = incoming.envelope
    my_key = keys.key_for(envelope.key_id, envelope.epoch)
    my_record = _my_record(keys, envelope.key_id, envelope.epoch)
    if my_key is None or my_record is None:
        raise EnvelopeRejected("unknown_recipient_key")
    try:
        request = open_request(
            envelope,
            my_key=my_key,
            my_record=my_record,
            relay_origin=keys.relay_origin,
            expected_from=caller_address,
            expected_to=keys.address,
            sender_identity_pub=pin.identity_pub,
            now=now,
        )
    except (CryptoError, ValueError) as exc:
        raise EnvelopeRejected(f"envelope_invalid:{type(exc).__name__}") from None
    try:
        # Reserved in the state database, so a replay is refused even after a restart.
        replay.reserve(pin.fingerprint, request.request_id, request.expires_at, now)
    except CryptoError as exc:
        raise EnvelopeRejected(f"replay_refused:{type(exc).__name__}") from None
    except StoreError:
        raise EnvelopeRejected("state_db_error") from None
    facts = CallFacts(
        call_id=incoming.call_id,
        caller_handle=incoming.from_,
        caller_address=caller_address,
        sender_fingerprint=pin.fingerprint,
        caller_encryption=served.encryption.record,
        requested_task=request.task,
        context_id=request.context_id,
        groups=frozenset(incoming.groups),
    )
    return OpenedCall(facts=facts, message=CallerMessage(request))


# --- 2. admission ----------------------------------------------------------------------------


@attrs.frozen
class RefusalAnswer:
    """How the listener answers a call it turns away before spawning anything: the failure to
    seal to the caller, and the status and flags for calls.log."""

    failure: CallFailure
    status: CallStatus
    flags: tuple[str, ...] = ()


_REFUSAL_STATUS: Final = {
    CallErrorCode.BLOCKED: (CallStatus.BLOCKED, ("blocked_caller_attempt",)),
    CallErrorCode.TASK_UNKNOWN: (CallStatus.TASK_UNKNOWN, ("unknown_task_request",)),
    CallErrorCode.TASK_NOT_OFFERED: (CallStatus.TASK_NOT_OFFERED, ()),
}


@attrs.frozen
class AdmissionInputs:
    """The local files admission reads: the owner's policy, the admin ceiling, the tasks."""

    policy: Policy
    ceiling: Ceiling | None
    tasks: TaskSet


def admit_call(
    load_inputs: Callable[[], AdmissionInputs],
    caller_handle: str,
    requested_task: str | None,
    groups: frozenset[str] = frozenset(),
) -> Admitted | RefusalAnswer:
    """Decide a call from local files, the verified caller and the task id alone.

    A conversation id is not an input: it can only narrow an admitted call later.
    """
    try:
        inputs = load_inputs()
    except (PolicyError, CeilingError):
        return RefusalAnswer(
            CallFailure(code=CallErrorCode.AGENT_ERROR, detail=POLICY_ERROR_DETAIL),
            CallStatus.POLICY_ERROR,
        )
    decision = resolve(
        inputs.policy, inputs.ceiling, inputs.tasks, caller_handle, requested_task, groups
    )
    if isinstance(decision, AdmissionDenied):
        status, flags = _REFUSAL_STATUS.get(decision.code, (CallStatus.BLOCKED, ()))
        failure = CallFailure(code=decision.code, detail=decision.detail, offered=decision.offered)
        return RefusalAnswer(failure, status, flags)
    return decision


def context_refusal() -> RefusalAnswer:
    return RefusalAnswer(
        CallFailure(code=CallErrorCode.CONTEXT_UNKNOWN, detail=CONTEXT_UNKNOWN_DETAIL),
        CallStatus.CONTEXT_UNKNOWN,
    )


def choose_workdir(config: Config, task: Task, is_dir: Callable[[str], bool]) -> str | CallFailure:
    """The task's own directory, else the first of the owner's read roots that exists."""
    if task.workdir is not None:
        if not is_dir(str(task.workdir)):
            return CallFailure(code=CallErrorCode.AGENT_ERROR, detail=NO_WORKDIR_DETAIL)
        return os.path.realpath(task.workdir)
    shared = [root for root in config.read_roots if is_dir(root)]
    if not shared:
        return CallFailure(code=CallErrorCode.AGENT_ERROR, detail=NO_WORKDIR_DETAIL)
    return os.path.realpath(shared[0])


# --- 4. the run: agentcall.listener.planning ------------------------------------------------


# --- 5. the result ---------------------------------------------------------------------------


@attrs.frozen
class Verdict:
    """What a finished run means for the caller and for calls.log."""

    outcome: Reply | CallFailure = attrs.field(repr=False)
    status: CallStatus
    # For the owner's log only (already redacted); None when the outcome says it all.
    error: str | None = None
    # The agent's own session id (never sent), for a follow-up turn.
    session: str | None = attrs.field(default=None, repr=False)
    resume_failed: bool = False
    flags: tuple[str, ...] = ()


def short_detail(text: str, secrets: Iterable[str]) -> str:
    """A failure detail safe to send: escapes removed, redacted, then one short clean line."""
    return sanitize_detail(redact(safe_text(text), secrets=secrets))


def reply_text(text: str, secrets: Iterable[str]) -> str:
    """The agent's answer as sent: terminal escapes and controls removed (the caller's
    ``--json | jq -r .text`` prints it raw), then redacted before the cut, so no secret is
    half-kept. Cleaning comes first: an escape sequence inside a key would hide its shape
    from redaction, and removing the sequence afterwards would rejoin the key."""
    cut, _ = cut_utf8(redact(safe_text(text), secrets=secrets), limits.MAX_REPLY_BYTES)
    return cut


def judge_run(
    adapter: AgentAdapter,
    result: RunResult,
    parser: AgentParser,
    *,
    secrets: Iterable[str],
    timeout_s: float,
    task_id: str = ASK_TASK,
    unguarded: Callable[[tuple[str, ...]], list[str]] | None = None,
) -> Verdict:
    """Interpret a finished run into the reply or failure for the caller.

    A failure tells the caller only :func:`failure_reason`'s words; what the agent printed
    about it (the end of its stderr, its error line) is ``Verdict.error``, for calls.log.

    ``unguarded`` returns the tool calls the guard never saw; any at all withholds the answer
    (it may carry what an unchecked tool read) and flags ``guard_unwired``.
    """
    secrets = tuple(secrets)
    outcome = adapter.interpret(result, parser)
    if isinstance(outcome, AgentAnswer) and unguarded is not None:
        missing = unguarded(outcome.tool_use_ids)
        if missing:
            failure = CallFailure(code=CallErrorCode.AGENT_ERROR, detail=GUARD_UNWIRED_DETAIL)
            error = f"{len(missing)} tool call(s) not seen by the guard"
            return Verdict(failure, CallStatus.AGENT_ERROR, error, flags=("guard_unwired",))
    if isinstance(outcome, AgentAnswer):
        reply = Reply(text=reply_text(outcome.text, secrets), task=task_id)
        return Verdict(reply, CallStatus.OK, session=outcome.session_id)
    if outcome.kind is FailureKind.RESUME_FAILED:
        failure = CallFailure(code=CallErrorCode.CONTEXT_UNKNOWN, detail=CONTEXT_UNKNOWN_DETAIL)
        detail = short_detail(outcome.detail, secrets)
        return Verdict(failure, CallStatus.CONTEXT_UNKNOWN, detail, resume_failed=True)
    if outcome.kind is FailureKind.TIMEOUT:
        detail = f"the agent did not answer within {timeout_s:g} s"
        return Verdict(CallFailure(code=CallErrorCode.TIMEOUT, detail=detail), CallStatus.TIMEOUT)
    if outcome.kind is FailureKind.UNAUTHENTICATED:
        failure = CallFailure(code=CallErrorCode.AGENT_ERROR, detail=NOT_LOGGED_IN_DETAIL)
        return Verdict(failure, CallStatus.AGENT_ERROR, short_detail(outcome.detail, secrets))
    failure = CallFailure(code=CallErrorCode.AGENT_ERROR, detail=failure_reason(outcome, result))
    cancelled = outcome.kind is FailureKind.CANCELLED
    status = CallStatus.CANCELED if cancelled else CallStatus.AGENT_ERROR
    error = short_detail(outcome.detail, secrets) or "the agent failed without saying why"
    return Verdict(failure, status, error)


def failure_reason(outcome: AgentFailure, result: RunResult) -> str:
    """The caller's words for a run that ended without an answer: fixed text of ours, and of
    the run only its exit status or signal, so nothing the agent printed can reach the caller."""
    if outcome.kind is FailureKind.CANCELLED:
        return STOPPED_RUN_DETAIL
    if outcome.kind is FailureKind.OUTPUT_TOO_LARGE:
        return TOO_MUCH_OUTPUT_DETAIL
    if outcome.kind is FailureKind.CLI_TOO_OLD:
        return CLI_TOO_OLD_DETAIL
    # After an early finish the runner stopped the agent itself, so its signal says nothing.
    if result.signal is not None and not result.early_finish:
        return f"the agent was killed by signal {result.signal} without an answer"
    if result.exit_code is not None and result.exit_code != 0:
        return f"the agent exited with status {result.exit_code} without an answer"
    return NO_ANSWER_DETAIL


# --- 6. sealing ------------------------------------------------------------------------------


def seal_outcome(
    keys: LocalKeys,
    opened: OpenedCall,
    outcome: Reply | CallFailure,
    now: float,
    *,
    validity_s: float = limits.CALL_DEADLINE_S,
) -> CallOutcome:
    """The signed, sealed answer to ``opened``, to the caller's pinned encryption key.

    A live call's answer is read at once; a mailbox job's may be fetched days later, so the
    pipeline seals it for :data:`~agentcall.limits.MAX_ENVELOPE_VALIDITY_S`.
    """
    envelope = seal_answer(
        opened.message,
        responder=keys.identity,
        outcome=outcome,
        caller_encryption=opened.facts.caller_encryption,
        now=now,
        validity_s=validity_s,
    )
    terminal = Terminal.COMPLETED if isinstance(outcome, Reply) else Terminal.FAILED
    return CallOutcome(call_id=opened.facts.call_id, terminal=terminal, envelope=envelope)
