"""The listener's call stages, one at a time, with every effect faked and time on a Clock.

The helpers here (parties, config, incoming calls, a key directory) are shared with
``test_listener_core.py``.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure as TwistedFailure

from agentcall import ids, limits
from agentcall.crypto import envelope as crypto_envelope
from agentcall.crypto.pins import IPinStorage, MemoryPinStorage, Pin, PinBook
from agentcall.crypto.replay import IReplayStorage, MemoryReplayStorage, ReplayWindow
from agentcall.errors import CallErrorCode
from agentcall.listener import agent_env, guardwire, planning, stages
from agentcall.listener.admission import Admitted
from agentcall.listener.agent_env import CALL_ID_ENV, agent_environment
from agentcall.listener.agents import claude, command
from agentcall.listener.callermessage import open_for_prompt
from agentcall.listener.calllog import CallStatus
from agentcall.listener.ceiling import Ceiling, CeilingError
from agentcall.listener.contexts import Binding
from agentcall.listener.policy import (
    DEFAULT_POLICY,
    Access,
    CallerRule,
    GroupRule,
    Policy,
    PolicyError,
)
from agentcall.listener.prompt import PromptParts, build_prompt
from agentcall.listener.redact import REDACTED
from agentcall.listener.runner import RunResult
from agentcall.listener.tasks import BUILTIN_ASK, Task, TaskSet
from agentcall.local.config import Config
from agentcall.local.home import Home
from agentcall.local.keystore import EpochKey, LocalKeys
from agentcall.local.statedb import StateDb
from agentcall.wire.frames import IncomingCall, SealedEnvelope, Terminal
from agentcall.wire.http import KeysResponse
from agentcall.wire.payloads import CallFailure, Reply, RequestPayload
from tests.unit.crypto_helpers import NOW, ORIGIN, Party, make_party, rotate

T = TypeVar("T")

TOKEN = "TOKENtokenTOKENtokenTOKENtokenTOKENtoken123"
CALL_ID = "0b6e0c1e-7a51-4b51-9a3d-2f0d6f1c9e11"
OTHER_CALL_ID = "1c7f1d2f-8b62-4c62-8b4e-3a1e7a2d0f22"
CORRELATION = "c" * 32
MESSAGE = "why does the build fail on main?"
ANN = make_party("@acme/ann")
KEN = make_party("@acme/ken")
MALLORY = make_party("@acme/mallory")


def keys_of(party: Party) -> LocalKeys:
    """A party's keys as the listener's key store holds them."""
    return LocalKeys(
        identity=party.identity_key,
        identity_record=party.identity,
        epochs=(EpochKey(key=party.enc_key, record=party.encryption),),
    )


def make_config(**changes: Any) -> Config:
    fields: dict[str, Any] = {
        "relay_url": f"https://{ORIGIN}",
        "relay_origin": ORIGIN,
        "org": "acme",
        "handle": "ken",
        "role": "member",
        "token": TOKEN,
        "agent_kind": "command",
        "agent_command": ["/opt/agent/answer"],
        "read_roots": ["/srv/shared", "/srv/other"],
        "agent_timeout_s": 120.0,
        "kill_grace_s": 3.0,
    }
    fields.update(changes)
    return Config(**fields)


def seal_from(
    sender: Party,
    *,
    message: str = MESSAGE,
    task: str | None = None,
    context_id: str | None = None,
    claimed_from: str | None = None,
    to: Party = KEN,
    now: float = NOW,
    request_id: str | None = None,
) -> tuple[SealedEnvelope, RequestPayload]:
    return crypto_envelope.seal_request(
        sender=sender.identity_key,
        sender_address=claimed_from or sender.address,
        recipient_identity=to.identity.record,
        recipient_encryption=to.enc_record,
        relay_origin=ORIGIN,
        message=message,
        task=task,
        context_id=context_id,
        now=now,
        request_id=request_id,
    )


def incoming(sealed: SealedEnvelope, *, from_: str = "ann", call_id: str = CALL_ID) -> IncomingCall:
    return IncomingCall(call_id=call_id, from_=from_, envelope=sealed, correlation_id=CORRELATION)


def call_from(sender: Party = ANN, call_id: str = CALL_ID, **kw: Any) -> IncomingCall:
    sealed, _ = seal_from(sender, **kw)
    return incoming(sealed, from_=ids.parse_address(sender.address).handle, call_id=call_id)


class FakeDirectory:
    """The relay's key directory: served records per handle, answered as Deferreds.

    With ``hold`` set, answers wait until :meth:`release`.
    """

    def __init__(self, *parties: Party) -> None:
        self.served: dict[str, KeysResponse] = {}
        self.asked: list[str] = []
        self.hold = False
        self.waiting: list[tuple[str, defer.Deferred[KeysResponse]]] = []
        for party in parties:
            self.serve(party)

    def serve(self, party: Party, *, encryption: bool = True) -> None:
        handle = ids.parse_address(party.address).handle
        self.served[handle] = KeysResponse(
            identity=party.identity, encryption=party.encryption if encryption else None
        )

    def fetch(self, handle: str) -> defer.Deferred[KeysResponse]:
        self.asked.append(handle)
        d: defer.Deferred[KeysResponse] = defer.Deferred()
        if self.hold:
            self.waiting.append((handle, d))
        else:
            self._answer(handle, d)
        return d

    def release(self) -> None:
        waiting, self.waiting = self.waiting, []
        for handle, d in waiting:
            self._answer(handle, d)

    def _answer(self, handle: str, d: defer.Deferred[KeysResponse]) -> None:
        if handle in self.served:
            d.callback(self.served[handle])
        else:
            d.errback(ConnectionError("the relay did not answer"))


def clock_at(now: float = NOW) -> Clock:
    clock = Clock()
    clock.advance(now)
    return clock


def outcome_of(d: defer.Deferred[T]) -> T:
    """The result of a Deferred that has already fired (its failure is raised)."""
    results: list[Any] = []
    d.addBoth(results.append)
    assert results, "the Deferred has not fired"
    if isinstance(results[0], TwistedFailure):
        results[0].raiseException()
    result: T = results[0]
    return result


def run_result(**changes: Any) -> RunResult:
    fields: dict[str, Any] = {
        "exit_code": 0,
        "signal": None,
        "stdout": b"",
        "stderr": b"",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "timed_out": False,
        "cancelled": False,
        "early_finish": False,
        "duration_s": 1.5,
        "swept_pids": 0,
    }
    fields.update(changes)
    return RunResult(**fields)


# --- 1. opening ------------------------------------------------------------------------------


@attrs.define
class Opener:
    directory: FakeDirectory = attrs.field(factory=lambda: FakeDirectory(ANN, MALLORY))
    pin_storage: IPinStorage = attrs.field(factory=MemoryPinStorage)
    replay_storage: IReplayStorage = attrs.field(factory=MemoryReplayStorage)
    clock: Clock = attrs.field(factory=clock_at)
    keys: LocalKeys = attrs.field(factory=lambda: keys_of(KEN))

    def open(self, call: IncomingCall) -> stages.OpenedCall:
        return outcome_of(
            defer.Deferred.fromCoroutine(
                stages.open_envelope(
                    call,
                    org="acme",
                    keys=self.keys,
                    fetch_keys=self.directory.fetch,
                    pins=PinBook(self.pin_storage),
                    replay=ReplayWindow(storage=self.replay_storage),
                    clock=self.clock,
                )
            )
        )

    def rejection(self, call: IncomingCall) -> str:
        with pytest.raises(stages.EnvelopeRejected) as caught:
            self.open(call)
        return caught.value.reason


def test_a_good_request_opens_and_pins_the_caller() -> None:
    """The caller's keys are fetched by handle, pinned, and the message comes out verified."""
    opener = Opener()
    opened = opener.open(call_from(ANN))
    facts = opened.facts
    assert facts.caller_address == "@acme/ann"
    assert open_for_prompt(opened.message) == MESSAGE
    assert facts.caller_encryption == ANN.enc_record
    assert opener.directory.asked == ["ann"]
    pin = opener.pin_storage.get(ORIGIN, "@acme/ann")
    assert pin is not None and pin.identity_pub == ANN.identity_pub
    assert facts.sender_fingerprint == pin.fingerprint
    assert opener.replay_storage.count_live(NOW) == 1


