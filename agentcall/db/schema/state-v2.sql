-- An installation's machine state, version 2. Times are seconds since the Unix epoch.
-- The engine adds the version table; agentcall/statedb.py, agentcall/listener/contexts.py and
-- agentcall/outbound.py hold every query. Version 2 added the two conversation tables.

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
