"""The caller flow: pin, seal, dial, and believe only answers that open and verify."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet import defer

from agentcall import limits
from agentcall.caller.call import CallRefused, CallResult, KeysConflict, ensure_published, place
from agentcall.client.api import Credentials, RelayUnreachable
from agentcall.client.ws import CallAborted
from agentcall.crypto import envelope
from agentcall.errors import ApiError, ApiErrorCode, CallErrorCode
from agentcall.local.config import Config
from agentcall.local.home import Home
from agentcall.local.keystore import LocalKeys, load_keys
from agentcall.local.statedb import StateDb
from agentcall.relayurl import RelayUrl
from agentcall.wire.frames import (
    CallError,
    CallOutcome,
    CallQueued,
    CallRequest,
    CallState,
    CallStatus,
    SealedEnvelope,
)
from agentcall.wire.http import KeysResponse, SignedEncryptionKeyRecord, SignedIdentityRecord
from agentcall.wire.payloads import CallFailure, Reply, RequestPayload
from tests.unit.cli_helpers import NOW, ORIGIN, install, run_with_clock
from tests.unit.crypto_helpers import DAY, Party, make_party

CALL_ID = "1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b"
BOB = "@acme/bob"


class FakeDirectory:
    """The relay's key routes in memory; records what was published."""

    def __init__(self, served: dict[str, KeysResponse] | None = None) -> None:
        self.served = dict(served or {})
        self.published: list[object] = []
        self.fail_get: Exception | None = None

    def get_keys(self, handle: str) -> defer.Deferred[KeysResponse]:
        if self.fail_get is not None:
            return defer.fail(self.fail_get)
        if handle not in self.served:
            return defer.fail(ApiError(404, ApiErrorCode.NOT_FOUND, "no published keys"))
        return defer.succeed(self.served[handle])

    def put_identity_key(self, record: SignedIdentityRecord) -> defer.Deferred[KeysResponse]:
        self.published.append(record)
        handle = record.record.address.split("/")[1]
        self.served[handle] = KeysResponse(identity=record)
        return defer.succeed(self.served[handle])

    def put_encryption_key(self, record: SignedEncryptionKeyRecord) -> defer.Deferred[KeysResponse]:
        self.published.append(record)
        handle = record.record.address.split("/")[1]
        self.served[handle] = attrs.evolve(self.served[handle], encryption=record)
        return defer.succeed(self.served[handle])


def served(party: Party) -> KeysResponse:
    return KeysResponse(identity=party.identity, encryption=party.encryption)


@attrs.define
class Callee:
    """Bob's side of the relay: opens the request with his key and answers as told."""

    party: Party
    caller_keys: LocalKeys
    answer: Callable[[RequestPayload], object]
    statuses: tuple[CallState, ...] = (CallState.RINGING, CallState.ANSWERED, CallState.WORKING)
    requests: list[RequestPayload] = attrs.field(factory=list)
    dials: list[dict[str, Any]] = attrs.field(factory=list)

    def dial(
        self,
        reactor: Any,
        relay_url: RelayUrl,
        credentials: Credentials,
        handle: str,
        frame: CallRequest,
        **kw: Any,
    ) -> defer.Deferred[CallOutcome | CallError | CallQueued]:
        self.dials.append({"handle": handle, "credentials": credentials, **kw})
        for state in self.statuses:
            kw["on_status"](CallStatus(call_id=CALL_ID, state=state))
        request = envelope.open_request(
            frame.envelope,
            my_key=self.party.enc_key,
            my_record=self.party.enc_record,
            relay_origin=ORIGIN,
            expected_from="@acme/ann",
            expected_to=BOB,
            sender_identity_pub=self.caller_keys.identity.public_b64,
            now=reactor.seconds(),
        )
        self.requests.append(request)
        result = self.answer(request)
        if isinstance(result, Exception):
            return defer.fail(result)
        if isinstance(result, (CallError, CallOutcome)):
            return defer.succeed(result)
        if not isinstance(result, (Reply, CallFailure)):
            raise TypeError(result)
        return defer.succeed(self.outcome(request, result))

    def outcome(self, request: RequestPayload, result: Reply | CallFailure) -> CallOutcome:
        sealed = envelope.seal_response(
            responder=self.party.identity_key,
            request=request,
            outcome=result,
            caller_encryption=self.caller_keys.current_record.record,
            now=request.issued_at,
        )
        return CallOutcome(call_id=CALL_ID, terminal="completed", envelope=sealed)


def forget_kept_keys(ann: tuple[Home, Config, LocalKeys], address: str) -> None:
    db = StateDb.open(ann[0])
    try:
        db.peer_keys(ORIGIN).forget(address)
    finally:
        db.close()


