-- An installation's machine state, version 6. Times are seconds since the Unix epoch.
-- The engine adds the version table; agentcall/statedb.py, agentcall/listener/contexts.py,
-- agentcall/listener/journal.py, agentcall/caller/outboundstore.py and
-- agentcall/caller/jobstore.py, agentcall/caller/keycache.py and agentcall/caller/cardseen.py hold
-- every query.
-- Version 2 added the two conversation tables, version 3 the execution journal, version 4 the
-- caller's sent mailbox jobs, version 5 the callees' key records the caller keeps, version 6 the
-- issue time of the newest card seen of each peer.

-- Trust on first use: one pinned identity key per peer, and the highest epoch seen from it.
CREATE TABLE pins (
    relay_origin TEXT NOT NULL,
    address TEXT NOT NULL,
    identity_pub TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    first_seen_at INTEGER NOT NULL,
    highest_epoch INTEGER NOT NULL CHECK (highest_epoch >= 1),
    PRIMARY KEY (relay_origin, address)
);

-- Replay reservations: a request id opened from a sender is kept until keep_until, so the
-- same sealed request is refused even after the listener restarts.
CREATE TABLE replay (
    sender_fingerprint TEXT NOT NULL,
    request_id TEXT NOT NULL,
    keep_until REAL NOT NULL,
    PRIMARY KEY (sender_fingerprint, request_id)
);

CREATE INDEX replay_by_keep_until ON replay (keep_until);

-- Conversations this installation answers (callee side). The agent session is the agent CLI's
-- own id for resuming; it never leaves this machine.
CREATE TABLE contexts (
    context_id TEXT PRIMARY KEY NOT NULL,
    caller TEXT NOT NULL,
    task TEXT NOT NULL,
    agent_kind TEXT NOT NULL,
    workdir TEXT NOT NULL,
    agent_session TEXT NOT NULL,
    turns INTEGER NOT NULL,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL
);

CREATE INDEX contexts_by_last_used ON contexts (last_used_at);

-- Conversations this installation opened as a caller: one open conversation per peer and task.
CREATE TABLE contexts_out (
    relay_origin TEXT NOT NULL,
    peer TEXT NOT NULL,
    task TEXT NOT NULL,
    context_id TEXT NOT NULL UNIQUE,
    last_at REAL NOT NULL,
    PRIMARY KEY (relay_origin, peer, task)
);

-- One row per mailbox job this listener accepted, written before its agent starts, so a job is
-- run at most once (agentcall/listener/journal.py). reply_sealed is the sealed answer
-- (ciphertext only); reply_error an error code; a stored reply has exactly one of them. Rows
-- are pruned MAILBOX_TTL_S (72 h) after acceptance.
CREATE TABLE journal (
    job_id TEXT PRIMARY KEY NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('accepted', 'started', 'sealed', 'acknowledged')),
    accepted_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    reply_sealed BLOB,
    reply_error TEXT,
    CHECK ((reply_sealed IS NULL) + (reply_error IS NULL)
        = (CASE WHEN state IN ('sealed', 'acknowledged') THEN 1 ELSE 2 END))
);

CREATE INDEX journal_by_accepted_at ON journal (accepted_at);

-- Mailbox jobs this installation queued as a caller, so their answers can be opened later:
-- the request as sent (the encoded RequestPayload, message included: the answer is verified
-- against its hash) and the callee's identity key pinned when it was sealed. This file is the
-- caller's own (0600); rows are pruned MAILBOX_METADATA_GRACE_S (24 h) after the job expires.
CREATE TABLE jobs_out (
    relay_origin TEXT NOT NULL,
    job_id TEXT NOT NULL,
    address TEXT NOT NULL,
    request BLOB NOT NULL,
    identity_pub TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (relay_origin, job_id)
);

CREATE INDEX jobs_out_by_expires_at ON jobs_out (expires_at);

-- The key records of callees this installation called (public records only: the encoded
-- KeysResponse the relay served, identity and newest encryption epoch), reused for later calls
-- without asking the relay (agentcall/caller/keycache.py). Trust stays with the pins above:
-- cached records are checked against them on every use.
CREATE TABLE peer_keys (
    relay_origin TEXT NOT NULL,
    address TEXT NOT NULL,
    records BLOB NOT NULL,
    fetched_at REAL NOT NULL,
    PRIMARY KEY (relay_origin, address)
);

-- The issue time of the newest card (a peer's signed menu) this installation has shown as
-- genuine, so a relay cannot put an older one in front of it again (agentcall/caller/cardseen.py).
CREATE TABLE seen_cards (
    relay_origin TEXT NOT NULL,
    address TEXT NOT NULL,
    issued_at INTEGER NOT NULL,
    PRIMARY KEY (relay_origin, address)
);
