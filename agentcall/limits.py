"""Every numeric limit of the product, in one place.

Sizes are bytes, durations are seconds (floats where Twisted wants them).
"""

from __future__ import annotations

import math

# Message and reply sizes (UTF-8 bytes of the text the people typed or the agent wrote).
MAX_MESSAGE_BYTES = 64_000
MAX_REPLY_BYTES = 256_000
MAX_DETAIL_CHARS = 500
MAX_OFFERED_TASKS = 50
MAX_TASK_ID_LENGTH = 64

# Sealed envelopes: the plaintext is JSON, so the worst case escapes every byte as \u00XX (x6),
# plus room for the signature and the other payload fields. The ciphertext is base64url (4/3)
# inside a JSON frame with a small header.
_ENVELOPE_OVERHEAD = 8_192
MAX_REQUEST_CIPHERTEXT_BYTES = MAX_MESSAGE_BYTES * 6 + _ENVELOPE_OVERHEAD
MAX_RESPONSE_CIPHERTEXT_BYTES = MAX_REPLY_BYTES * 6 + _ENVELOPE_OVERHEAD
_FRAME_OVERHEAD = 4_096
MAX_REQUEST_FRAME_BYTES = math.ceil(MAX_REQUEST_CIPHERTEXT_BYTES * 4 / 3) + _FRAME_OVERHEAD
MAX_RESPONSE_FRAME_BYTES = math.ceil(MAX_RESPONSE_CIPHERTEXT_BYTES * 4 / 3) + _FRAME_OVERHEAD
# The caller's key records a relay attaches to incoming_call and job_delivery (caller_keys): two
# signed records of a few hundred bytes each; the longest relay origin and address the wire
# allows keep them under 2 KiB, so this leaves room.
MAX_CALLER_KEYS_BYTES = 4_096
# What a listener accepts from its relay: the larger of the largest request the relay lets
# through, as an incoming_call with the caller's records attached, and the largest answer to one
# of the installation's own outgoing calls (on its persistent socket).
MAX_TO_LISTENER_FRAME_BYTES = max(
    MAX_REQUEST_FRAME_BYTES + MAX_CALLER_KEYS_BYTES, MAX_RESPONSE_FRAME_BYTES
)
# Any frame at all (the decoder's hard cap, before JSON parsing).
MAX_FRAME_BYTES = MAX_RESPONSE_FRAME_BYTES
# Control frames (status, accepted, started, ...) never need more than this.
MAX_CONTROL_FRAME_BYTES = 4_096
# HTTP request bodies the relay accepts (keys, invites, registration).
MAX_HTTP_BODY_BYTES = 16_384

# The signed card (agentcall.wire.http.CardRecord): what every member of the organisation sees
# of an installation. Sized so the largest card, every character JSON-escaped, fits in one
# HTTP body (a test checks it).
MAX_CARD_TASKS = 32
MAX_CARD_NAME_BYTES = 200  # a task's name, UTF-8
MAX_CARD_SUMMARY_BYTES = 300  # a task's one-line description, UTF-8
MAX_CARD_TEXT_BYTES = 6_000  # ids, names and summaries of all its tasks together
CARD_CHECK_INTERVAL_S = 10.0  # how often the listener looks for a changed card

# Time.
CALL_DEADLINE_S = 360.0  # relay deadline per call; also the longest validity of a request
AGENT_TIMEOUT_S = 300.0  # agent kill timer (a task may lower it)
KILL_GRACE_S = 10.0  # SIGTERM to the group, then SIGKILL this much later
CLIENT_CALL_TIMEOUT_S = 420.0  # the caller CLI gives up after this
CLOCK_SKEW_S = 120.0  # issued_at may be this far in the future; replay entries live this long
REPLAY_MAX_ENTRIES = 100_000  # live reservations; a queueable request holds one for 72 h
MAX_KEY_VALIDITY_S = 30 * 24 * 3600  # encryption key records
KEY_ROTATE_BEFORE_S = 7 * 24 * 3600  # rotate when less than this validity remains
# A caller reuses a callee's key records it keeps (caller/keycache.py) until the callee may be
# rotating (the last KEY_ROTATE_BEFORE_S of the record's window); from then on it asks the relay
# again at most this often.
KEY_CACHE_REFETCH_S = 3600.0