def _tampered(call: IncomingCall) -> IncomingCall:
    ct = call.envelope.ct
    flipped = ct[:-5] + ("A" if ct[-5] != "A" else "B") + ct[-4:]
    return attrs.evolve(call, envelope=attrs.evolve(call.envelope, ct=flipped))


def _pinned_to_mallory(opener: Opener) -> None:
    wrong = PinBook(opener.pin_storage)
    served = KeysResponse(identity=MALLORY.identity, encryption=MALLORY.encryption)
    # A pin for ann's address holding another identity key, as if ann's key had changed.
    pin = wrong.check_and_pin("@acme/mallory", served.identity, MALLORY.encryption, NOW)
    opener.pin_storage.put(attrs.evolve(pin, address="@acme/ann"))


def _unknown_caller(opener: Opener) -> IncomingCall:
    opener.directory.served.pop("ann")
    return call_from(ANN)


def _no_encryption(opener: Opener) -> IncomingCall:
    opener.directory.serve(ANN, encryption=False)
    return call_from(ANN)


def _mislabelled() -> IncomingCall:
    return incoming(seal_from(MALLORY)[0], from_="ann")


def _forged() -> IncomingCall:
    sealed, _ = seal_from(MALLORY, claimed_from="@acme/ann")
    return incoming(sealed, from_="ann")


def _to_unknown_key() -> IncomingCall:
    sealed, _ = seal_from(ANN, to=rotate(KEN))
    return incoming(sealed)


def _expired(opener: Opener) -> IncomingCall:
    call = call_from(ANN)
    opener.clock.advance(limits.CALL_DEADLINE_S + 1)
    return call


def _pin_changed(opener: Opener) -> IncomingCall:
    _pinned_to_mallory(opener)
    return call_from(ANN)


REJECTIONS: list[tuple[str, Callable[[Opener], IncomingCall], str]] = [
    ("keys unavailable", _unknown_caller, "caller_keys_unavailable"),
    ("no encryption key", _no_encryption, "caller_has_no_encryption_key"),
    (
        "tampered ciphertext",
        lambda _o: _tampered(call_from(ANN)),
        "envelope_invalid:EnvelopeInvalid",
    ),
    (
        "relay says ann, envelope says mallory",
        lambda _o: _mislabelled(),
        "envelope_invalid:EnvelopeInvalid",
    ),
    ("signed by someone else", lambda _o: _forged(), "envelope_invalid:SignatureInvalid"),
    ("sealed to a key we do not hold", lambda _o: _to_unknown_key(), "unknown_recipient_key"),
    ("expired", _expired, "envelope_invalid:RequestExpired"),
    ("pin changed", _pin_changed, "caller_keys_untrusted:IdentityChanged"),
]


@pytest.mark.parametrize(
    ("case", "make", "reason"), REJECTIONS, ids=[case for case, _, _ in REJECTIONS]
)
def test_an_untrustworthy_request_is_rejected_with_a_safe_reason(
    case: str, make: Callable[[Opener], IncomingCall], reason: str
) -> None:
    """Every failure to fetch, pin, open or verify is one EnvelopeRejected, its reason loggable."""
    opener = Opener()
    assert opener.rejection(make(opener)) == reason
    # Nothing was reserved for a request that was not opened.
    assert opener.replay_storage.count_live(opener.clock.seconds()) == 0


def test_a_replayed_request_is_rejected() -> None:
    """The same sealed request a second time (under a new call id) is refused."""
    opener = Opener()
    sealed, _ = seal_from(ANN)
    opener.open(incoming(sealed))
    assert opener.rejection(incoming(sealed, call_id=OTHER_CALL_ID)) == (
        "replay_refused:ReplayDetected"
    )


def test_a_replay_is_refused_after_a_restart(tmp_path: Path) -> None:
    """Reservations live in state.sqlite, so a new process refuses the same request."""
    home = Home(state_dir=tmp_path / "state", user_home=tmp_path)
    sealed, _ = seal_from(ANN)
    first = StateDb.open(home)
    Opener(replay_storage=first.replay).open(incoming(sealed))
    first.close()
    second = StateDb.open(home)
    again = Opener(replay_storage=second.replay)
    assert again.rejection(incoming(sealed)) == "replay_refused:ReplayDetected"
    second.close()


def test_rejection_reasons_never_carry_the_message_or_keys() -> None:
    """Reasons are fixed identifiers: no plaintext and no key material to leak into logs."""
    for case, make, _ in REJECTIONS:
        opener = Opener()
        reason = opener.rejection(make(opener))
        assert MESSAGE not in reason, case
        for secret in ANN.secrets() + KEN.secrets():
            assert secret not in reason, case


