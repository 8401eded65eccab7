"""The relay's audit trail: the fixed vocabulary of events, one entry, and where it is written.

An audit row is metadata: who did what to whom and when. It never carries message content,
bearer tokens or invite secrets; the store refuses any event not named here.
"""

from __future__ import annotations

from typing import Protocol

import attrs
from twisted.internet.defer import Deferred

INVITE_ISSUE = "invite.issue"
INVITE_REDEEM = "invite.redeem"
INVITE_REVOKE = "invite.revoke"
MEMBER_REGISTER = "member.register"
# The member turned the offline mailbox on or off; detail "on" or "off".
MEMBER_OFFLINE_DELIVERY = "member.offline_delivery"
KEYS_IDENTITY_PUBLISH = "keys.identity.publish"
KEYS_ENCRYPTION_PUBLISH = "keys.encryption.publish"
CALL_SUBMIT = "call.submit"
CALL_ACCEPT = "call.accept"
CALL_COMPLETE = "call.complete"
CALL_FAIL = "call.fail"
CALL_CANCEL = "call.cancel"
CALL_TIMEOUT = "call.timeout"
# The offline mailbox (agentcall.relay.mailbox): one row per job transition; call_id is the job id.
JOB_QUEUE = "job.queue"
JOB_DELIVER = "job.deliver"
JOB_ACCEPT = "job.accept"
JOB_COMPLETE = "job.complete"
JOB_FAIL = "job.fail"
JOB_EXPIRE = "job.expire"
JOB_CANCEL = "job.cancel"
# One row per source address and minute with a count; target is the address, never a token.
AUTH_FAILED = "auth.failed"

# The org column of rows about the relay as a whole (no organisation was proven).
RELAY_WIDE = ""

EVENTS = frozenset(
    {
        INVITE_ISSUE,
        INVITE_REDEEM,
        INVITE_REVOKE,
        MEMBER_REGISTER,
        MEMBER_OFFLINE_DELIVERY,
        KEYS_IDENTITY_PUBLISH,
        KEYS_ENCRYPTION_PUBLISH,
        CALL_SUBMIT,
        CALL_ACCEPT,
        CALL_COMPLETE,
        CALL_FAIL,
        CALL_CANCEL,
        CALL_TIMEOUT,
        JOB_QUEUE,
        JOB_DELIVER,
        JOB_ACCEPT,
        JOB_COMPLETE,
        JOB_FAIL,
        JOB_EXPIRE,
        JOB_CANCEL,
        AUTH_FAILED,
    }
)


@attrs.frozen
class AuditEntry:
    """One audit row as a core writes it (the store adds its id)."""

    event: str
    org: str
    actor: str | None
    target: str | None
    call_id: str | None
    at: float
    detail: str | None = None


class AuditSink(Protocol):
    """Where the relay writes audit rows: metadata only, never message content.

    Writers fire and forget: they add an errback that logs, so a failed write is never
    unhandled and never stops what was being audited.
    """

    def record(self, entry: AuditEntry) -> Deferred[None]:
        """Append one row; its event is from :data:`EVENTS`."""
        ...
