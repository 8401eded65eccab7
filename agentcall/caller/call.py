"""The caller's side of one call: fetch and pin the callee's keys, seal, dial, open the answer.

:func:`place` is what ``agentcall call`` and the self-check of ``agentcall setup`` run; tests and
benchmarks reuse it with a fake key directory and a fake dialler. Every way a call can end is a
:class:`CallResult` (a reply, or a failure code with an optional detail); only local refusals —
a changed identity, keys that do not verify, an unusable installation — raise
:class:`CallRefused`, because they are not answers from anyone and need the user to act.

Trust comes only from the pins and the signatures: the relay supplies the callee's records and
carries the sealed request and answer, but an answer counts only once it opens with our key and
verifies against the callee's pinned identity and the hash of the request we sent.

A call may be queued (the offline mailbox, issue 9): unless ``queue=False``, the request is
sealed to stay valid as long as a job may live, and a callee who opted in and is offline or
busy gets it later. The relay then answers ``call_queued``; the request and the pin are kept in
state.sqlite (:mod:`agentcall.caller.jobstore`) so :mod:`agentcall.caller.jobs` can open the
answer with :func:`open_answer`, exactly as a live call's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs
from twisted.internet import defer

from agentcall import ids, limits
from agentcall.caller.jobstore import SentJob
from agentcall.client.api import Credentials, RelayApi, RelayUnreachable
from agentcall.client.ws import CallAborted, SocketRefused, place_call
from agentcall.crypto import envelope
from agentcall.crypto.pins import Pin, PinBook
from agentcall.errors import (
    AgentCallError,
    ApiError,
    ApiErrorCode,
    CallErrorCode,
    CryptoError,
    IdentityChanged,
    KeyRecordExpired,
)
from agentcall.local.config import Config
from agentcall.local.home import Home, LocalStateError
from agentcall.local.keystore import LocalKeys, rotate_if_needed
from agentcall.local.statedb import StateDb
from agentcall.wire.frames import (
    CallError,
    CallOutcome,
    CallQueued,
    CallRequest,
    CallStatus,
    SealedEnvelope,
)
from agentcall.wire.http import KeysResponse, SignedEncryptionKeyRecord, SignedIdentityRecord
from agentcall.wire.payloads import CallFailure, Reply, RequestPayload


class KeyDirectory(Protocol):
    """The relay routes the caller needs; :class:`~agentcall.client.api.RelayApi` is one."""

    def get_keys(self, handle: str) -> defer.Deferred[KeysResponse]: ...

    def put_identity_key(self, record: SignedIdentityRecord) -> defer.Deferred[KeysResponse]: ...

    def put_encryption_key(
        self, record: SignedEncryptionKeyRecord
    ) -> defer.Deferred[KeysResponse]: ...


# Same shape as agentcall.client.ws.place_call, which is the default.
Dial = Callable[..., "defer.Deferred[CallOutcome | CallError | CallQueued]"]
StatusHandler = Callable[[CallStatus], None]


class CallRefused(AgentCallError):
    """The call was not placed, or its answer not believed, for a reason the user must fix.

    ``code`` names the reason for ``--json`` output: ``identity_changed``, ``keys_rejected``,
    ``keys_expired`` (the callee has been offline too long), ``bad_request`` or ``local_error``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class KeysConflict(AgentCallError):
    """The relay holds an identity key for us that is not ours: publishing cannot fix that."""


@attrs.frozen
class QueuedJob:
    """The relay kept the call as a mailbox job; its answer is fetched later by ``job_id``."""

    job_id: str
    expires_at: int


@attrs.frozen
class CallResult:
    """How a call ended: ``reply`` on success, ``job`` when it was queued, else ``code`` (and
    perhaps detail and tasks)."""

    address: str
    call_id: str | None
    elapsed_s: float
    reply: Reply | None = None
    code: CallErrorCode | None = None
    detail: str | None = None
    offered: tuple[str, ...] = ()
    job: QueuedJob | None = None

    @property
    def ok(self) -> bool:
        return self.reply is not None

    @property
    def queued(self) -> bool:
        return self.job is not None

    @property
    def text(self) -> str | None:
        return None if self.reply is None else self.reply.text