@pytest.fixture
def ann(tmp_path: Path) -> tuple[Home, Config, LocalKeys]:
    return install(tmp_path / "ann")


@pytest.fixture
def bob() -> Party:
    return make_party(BOB, origin=ORIGIN)


def call(
    ann: tuple[Home, Config, LocalKeys],
    directory: FakeDirectory,
    callee: Callee | None,
    message: str = "why is the build red?",
    *,
    task: str | None = None,
    target: str = BOB,
    timeout_s: float = limits.CLIENT_CALL_TIMEOUT_S,
    context_id: str | None = None,
) -> tuple[CallResult, list[CallStatus]]:
    home, config, keys = ann
    seen: list[CallStatus] = []

    def refuse_dial(
        *_args: Any, **_kw: Any
    ) -> defer.Deferred[CallOutcome | CallError | CallQueued]:
        raise AssertionError("nothing may be dialled")

    async def work(reactor: Any) -> CallResult:
        return await place(
            reactor,
            home,
            config,
            keys,
            target,
            message,
            task,
            seen.append,
            timeout_s=timeout_s,
            api=directory,
            dial=callee.dial if callee is not None else refuse_dial,
            context_id=context_id,
        )

    return run_with_clock(work), seen


def test_a_reply_comes_back_opened_and_verified(ann: Any, bob: Party) -> None:
    """Bob opens exactly what Ann sent, and Ann gets Bob's text with the call id."""
    callee = Callee(bob, ann[2], lambda req: Reply(text=f"echo: {req.message}", task=req.task))
    result, seen = call(ann, FakeDirectory({"bob": served(bob)}), callee, task="review")
    assert result.ok
    assert result.text == "echo: why is the build red?"
    assert result.call_id == CALL_ID
    assert [s.state for s in seen] == [CallState.RINGING, CallState.ANSWERED, CallState.WORKING]
    (request,) = callee.requests
    assert (request.message, request.task, request.to) == ("why is the build red?", "review", BOB)
    assert callee.dials[0]["handle"] == "bob"


def test_a_sealed_failure_carries_code_detail_and_offered_tasks(ann: Any, bob: Party) -> None:
    """A peer's failure is reported with what it says, not as a transport error."""
    failure = CallFailure(code="task_not_offered", detail="ask for review", offered=("review",))
    callee = Callee(bob, ann[2], lambda _req: failure)
    result, _seen = call(ann, FakeDirectory({"bob": served(bob)}), callee)
    assert not result.ok
    assert (result.code, result.detail, result.offered) == (
        CallErrorCode.TASK_NOT_OFFERED,
        "ask for review",
        ("review",),
    )


def test_a_relay_error_frame_becomes_its_code(ann: Any, bob: Party) -> None:
    """call_error from the relay (offline) ends the call with that code and call id."""
    callee = Callee(bob, ann[2], lambda _r: CallError(code="offline", call_id=CALL_ID), ())
    result, seen = call(ann, FakeDirectory({"bob": served(bob)}), callee)
    assert (result.code, result.call_id, seen) == (CallErrorCode.OFFLINE, CALL_ID, [])


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (ApiError(404, ApiErrorCode.NOT_FOUND, "no keys"), CallErrorCode.UNKNOWN_HANDLE),
        (ApiError(401, ApiErrorCode.UNAUTHORIZED, "bad token"), CallErrorCode.UNAUTHORIZED),
        (RelayUnreachable("relay.example refused the connection"), CallErrorCode.CONNECTION_FAILED),
    ],
)
def test_key_fetch_failures_map_to_codes(ann: Any, failure: Exception, code: str) -> None:
    """Without the callee's keys nothing is dialled, and the reason keeps its meaning."""
    directory = FakeDirectory()
    directory.fail_get = failure
    result, _seen = call(ann, directory, None)
    assert result.code == code


def test_transport_failures_are_connection_failed(ann: Any, bob: Party) -> None:
    """A relay that cannot be dialled is connection_failed, with its reason as detail."""
    callee = Callee(bob, ann[2], lambda _r: RelayUnreachable("cannot resolve relay.example"))
    result, _seen = call(ann, FakeDirectory({"bob": served(bob)}), callee)
    assert result.code is CallErrorCode.CONNECTION_FAILED
    assert result.detail == "cannot resolve relay.example"


