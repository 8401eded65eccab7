"""Valid examples of every shape a target parses, built with the product's own types.

The fuzzer starts from these, so its first mutations already reach the field validators and
the nested shapes instead of spending its budget rediscovering ``{"type": ...}``.
"""

from __future__ import annotations

import json
from typing import Any, Final

import attrs

from agentcall.errors import ApiErrorCode, CallErrorCode
from agentcall.wire import codec, frames, http, local, payloads

ORIGIN: Final = "relay.example.com:8443"
ANN: Final = "@acme/ann"
KEN: Final = "@acme/ken"
CALL_ID: Final = "0f8fad5b-d9cb-469f-a165-70867728950e"
CORRELATION_ID: Final = "1c2d3e4f" * 4
KEY_ID: Final = "ab" * 16
HASH64: Final = "cd" * 32
ROSTER: Final = "R0ster-id-0000001"
TOKEN: Final = "A" * 43
SIGNATURE: Final = "S" * 86
PUB: Final = "P" * 43
NOW: Final = 1_750_000_000


def envelope(direction: frames.Direction) -> frames.SealedEnvelope:
    return frames.SealedEnvelope(
        v=1,
        direction=direction,
        relay_origin=ORIGIN,
        from_=ANN if direction is frames.Direction.REQUEST else KEN,
        to=KEN if direction is frames.Direction.REQUEST else ANN,
        key_id=KEY_ID,
        epoch=3,
        ct="Q2lwaGVydGV4dA" * 5,
    )


def all_frames() -> list[frames.Frame]:
    """One or more of every frame type, optional fields filled in where they exist."""
    request, response = envelope(frames.Direction.REQUEST), envelope(frames.Direction.RESPONSE)
    return [
        frames.Ready(role=frames.Role.CALL, address=ANN, relay_origin=ORIGIN),
        frames.Ready(role=frames.Role.LISTEN, address=KEN, relay_origin=ORIGIN),
        frames.Ready(
            role=frames.Role.LISTEN, address=KEN, relay_origin=ORIGIN, calls=True, jobs_held=True
        ),
        frames.CallRequest(envelope=request, correlation_id=CORRELATION_ID),
        frames.CallRequest(envelope=request, correlation_id=CORRELATION_ID, queue=True),
        frames.CallQueued(job_id=CALL_ID, expires_at=NOW + 72 * 3600),
        frames.CallStatus(call_id=CALL_ID, state=frames.CallState.WORKING),
        frames.CallError(code=CallErrorCode.BUSY),
        frames.CallError(code=CallErrorCode.OFFLINE, call_id=CALL_ID, detail="ken is away"),
        frames.CallOutcome(call_id=CALL_ID, terminal=frames.Terminal.COMPLETED, envelope=response),
        frames.IncomingCall(
            call_id=CALL_ID,
            from_="ann",
            envelope=request,
            correlation_id=CORRELATION_ID,
            groups=(ROSTER, "R0ster-id-0000002"),
        ),
        frames.IncomingCall(
            call_id=CALL_ID,
            from_="ann",
            envelope=request,
            correlation_id=CORRELATION_ID,
            caller_keys=http.KeysResponse(identity=_identity(ANN), encryption=_encryption(ANN)),
        ),
        frames.CancelCall(call_id=CALL_ID),
        frames.CallAccepted(call_id=CALL_ID),
        frames.CallStarted(call_id=CALL_ID),
        frames.CallRejected(call_id=CALL_ID),
        frames.CallCancelled(call_id=CALL_ID, phase=frames.CancelPhase.RUNNING),
        frames.CallNotCancelled(call_id=CALL_ID, reason=frames.NotCancelledReason.TOO_LATE),
        frames.JobDelivery(
            job_id=CALL_ID, from_="ann", envelope=request, expires_at=NOW + 3600, attempt=2
        ),
        frames.JobDelivery(
            job_id=CALL_ID,
            from_="ann",
            envelope=request,
            expires_at=NOW + 3600,
            attempt=1,
            caller_keys=http.KeysResponse(identity=_identity(ANN), encryption=_encryption(ANN)),
        ),
        frames.CancelJob(job_id=CALL_ID),
        frames.JobAck(job_id=CALL_ID),
        frames.JobNack(job_id=CALL_ID, code=CallErrorCode.STORAGE_FULL),
        frames.JobAccepted(job_id=CALL_ID),
        frames.JobDeclined(job_id=CALL_ID),
        frames.JobRenew(job_id=CALL_ID),
        frames.JobsHeld(job_ids=()),
        frames.JobsHeld(job_ids=(CALL_ID, CALL_ID)),
        frames.JobResult(job_id=CALL_ID, terminal=frames.Terminal.COMPLETED, envelope=response),
        frames.JobResult(job_id=CALL_ID, error=frames.JobError.INDETERMINATE_EXECUTION),
    ]