async def ensure_published(api: KeyDirectory, keys: LocalKeys, now: float) -> list[str]:
    """Publish whatever of our key records the relay does not have yet; what was published.

    Safe to repeat: an identity record already there is left alone, and only encryption epochs
    above the relay's highest are sent, oldest first, so the relay can check their chain.
    """
    handle = ids.parse_address(keys.address).handle
    try:
        served: KeysResponse | None = await api.get_keys(handle)
    except ApiError as exc:
        if exc.code is not ApiErrorCode.NOT_FOUND:
            raise
        served = None
    done: list[str] = []
    if served is None:
        await api.put_identity_key(keys.identity_record)
        done.append("identity key")
    elif served.identity.record != keys.identity_record.record:
        raise KeysConflict(
            f"the relay already holds a different identity key for {keys.address}; "
            "this installation cannot replace it (ask an admin to reset the enrolment)"
        )
    highest = 0 if served is None or served.encryption is None else served.encryption.record.epoch
    for entry in keys.epochs:
        # An epoch whose window has ended would be refused, and is useless to callers anyway.
        if entry.epoch > highest and entry.record.record.not_after > now:
            await api.put_encryption_key(entry.record)
            done.append(f"encryption key epoch {entry.epoch}")
    return done


@contextlib.contextmanager
def _pin_book(home: Home) -> Iterator[PinBook]:
    try:
        db = StateDb.open(home)
    except AgentCallError as exc:
        raise CallRefused("local_error", f"cannot open the pin store: {exc}") from None
    try:
        yield PinBook(db.pins)
    finally:
        db.close()


def _api_failure(exc: ApiError) -> tuple[CallErrorCode, str]:
    codes = {
        ApiErrorCode.NOT_FOUND: CallErrorCode.UNKNOWN_HANDLE,
        ApiErrorCode.UNAUTHORIZED: CallErrorCode.UNAUTHORIZED,
        ApiErrorCode.RATE_LIMITED: CallErrorCode.RATE_LIMITED,
    }
    return codes.get(exc.code, CallErrorCode.PROTOCOL_ERROR), exc.message


def _check_request(
    config: Config, keys: LocalKeys, address: str, task: str | None, context_id: str | None
) -> str:
    """The target's handle, after the checks that need no network; raises CallRefused."""
    try:
        target = ids.parse_address(address)
    except ids.AddressError:
        raise CallRefused(
            "bad_request", f"{address!r} is not an address like @org/handle"
        ) from None
    if target.org != config.org:
        raise CallRefused(
            "bad_request",
            f"{address} is outside your organisation ({config.org}); calls never "
            "cross organisations",
        )
    if task is not None and not ids.is_task_id(task):
        raise CallRefused("bad_request", f"{task!r} is not a valid task id")
    if context_id is not None and ids.CONTEXT_ID_RE.match(context_id) is None:
        raise CallRefused("bad_request", f"{context_id!r} is not a valid conversation id")
    if (keys.address, keys.relay_origin) != (config.address, config.relay_origin):
        raise CallRefused(
            "local_error",
            f"keys.json belongs to {keys.address} at {keys.relay_origin}, but config.json to "
            f"{config.address} at {config.relay_origin}",
        )
    return target.handle


async def _fresh_keys(
    home: Home, api: KeyDirectory, keys: LocalKeys, now: float, note: Callable[[str], None]
) -> LocalKeys:
    """Our keys with the next encryption epoch minted (and published) when one is due."""
    try:
        rotated = rotate_if_needed(home, keys, now)
    except LocalStateError as exc:
        raise CallRefused("local_error", str(exc)) from None
    if rotated is None:
        return keys
    try:
        await ensure_published(api, rotated, now)
    except (ApiError, RelayUnreachable, KeysConflict) as exc:
        # The call can still go ahead: the epoch the relay has is valid for days yet.
        note(f"could not publish your new encryption key ({exc}); run `agentcall setup --resume`")
    return rotated


def expired_key_message(address: str, not_after: int) -> str:
    """What a caller is told when the callee's published encryption key has expired.

    Expiry is not an attack: the callee's own AgentCall renews the key while it runs (the
    listener, or any call it places), so an expired key means nothing of theirs has run for
    weeks. The message says so, and what the callee can do about it.
    """
    handle = ids.parse_address(address).handle
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(not_after))
    return (
        f"{address}'s published encryption key expired on {when}: {handle}'s listener has "
        f"been offline too long to accept calls (keys last at most "
        f"{limits.MAX_KEY_VALIDITY_S // 86400} days and are renewed while it runs); "
        f"{handle} should start it (`agentcall listen`, or the installed service), which "
        "publishes a fresh key"
    )