# Keepalive (WebSocket ping/pong) so dead peers are noticed.
KEEPALIVE_INTERVAL_S = 30.0
KEEPALIVE_TIMEOUT_S = 20.0
WS_OPENING_HANDSHAKE_TIMEOUT_S = 10.0

# Rate limits.
CALLS_PER_HOUR_PER_PAIR = 30
RATE_WINDOW_S = 3600.0

# Invites.
INVITE_DEFAULT_DAYS = 7
INVITE_MIN_DAYS = 1
INVITE_MAX_DAYS = 90
MAX_ACTIVE_INVITES_PER_ORG = 100
MAX_INVITE_DESCRIPTION_CHARS = 100
MAX_INVITES_LISTED = 200

# Recoveries of one address the relay keeps (and serves with its keys) so that a caller who
# pinned any earlier identity can walk to the current one.
MAX_RECOVERY_LINKS = 16
# A recovery statement is accepted this long either side of the relay's clock.
RECOVERY_STATEMENT_SKEW_S = 600

# Members: `GET /v1/members` answers a page at a time (sorted by handle).
MAX_MEMBERS_LISTED = 500
# Last-seen times wait in memory and are written in batches: this often, or at this many.
LAST_SEEN_FLUSH_S = 60.0
LAST_SEEN_MAX_PENDING = 1000

# Listener.
MAX_RUNNING_CALLS = 1
MAX_WAITING_CALLS = 0
MAX_STDOUT_BYTES = 10 * 1024 * 1024
MAX_STDERR_BYTES = 1024 * 1024
# Reconnecting to the relay ("full jitter", agentcall.listener.connection.reconnect_delay):
# attempt n waits a uniform time in [RECONNECT_MIN_S, window) with window
# FIRST_WINDOW * 1.5**(n-1) capped at RECONNECT_MAX_S, so 10,000 listeners that lost the relay at
# once come back spread over the first 10 s (about 1,000 a second, what one relay process takes
# on a 2-core machine: with 4 s, four in five dials of a 10,000-listener storm were turned away
# and dialled again, bench/storm_bench.py), and those turned away over 15 s, 22.5 s, ...; a
# Retry-After from the relay is honoured (up to RECONNECT_MAX_S) plus up to RECONNECT_JITTER_S.
RECONNECT_MIN_S = 0.25
RECONNECT_FIRST_WINDOW_S = 10.0
RECONNECT_MAX_S = 60.0
RECONNECT_JITTER_S = 0.5

# Conversations.
CONTEXT_TTL_S = 30 * 60.0
MAX_CONTEXT_TURNS = 10
MAX_CONTEXTS = 100

# Offline mailbox (the relay keeps sealed requests for a callee who is offline or busy).
MAILBOX_TTL_S = 72 * 3600.0  # request and answer ciphertext is kept at most this long
MAILBOX_METADATA_GRACE_S = 24 * 3600.0  # then the job's metadata stays visible this much longer
MAILBOX_LEASE_S = 30.0  # a delivery not accepted (or a run not renewed) within this lapses
MAILBOX_MAX_ATTEMPTS = 3  # deliveries of one job before it ends delivery_failed
MAILBOX_MAX_OUTSTANDING_PER_CALLER = 10  # queued, delivered or running; the 11th gets busy
# Per callee: enough for ten callers each at their own cap above, so the per-caller cap is what
# a well-behaved org meets first; the callee cap only bounds a crowd.
MAILBOX_MAX_QUEUED_PER_CALLEE = 100
# Per callee, bytes of sealed requests held: 16 MiB is about 40 requests of the largest size
# (MAX_REQUEST_CIPHERTEXT_BYTES, ~383 KiB) and thousands of ordinary ones, so a flood of huge
# requests stops well before the count cap while one callee can cost the relay's disk at most
# 16 MiB for 72 hours. Larger than one largest request, so every valid request can be queued.
MAILBOX_MAX_QUEUED_BYTES_PER_CALLEE = 16 * 1024 * 1024
# The longest a sealed request or answer may stay valid: a queued job's whole life. Requests
# that may be queued, and the answers to jobs, are sealed for this long; the callee's replay
# memory and both sides' old encryption keys are kept at least this long after their use.
MAX_ENVELOPE_VALIDITY_S = MAILBOX_TTL_S
MAILBOX_RENEW_S = 10.0  # a running job's listener renews its lease this often (a third of it)
MAILBOX_MAX_WAIT_S = 30.0  # GET /v1/jobs/<id>?wait=N holds the request at most this long
MAX_JOBS_LISTED = 200  # GET /v1/jobs returns at most this many, newest first
# At start-up the relay gives every held lease (delivered or running job) at least this long
# from now: leases that lapsed while it was down must not fail running jobs before any listener
# could reconnect. Longer than a listener's longest reconnect delay (RECONNECT_MAX_S plus
# jitter) plus one lease, in which its renew or result arrives.
MAILBOX_RESTART_GRACE_S = 120.0
# A listener's jobs_held lists at most this many jobs (those it runs and those whose result the
# relay has not acknowledged; a handful in practice). One holding more says nothing, and its
# leases lapse as they would for a listener that predates jobs_held.
MAILBOX_MAX_JOBS_HELD = 1000