def test_giving_up_at_the_timeout_is_a_timeout(ann: Any, bob: Party) -> None:
    """When our own deadline ends the socket, the call timed out rather than broke."""
    aborted = defer.Deferred[CallOutcome | CallError | CallQueued]()

    class SlowCallee(Callee):
        def dial(self, reactor: Any, *args: Any, **kw: Any) -> Any:
            reactor.callLater(kw["timeout_s"], aborted.errback, CallAborted("no outcome"))
            return aborted

    callee = SlowCallee(bob, ann[2], lambda _r: None)
    result, _seen = call(ann, FakeDirectory({"bob": served(bob)}), callee, timeout_s=5)
    assert result.code is CallErrorCode.TIMEOUT


def test_a_changed_identity_is_refused_before_dialling(ann: Any, bob: Party) -> None:
    """After a first call pins Bob, a new identity key for him stops the call with the fix."""
    callee = Callee(bob, ann[2], lambda _r: Reply(text="hi"))
    call(ann, FakeDirectory({"bob": served(bob)}), callee)
    forget_kept_keys(ann, BOB)  # so the second call fetches what the relay serves now
    impostor = make_party(BOB, origin=ORIGIN)
    with pytest.raises(CallRefused) as refused:
        call(ann, FakeDirectory({"bob": served(impostor)}), None)
    assert refused.value.code == "identity_changed"
    assert "agentcall trust --reset @acme/bob" in str(refused.value)


def test_an_expired_key_says_the_callee_has_been_offline_too_long(ann: Any) -> None:
    """A callee whose listener has not run for weeks: not "keys rejected", but when the key
    expired, why, and what the callee should do; nothing is dialled."""
    expired_at = int(NOW) - 3 * DAY
    away = make_party(BOB, origin=ORIGIN, not_before=expired_at - 30 * DAY, not_after=expired_at)
    with pytest.raises(CallRefused) as refused:
        call(ann, FakeDirectory({"bob": served(away)}), None)
    assert refused.value.code == "keys_expired"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(expired_at))
    assert str(refused.value) == (
        f"@acme/bob's published encryption key expired on {when}: bob's listener has been "
        "offline too long to accept calls (keys last at most 30 days and are renewed while it "
        "runs); bob should start it (`agentcall listen`, or the installed service), which "
        "publishes a fresh key"
    )


def test_a_key_not_valid_yet_is_still_rejected(ann: Any) -> None:
    """Only expiry gets the offline wording; a record from the future is a rejected key."""
    early = make_party(BOB, origin=ORIGIN, not_before=int(NOW) + DAY, not_after=int(NOW) + 2 * DAY)
    with pytest.raises(CallRefused) as refused:
        call(ann, FakeDirectory({"bob": served(early)}), None)
    assert refused.value.code == "keys_rejected"


def test_an_answer_signed_by_another_key_is_not_believed(ann: Any, bob: Party) -> None:
    """An outcome signed by someone other than the pinned callee is a protocol error."""
    forger = attrs.evolve(bob, identity_key=make_party(BOB, origin=ORIGIN).identity_key)
    callee = Callee(bob, ann[2], lambda _r: Reply(text="trust me"))
    callee_forged = Callee(forger, ann[2], lambda _r: Reply(text="trust me"))
    callee.answer = lambda req: callee_forged.outcome(req, Reply(text="trust me"))
    result, _seen = call(ann, FakeDirectory({"bob": served(bob)}), callee)
    assert result.code is CallErrorCode.PROTOCOL_ERROR
    assert result.text is None
    assert "could not be verified" in (result.detail or "")


def test_an_answer_sealed_to_an_unknown_key_is_a_protocol_error(ann: Any, bob: Party) -> None:
    """Only our own retained epochs can open an answer; another key id is refused."""
    callee = Callee(bob, ann[2], lambda _r: Reply(text="hi"))

    def elsewhere(req: RequestPayload) -> CallOutcome:
        outcome = callee.outcome(req, Reply(text="hi"))
        moved: SealedEnvelope = attrs.evolve(outcome.envelope, key_id="0" * 31 + "1")
        return attrs.evolve(outcome, envelope=moved)

    callee.answer = elsewhere
    result, _seen = call(ann, FakeDirectory({"bob": served(bob)}), callee)
    assert result.code is CallErrorCode.PROTOCOL_ERROR


def test_a_target_without_an_encryption_key_is_unknown(ann: Any, bob: Party) -> None:
    """An enrolled but unfinished callee cannot be sealed to; nothing is dialled."""
    directory = FakeDirectory({"bob": KeysResponse(identity=bob.identity)})
    result, _seen = call(ann, directory, None)
    assert result.code is CallErrorCode.UNKNOWN_HANDLE