def _pin(
    pins: PinBook,
    config: Config,
    keys: LocalKeys,
    address: str,
    identity: SignedIdentityRecord,
    encryption: SignedEncryptionKeyRecord,
    now: float,
) -> Pin:
    if address == config.address and identity.record.identity_pub != keys.identity.public_b64:
        raise CallRefused(
            "identity_changed",
            f"the relay serves an identity key for your own address {address} that is not "
            "this installation's; someone else may have enrolled with your handle",
        )
    try:
        return pins.check_and_pin(
            address, identity, encryption, now, relay_origin=config.relay_origin
        )
    except IdentityChanged as exc:
        raise CallRefused("identity_changed", str(exc)) from None
    except KeyRecordExpired as exc:
        raise CallRefused("keys_expired", expired_key_message(address, exc.not_after)) from None
    except CryptoError as exc:
        raise CallRefused(
            "keys_rejected", f"the keys the relay served for {address} were rejected: {exc}"
        ) from None


async def place(
    reactor: Any,
    home: Home,
    config: Config,
    keys: LocalKeys,
    target_address: str,
    message: str,
    task: str | None,
    on_status: StatusHandler,
    *,
    timeout_s: float = limits.CLIENT_CALL_TIMEOUT_S,
    api: KeyDirectory | None = None,
    dial: Dial | None = None,
    on_note: Callable[[str], None] | None = None,
    context_id: str | None = None,
    queue: bool = True,
) -> CallResult:
    """Call ``target_address`` with ``message`` and wait for how the call ends.

    ``on_status`` sees each ``call_status`` frame (ringing, answered, working) as it arrives;
    ``on_note`` gets warnings that do not stop the call. ``context_id`` continues a
    conversation an earlier answer opened (the reply then says whether it still is).
    ``queue`` lets the relay keep the call as a job when the callee is offline or busy and has
    opted in; the result then carries ``job`` (stored locally before it is returned). Run it
    with ``Deferred.fromCoroutine(place(...))`` where a Deferred is wanted.
    """
    start = reactor.seconds()
    handle = _check_request(config, keys, target_address, task, context_id)

    def failed(code: CallErrorCode, detail: str | None, call_id: str | None = None) -> CallResult:
        elapsed = reactor.seconds() - start
        return CallResult(target_address, call_id, elapsed, code=code, detail=detail)

    try:
        size = len(message.encode("utf-8"))
    except UnicodeEncodeError:
        raise CallRefused("bad_request", "the message is not valid UTF-8 text") from None
    if size == 0:
        raise CallRefused("bad_request", "the message is empty")
    if size > limits.MAX_MESSAGE_BYTES:
        return failed(
            CallErrorCode.MESSAGE_TOO_LARGE,
            f"{size} bytes; the limit is {limits.MAX_MESSAGE_BYTES}",
        )
    credentials = Credentials(config.org, config.handle, config.token)
    if api is None:
        try:
            api = RelayApi(reactor, config.relay, credentials, config.ca_file)
        except AgentCallError as exc:
            raise CallRefused("local_error", str(exc)) from None
    keys = await _fresh_keys(home, api, keys, reactor.seconds(), on_note or (lambda _text: None))

    try:
        served = await api.get_keys(handle)
    except ApiError as exc:
        return failed(*_api_failure(exc))
    except RelayUnreachable as exc:
        return failed(CallErrorCode.CONNECTION_FAILED, str(exc))
    if served.encryption is None:
        return failed(
            CallErrorCode.UNKNOWN_HANDLE,
            f"{target_address} has not published an encryption key (setup not finished?)",
        )
    now = reactor.seconds()
    with _pin_book(home) as pins:
        pin = _pin(pins, config, keys, target_address, served.identity, served.encryption, now)
    try:
        sealed, request = envelope.seal_request(
            sender=keys.identity,
            sender_address=config.address,
            recipient_identity=served.identity.record,
            recipient_encryption=served.encryption.record,
            relay_origin=config.relay_origin,
            message=message,
            task=task,
            context_id=context_id,
            now=now,
            # A queued request is opened when the callee comes back, up to days later.
            validity_s=limits.MAX_ENVELOPE_VALIDITY_S if queue else limits.CALL_DEADLINE_S,
        )
    except (ValueError, CryptoError) as exc:
        raise CallRefused("keys_rejected", f"cannot seal to {target_address}: {exc}") from None

    seen_call_id: list[str] = []

    def status(frame: CallStatus) -> None:
        if not seen_call_id:
            seen_call_id.append(frame.call_id)
        on_status(frame)

    frame = CallRequest(envelope=sealed, correlation_id=ids.mint_correlation_id(), queue=queue)
    try:
        terminal = await (dial or place_call)(
            reactor,
            config.relay,
            credentials,
            handle,
            frame,
            ca_file=config.ca_file,
            on_status=status,
            timeout_s=timeout_s,
        )
    except CallAborted as exc:
        call_id = seen_call_id[0] if seen_call_id else None
        if reactor.seconds() - start >= timeout_s:
            return failed(CallErrorCode.TIMEOUT, f"no answer within {timeout_s:g} s", call_id)
        return failed(CallErrorCode.CONNECTION_FAILED, str(exc), call_id)
    except (RelayUnreachable, SocketRefused) as exc:
        return failed(CallErrorCode.CONNECTION_FAILED, str(exc))
    except AgentCallError as exc:
        # Local TLS trouble (an unreadable CA file) surfaces only when dialling.
        return failed(CallErrorCode.CONNECTION_FAILED, str(exc))
    if isinstance(terminal, CallError):
        return failed(terminal.code, terminal.detail, terminal.call_id)
    if isinstance(terminal, CallQueued):
        if not queue and on_note is not None:
            # Sealed for minutes only, it will likely be refused when delivered; say so.
            on_note("the relay queued the call although it was asked not to")
        job = QueuedJob(terminal.job_id, terminal.expires_at)
        sent = SentJob(
            job_id=job.job_id,
            address=target_address,
            request=request,
            identity_pub=pin.identity_pub,
            created_at=reactor.seconds(),
            expires_at=float(job.expires_at),
        )
        _remember_job(home, config.relay_origin, sent, reactor.seconds(), on_note)
        elapsed = reactor.seconds() - start
        return CallResult(target_address, None, elapsed, job=job)
    now = reactor.seconds()
    return open_answer(
        now,
        now - start,
        target_address,
        keys,
        request,
        pin.identity_pub,
        terminal.envelope,
        terminal.call_id,
    )