# Relay HTTP client timeout.
HTTP_TIMEOUT_S = 10.0

# The relay's front door (each one a `twistd agentcall-relay` option).
HEAD_TIMEOUT_S = 10.0  # a whole request head (and body) must arrive within this
CALL_REQUEST_TIMEOUT_S = 10.0  # a caller socket sends its call_request this soon after ready
MAX_CONNECTIONS_PER_SOURCE = 64
MAX_CALLERS_PER_IDENTITY = 8
MAX_OUTGOING_CALLS_PER_SOCKET = 8  # calls one installation places at once on its own socket
MAX_CONNECTIONS_IN_HEAD = 256  # connections still sending their first request head (or upgrade)
# At that cap the oldest unfinished connection is evicted for a newcomer, whatever its age; while
# every one is younger than this (most likely honest clients mid-handshake in a reconnect
# storm), newcomers wait in the kernel's accept queue instead (the accept valve).
HEAD_EVICT_AFTER_S = 2.0
# WebSocket upgrades between the request and `ready` (their credentials being checked); more are
# answered 503 with a Retry-After of UPGRADE_RETRY_MIN_S..UPGRADE_RETRY_MAX_S, before any lookup.
MAX_UPGRADES_IN_FLIGHT = 64
UPGRADE_RETRY_MIN_S = 1
UPGRADE_RETRY_MAX_S = 10
FD_RESERVE = 128  # descriptors kept free under RLIMIT_NOFILE for the database, logs and refusals
REGISTER_PER_MINUTE = 30  # POST /v1/register attempts per source address (bucket size and rate)
AUTH_FAILURES_PER_MINUTE = 20  # failed authentications per source address before 429

# The service's local socket (a thin `agentcall call` hands its call to the running service).
# A request line holds at most one message, JSON-escaped (x6 in the worst case), and a little.
MAX_LOCAL_REQUEST_BYTES = MAX_MESSAGE_BYTES * 6 + 4_096
# An event line: the final one holds a reply, JSON-escaped, and the rest of the outcome.
MAX_LOCAL_EVENT_BYTES = MAX_REPLY_BYTES * 6 + 64 * 1024
LOCAL_REQUEST_TIMEOUT_S = 10.0  # a client that connects must send its request within this
LOCAL_MAX_CLIENTS = 32  # connections the service serves at once; more are closed at once
LOCAL_CONNECT_TIMEOUT_S = 2.0  # the CLI gives up on a service that does not accept
# The CLI waits this much beyond its --timeout for the service to report how the call ended.
LOCAL_RESULT_MARGIN_S = 30.0
# Audit rows the relay batches (agentcall.relay.audit.BatchingAuditSink): a batch is written
# this long after its first row, or at the next reactor turn once it holds AUDIT_BATCH_ROWS.
AUDIT_WINDOW_S = 0.01
AUDIT_BATCH_ROWS = 256
AUDIT_MAX_PENDING = 10_000  # rows kept while the database refuses them; older ones are dropped
AUDIT_RETRY_S = 5.0  # a failed batch is tried again this much later
# Retention (agentcall.relay.retention): audit rows and ended invites older than this are
# pruned once a day (the relay option --audit-retention-days), except what a legal hold covers.
AUDIT_RETENTION_DAYS = 365
AUDIT_RETENTION_MAX_DAYS = 36_500
RETENTION_EVERY_S = 86_400.0
RETENTION_BATCH_ROWS = 5_000  # rows deleted per transaction; the reactor runs in between
AUDIT_EXPORT_PAGE = 500  # rows an export reads from the store at a time
MAX_AUDIT_HOLDS = 1_000  # legal holds per organisation
MAX_HOLD_NOTE_CHARS = 200