# --- 2. admission -----------------------------------------------------------------------------

CEILING_PATH = "/etc/agentcall/policy.json"
ROSTER = "R0ster-id-0000001"
NO_GROUPS: frozenset[str] = frozenset()
CI = Task(
    id="ci",
    name="CI triage",
    description="Why did CI fail?",
    tools=frozenset({"read", "exec"}),
    instructions="Read the failing job's log and name the first error.",
)
ON_DISK = TaskSet({"ask": BUILTIN_ASK, "ci": CI})
BLOCK_ANN = Policy(callers=[CallerRule("ann", Access.BLOCKED)])
GRANT_ANN_CI = Policy(callers=[CallerRule("ann", grants=("ci",))])
GROUP_CI = Policy(groups=[GroupRule("eng", ROSTER, ("ci",))])


def _inputs(
    policy: Policy = DEFAULT_POLICY, ceiling: Ceiling | None = None, tasks: TaskSet | None = None
) -> Callable[[], stages.AdmissionInputs]:
    loaded = stages.AdmissionInputs(policy=policy, ceiling=ceiling, tasks=tasks or TaskSet())
    return lambda: loaded


def _broken() -> stages.AdmissionInputs:
    raise PolicyError("/home/ken/.agentcall/policy.json", "is not valid JSON")


def _broken_ceiling() -> stages.AdmissionInputs:
    raise CeilingError(CEILING_PATH, "is owned by uid 1000, not root")


ADMISSIONS: list[
    tuple[str, Callable[[], stages.AdmissionInputs], str | None, frozenset[str], Any]
] = [
    ("default policy", _inputs(), None, NO_GROUPS, Admitted("ask")),
    ("ask named", _inputs(), "ask", NO_GROUPS, Admitted("ask")),
    (
        "caller blocked",
        _inputs(BLOCK_ANN),
        None,
        NO_GROUPS,
        (CallErrorCode.BLOCKED, CallStatus.BLOCKED),
    ),
    (
        "everyone blocked by default",
        _inputs(Policy(default_access=Access.BLOCKED)),
        None,
        NO_GROUPS,
        (CallErrorCode.BLOCKED, CallStatus.BLOCKED),
    ),
    (
        "unknown task",
        _inputs(),
        "deploy",
        NO_GROUPS,
        (CallErrorCode.TASK_UNKNOWN, CallStatus.TASK_UNKNOWN),
    ),
    (
        "on disk but not offered",
        _inputs(tasks=ON_DISK),
        "ci",
        NO_GROUPS,
        (CallErrorCode.TASK_NOT_OFFERED, CallStatus.TASK_NOT_OFFERED),
    ),
    ("granted to the caller", _inputs(GRANT_ANN_CI, tasks=ON_DISK), "ci", NO_GROUPS, Admitted(CI)),
    (
        "granted to a roster the relay attests",
        _inputs(GROUP_CI, tasks=ON_DISK),
        "ci",
        frozenset({ROSTER}),
        Admitted(CI),
    ),
    (
        "granted to a roster the relay does not attest",
        _inputs(GROUP_CI, tasks=ON_DISK),
        "ci",
        NO_GROUPS,
        (CallErrorCode.TASK_NOT_OFFERED, CallStatus.TASK_NOT_OFFERED),
    ),
    (
        "blocked by the ceiling whatever the owner says",
        _inputs(ceiling=Ceiling(CEILING_PATH, blocked_callers=frozenset({"ann"}))),
        None,
        NO_GROUPS,
        (CallErrorCode.BLOCKED, CallStatus.BLOCKED),
    ),
    (
        "a task the ceiling does not allow",
        _inputs(GRANT_ANN_CI, Ceiling(CEILING_PATH, allowed_tasks=frozenset({"ask"})), ON_DISK),
        "ci",
        NO_GROUPS,
        (CallErrorCode.TASK_NOT_OFFERED, CallStatus.TASK_NOT_OFFERED),
    ),
    (
        "tools capped by the ceiling",
        _inputs(GRANT_ANN_CI, Ceiling(CEILING_PATH, max_tools=frozenset({"read"})), ON_DISK),
        "ci",
        NO_GROUPS,
        Admitted(CI, frozenset({"read"})),
    ),
    (
        "unreadable policy",
        _broken,
        None,
        NO_GROUPS,
        (CallErrorCode.AGENT_ERROR, CallStatus.POLICY_ERROR),
    ),
    (
        "unusable ceiling",
        _broken_ceiling,
        None,
        NO_GROUPS,
        (CallErrorCode.AGENT_ERROR, CallStatus.POLICY_ERROR),
    ),
]


@pytest.mark.parametrize(
    ("case", "load", "task", "groups", "expected"),
    ADMISSIONS,
    ids=[case for case, *_ in ADMISSIONS],
)
def test_admission_decides_from_local_files_caller_task_and_groups(
    case: str,
    load: Callable[[], stages.AdmissionInputs],
    task: str | None,
    groups: frozenset[str],
    expected: Any,
) -> None:
    """Each decision, with the failure code and calls.log status of a refusal."""
    decision = stages.admit_call(load, "ann", task, groups)
    if isinstance(expected, Admitted):
        assert decision == expected
    else:
        assert isinstance(decision, stages.RefusalAnswer)
        assert (decision.failure.code, decision.status) == expected


def test_refusal_details_say_why_without_leaking_the_policy() -> None:
    """Policy and ceiling errors name nothing of the files; a refused task shows the menu."""
    for load in (_broken, _broken_ceiling):
        broken = stages.admit_call(load, "ann", None)
        assert isinstance(broken, stages.RefusalAnswer)
        assert broken.failure.detail == "a local policy error prevented this call"
    context = stages.context_refusal()
    assert (context.failure.code, context.status) == (
        CallErrorCode.CONTEXT_UNKNOWN,
        CallStatus.CONTEXT_UNKNOWN,
    )
    assert "conversation" in (context.failure.detail or "")
    blocked = stages.admit_call(_inputs(BLOCK_ANN), "ann", None)
    assert isinstance(blocked, stages.RefusalAnswer) and blocked.flags == (
        "blocked_caller_attempt",
    )
    assert blocked.failure.offered == ()
    not_offered = stages.admit_call(_inputs(tasks=ON_DISK), "ann", "ci")
    assert isinstance(not_offered, stages.RefusalAnswer) and not_offered.failure.offered == ("ask",)