def _job_info(answered: bool) -> http.JobInfo:
    if not answered:
        return http.JobInfo(
            job_id=CALL_ID,
            side=http.JobSide.RECEIVED,
            caller=ANN,
            callee=KEN,
            state=http.JobState.FAILED,
            created_at=NOW,
            expires_at=NOW + 72 * 3600,
            attempts=3,
            reason=http.JobFailureReason.DELIVERY_FAILED,
        )
    return http.JobInfo(
        job_id=CALL_ID,
        side=http.JobSide.SENT,
        caller=ANN,
        callee=KEN,
        state=http.JobState.ANSWERED,
        created_at=NOW,
        expires_at=NOW + 72 * 3600,
        attempts=1,
        terminal=frames.Terminal.COMPLETED,
        answer=envelope(frames.Direction.RESPONSE),
    )


def _invite_info() -> http.InviteInfo:
    return http.InviteInfo(
        id=HASH64,
        org="acme",
        role=http.MemberRole.MEMBER,
        status=http.InviteStatus.USED,
        created_by="ann",
        created_at=NOW,
        expires_at=NOW + 7 * 86400,
        description="for Ken",
        used_by="ken",
    )


def _identity(address: str = KEN, *, recovery: bool = False) -> http.SignedIdentityRecord:
    record = http.IdentityRecord(
        v=1,
        relay_origin=ORIGIN,
        address=address,
        identity_pub=PUB,
        recovery_pub=PUB if recovery else None,
        recovery_issued_at=1_750_000_000 if recovery else None,
    )
    return http.SignedIdentityRecord(record=record, signature=SIGNATURE)


def _statement() -> http.SignedRecoveryStatement:
    statement = http.RecoveryStatement(
        v=1, relay_origin=ORIGIN, address=KEN, recovery_pub=PUB, new_identity_pub=PUB, at=1
    )
    return http.SignedRecoveryStatement(statement=statement, signature=SIGNATURE)


def _encryption(address: str = KEN) -> http.SignedEncryptionKeyRecord:
    record = http.EncryptionKeyRecord(
        v=1,
        relay_origin=ORIGIN,
        address=address,
        key_id=KEY_ID,
        suite=http.SUITE_X25519,
        pub=PUB,
        epoch=2,
        not_before=NOW,
        not_after=NOW + 86400,
        prev="ef" * 16,
    )
    return http.SignedEncryptionKeyRecord(record=record, signature=SIGNATURE)


def _card(kind: http.AgentKind | None = http.AgentKind.CLAUDE) -> http.SignedCardRecord:
    tasks = (
        http.CardTask(id="ask", name="Ask a question", summary="Ask; it reads, changes nothing."),
        http.CardTask(id="review", name="Code review", summary='Review a diff "as is" — ünïcode'),
    )
    record = http.CardRecord(
        v=1,
        relay_origin=ORIGIN,
        address=KEN,
        identity_pub=PUB,
        issued_at=NOW,
        agent_kind=kind,
        tasks=tasks if kind is not None else (),
        omitted=1 if kind is not None else 0,
    )
    return http.SignedCardRecord(record=record, signature=SIGNATURE)


