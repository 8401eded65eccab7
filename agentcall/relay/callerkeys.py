"""The caller's key records a relay attaches to ``incoming_call`` and ``job_delivery``.

A listener needs its caller's identity record (to verify the request's signature) and newest
encryption record (to seal the answer). Attached to the frame, they spare it a
``GET /v1/keys/<caller>`` on every call. The relay is no more trusted for them here than on
that route: the listener verifies them against its pin and their signatures exactly as records
it fetched (``agentcall.listener.stages.open_envelope``).

Attaching is an optimisation, never a condition: when the store cannot answer, or the caller
has no encryption record, the frame goes without them and the listener fetches, as it does from
an older relay.
"""

from __future__ import annotations

from twisted.internet import defer
from twisted.python.failure import Failure

from agentcall.logevents import Logger
from agentcall.relay.store_interface import KeySource
from agentcall.wire.keyrecords import KeysResponse

_log = Logger(namespace="agentcall.relay.callerkeys")


def attachable_keys(
    source: KeySource | None, org: str, handle: str
) -> defer.Deferred[KeysResponse | None]:
    """``@org/handle``'s records to attach, or None (no source, none published, a failure).

    The Deferred never fails.
    """
    if source is None:
        return defer.succeed(None)

    def complete(found: KeysResponse | None) -> KeysResponse | None:
        # Without an encryption record the listener cannot answer anyway; it fetches and says so.
        return found if found is not None and found.encryption is not None else None

    def failed(failure: Failure) -> None:
        _log.warn(
            "caller_keys_unavailable",
            org=org,
            caller=handle,
            reason=failure.type.__name__ if failure.type else "unknown",
        )

    return defer.maybeDeferred(source.fetch_keys, org, handle).addCallbacks(complete, failed)