def test_admission_has_no_way_to_see_the_message() -> None:
    """The decision's inputs are the local files, the caller, the task id and attested groups."""
    assert list(inspect.signature(stages.admit_call).parameters) == [
        "load_inputs",
        "caller_handle",
        "requested_task",
        "groups",
    ]


# --- 3. the working directory -------------------------------------------------------------------


def test_the_workdir_is_the_first_shared_directory_that_exists() -> None:
    """A missing first root is skipped; none at all is a failure, not a wider directory."""
    config = make_config()
    picked = stages.choose_workdir(config, BUILTIN_ASK, lambda path: path == "/srv/other")
    assert picked == os.path.realpath("/srv/other")
    nothing = stages.choose_workdir(config, BUILTIN_ASK, lambda path: False)
    assert nothing == CallFailure(code=CallErrorCode.AGENT_ERROR, detail=stages.NO_WORKDIR_DETAIL)


def test_a_tasks_own_workdir_wins_and_is_never_replaced_by_a_read_root() -> None:
    task = attrs.evolve(CI, workdir=Path("/srv/other/repo"))
    config = make_config()
    assert stages.choose_workdir(config, task, lambda _path: True) == os.path.realpath(
        "/srv/other/repo"
    )
    gone = stages.choose_workdir(config, task, lambda path: path != "/srv/other/repo")
    assert gone == CallFailure(code=CallErrorCode.AGENT_ERROR, detail=stages.NO_WORKDIR_DETAIL)


# --- 4. planning the run ------------------------------------------------------------------------

ENVIRON = {
    "PATH": "/usr/local/bin:/usr/bin",
    "HOME": "/home/ken",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "ANTHROPIC_API_KEY": "vendor-key",
    "FAKE_AGENT_SCENARIO": "happy",
    "AGENTCALL_HOME": "/home/ken/.agentcall",
    "AGENTCALL_CALL_ID": "forged",
    "AGENTCALL_GUARD_CAPS": "read,write,fetch,exec",
    "AGENTCALL_GUARD_ROOTS": "/",
    "GITHUB_TOKEN": "ghp_not_for_agents",
    "DATABASE_URL": "postgres://secret",
}
GUARD = planning.GuardSetup(
    argv=("/usr/bin/python3", "-I", "-m", "agentcall.guard"),
    tools_log="/home/ken/.agentcall/tools.log",
    home="/home/ken",
    extra_denied=("/opt/agentcall/lib/agentcall", "/home/ken/AgentCall/tasks"),
)
ASK = Admitted("ask")
CLAUDE = make_config(agent_kind="claude", agent_command=None)
CODEX = make_config(agent_kind="codex", agent_command=None)


def opened_call(**kw: Any) -> stages.OpenedCall:
    return Opener().open(call_from(ANN, **kw))


def a_binding(**changes: Any) -> Binding:
    fields: dict[str, Any] = {
        "context_id": "ctx_" + "a" * 22,
        "caller": "@acme/ann",
        "task": "ask",
        "agent_kind": "claude",
        "workdir": os.path.realpath("/srv/shared"),
        "agent_session": "sess-earlier-1",
        "turns": 1,
        "created_at": NOW - 60,
        "last_used_at": NOW - 60,
    }
    fields.update(changes)
    return Binding(**fields)


@attrs.define
class Planner:
    existing: set[str] = attrs.field(factory=lambda: {"/srv/shared", "/srv/other"})
    installed: dict[str, str] = attrs.field(
        factory=lambda: {"claude": "/usr/local/bin/claude", "codex": "/usr/local/bin/codex"}
    )
    lookups: list[tuple[str, str]] = attrs.field(factory=list)
    prompts: list[tuple[PromptParts, str]] = attrs.field(factory=list)
    guard: planning.GuardSetup = GUARD

    def which(self, program: str, path: str) -> str | None:
        self.lookups.append((program, path))
        if program.startswith("/"):
            return program
        return self.installed.get(program)

    def build(self, parts: PromptParts, message: str) -> str:
        self.prompts.append((parts, message))
        return build_prompt(parts, message)

    def is_dir(self, path: str) -> bool:
        return path in self.existing

    def plan(
        self,
        config: Config,
        opened: stages.OpenedCall,
        admitted: Admitted = ASK,
        binding: Binding | None = None,
        shell_allowed: bool = True,
    ) -> planning.RunPlan | CallFailure:
        workdir = stages.choose_workdir(config, admitted.task, self.is_dir)
        if isinstance(workdir, CallFailure):
            return workdir
        return planning.plan_run(
            config,
            opened,
            admitted,
            workdir,
            binding,
            guard=self.guard,
            shell_allowed=shell_allowed,
            environ=ENVIRON,
            which=self.which,
            is_dir=self.is_dir,
            build_prompt=self.build,
        )


def planned(config: Config, admitted: Admitted = ASK, **kw: Any) -> planning.RunPlan:
    plan = Planner().plan(config, opened_call(), admitted, **kw)
    assert isinstance(plan, planning.RunPlan)
    return plan


def after(argv: tuple[str, ...], flag: str) -> str:
    """The argument following ``flag`` (which must appear exactly once)."""
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def test_a_claude_run_is_planned_on_path_with_a_filtered_environment() -> None:
    """claude is found on the listener's PATH; env keeps vendor and fake-agent variables only."""
    planner = Planner()
    plan = planner.plan(CLAUDE, opened_call())
    assert isinstance(plan, planning.RunPlan)
    assert planner.lookups == [("claude", ENVIRON["PATH"])]
    assert plan.run.argv[0] == "/usr/local/bin/claude"
    assert after(plan.run.argv, "--add-dir") == "/srv/other"
    assert MESSAGE not in " ".join(plan.run.argv)
    assert plan.run.cwd == os.path.realpath("/srv/shared") == plan.workdir
    assert (plan.run.timeout_s, plan.run.kill_grace_s) == (120.0, 3.0)
    env = plan.run.env
    assert env[CALL_ID_ENV] == CALL_ID
    assert env["ANTHROPIC_API_KEY"] == "vendor-key"
    assert env["FAKE_AGENT_SCENARIO"] == "happy"
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "2"  # the adapter's own addition
    for dropped in ("AGENTCALL_HOME", "GITHUB_TOKEN", "DATABASE_URL"):
        assert dropped not in env
    assert MESSAGE in plan.run.stdin.decode()


