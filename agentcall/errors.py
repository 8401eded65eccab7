"""Error codes shared by the relay, the listener and the CLI, and the exception tree.

Codes are part of the wire protocol: they travel in ``call_error`` frames, in sealed failure
outcomes and in HTTP error bodies, so their string values never change.
"""

from __future__ import annotations

import enum


class CallErrorCode(enum.StrEnum):
    """Why a call did not produce a reply."""

    # Relay-originated (unauthenticated, in ``call_error``).
    UNKNOWN_HANDLE = "unknown_handle"
    OFFLINE = "offline"
    TIMEOUT = "timeout"
    CANCELED = "canceled"
    UNAUTHORIZED = "unauthorized"
    RATE_LIMITED = "rate_limited"
    MESSAGE_TOO_LARGE = "message_too_large"
    PROTOCOL_ERROR = "protocol_error"
    # The relay cannot write its store: its disk is full (or the filesystem is read-only) ...
    STORAGE_FULL = "storage_full"
    # ... or the store fails otherwise (an I/O error, a database it cannot reach). Both pass.
    UNAVAILABLE = "unavailable"
    # The callee's listener disconnected during a live call, before it answered.
    CALLEE_GONE = "callee_gone"
    # Peer-originated (inside an authenticated, sealed failure outcome).
    BUSY = "busy"
    AGENT_ERROR = "agent_error"
    BLOCKED = "blocked"
    TASK_UNKNOWN = "task_unknown"
    TASK_NOT_OFFERED = "task_not_offered"
    CONTEXT_UNKNOWN = "context_unknown"
    # Caller-side only: the relay could not be reached.
    CONNECTION_FAILED = "connection_failed"
    # How a mailbox job ended without an answer (agentcall.relay.mailbox), as `jobs get` says it.
    DELIVERY_FAILED = "delivery_failed"  # no delivery was taken within its lease, 3 times
    INDETERMINATE_EXECUTION = "indeterminate_execution"  # accepted, then lost: it may have run
    REVOKED = "revoked"  # the caller or the callee left the organisation
    EXPIRED = "expired"  # not answered within 72 hours


RELAY_CALL_ERRORS = frozenset(
    {
        CallErrorCode.UNKNOWN_HANDLE,
        CallErrorCode.OFFLINE,
        CallErrorCode.TIMEOUT,
        CallErrorCode.CANCELED,
        CallErrorCode.UNAUTHORIZED,
        CallErrorCode.RATE_LIMITED,
        CallErrorCode.MESSAGE_TOO_LARGE,
        CallErrorCode.PROTOCOL_ERROR,
        CallErrorCode.BUSY,
        # A live call whose caller or callee an admin removed from the organisation.
        CallErrorCode.REVOKED,
        CallErrorCode.STORAGE_FULL,
        CallErrorCode.UNAVAILABLE,
        CallErrorCode.CALLEE_GONE,
    }
)

PEER_FAILURE_CODES = frozenset(
    {
        CallErrorCode.BUSY,
        CallErrorCode.TIMEOUT,
        CallErrorCode.AGENT_ERROR,
        CallErrorCode.BLOCKED,
        CallErrorCode.TASK_UNKNOWN,
        CallErrorCode.TASK_NOT_OFFERED,
        CallErrorCode.CONTEXT_UNKNOWN,
        CallErrorCode.CANCELED,
        # The listener stopped while the agent worked: it may have acted, and will not go on.
        CallErrorCode.INDETERMINATE_EXECUTION,
    }
)


class ApiErrorCode(enum.StrEnum):
    """Error codes in relay HTTP error bodies ``{"error": code, "message": text}``."""

    BAD_REQUEST = "bad_request"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BODY_TOO_LARGE = "body_too_large"
    INVITE_UNKNOWN = "invite_unknown"
    INVITE_USED = "invite_used"
    INVITE_REVOKED = "invite_revoked"
    INVITE_EXPIRED = "invite_expired"
    TOO_MANY_INVITES = "too_many_invites"
    HANDLE_INVALID = "handle_invalid"
    HANDLE_TAKEN = "handle_taken"
    IDENTITY_KEY_EXISTS = "identity_key_exists"
    IDENTITY_KEY_MISSING = "identity_key_missing"
    EPOCH_NOT_INCREASING = "epoch_not_increasing"
    SIGNATURE_INVALID = "signature_invalid"
    RECORD_INVALID = "record_invalid"
    RATE_LIMITED = "rate_limited"
    UPGRADE_REQUIRED = "upgrade_required"
    LAST_ADMIN = "last_admin"  # the change would leave the organisation without an admin
    HANDLE_BUSY = "handle_busy"  # a release while the relay still keeps jobs of the handle
    # One refusal for every reason a recovery fails (unknown handle, no recovery key, a bad
    # code), so the unauthenticated route tells a guesser nothing.
    RECOVERY_REFUSED = "recovery_refused"
    JOB_ENDED = "job_ended"  # cancel of a mailbox job that has already ended
    CARD_NOT_NEWER = "card_not_newer"  # a card dated no later than the one the relay keeps
    TOO_MANY_HOLDS = "too_many_holds"  # past limits.MAX_AUDIT_HOLDS legal holds
    # The relay cannot write its store (503): out of space, or failing otherwise.
    STORAGE_FULL = "storage_full"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class AgentCallError(Exception):
    """Base of every error this package raises on purpose."""


class MalformedFrame(AgentCallError):
    """Any input at the wire boundary that is not exactly one valid frame or body."""


class CryptoError(AgentCallError):
    """An envelope or key record failed a cryptographic or binding check."""


class KeyRecordInvalid(CryptoError):
    """A published key record is malformed, badly signed, or outside its validity."""


class CardInvalid(CryptoError):
    """A published card is badly signed, names another address, relay or key, or is older
    than one already seen: it must not be shown as what its owner published."""


class EnvelopeInvalid(CryptoError):
    """An envelope could not be opened, or its contents do not match its route."""


class SignatureInvalid(CryptoError):
    """A signature does not verify against the pinned identity key."""


class RequestExpired(CryptoError):
    """A request or response is outside its validity window."""


class ReplayDetected(CryptoError):
    """A request id was already used by this sender."""


class IdentityChanged(CryptoError):
    """A peer's identity key differs from the pinned one: a hard error until reset."""


class EpochRollback(CryptoError):
    """A peer's encryption key epoch is lower than one already seen."""


class StoreError(AgentCallError):
    """A persistent store could not be read or written."""


class LoggedInAggregate(AgentCallError):
    """A failure already logged where it is counted (one line per storage episode, a tally of
    dropped rows): :meth:`agentcall.logevents.Logger.failure` writes one debug line for it, not
    a traceback, so that every request meanwhile does not add one."""


class StorageFault(StoreError, LoggedInAggregate):
    """The store's storage itself failed (no space, read-only, I/O error, unreachable): the
    request was sound and may succeed later, unlike a store refusing bad data.

    ``code`` is what the asker is told: :attr:`CallErrorCode.STORAGE_FULL` or
    :attr:`CallErrorCode.UNAVAILABLE` (the API uses the same strings).
    """

    def __init__(self, code: CallErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class ApiError(AgentCallError):
    """A relay API refusal, carried to the HTTP layer as a status and a code."""

    def __init__(self, status: int, code: ApiErrorCode, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class KeyRecordExpired(KeyRecordInvalid):
    """A published encryption key's validity ended: its owner has not renewed it in time.

    ``not_after`` (Unix seconds) lets the message say when, and so how long ago.
    """

    def __init__(self, message: str, not_after: int) -> None:
        super().__init__(message)
        self.not_after = not_after
