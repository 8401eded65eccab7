-- relay version 6 -> 7: members' signed cards. Existing tables are untouched; no member has a
-- card until their listener (or `agentcall card --publish`) publishes one.

-- Each member's signed card (agentcall.wire.http.SignedCardRecord), the newest only: what the
-- organisation sees of their installation. Verified against the published identity before it
-- is stored; withdrawn with the keys when the member is removed, and deleted when a recovery
-- replaces the identity key that signed it.
CREATE TABLE cards (
    org TEXT NOT NULL,
    handle TEXT NOT NULL,
    record_json TEXT NOT NULL,
    issued_at INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (org, handle),
    FOREIGN KEY (org, handle) REFERENCES identity_keys (org, handle)
);