def test_the_prompt_is_built_for_the_verified_caller_and_the_ask_task() -> None:
    """Owner and caller addresses, task ask, no instructions, the configured read roots."""
    planner = Planner()
    planner.plan(make_config(), opened_call())
    [(parts, message)] = planner.prompts
    assert message == MESSAGE
    assert (parts.owner_address, parts.caller_address) == ("@acme/ken", "@acme/ann")
    assert (parts.task_id, parts.task_name, parts.task_instructions) == (
        "ask",
        "Ask a question",
        None,
    )
    assert parts.readable_roots == ("/srv/shared", "/srv/other")
    assert parts.threaded is False


def test_a_named_task_brings_its_instructions_tools_and_timeout() -> None:
    """The SKILL.md body goes into the prompt; its tools into --tools; the shorter timeout."""
    planner = Planner()
    task = attrs.evolve(CI, timeout_s=45)
    plan = planner.plan(CLAUDE, opened_call(task="ci"), Admitted(task))
    assert isinstance(plan, planning.RunPlan)
    [(parts, _)] = planner.prompts
    assert (parts.task_id, parts.task_name) == ("ci", "CI triage")
    assert parts.task_instructions == CI.instructions
    assert CI.instructions in plan.run.stdin.decode()
    assert after(plan.run.argv, "--tools") == "Read,Grep,Glob,Bash"
    assert plan.run.timeout_s == 45.0
    assert plan.run.env["AGENTCALL_GUARD_CAPS"] == "exec,read"
    # The config's timeout stays the cap for a task that asks for more.
    long = planned(CLAUDE, Admitted(attrs.evolve(CI, timeout_s=300)))
    assert long.run.timeout_s == 120.0


def test_the_plan_never_widens_the_tools_admission_allowed() -> None:
    """A ceiling that caps a task to fetch alone: no read tool, and the guard allows fetch only."""
    fetcher = Task(id="news", name="News", description="d", tools=frozenset({"read", "fetch"}))
    plan = planned(CLAUDE, Admitted(fetcher, frozenset({"fetch"})))
    assert after(plan.run.argv, "--tools") == "WebFetch,WebSearch"
    assert plan.run.env["AGENTCALL_GUARD_CAPS"] == "fetch"


def test_a_command_agent_keeps_its_configured_arguments() -> None:
    """agent_command is the argv: the program resolved, the arguments after it."""
    planner = Planner()
    config = make_config(agent_command=["/opt/agent/answer", "--quiet", "-"])
    plan = planner.plan(config, opened_call())
    assert isinstance(plan, planning.RunPlan)
    assert plan.run.argv == ("/opt/agent/answer", "--quiet", "-")


def test_a_missing_workdir_fails_the_plan() -> None:
    nothing = Planner(existing=set()).plan(make_config(), opened_call())
    assert nothing == CallFailure(code=CallErrorCode.AGENT_ERROR, detail=stages.NO_WORKDIR_DETAIL)


def test_a_missing_agent_binary_is_an_agent_error() -> None:
    """Neither on PATH nor at its configured path: "the answering agent is not installed"."""
    codex = Planner(installed={}).plan(CODEX, opened_call())
    assert codex == CallFailure(
        code=CallErrorCode.AGENT_ERROR, detail="the answering agent is not installed"
    )

    class Gone(Planner):
        def which(self, program: str, path: str) -> str | None:
            return None

    gone = Gone().plan(make_config(), opened_call())
    assert isinstance(gone, CallFailure) and gone.detail == "the answering agent is not installed"


# --- the tool guard on the command line and in the environment ---------------------------------


def test_claude_gets_exactly_the_guard_settings_and_no_other_setting_sources() -> None:
    argv = planned(CLAUDE).run.argv
    assert after(argv, "--settings") == guardwire.claude_guard_settings(list(GUARD.argv))
    assert after(argv, "--setting-sources") == ""
    assert "--dangerously-bypass-hook-trust" not in argv


def test_codex_gets_the_hook_and_the_trust_bypass_it_needs() -> None:
    argv = planned(CODEX).run.argv
    assert "--dangerously-bypass-hook-trust" in argv
    hook = "hooks.PreToolUse=" + guardwire.codex_hook_value(list(GUARD.argv))
    assert hook in argv and argv[argv.index(hook) - 1] == "-c"
    assert "--settings" not in argv


@pytest.mark.parametrize(
    ("config", "caps"), [(CLAUDE, "read"), (CODEX, "exec,read"), (make_config(), "read")]
)
def test_the_guard_variables_are_set_and_none_leak_in_from_outside(
    config: Config, caps: str
) -> None:
    """Every AGENTCALL_* variable is ours; Codex's guard lets commands through to be recorded."""
    env = planned(config).run.env
    workdir = os.path.realpath("/srv/shared")
    expected = guardwire.guard_env(
        roots=(workdir, os.path.realpath("/srv/other")),
        write_root=None,
        caps=caps.split(","),
        call_id=CALL_ID,
        log_path=GUARD.tools_log,
        home=GUARD.home,
        extra_denied=GUARD.extra_denied,
    )
    ours = {name: value for name, value in env.items() if name.startswith("AGENTCALL_")}
    assert ours == expected
    assert env["AGENTCALL_GUARD_CAPS"] == caps
    assert env[CALL_ID_ENV] == CALL_ID


def test_codex_gets_no_shell_where_the_admin_ceiling_forbids_exec() -> None:
    """Codex reads only through its shell; a ceiling without exec must not be widened for it."""
    env = planned(CODEX, shell_allowed=False).run.env
    assert env["AGENTCALL_GUARD_CAPS"] == "read"


def test_the_shell_is_allowed_unless_a_ceiling_caps_exec_away() -> None:
    from agentcall.listener.ceiling import Ceiling

    def ceiling(max_tools: frozenset[str] | None) -> Ceiling:
        return Ceiling(
            path="/etc/agentcall/policy.json",
            allowed_tasks=None,
            blocked_callers=frozenset(),
            max_tools=max_tools,
            assertions=(),
        )

    assert planning.shell_allowed(None)
    assert planning.shell_allowed(ceiling(None))
    assert planning.shell_allowed(ceiling(frozenset({"read", "exec"})))
    assert not planning.shell_allowed(ceiling(frozenset({"read"})))


