-- An installation's machine state, version 1. Times are seconds since the Unix epoch.
-- The engine adds the version table; agentcall/statedb.py holds every query. Later tables
-- (conversation bindings, the execution journal, outbound jobs) arrive as upgrade scripts.

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