def http_bodies() -> dict[type[Any], list[Any]]:
    """Every request and response body of the relay's HTTP API, by class."""
    info = _invite_info()
    member = http.MemberInfo(
        handle="ann",
        role=http.MemberRole.ADMIN,
        status=http.MemberStatus.ACTIVE,
        enrolled_at=1_750_000_000,
        last_seen=1_750_086_400,
        agent_kind=http.AgentKind.CLAUDE,
    )
    removed = http.MemberInfo(
        handle="ken",
        role=http.MemberRole.MEMBER,
        status=http.MemberStatus.REMOVED,
        enrolled_at=1_750_000_000,
        removed_at=1_750_090_000,
        removed_by="ann",
    )
    hold = http.AuditHold(
        http.HoldScope.HANDLE, "ken", set_at=1_750_100_000, set_by="ann", note="case 2026-14"
    )
    org_hold = http.AuditHold(http.HoldScope.ORGANISATION, None, 1_750_100_000, "ann")
    return {
        http.ApiErrorBody: [http.ApiErrorBody(ApiErrorCode.BAD_REQUEST, "malformed body")],
        http.StatusResponse: [http.StatusResponse(ok=True, version="1", relay_origin=ORIGIN)],
        http.RegisterRequest: [
            http.RegisterRequest(org="acme", invite=TOKEN, handle="ken"),
            http.RegisterRequest(
                org="acme", invite=TOKEN, handle="ken", agent_kind=http.AgentKind.CODEX
            ),
        ],
        http.RegisterResponse: [
            http.RegisterResponse(
                org="acme",
                handle="ken",
                address=KEN,
                role=http.MemberRole.ADMIN,
                token=TOKEN,
                relay_origin=ORIGIN,
            )
        ],
        http.WhoAmIResponse: [
            http.WhoAmIResponse(
                org="acme",
                handle="ann",
                address=ANN,
                role=http.MemberRole.MEMBER,
                relay_origin=ORIGIN,
                offline_delivery=True,
            )
        ],
        http.OfflineDelivery: [http.OfflineDelivery(enabled=False)],
        http.JobInfo: [_job_info(True), _job_info(False)],
        http.JobList: [http.JobList(jobs=(_job_info(False), _job_info(False)))],
        http.InviteCreateRequest: [
            http.InviteCreateRequest(),
            http.InviteCreateRequest(http.MemberRole.ADMIN, 3, "for the new hire"),
        ],
        http.InviteInfo: [info],
        http.InviteCreated: [
            http.InviteCreated(invite=f"https://{ORIGIN}/join/acme#{TOKEN}", info=info)
        ],
        http.InviteList: [http.InviteList(invites=(info, info))],
        http.HealthResponse: [
            http.HealthResponse(ok=True),
            http.HealthResponse(ok=False, problem="database_unavailable"),
        ],
        http.TokenRotateRequest: [http.TokenRotateRequest(token=TOKEN)],
        http.TokenRotated: [http.TokenRotated(rotated_at=1_750_000_000)],
        http.MemberInfo: [member],
        http.MemberList: [
            http.MemberList(members=(member, removed), next_after="ken"),
            http.MemberList(members=()),
        ],
        http.MemberRemoveRequest: [http.MemberRemoveRequest(), http.MemberRemoveRequest(True)],
        http.MemberRoleRequest: [http.MemberRoleRequest(http.MemberRole.ADMIN)],
        http.IdentityRecord: [_identity().record, _identity(recovery=True).record],
        http.RecoveryStatement: [_statement().statement],
        http.SignedRecoveryStatement: [_statement()],
        http.RecoveryLink: [http.RecoveryLink(_identity(recovery=True), _statement())],
        http.RecoverRequest: [
            http.RecoverRequest(
                org="acme", handle="ken", identity=_identity(), statement=_statement()
            )
        ],
        http.SignedIdentityRecord: [_identity()],
        http.EncryptionKeyRecord: [_encryption().record],
        http.SignedEncryptionKeyRecord: [_encryption()],
        http.KeysResponse: [
            http.KeysResponse(identity=_identity()),
            http.KeysResponse(identity=_identity(), encryption=_encryption()),
        ],
        http.PresenceResponse: [http.PresenceResponse(address=KEN, online=False)],
        http.CardTask: [_card().record.tasks[0]],
        http.CardRecord: [_card().record, _card(kind=None).record],
        http.SignedCardRecord: [_card()],
        http.AuditEvent: [
            http.AuditEvent(
                id=1,
                at_ms=1_700_000_000_250,
                event="member.role",
                actor="ada",
                target="ann",
                detail="member->admin",
            ),
            http.AuditEvent(
                id=2**40, at_ms=0, event="presence.refused", actor="ann", target="@other/ken"
            ),
        ],
        http.AuditExportEnd: [http.AuditExportEnd(complete=True, events=2)],
        http.AuditHoldRequest: [
            http.AuditHoldRequest(),
            http.AuditHoldRequest(handle="ken", note="case 2026-14"),
        ],
        http.AuditHold: [hold, org_hold],
        http.AuditHoldList: [http.AuditHoldList(holds=(org_hold, hold)), http.AuditHoldList(())],
    }