def test_a_writing_task_tells_the_guard_where_it_may_write() -> None:
    writer = attrs.evolve(CI, tools=frozenset({"read", "write"}))
    env = planned(CLAUDE, Admitted(writer)).run.env
    assert env["AGENTCALL_GUARD_WRITE_ROOT"] == os.path.realpath("/srv/shared")
    assert env["AGENTCALL_GUARD_CAPS"] == "read,write"


# --- connectors: the owner's MCP servers a task names -------------------------------------------

MCP_TOKEN = "ghp_" + "M" * 36
GITHUB_MCP = {"type": "http", "url": "https://mcp.example", "headers": {"Authorization": MCP_TOKEN}}
WITH_GITHUB = attrs.evolve(CI, connectors=("github",))


def owner_home(tmp_path: Path, content: object) -> Planner:
    """A planner whose owner's home holds ``.claude.json`` (text as given, else JSON)."""
    text = content if isinstance(content, str) else json.dumps(content)
    (tmp_path / ".claude.json").write_text(text)
    state = tmp_path / ".agentcall"
    state.mkdir(mode=0o700, exist_ok=True)
    guard = attrs.evolve(GUARD, home=str(tmp_path), tools_log=str(state / "tools.log"))
    return Planner(guard=guard)


def test_a_tasks_connectors_reach_claude_and_the_guard(tmp_path: Path) -> None:
    """Only the named server goes into --mcp-config and the allow rules; the guard is told."""
    servers = {"github": GITHUB_MCP, "slack": {"command": "/usr/bin/slack-mcp"}}
    planner = owner_home(tmp_path, {"mcpServers": servers})
    plan = planner.plan(CLAUDE, opened_call(task="ci"), Admitted(WITH_GITHUB))
    assert isinstance(plan, planning.RunPlan)
    argv = plan.run.argv
    # By path, in a 0600 file: the server configs (tokens) never appear in argv.
    config_file = Path(after(argv, "--mcp-config"))
    assert config_file.parent == tmp_path / ".agentcall"
    assert json.loads(config_file.read_text()) == {"mcpServers": {"github": GITHUB_MCP}}
    assert config_file.stat().st_mode & 0o777 == 0o600
    assert plan.private_files == (str(config_file),)
    assert not any(MCP_TOKEN in arg for arg in argv)
    assert argv[argv.index("--mcp-config") - 1] == "--strict-mcp-config"
    assert after(argv, "--allowedTools") == "Bash,mcp__github__*"
    assert plan.run.env["AGENTCALL_GUARD_MCP"] == "github"
    assert not any(MCP_TOKEN in value for value in plan.run.env.values())
    assert MCP_TOKEN not in repr(plan)


def test_a_task_without_connectors_reads_nothing_and_grants_no_mcp(tmp_path: Path) -> None:
    """Even a broken .claude.json is not read for a task that names no connector."""
    planner = owner_home(tmp_path, "{broken")
    plan = planner.plan(CLAUDE, opened_call(task="ci"), Admitted(CI))
    assert isinstance(plan, planning.RunPlan)
    assert "--mcp-config" not in plan.run.argv
    assert not any("mcp__" in arg for arg in plan.run.argv)
    assert plan.run.env["AGENTCALL_GUARD_MCP"] == ""


def test_a_connector_the_owner_lacks_refuses_the_call(tmp_path: Path) -> None:
    planner = owner_home(tmp_path, {"mcpServers": {"slack": {"command": "/usr/bin/slack"}}})
    got = planner.plan(CLAUDE, opened_call(task="ci"), Admitted(WITH_GITHUB))
    assert got == CallFailure(
        code=CallErrorCode.AGENT_ERROR,
        detail="task ci names connector github, which is not configured",
    )
    assert planner.prompts == []


@pytest.mark.parametrize("content", ["{broken", '{"mcpServers": {"github": "' + MCP_TOKEN + '"}}'])
def test_a_malformed_owner_config_fails_closed(tmp_path: Path, content: str) -> None:
    """agent_error naming the file (home as ~), never its content; nothing is planned."""
    planner = owner_home(tmp_path, content)
    got = planner.plan(CLAUDE, opened_call(task="ci"), Admitted(WITH_GITHUB))
    assert isinstance(got, CallFailure)
    assert got.code == CallErrorCode.AGENT_ERROR and got.detail is not None
    assert got.detail.startswith("~/.claude.json")
    assert MCP_TOKEN not in got.detail and str(tmp_path) not in got.detail
    assert planner.prompts == []


@pytest.mark.parametrize("config", [CODEX, make_config()], ids=["codex", "command"])
def test_connectors_are_claude_only(tmp_path: Path, config: Config) -> None:
    """Another agent cannot be given the servers: refused before anything is read or built."""
    planner = owner_home(tmp_path, "{broken")
    got = planner.plan(config, opened_call(task="ci"), Admitted(WITH_GITHUB))
    assert got == CallFailure(
        code=CallErrorCode.AGENT_ERROR,
        detail="this task's connectors are only supported with Claude Code",
    )
    assert planner.prompts == []


# --- sessions ------------------------------------------------------------------------------------


def test_a_threadable_claude_call_keeps_its_session_and_a_mutating_one_does_not() -> None:
    kept = planned(CLAUDE).run.argv
    assert "--no-session-persistence" not in kept and "--resume" not in kept
    writer = attrs.evolve(CI, tools=frozenset({"read", "write"}), threadable=False)
    one_shot = planned(CLAUDE, Admitted(writer)).run.argv
    assert "--no-session-persistence" in one_shot


def test_a_confirmed_binding_resumes_its_session_in_a_threaded_prompt() -> None:
    planner = Planner()
    plan = planner.plan(CLAUDE, opened_call(), Admitted("ask"), a_binding())
    assert isinstance(plan, planning.RunPlan)
    assert after(plan.run.argv, "--resume") == "sess-earlier-1"
    [(parts, _)] = planner.prompts
    assert parts.threaded is True
    codex = planned(CODEX, binding=a_binding(agent_kind="codex")).run.argv
    assert codex[1:4] == ("exec", "resume", "sess-earlier-1")


