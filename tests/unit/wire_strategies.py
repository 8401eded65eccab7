"""Hypothesis strategies that build valid instances of every wire shape.

Each strategy produces objects that the attrs validators accept, so anything built here must
survive ``encode`` → ``decode`` unchanged. The ``*_STRATEGIES`` tables are keyed by class so that
tests can check every class of a module has one (a new class without a strategy fails a test).
"""

from __future__ import annotations

import string
from typing import Any

from hypothesis import strategies as st

from agentcall import limits
from agentcall.errors import PEER_FAILURE_CODES, RELAY_CALL_ERRORS, ApiErrorCode, CallErrorCode
from agentcall.relay import audit
from agentcall.wire import frames, http, payloads

LOWER_DIGITS = string.ascii_lowercase + string.digits
HEX = "0123456789abcdef"
B64URL = string.ascii_letters + string.digits + "-_"


def _exact(alphabet: str, size: int) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=size, max_size=size)


def _label(max_rest: int, *, min_rest: int) -> st.SearchStrategy[str]:
    """A lowercase name: a letter or digit, then letters, digits and hyphens."""
    first = st.sampled_from(LOWER_DIGITS)
    rest = st.text(LOWER_DIGITS + "-", min_size=min_rest, max_size=max_rest)
    return st.tuples(first, rest).map("".join)