def _request_payload() -> payloads.RequestPayload:
    return payloads.RequestPayload(
        v=1,
        direction=frames.Direction.REQUEST,
        relay_origin=ORIGIN,
        from_=ANN,
        to=KEN,
        request_id="01" * 16,
        sender_key_id=KEY_ID,
        recipient_key_id="ef" * 16,
        recipient_epoch=2,
        issued_at=NOW,
        expires_at=NOW + 300,
        task="review",
        context_id="ctx_" + "a" * 22,
        message="Please review the diff in PR 12.\nThanks!",
    )


def _response_payload(outcome: payloads.Outcome) -> payloads.ResponsePayload:
    return payloads.ResponsePayload(
        v=1,
        direction=frames.Direction.RESPONSE,
        relay_origin=ORIGIN,
        from_=KEN,
        to=ANN,
        request_id="01" * 16,
        sender_key_id="ef" * 16,
        recipient_key_id=KEY_ID,
        recipient_epoch=1,
        issued_at=NOW,
        expires_at=NOW + 300,
        request_transcript_hash=HASH64,
        outcome=outcome,
    )


def sealed_payloads() -> dict[type[Any], list[Any]]:
    """The plaintexts inside sealed envelopes, by class."""
    reply = payloads.Reply(text="Looks good.", context_id="ctx_" + "b" * 22, task="review")
    failure = payloads.CallFailure(
        code=CallErrorCode.TASK_NOT_OFFERED, detail="not offered", offered=("ask", "review")
    )
    responses = [_response_payload(reply), _response_payload(failure)]
    return {
        payloads.RequestPayload: [_request_payload()],
        payloads.ResponsePayload: responses,
        payloads.SignedRequest: [
            payloads.SignedRequest(payload=_request_payload(), signature=SIGNATURE)
        ],
        payloads.SignedResponse: [
            payloads.SignedResponse(payload=response, signature=SIGNATURE) for response in responses
        ],
    }


def skill_texts(workdir: str) -> list[str]:
    """SKILL.md files using every construct of the frontmatter subset; ``workdir`` exists."""
    full = "\n".join(
        [
            "---",
            "# a comment line",
            'description: "Review a \\"diff\\"\\tand say what\\\\breaks"',
            "name: 'Ken''s review'  # trailing comment",
            "keywords: [review, 'pull request', \"diff, patch\"]",
            "examples:",
            "  - review PR 12",
            "  - 'check the tests'",
            "",
            "tools: [read, write, fetch, exec]",
            f"workdir: {workdir}",
            "timeout_s: 120",
            "threadable: false",
            "connectors:",
            "- github",
            "- linear.app",
            "---",
            "Read the diff, run nothing destructive, answer in five bullet points.",
            "",
        ]
    )
    small = "---\r\ndescription: Answer questions about the build\r\ntools: []\r\n---\r\nBe brief."
    empty_lists = "---\ndescription: plain text value\nkeywords: []\nexamples:\n  -  x\n---\n"
    return [full, small, empty_lists]


