"""The caller's side of one call: the callee's keys (kept or fetched) pinned, seal, dial, open
the answer.

:func:`place` is what ``agentcall call`` and the self-check of ``agentcall setup`` run; tests and
benchmarks reuse it with a fake key directory and a fake dialler. Every way a call can end is a
:class:`CallResult` (a reply, or a failure code with an optional detail); only local refusals —
a changed identity, keys that do not verify, an unusable installation — raise
:class:`CallRefused`, because they are not answers from anyone and need the user to act.

Trust comes only from the pins and the signatures: the relay supplies the callee's records and
carries the sealed request and answer, but an answer counts only once it opens with our key and
verifies against the callee's pinned identity and the hash of the request we sent.

The callee's records are fetched on the first call and kept in state.sqlite
(:mod:`agentcall.caller.keycache`); later calls reuse them, checked against the pin each time,
until the callee may be rotating, and then fetch at most hourly. If the callee's listener
refuses a request sealed with kept records (``call_error protocol_error`` with a call id: it
could not open it, perhaps because that epoch is gone), the records are fetched again and,
when they changed, the call is sealed anew and sent once more.

A call may be queued (the offline mailbox, issue 9): unless ``queue=False``, the request is
sealed to stay valid as long as a job may live, and a callee who opted in and is offline or
busy gets it later. The relay then answers ``call_queued``; the request and the pin are kept in
state.sqlite (:mod:`agentcall.caller.jobstore`) so :mod:`agentcall.caller.jobs` can open the
answer with :func:`open_answer`, exactly as a live call's.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
from twisted.internet import defer
from twisted.internet.task import deferLater

from agentcall import ids, limits
from agentcall.caller import keycache
from agentcall.caller.jobstore import SentJob
from agentcall.client.common import Credentials, RelayUnreachable
from agentcall.client.ws import CallAborted, RelayBusy, SocketRefused, place_call
from agentcall.crypto import envelope
from agentcall.crypto.pins import Pin, PinBook, PinState
from agentcall.errors import (
    AgentCallError,
    ApiError,
    ApiErrorCode,
    CallErrorCode,
    CryptoError,
    IdentityChanged,
    KeyRecordExpired,
    StoreError,
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
    CallState,
    CallStatus,
    SealedEnvelope,
)
from agentcall.wire.keyrecords import (
    KeysResponse,
    RecoveryLink,
    SignedEncryptionKeyRecord,
    SignedIdentityRecord,
)
from agentcall.wire.payloads import CallFailure, Reply, RequestPayload

if TYPE_CHECKING:
    from agentcall.client.api import RelayApi
    from agentcall.client.tls import RelayTlsPolicy


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


# A relay that turns the upgrade away busy (503 with a Retry-After, during a reconnect storm)
# is dialled again after the wait it names: at most this many times, and only for waits up to
# the longest it sends (UPGRADE_RETRY_MAX_S); a longer one ends the call at once, saying so.
BUSY_RETRIES = 2
BUSY_WAIT_MAX_S = float(limits.UPGRADE_RETRY_MAX_S)


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
    elif served.identity.record.identity_pub != keys.identity_record.record.identity_pub:
        raise KeysConflict(
            f"the relay already holds a different identity key for {keys.address}; "
            "this installation cannot replace it (ask an admin to reset the enrolment)"
        )
    elif (keys.identity_record.record.recovery_issued_at or 0) > (
        served.identity.record.recovery_issued_at or 0
    ):
        # Re-signed here to name a newer recovery key, and not yet taken by the relay.
        await api.put_identity_key(keys.identity_record)
        done.append("recovery key")
    highest = 0 if served is None or served.encryption is None else served.encryption.record.epoch
    for entry in keys.epochs:
        # An epoch whose window has ended would be refused, and is useless to callers anyway.
        if entry.epoch > highest and entry.record.record.not_after > now:
            await api.put_encryption_key(entry.record)
            done.append(f"encryption key epoch {entry.epoch}")
    return done


def _tls_policy(config: Config) -> RelayTlsPolicy | None:
    """The TLS trust for an https relay (the CA file read now), None for plain http."""
    if not config.relay.secure:
        return None
    from agentcall.client.tls import RelayTlsPolicy

    return RelayTlsPolicy(config.ca_file)


class _ApiOnDemand:
    """The relay's HTTP API, made on first use. A call sealed with kept keys asks the relay
    nothing over HTTP, so it never loads Twisted's web client (tens of milliseconds of a
    short-lived CLI's start)."""

    def __init__(
        self,
        reactor: Any,
        config: Config,
        credentials: Credentials,
        tls: RelayTlsPolicy | None,
    ) -> None:
        self._reactor = reactor
        self._config = config
        self._credentials = credentials
        self._tls = tls
        self._api: RelayApi | None = None

    def _made(self) -> RelayApi:
        if self._api is None:
            from agentcall.client.api import RelayApi

            self._api = RelayApi(
                self._reactor, self._config.relay, self._credentials, tls_policy=self._tls
            )
        return self._api

    def get_keys(self, handle: str) -> defer.Deferred[KeysResponse]:
        return self._made().get_keys(handle)

    def put_identity_key(self, record: SignedIdentityRecord) -> defer.Deferred[KeysResponse]:
        return self._made().put_identity_key(record)

    def put_encryption_key(self, record: SignedEncryptionKeyRecord) -> defer.Deferred[KeysResponse]:
        return self._made().put_encryption_key(record)


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
    *,
    recovered: Sequence[RecoveryLink] = (),
    on_note: Callable[[str], None] | None = None,
) -> Pin:
    if address == config.address and identity.record.identity_pub != keys.identity.public_b64:
        raise CallRefused(
            "identity_changed",
            f"the relay serves an identity key for your own address {address} that is not "
            "this installation's; someone else may have enrolled with your handle",
        )
    try:
        return pins.check_and_pin(
            address,
            identity,
            encryption,
            now,
            relay_origin=config.relay_origin,
            recovered=recovered,
            on_recovered=None if on_note is None else _tell_recovered(on_note),
        )
    except IdentityChanged as exc:
        raise CallRefused("identity_changed", str(exc)) from None
    except KeyRecordExpired as exc:
        raise CallRefused("keys_expired", expired_key_message(address, exc.not_after)) from None
    except CryptoError as exc:
        raise CallRefused(
            "keys_rejected", f"the keys the relay served for {address} were rejected: {exc}"
        ) from None