# --- agent environment -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("PATH", True),
        ("HOME", True),
        ("USER", True),
        ("LANG", True),
        ("LC_CTYPE", True),
        ("TERM", True),
        ("TMPDIR", True),
        ("SHELL", True),
        ("https_proxy", True),
        ("NO_PROXY", True),
        ("ANTHROPIC_BASE_URL", True),
        ("CLAUDE_CONFIG_DIR", True),
        ("OPENAI_API_KEY", True),
        ("CODEX_HOME", True),
        ("FAKE_AGENT_LOG", True),
        ("XDG_CONFIG_HOME", True),
        ("AGENTCALL_HOME", False),
        ("AGENTCALL_RELAY", False),
        ("AWS_SECRET_ACCESS_KEY", False),
        ("GITHUB_TOKEN", False),
        ("SSH_AUTH_SOCK", False),
        ("PYTHONPATH", False),
    ],
)
def test_agent_environment_keeps_only_what_agents_need(name: str, kept: bool) -> None:
    """A fixed allow-list; anything AGENTCALL_* from outside is dropped."""
    env = agent_environment({name: "value"}, CALL_ID, {})
    assert (name in env) is kept


def test_the_owners_session_addresses_never_reach_the_agent() -> None:
    """Not from the listener's environment, and not from an adapter's additions either."""
    session = dict.fromkeys(agent_env.SESSION_NAMES, "value")
    assert {"SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "DISPLAY", "WAYLAND_DISPLAY"} <= set(
        session
    )
    env = agent_environment({**session, "PATH": "/bin"}, CALL_ID, session)
    assert env == {"PATH": "/bin", CALL_ID_ENV: CALL_ID}


def test_the_call_id_variable_cannot_be_forged() -> None:
    """Neither the environment nor the adapter's additions can set AGENTCALL_* variables."""
    env = agent_environment(
        {CALL_ID_ENV: "outer"},
        CALL_ID,
        {CALL_ID_ENV: "adapter", "AGENTCALL_OTHER": "x", "CLAUDE_CODE_MAX_RETRIES": "2"},
    )
    assert env == {CALL_ID_ENV: CALL_ID, "CLAUDE_CODE_MAX_RETRIES": "2"}


# --- 5. judging the result ----------------------------------------------------------------------


def judge(result: RunResult, adapter: Any = command.ADAPTER) -> stages.Verdict:
    parser = adapter.new_parser()
    for line in result.stdout.splitlines():
        parser.feed_line(line)
    return stages.judge_run(adapter, result, parser, secrets=[TOKEN], timeout_s=120.0)


def test_an_answer_becomes_a_reply_for_the_ask_task() -> None:
    verdict = judge(run_result(stdout=b"It fails because of a stale cache.\n"))
    assert verdict.status is CallStatus.OK
    assert verdict.outcome == Reply(text="It fails because of a stale cache.\n", task="ask")


def test_credential_shapes_and_the_installation_token_are_redacted() -> None:
    """A token-shaped string and config.token never leave in a reply."""
    text = f"key sk-ant-api03-FAKEfakeFAKEfake0123 and ours {TOKEN} done"
    verdict = judge(run_result(stdout=text.encode()))
    assert isinstance(verdict.outcome, Reply)
    assert verdict.outcome.text == f"key {REDACTED} and ours {REDACTED} done"


def test_a_long_reply_is_cut_at_the_limit_on_a_code_point_boundary() -> None:
    """256,000 bytes at most, never half a character."""
    text = "a" + "€" * 100_000  # 300,001 bytes; 3-byte characters straddle the limit
    verdict = judge(run_result(stdout=text.encode()))
    assert isinstance(verdict.outcome, Reply)
    data = verdict.outcome.text.encode("utf-8")
    assert len(data) == 1 + 3 * ((limits.MAX_REPLY_BYTES - 1) // 3) <= limits.MAX_REPLY_BYTES
    assert verdict.outcome.text.endswith("€")


def test_redaction_comes_before_the_cut() -> None:
    """A key straddling the limit is removed whole, not cut into a leaking prefix."""
    text = "a" * (limits.MAX_REPLY_BYTES - 11) + " sk-ant-api03-" + "x" * 40
    verdict = judge(run_result(stdout=text.encode()))
    assert isinstance(verdict.outcome, Reply)
    assert verdict.outcome.text.endswith(REDACTED)
    assert "sk-ant" not in verdict.outcome.text


def test_terminal_escapes_are_removed_before_the_answer_is_sealed() -> None:
    """OSC 52 (clipboard), OSC 8 (links), CSI colours, C1, CR, backspace and bidi overrides
    never reach the caller, whose `--json | jq -r .text` would print them raw."""
    text = (
        "A\x1b]52;c;cm0gLXJmIH4=\x07B\x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\"
        "\x1b[31mC\x1b[0m\x9b2J\x9d0;title\x9cD\rE\x08F\u202eG\tH\n"
    )
    verdict = judge(run_result(stdout=text.encode()))
    assert isinstance(verdict.outcome, Reply)
    assert verdict.outcome.text == "ABlinkCDE F G\tH\n"


def test_an_escape_inside_a_key_does_not_hide_it_from_redaction() -> None:
    """Cleaning comes before redaction: a sequence splitting a key is removed and the whole
    key, now whole again, is redacted rather than sent."""
    text = "key sk-ant-api03-FAKE\x1b[0mfakeFAKEfake0123 done"
    verdict = judge(run_result(stdout=text.encode()))
    assert isinstance(verdict.outcome, Reply)
    assert verdict.outcome.text == f"key {REDACTED} done"


FAILURES: list[tuple[str, RunResult, Any, CallErrorCode, CallStatus]] = [
    (
        "kill timer",
        run_result(exit_code=None, signal=15, timed_out=True),
        command.ADAPTER,
        CallErrorCode.TIMEOUT,
        CallStatus.TIMEOUT,
    ),
    (
        "not logged in",
        run_result(
            stdout=b'{"type":"result","subtype":"success","is_error":true,'
            b'"result":"Not logged in \\u00b7 Please run /login"}\n'
        ),
        claude.ADAPTER,
        CallErrorCode.AGENT_ERROR,
        CallStatus.AGENT_ERROR,
    ),
    (
        "crash",
        run_result(exit_code=3, stderr=b"boom"),
        command.ADAPTER,
        CallErrorCode.AGENT_ERROR,
        CallStatus.AGENT_ERROR,
    ),
]


@pytest.mark.parametrize(
    ("case", "result", "adapter", "code", "status"),
    FAILURES,
    ids=[case for case, *_ in FAILURES],
)
def test_failures_map_to_codes_and_statuses(
    case: str, result: RunResult, adapter: Any, code: CallErrorCode, status: CallStatus
) -> None:
    verdict = judge(result, adapter)
    assert isinstance(verdict.outcome, CallFailure)
    assert (verdict.outcome.code, verdict.status) == (code, status)


def test_failure_details_are_fixed_and_the_owners_error_is_clean_and_redacted() -> None:
    """The caller's detail is fixed words; the owner's error is one redacted line."""
    timeout = judge(run_result(exit_code=None, signal=15, timed_out=True)).outcome
    assert (
        isinstance(timeout, CallFailure)
        and timeout.detail == "the agent did not answer within 120 s"
    )
    login = judge(FAILURES[1][1], claude.ADAPTER).outcome
    assert isinstance(login, CallFailure) and login.detail == "the answering agent is not logged in"
    stderr = f"fatal: token {TOKEN} rejected\n\x1b[31mred\x1b[0m\n".encode()
    crash = judge(run_result(exit_code=1, stderr=stderr))
    assert crash.outcome == CallFailure(
        code=CallErrorCode.AGENT_ERROR, detail="the agent exited with status 1 without an answer"
    )
    assert crash.error is not None
    assert TOKEN not in crash.error and REDACTED in crash.error and "red" in crash.error
    assert "\x1b" not in crash.error and "\n" not in crash.error
    assert len(crash.error) <= limits.MAX_DETAIL_CHARS


def claude_stdout(text: str, *, session: str = "sess-new-1", tools: tuple[str, ...] = ()) -> bytes:
    """What ``claude -p --output-format stream-json`` prints for one answered run."""
    lines: list[dict[str, Any]] = [{"type": "system", "subtype": "init", "session_id": session}]
    if tools:
        uses = [{"type": "tool_use", "id": ident, "name": "Read", "input": {}} for ident in tools]
        lines.append({"type": "assistant", "message": {"content": uses}})
    lines.append(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": text,
            "session_id": session,
        }
    )
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def judge_claude(
    result: RunResult, unguarded: Callable[[tuple[str, ...]], list[str]] | None
) -> stages.Verdict:
    parser = claude.ADAPTER.new_parser()
    for line in result.stdout.splitlines():
        parser.feed_line(line)
    return stages.judge_run(
        claude.ADAPTER,
        result,
        parser,
        secrets=[TOKEN],
        timeout_s=120.0,
        task_id="ci",
        unguarded=unguarded,
    )