def _optional(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | inner


def texts(max_chars: int, *, min_chars: int = 0) -> st.SearchStrategy[str]:
    """Well-formed Unicode (hypothesis excludes surrogates by default), size kept small."""
    return st.text(min_size=min_chars, max_size=min(max_chars, 60))


def _sorted_codes(codes: frozenset[CallErrorCode]) -> list[CallErrorCode]:
    return sorted(codes, key=str)


# --- identifiers -----------------------------------------------------------------------------


def _joined_words(max_len: int) -> st.SearchStrategy[str]:
    """A handle: lowercase words joined by single hyphens, 2 to ``max_len`` characters."""
    whole = st.text(LOWER_DIGITS, min_size=2, max_size=max_len)
    word = st.text(LOWER_DIGITS, min_size=1, max_size=10)
    joined = st.lists(word, min_size=2, max_size=3).map("-".join)
    return whole | joined.filter(lambda name: len(name) <= max_len)


orgs = _label(19, min_rest=1)
handles = _joined_words(31)
task_ids = _label(63, min_rest=0)
addresses = st.tuples(orgs, handles).map(lambda pair: f"@{pair[0]}/{pair[1]}")
hex32s = _exact(HEX, 32)
hex64s = _exact(HEX, 64)
correlation_ids = hex32s.filter(lambda value: value != "0" * 32)
call_ids = st.uuids(version=4).map(str)
context_ids = _exact(B64URL, 22).map("ctx_".__add__)
roster_ids = st.text(B64URL, min_size=16, max_size=64)
tokens = _exact(B64URL, 43)
relay_origins = st.tuples(
    st.text(LOWER_DIGITS + ".-", min_size=1, max_size=253),
    _optional(st.text(string.digits, min_size=1, max_size=5)),
).map(lambda pair: pair[0] if pair[1] is None else f"{pair[0]}:{pair[1]}")
signatures = _exact(B64URL, 86)
public_keys = _exact(B64URL, 43)
ciphertexts = st.text(B64URL, min_size=44, max_size=200)
timestamps = st.integers(0, 2**40)
epochs = st.integers(1, 2**31)

# --- frames ----------------------------------------------------------------------------------

envelopes = st.builds(
    frames.SealedEnvelope,
    v=st.just(1),
    direction=st.sampled_from(frames.Direction),
    relay_origin=relay_origins,
    from_=addresses,
    to=addresses,
    key_id=hex32s,
    epoch=epochs,
    ct=ciphertexts,
)

FRAME_STRATEGIES: dict[type[Any], st.SearchStrategy[Any]] = {
    frames.Ready: st.builds(
        frames.Ready,
        role=st.sampled_from(frames.Role),
        address=addresses,
        relay_origin=relay_origins,
        jobs_held=st.booleans(),
    ),
    frames.CallRequest: st.builds(
        frames.CallRequest,
        envelope=envelopes,
        correlation_id=correlation_ids,
        queue=st.booleans(),
    ),
    frames.CallQueued: st.builds(frames.CallQueued, job_id=call_ids, expires_at=timestamps),
    frames.CallStatus: st.builds(
        frames.CallStatus, call_id=call_ids, state=st.sampled_from(frames.CallState)
    ),
    frames.CallError: st.builds(
        frames.CallError,
        code=st.sampled_from(_sorted_codes(RELAY_CALL_ERRORS)),
        call_id=_optional(call_ids),
        detail=_optional(texts(limits.MAX_DETAIL_CHARS)),
    ),
    frames.CallOutcome: st.builds(
        frames.CallOutcome,
        call_id=call_ids,
        terminal=st.sampled_from(frames.Terminal),
        envelope=envelopes,
    ),
    frames.IncomingCall: st.builds(
        frames.IncomingCall,
        call_id=call_ids,
        from_=handles,
        envelope=envelopes,
        correlation_id=correlation_ids,
        groups=st.lists(roster_ids, max_size=4).map(tuple),
        caller_keys=_optional(st.deferred(lambda: keys_responses)),
    ),
    frames.CancelCall: st.builds(frames.CancelCall, call_id=call_ids),
    frames.CallAccepted: st.builds(frames.CallAccepted, call_id=call_ids),
    frames.CallStarted: st.builds(frames.CallStarted, call_id=call_ids),
    frames.CallRejected: st.builds(frames.CallRejected, call_id=call_ids),
    frames.CallCancelled: st.builds(
        frames.CallCancelled, call_id=call_ids, phase=st.sampled_from(frames.CancelPhase)
    ),
    frames.CallNotCancelled: st.builds(
        frames.CallNotCancelled,
        call_id=call_ids,
        reason=st.sampled_from(frames.NotCancelledReason),
    ),
    frames.JobDelivery: st.builds(
        frames.JobDelivery,
        job_id=call_ids,
        from_=handles,
        envelope=envelopes,
        expires_at=timestamps,
        attempt=st.integers(1, 100),
        caller_keys=_optional(st.deferred(lambda: keys_responses)),
    ),
    frames.CancelJob: st.builds(frames.CancelJob, job_id=call_ids),
    frames.JobAck: st.builds(frames.JobAck, job_id=call_ids),
    frames.JobNack: st.builds(
        frames.JobNack,
        job_id=call_ids,
        code=st.sampled_from([CallErrorCode.STORAGE_FULL, CallErrorCode.UNAVAILABLE]),
    ),
    frames.JobAccepted: st.builds(frames.JobAccepted, job_id=call_ids),
    frames.JobDeclined: st.builds(frames.JobDeclined, job_id=call_ids),
    frames.JobRenew: st.builds(frames.JobRenew, job_id=call_ids),
    frames.JobsHeld: st.builds(frames.JobsHeld, job_ids=st.lists(call_ids, max_size=5).map(tuple)),
    frames.JobResult: st.one_of(
        st.builds(
            frames.JobResult,
            job_id=call_ids,
            terminal=st.sampled_from(frames.Terminal),
            envelope=envelopes,
        ),
        st.builds(frames.JobResult, job_id=call_ids, error=st.sampled_from(frames.JobError)),
    ),
}

any_frame: st.SearchStrategy[Any] = st.one_of(*FRAME_STRATEGIES.values())

# --- sealed payloads -------------------------------------------------------------------------

request_payloads = st.builds(
    payloads.RequestPayload,
    v=st.just(1),
    direction=st.just(frames.Direction.REQUEST),
    relay_origin=relay_origins,
    from_=addresses,
    to=addresses,
    request_id=hex32s,
    sender_key_id=hex32s,
    recipient_key_id=hex32s,
    recipient_epoch=epochs,
    issued_at=timestamps,
    expires_at=timestamps,
    task=_optional(task_ids),
    context_id=_optional(context_ids),
    message=texts(limits.MAX_MESSAGE_BYTES, min_chars=1),
)

replies = st.builds(
    payloads.Reply,
    text=texts(limits.MAX_REPLY_BYTES),
    context_id=_optional(context_ids),
    task=_optional(task_ids),
)

failures = st.builds(
    payloads.CallFailure,
    code=st.sampled_from(_sorted_codes(PEER_FAILURE_CODES)),
    detail=_optional(texts(limits.MAX_DETAIL_CHARS)),
    offered=st.lists(task_ids, max_size=4).map(tuple),
)


def response_payloads(outcomes: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.builds(
        payloads.ResponsePayload,
        v=st.just(1),
        direction=st.just(frames.Direction.RESPONSE),
        relay_origin=relay_origins,
        from_=addresses,
        to=addresses,
        request_id=hex32s,
        sender_key_id=hex32s,
        recipient_key_id=hex32s,
        recipient_epoch=epochs,
        issued_at=timestamps,
        expires_at=timestamps,
        request_transcript_hash=hex64s,
        outcome=outcomes,
    )


any_response_payload = response_payloads(replies | failures)

PAYLOAD_STRATEGIES: dict[type[Any], st.SearchStrategy[Any]] = {
    payloads.RequestPayload: request_payloads,
    payloads.ResponsePayload: any_response_payload,
    payloads.SignedRequest: st.builds(
        payloads.SignedRequest, payload=request_payloads, signature=signatures
    ),
    payloads.SignedResponse: st.builds(
        payloads.SignedResponse, payload=any_response_payload, signature=signatures
    ),
}

# --- HTTP bodies -----------------------------------------------------------------------------

invite_infos = st.builds(
    http.InviteInfo,
    id=hex64s,
    org=orgs,
    role=st.sampled_from(http.MemberRole),
    status=st.sampled_from(http.InviteStatus),
    created_by=_optional(handles),
    created_at=timestamps,
    expires_at=timestamps,
    description=_optional(texts(limits.MAX_INVITE_DESCRIPTION_CHARS)),
    used_by=_optional(handles),
)

audit_events = st.builds(
    http.AuditEvent,
    id=st.integers(1, 2**63 - 1),
    at_ms=st.integers(0, 2**50),
    event=st.sampled_from(sorted(audit.EVENTS)),
    actor=_optional(texts(200)),
    target=_optional(texts(200)),
    call_id=_optional(texts(64)),
    detail=_optional(texts(limits.MAX_DETAIL_CHARS)),
)
audit_holds = st.one_of(
    st.builds(
        http.AuditHold,
        scope=st.just(http.HoldScope.ORGANISATION),
        handle=st.none(),
        set_at=timestamps,
        set_by=handles,
        note=_optional(texts(limits.MAX_HOLD_NOTE_CHARS)),
    ),
    st.builds(
        http.AuditHold,
        scope=st.just(http.HoldScope.HANDLE),
        handle=handles,
        set_at=timestamps,
        set_by=handles,
        note=_optional(texts(limits.MAX_HOLD_NOTE_CHARS)),
    ),
)
member_infos = st.builds(
    http.MemberInfo,
    handle=handles,
    role=st.sampled_from(http.MemberRole),
    status=st.sampled_from(http.MemberStatus),
    enrolled_at=timestamps,
    last_seen=_optional(timestamps),
    agent_kind=_optional(st.sampled_from(http.AgentKind)),
    removed_at=_optional(timestamps),
    removed_by=_optional(handles),
)


@st.composite
def identity_records(draw: st.DrawFn) -> http.IdentityRecord:
    """With or without a recovery key (which always comes with its issue time)."""
    recovery = draw(st.booleans())
    return http.IdentityRecord(
        v=1,
        relay_origin=draw(relay_origins),
        address=draw(addresses),
        identity_pub=draw(public_keys),
        recovery_pub=draw(public_keys) if recovery else None,
        recovery_issued_at=draw(timestamps) if recovery else None,
    )


@st.composite
def encryption_key_records(draw: st.DrawFn) -> http.EncryptionKeyRecord:
    """A record whose window is positive and at most 30 days, with prev null only at epoch 1."""
    epoch = draw(epochs | st.just(1))
    not_before = draw(st.integers(0, 2**40 - limits.MAX_KEY_VALIDITY_S))
    return http.EncryptionKeyRecord(
        v=1,
        relay_origin=draw(relay_origins),
        address=draw(addresses),
        key_id=draw(hex32s),
        suite=draw(st.sampled_from(sorted(http.SUITES))),
        pub=draw(public_keys),
        epoch=epoch,
        not_before=not_before,
        not_after=not_before + draw(st.integers(1, limits.MAX_KEY_VALIDITY_S)),
        prev=None if epoch == 1 else draw(hex32s),
    )


# One line, nothing a terminal acts on: what the card's validators accept.
card_texts = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=40
).filter(lambda text: text.strip() == text and text != "")
card_tasks = st.builds(http.CardTask, id=task_ids, name=card_texts, summary=card_texts)


@st.composite
def card_records(draw: st.DrawFn) -> http.CardRecord:
    kind = draw(_optional(st.sampled_from(http.AgentKind)))
    tasks = [] if kind is None else draw(st.lists(card_tasks, max_size=4, unique_by=lambda t: t.id))
    return http.CardRecord(
        v=1,
        relay_origin=draw(relay_origins),
        address=draw(addresses),
        identity_pub=draw(public_keys),
        issued_at=draw(st.integers(0, 2**40)),
        agent_kind=kind,
        tasks=tuple(sorted(tasks, key=lambda t: t.id)),
        omitted=draw(st.integers(0, 5)),
    )


signed_identity_records = st.builds(
    http.SignedIdentityRecord, record=identity_records(), signature=signatures
)
recovery_statements = st.builds(
    http.RecoveryStatement,
    v=st.just(1),
    relay_origin=relay_origins,
    address=addresses,
    recovery_pub=public_keys,
    new_identity_pub=public_keys,
    at=timestamps,
)
signed_recovery_statements = st.builds(
    http.SignedRecoveryStatement, statement=recovery_statements, signature=signatures
)
recovery_links = st.builds(
    http.RecoveryLink, previous=signed_identity_records, statement=signed_recovery_statements
)
signed_encryption_key_records = st.builds(
    http.SignedEncryptionKeyRecord, record=encryption_key_records(), signature=signatures
)


@st.composite
def job_infos(draw: st.DrawFn) -> http.JobInfo:
    state = draw(st.sampled_from(http.JobState))
    answered = state is http.JobState.ANSWERED and draw(st.booleans())
    reason = draw(st.sampled_from(http.JobFailureReason)) if state is http.JobState.FAILED else None
    return http.JobInfo(
        job_id=draw(call_ids),
        side=draw(st.sampled_from(http.JobSide)),
        caller=draw(addresses),
        callee=draw(addresses),
        state=state,
        created_at=draw(timestamps),
        expires_at=draw(timestamps),
        attempts=draw(st.integers(0, 100)),
        reason=reason,
        cancel_requested=draw(st.booleans()),
        terminal=draw(st.sampled_from(frames.Terminal)) if answered else None,
        answer=draw(envelopes) if answered else None,
    )


keys_responses: st.SearchStrategy[http.KeysResponse] = st.builds(
    http.KeysResponse,
    identity=signed_identity_records,
    encryption=_optional(signed_encryption_key_records),
    recovered=st.lists(recovery_links, max_size=2).map(tuple),
)

HTTP_STRATEGIES: dict[type[Any], st.SearchStrategy[Any]] = {
    http.ApiErrorBody: st.builds(
        http.ApiErrorBody, error=st.sampled_from(ApiErrorCode), message=texts(500)
    ),
    http.StatusResponse: st.builds(
        http.StatusResponse, ok=st.booleans(), version=texts(40), relay_origin=relay_origins
    ),
    http.RegisterRequest: st.builds(
        http.RegisterRequest,
        org=orgs,
        invite=tokens,
        handle=texts(64),
        agent_kind=_optional(st.sampled_from(http.AgentKind)),
    ),
    http.RegisterResponse: st.builds(
        http.RegisterResponse,
        org=orgs,
        handle=handles,
        address=addresses,
        role=st.sampled_from(http.MemberRole),
        token=tokens,
        relay_origin=relay_origins,
    ),
    http.WhoAmIResponse: st.builds(
        http.WhoAmIResponse,
        org=orgs,
        handle=handles,
        address=addresses,
        role=st.sampled_from(http.MemberRole),
        relay_origin=relay_origins,
        offline_delivery=st.booleans(),
    ),
    http.OfflineDelivery: st.builds(http.OfflineDelivery, enabled=st.booleans()),
    http.JobInfo: job_infos(),
    http.JobList: st.builds(http.JobList, jobs=st.lists(job_infos(), max_size=3).map(tuple)),
    http.InviteCreateRequest: st.builds(
        http.InviteCreateRequest,
        role=st.sampled_from(http.MemberRole),
        expires_in_days=st.integers(limits.INVITE_MIN_DAYS, limits.INVITE_MAX_DAYS),
        description=_optional(texts(limits.MAX_INVITE_DESCRIPTION_CHARS)),
    ),
    http.InviteInfo: invite_infos,
    http.InviteCreated: st.builds(http.InviteCreated, invite=texts(600), info=invite_infos),
    http.InviteList: st.builds(
        http.InviteList, invites=st.lists(invite_infos, max_size=3).map(tuple)
    ),
    http.HealthResponse: st.builds(
        http.HealthResponse, ok=st.booleans(), problem=_optional(texts(200))
    ),
    http.TokenRotateRequest: st.builds(http.TokenRotateRequest, token=tokens),
    http.TokenRotated: st.builds(http.TokenRotated, rotated_at=timestamps),
    http.MemberInfo: member_infos,
    http.MemberList: st.builds(
        http.MemberList,
        members=st.lists(member_infos, max_size=3).map(tuple),
        next_after=_optional(handles),
    ),
    http.MemberRemoveRequest: st.builds(http.MemberRemoveRequest, release=st.booleans()),
    http.MemberRoleRequest: st.builds(
        http.MemberRoleRequest, role=st.sampled_from(http.MemberRole)
    ),
    http.IdentityRecord: identity_records(),
    http.RecoveryStatement: recovery_statements,
    http.SignedRecoveryStatement: signed_recovery_statements,
    http.RecoveryLink: recovery_links,
    http.RecoverRequest: st.builds(
        http.RecoverRequest,
        org=orgs,
        handle=handles,
        identity=signed_identity_records,
        statement=signed_recovery_statements,
        agent_kind=_optional(st.sampled_from(http.AgentKind)),
    ),
    http.SignedIdentityRecord: signed_identity_records,
    http.EncryptionKeyRecord: encryption_key_records(),
    http.SignedEncryptionKeyRecord: signed_encryption_key_records,
    http.KeysResponse: keys_responses,
    http.CardTask: card_tasks,
    http.CardRecord: card_records(),
    http.SignedCardRecord: st.builds(
        http.SignedCardRecord, record=card_records(), signature=signatures
    ),
    http.PresenceResponse: st.builds(
        http.PresenceResponse, address=addresses, online=st.booleans()
    ),
    http.AuditEvent: audit_events,
    http.AuditExportEnd: st.builds(
        http.AuditExportEnd, complete=st.just(True), events=st.integers(0, 2**63 - 1)
    ),
    http.AuditHoldRequest: st.builds(
        http.AuditHoldRequest,
        handle=_optional(handles),
        note=_optional(texts(limits.MAX_HOLD_NOTE_CHARS)),
    ),
    http.AuditHold: audit_holds,
    http.AuditHoldList: st.builds(
        http.AuditHoldList, holds=st.lists(audit_holds, max_size=3).map(tuple)
    ),
}

# --- hostile raw material --------------------------------------------------------------------

# Any text at all, lone surrogates included (hypothesis leaves them out unless asked).
hostile_text = st.text(st.characters() | st.integers(0xD800, 0xDFFF).map(chr), max_size=20)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | hostile_text
    | st.sampled_from(sorted(frames.FRAME_TYPES))
)

# Nested dicts/lists of scalars: the shapes json.loads can hand to the structurer.
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(hostile_text, children, max_size=4)
    ),
    max_leaves=8,
)

_WIRE_KEYS = sorted(
    {"type", "from", "kind"}
    | {
        field.name
        for cls in (*frames.FRAME_TYPES.values(), *PAYLOAD_STRATEGIES, *HTTP_STRATEGIES)
        for field in cls.__attrs_attrs__
    }
)

# Objects whose keys look like real field names, so the structurer is exercised past the
# first "unknown key" check.
frame_shaped: st.SearchStrategy[Any] = st.dictionaries(
    st.sampled_from(_WIRE_KEYS), json_scalars | json_values, max_size=6
)