def test_message_size_is_checked_before_any_network(ann: Any, bob: Party) -> None:
    """One byte over the limit fails locally; exactly the limit goes through."""
    directory = FakeDirectory()
    directory.fail_get = AssertionError("no key fetch for an oversize message")
    too_big, _seen = call(ann, directory, None, "é" * (limits.MAX_MESSAGE_BYTES // 2) + "x")
    assert too_big.code is CallErrorCode.MESSAGE_TOO_LARGE
    callee = Callee(bob, ann[2], lambda req: Reply(text=str(len(req.message))))
    exact, _seen = call(ann, FakeDirectory({"bob": served(bob)}), callee, "x" * 64_000)
    assert exact.text == "64000"


@pytest.mark.parametrize(
    ("target", "message", "task"),
    [("@other/bob", "hi", None), (BOB, "", None), (BOB, "hi", "Not A Task")],
)
def test_bad_requests_are_refused_locally(ann: Any, target: str, message: str, task: Any) -> None:
    """Other organisations, empty messages and bad task ids never reach the relay."""
    with pytest.raises(CallRefused) as refused:
        call(ann, FakeDirectory(), None, message, task=task, target=target)
    assert refused.value.code == "bad_request"


def test_calling_yourself_checks_the_served_key_against_your_own(ann: Any) -> None:
    """The relay cannot substitute another key for your own address."""
    someone = make_party("@acme/ann", origin=ORIGIN)
    with pytest.raises(CallRefused) as refused:
        call(ann, FakeDirectory({"ann": served(someone)}), None, target="@acme/ann")
    assert refused.value.code == "identity_changed"


def test_a_due_rotation_is_minted_and_published_before_calling(tmp_path: Path, bob: Party) -> None:
    """Keys made 25 days ago get epoch 2, published to the relay, before the call goes out."""
    old = install(tmp_path / "old", now=NOW - 25 * DAY)
    directory = FakeDirectory({"bob": served(bob)})
    directory.served["ann"] = KeysResponse(
        identity=old[2].identity_record, encryption=old[2].current_record
    )
    callee = Callee(bob, old[2], lambda _r: CallError(code="busy"), ())
    result, _seen = call(old, directory, callee)
    assert result.code is CallErrorCode.BUSY
    assert [r.record.epoch for r in directory.published] == [2]  # type: ignore[attr-defined]
    assert load_keys(old[0]).current_record.record.epoch == 2


def run_publish(directory: FakeDirectory, keys: LocalKeys) -> list[str]:
    async def work(_reactor: Any) -> list[str]:
        return await ensure_published(directory, keys, NOW)

    return run_with_clock(work)


def test_publishing_is_idempotent(ann: Any) -> None:
    """First identity then encryption; a second run sends nothing."""
    directory = FakeDirectory()
    assert run_publish(directory, ann[2]) == ["identity key", "encryption key epoch 1"]
    assert run_publish(directory, ann[2]) == []
    assert len(directory.published) == 2


def test_publishing_never_replaces_another_identity(ann: Any) -> None:
    """If the relay holds someone else's identity for us, publishing stops with an error."""
    other = make_party("@acme/ann", origin=ORIGIN)
    directory = FakeDirectory({"ann": served(other)})
    with pytest.raises(KeysConflict):
        run_publish(directory, ann[2])
    assert directory.published == []


CTX = "ctx_" + "c" * 22


def test_a_follow_up_carries_its_conversation_id_sealed(ann: Any, bob: Party) -> None:
    """The conversation id and task travel inside the signed request; the reply's id comes back."""
    callee = Callee(
        bob, ann[2], lambda req: Reply(text="more", context_id=req.context_id, task=req.task)
    )
    result, _seen = call(
        ann, FakeDirectory({"bob": served(bob)}), callee, task="review", context_id=CTX
    )
    (request,) = callee.requests
    assert (request.context_id, request.task) == (CTX, "review")
    assert result.reply == Reply(text="more", context_id=CTX, task="review")


def test_a_fresh_call_carries_no_conversation_id(ann: Any, bob: Party) -> None:
    """Without --continue nothing links the call to an earlier one."""
    callee = Callee(bob, ann[2], lambda _req: Reply(text="hi", context_id=CTX))
    result, _seen = call(ann, FakeDirectory({"bob": served(bob)}), callee)
    assert callee.requests[0].context_id is None
    assert result.reply is not None and result.reply.context_id == CTX


@pytest.mark.parametrize("bad", ["ctx_short", "ctx_" + "c" * 21 + "/", " " + CTX])
def test_a_malformed_conversation_id_is_refused_locally(ann: Any, bad: str) -> None:
    """A conversation id that is not ctx_ + 22 characters never reaches the relay."""
    with pytest.raises(CallRefused) as refused:
        call(ann, FakeDirectory(), None, context_id=bad)
    assert refused.value.code == "bad_request"
    assert "conversation id" in str(refused.value)