def test_an_answer_names_its_task_and_keeps_the_session_for_the_pipeline_only() -> None:
    seen: list[tuple[str, ...]] = []

    def all_logged(used: tuple[str, ...]) -> list[str]:
        seen.append(used)
        return []

    verdict = judge_claude(run_result(stdout=claude_stdout("fine", tools=("toolu_1",))), all_logged)
    assert verdict.outcome == Reply(text="fine", task="ci")
    assert (verdict.status, verdict.session, verdict.flags) == (CallStatus.OK, "sess-new-1", ())
    assert seen == [("toolu_1",)]
    assert "sess-new-1" not in repr(verdict)


def test_a_tool_call_the_guard_never_saw_withholds_the_answer() -> None:
    stdout = claude_stdout("the secret is 42", tools=("toolu_1", "toolu_2"))
    verdict = judge_claude(run_result(stdout=stdout), lambda used: list(used[1:]))
    assert verdict.outcome == CallFailure(
        code=CallErrorCode.AGENT_ERROR, detail=stages.GUARD_UNWIRED_DETAIL
    )
    assert (verdict.status, verdict.flags) == (CallStatus.AGENT_ERROR, ("guard_unwired",))
    assert verdict.session is None
    assert "42" not in repr(verdict)


def test_a_session_the_agent_cannot_resume_is_context_unknown() -> None:
    stderr = b"Error: No conversation found with session ID: sess-earlier-1\n"
    verdict = judge_claude(run_result(exit_code=1, stderr=stderr), None)
    assert verdict.outcome == CallFailure(
        code=CallErrorCode.CONTEXT_UNKNOWN, detail=stages.CONTEXT_UNKNOWN_DETAIL
    )
    assert (verdict.status, verdict.resume_failed) == (CallStatus.CONTEXT_UNKNOWN, True)


# --- 6. sealing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "terminal"),
    [
        (Reply(text="answer", task="ask"), Terminal.COMPLETED),
        (CallFailure(code=CallErrorCode.BUSY, detail="busy"), Terminal.FAILED),
    ],
)
def test_the_outcome_is_sealed_to_the_caller_and_signed_by_us(
    outcome: Reply | CallFailure, terminal: Terminal
) -> None:
    """Only the caller can open it, it verifies against our identity, and binds the request."""
    sealed, request = seal_from(ANN)
    opened = Opener().open(incoming(sealed, from_="ann", call_id=CALL_ID))
    frame = stages.seal_outcome(keys_of(KEN), opened, outcome, NOW + 5)
    assert (frame.call_id, frame.terminal) == (CALL_ID, terminal)
    payload = crypto_envelope.open_response(
        frame.envelope,
        my_key=ANN.enc_key,
        my_record=ANN.enc_record,
        request=request,
        responder_identity_pub=KEN.identity_pub,
        now=NOW + 6,
    )
    assert payload.outcome == outcome


def test_pin_helpers_are_consistent() -> None:
    """(Guard for the fixtures above) a pin for ann made by the helper is mallory's key."""
    opener = Opener()
    _pinned_to_mallory(opener)
    pin = opener.pin_storage.get(ORIGIN, "@acme/ann")
    assert isinstance(pin, Pin) and pin.identity_pub == MALLORY.identity_pub


def test_a_live_answer_lives_a_call_deadline_and_a_job_answer_the_mailbox_ttl() -> None:
    """A mailbox job's answer may be fetched days later; a live one is read at once."""
    sealed, request = seal_from(ANN)
    opened = Opener().open(incoming(sealed, from_="ann", call_id=CALL_ID))
    outcome = Reply(text="answer", task="ask")
    for validity, frame in [
        (limits.CALL_DEADLINE_S, stages.seal_outcome(keys_of(KEN), opened, outcome, NOW)),
        (
            limits.MAX_ENVELOPE_VALIDITY_S,
            stages.seal_outcome(
                keys_of(KEN), opened, outcome, NOW, validity_s=limits.MAX_ENVELOPE_VALIDITY_S
            ),
        ),
    ]:
        payload = crypto_envelope.open_response(
            frame.envelope,
            my_key=ANN.enc_key,
            my_record=ANN.enc_record,
            request=request,
            responder_identity_pub=KEN.identity_pub,
            now=NOW + 1,
        )
        assert payload.expires_at - payload.issued_at == validity