def _tell_recovered(on_note: Callable[[str], None]) -> Callable[[str, int], None]:
    def told(address: str, at: int) -> None:
        when = time.strftime("%Y-%m-%d", time.gmtime(at))
        on_note(
            f"{address} recovered their identity on {when}: their new key is vouched for by "
            "the recovery key their old one published, so it is now the one pinned"
        )

    return told


class _Unfetched(Exception):
    """The callee's records could not be had: how the call ends."""

    def __init__(self, code: CallErrorCode, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@attrs.frozen
class _Believed:
    """The callee's records this call seals to, checked against the pin just now."""

    keys: KeysResponse
    encryption: SignedEncryptionKeyRecord
    pin: Pin
    kept: bool  # the records kept from an earlier call (no fetch was made)


async def _callee_keys(
    reactor: Any,
    home: Home,
    api: KeyDirectory,
    config: Config,
    keys: LocalKeys,
    address: str,
    handle: str,
    *,
    kept: bool = True,
    on_note: Callable[[str], None] | None = None,
) -> _Believed:
    """The callee's records, believed: the kept ones when :func:`keycache.decide` allows
    (``kept``) and they still match the pin, else fetched, pinned and kept for next time.

    Raises :class:`CallRefused` for records that must not be believed (a changed identity
    above all, kept or fetched) and :class:`_Unfetched` when the relay does not serve them.
    """
    try:
        db = StateDb.open(home)
    except AgentCallError as exc:
        raise CallRefused("local_error", f"cannot open the pin store: {exc}") from None
    try:
        pins = PinBook(db.pins)
        store = db.peer_keys(config.relay_origin)
        if kept:
            found = _kept(store, address)
            decision = keycache.decide(found, reactor.seconds())
            # Kept records are reused only under a pin that exists: with none (first contact,
            # or the owner ran `agentcall trust --reset`) the relay's current ones are pinned.
            if isinstance(decision, keycache.Reuse) and _pinned(pins, config, decision.kept):
                records = decision.kept.keys
                encryption = records.encryption
                if encryption is not None:
                    try:
                        pin = _pin(
                            pins,
                            config,
                            keys,
                            address,
                            records.identity,
                            encryption,
                            reactor.seconds(),
                        )
                    except CallRefused as exc:
                        if exc.code == "identity_changed":
                            raise
                        # Outdated rather than hostile (an epoch above them pinned since, say):
                        # fetched afresh below, and believed only if those pass.
                    else:
                        return _Believed(records, encryption, pin, kept=True)
        served = await _fetch(api, handle, address)
        encryption = served.encryption
        if encryption is None:  # pragma: no cover - _fetch refuses records without one
            raise _Unfetched(CallErrorCode.UNKNOWN_HANDLE, "no encryption key")
        now = reactor.seconds()
        pin = _pin(
            pins,
            config,
            keys,
            address,
            served.identity,
            encryption,
            now,
            recovered=served.recovered,
            on_note=on_note,
        )
        with contextlib.suppress(StoreError):
            # Only believed records are kept; a failure here costs the next call a fetch.
            store.keep(address, served, now)
        return _Believed(served, encryption, pin, kept=False)
    finally:
        db.close()


def _pinned(pins: PinBook, config: Config, kept: keycache.KeptKeys) -> bool:
    identity = kept.keys.identity.record
    state = pins.peek_state(config.relay_origin, kept.address, identity.identity_pub)
    return state is not PinState.UNSEEN


def _kept(store: keycache.SqlitePeerKeys, address: str) -> keycache.KeptKeys | None:
    try:
        return store.get(address)
    except StoreError:
        return None


async def _fetch(api: KeyDirectory, handle: str, address: str) -> KeysResponse:
    try:
        served = await api.get_keys(handle)
    except ApiError as exc:
        raise _Unfetched(*_api_failure(exc)) from None
    except RelayUnreachable as exc:
        raise _Unfetched(CallErrorCode.CONNECTION_FAILED, str(exc)) from None
    if served.encryption is None:
        raise _Unfetched(
            CallErrorCode.UNKNOWN_HANDLE,
            f"{address} has not published an encryption key (setup not finished?)",
        )
    return served


def _refused_by_callee(terminal: object) -> bool:
    """The relay's report that the callee's listener refused the request (``call_rejected``:
    it did not open or verify there), as opposed to a refusal of the relay's own, which comes
    before a call id exists."""
    return (
        isinstance(terminal, CallError)
        and terminal.code is CallErrorCode.PROTOCOL_ERROR
        and terminal.call_id is not None
    )


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
    if dial is None or api is None:
        # The CA file is read once, here, for the socket and any HTTP fetch alike; a bad one
        # is the user's to fix before anything is sent.
        try:
            tls = _tls_policy(config)
        except AgentCallError as exc:
            raise CallRefused("local_error", str(exc)) from None
        if dial is None:
            dial = functools.partial(place_call, tls=tls)
        if api is None:
            api = _ApiOnDemand(reactor, config, credentials, tls)
    note = on_note or (lambda _text: None)
    keys = await _fresh_keys(home, api, keys, reactor.seconds(), note)

    try:
        believed = await _callee_keys(
            reactor, home, api, config, keys, target_address, handle, on_note=on_note
        )
    except _Unfetched as exc:
        return failed(exc.code, exc.detail)

    seen_call_id: list[str] = []
    # Whether the callee's listener took the current attempt (answered or working): a request
    # it took may have run, so it is never sent again.
    taken: list[bool] = [False]

    def status(frame: CallStatus) -> None:
        if not seen_call_id:
            seen_call_id.append(frame.call_id)
        if frame.state is not CallState.RINGING:
            taken[0] = True
        on_status(frame)

    async def attempt(
        callee: _Believed, *, retry: bool = False
    ) -> tuple[RequestPayload, CallOutcome | CallError | CallQueued | CallResult]:
        """Seal to ``callee``'s records and dial: what came back, or how the dial failed."""
        seen_call_id.clear()
        taken[0] = False
        now = reactor.seconds()
        try:
            sealed, request = envelope.seal_request(
                sender=keys.identity,
                sender_address=config.address,
                recipient_identity=callee.keys.identity.record,
                recipient_encryption=callee.encryption.record,
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
        frame = CallRequest(envelope=sealed, correlation_id=ids.mint_correlation_id(), queue=queue)
        busy_waits = 0
        while True:
            try:
                terminal = await dial(
                    reactor,
                    config.relay,
                    credentials,
                    handle,
                    frame,
                    ca_file=config.ca_file,
                    on_status=status,
                    # A retry has what is left of the caller's time.
                    timeout_s=timeout_s - (reactor.seconds() - start)
                    if retry or busy_waits
                    else timeout_s,
                )
            except RelayBusy as exc:
                # Turned away before the socket was usable: nothing was sent, and the same
                # frame may go again once the relay's Retry-After has passed, a bounded number
                # of times and only inside the caller's timeout.
                wait = exc.retry_after_s
                left = timeout_s - (reactor.seconds() - start)
                if busy_waits >= BUSY_RETRIES:
                    detail = f"{exc}; tried {busy_waits + 1} times, try again in a minute"
                    return request, failed(CallErrorCode.CONNECTION_FAILED, detail)
                if wait > BUSY_WAIT_MAX_S or wait >= left:
                    detail = f"{exc}, longer than this call waits; try again later"
                    return request, failed(CallErrorCode.CONNECTION_FAILED, detail)
                busy_waits += 1
                note(f"the relay is busy; dialling it again in {wait:g} s (it asked for that)")
                await deferLater(reactor, wait)
                continue
            except CallAborted as exc:
                call_id = seen_call_id[0] if seen_call_id else None
                if reactor.seconds() - start >= timeout_s:
                    return request, failed(
                        CallErrorCode.TIMEOUT, f"no answer within {timeout_s:g} s", call_id
                    )
                return request, failed(CallErrorCode.CONNECTION_FAILED, str(exc), call_id)
            except (RelayUnreachable, SocketRefused) as exc:
                return request, failed(CallErrorCode.CONNECTION_FAILED, str(exc))
            except AgentCallError as exc:
                # Local TLS trouble (an unreadable CA file) surfaces only when dialling.
                return request, failed(CallErrorCode.CONNECTION_FAILED, str(exc))
            break
        return request, terminal

    request, terminal = await attempt(believed)
    time_left = timeout_s - (reactor.seconds() - start)
    if believed.kept and not taken[0] and time_left > 0 and _refused_by_callee(terminal):
        # Sealed with kept records, and the callee refused it before taking it (it could not
        # open it: perhaps it rotated and no longer holds that epoch). Ask the relay; only
        # records that changed are worth a second request (a new request id), and only one.
        try:
            fresh = await _callee_keys(
                reactor,
                home,
                api,
                config,
                keys,
                target_address,
                handle,
                kept=False,
                on_note=on_note,
            )
        except _Unfetched:
            fresh = None
        if fresh is not None and fresh.keys != believed.keys:
            believed = fresh
            request, terminal = await attempt(believed, retry=True)
    pin = believed.pin
    if isinstance(terminal, CallResult):
        return terminal
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