def policy_documents() -> list[Any]:
    """policy.json documents, version 2 with every field and version 1."""
    return [
        {
            "version": 2,
            "default_access": "blocked",
            "default_offer": ["ask", "review"],
            "callers": {
                "ann": {"access": "allowed", "grants": ["deploy-docs"]},
                "bob": {"access": "blocked"},
                "cy": {},
            },
            "groups": {"eng": {"roster_id": ROSTER, "grants": ["review"]}},
            "assertions": [
                {"caller": "ann", "accept": ["review"]},
                {"caller": "bob", "deny": ["*"]},
                {"caller": "cy", "groups": ["eng"], "accept": ["review"], "deny": ["payroll"]},
            ],
        },
        {"version": 1, "default_access": "allowed", "callers": {"mallory": {"access": "blocked"}}},
        {"version": 2},
    ]


def ceiling_documents() -> list[Any]:
    """Administrator ceilings: every field, and the smallest valid one."""
    return [
        {
            "version": 1,
            "allowed_tasks": ["ask", "review"],
            "blocked_callers": ["mallory", "eve"],
            "max_tools": ["read", "fetch"],
            "assertions": [{"caller": "mallory", "deny": ["*"]}],
        },
        {"version": 1, "allowed_tasks": [], "max_tools": []},
    ]


def local_lines() -> list[Any]:
    """Every line of the local socket (a thin CLI and its service), each kind of ending."""
    return [
        local.LocalCall(target="ken", message="why did CI fail?"),
        local.LocalCall(
            target=KEN, message="and then?", task="ci-triage", continue_=True, queue=False
        ),
        local.LocalCall(target="ken", message="m", context_id="ctx_" + "A" * 22, timeout_ms=5000),
        local.LocalStatus(state="ringing", call_id=CALL_ID),
        local.LocalNote(text="could not publish your new encryption key"),
        local.LocalEnded(
            local.EndKind.ANSWER, KEN, CALL_ID, text="it timed out", context_id="ctx_" + "B" * 22
        ),
        local.LocalEnded(local.EndKind.QUEUED, KEN, job_id=CALL_ID, expires_at=NOW),
        local.LocalEnded(
            local.EndKind.FAILED, KEN, CALL_ID, code="task_unknown", detail="no", offered=("ask",)
        ),
        local.LocalEnded.refused("identity_changed", "the key changed", KEN),
        local.LocalJobs("list"),
        local.LocalJobs("list", "ken"),
        local.LocalJobs("get", "ken", CALL_ID, wait_s=120),
        local.LocalJobs("cancel", KEN, CALL_ID, wait_s=60),
        local.LocalProgress(f"waiting up to 120 s for job {CALL_ID}…"),
        local.LocalJobsEnded(NOW, jobs=(_job_info(False), _job_info(False))),
        local.LocalJobsEnded(
            NOW,
            KEN,
            info=attrs.evolve(_job_info(True), answer=None, terminal=None),
            result=local.LocalEnded(local.EndKind.ANSWER, KEN, CALL_ID, text="it timed out"),
        ),
        local.LocalJobsEnded(NOW, KEN, info=_job_info(False)),
        local.LocalJobsEnded.trouble(NOW, "not_found", "the relay knows no job 1 of yours", KEN),
    ]


def json_bytes(document: Any, *, indent: int | None = 2) -> bytes:
    """A document as an owner would write it (indented) or compact."""
    return json.dumps(document, indent=indent).encode("utf-8")


def wire_bytes(value: Any) -> bytes:
    return codec.encode(value)