def _remember_job(
    home: Home,
    relay_origin: str,
    sent: SentJob,
    now: float,
    on_note: Callable[[str], None] | None,
) -> None:
    """Keep what opening the job's answer needs; a failure is reported, never hidden."""
    try:
        db = StateDb.open(home)
        try:
            db.sent_jobs(relay_origin).remember(sent, now)
        finally:
            db.close()
    except AgentCallError as exc:
        # The job is queued at the relay whatever happens here, so the call still succeeded;
        # but its answer will not open on this machine, and the person must know that now.
        if on_note is not None:
            on_note(
                f"could not record job {sent.job_id} in the state database ({exc}); its answer "
                f"cannot be opened here: cancel it with `agentcall jobs cancel {sent.address} "
                f"{sent.job_id}` and call again"
            )


def open_answer(
    now: float,
    elapsed: float,
    address: str,
    keys: LocalKeys,
    request: RequestPayload,
    identity_pub: str,
    sealed: SealedEnvelope,
    call_id: str | None,
) -> CallResult:
    """The result a sealed answer carries, believed only if it opens with one of our keys and
    verifies against the callee's pinned ``identity_pub`` and the hash of ``request``.

    A live call's outcome and a mailbox job's answer are both opened here.
    """
    epoch = next((entry for entry in keys.epochs if entry.key_id == sealed.key_id), None)
    if epoch is None:
        return CallResult(
            address,
            call_id,
            elapsed,
            code=CallErrorCode.PROTOCOL_ERROR,
            detail="the answer is sealed to a key this installation does not hold",
        )
    try:
        payload = envelope.open_response(
            sealed,
            my_key=epoch.key,
            my_record=epoch.record.record,
            request=request,
            responder_identity_pub=identity_pub,
            now=now,
        )
    except CryptoError as exc:
        return CallResult(
            address,
            call_id,
            elapsed,
            code=CallErrorCode.PROTOCOL_ERROR,
            detail=f"the answer could not be verified: {exc}",
        )
    outcome = payload.outcome
    if isinstance(outcome, CallFailure):
        return CallResult(
            address,
            call_id,
            elapsed,
            code=outcome.code,
            detail=outcome.detail,
            offered=outcome.offered,
        )
    return CallResult(address, call_id, elapsed, reply=outcome)
