-- relay version 4 -> 5: members' signed cards. Existing tables are untouched; no member has a
-- card until their listener (or `agentcall card --publish`) publishes one.

CREATE TABLE cards (
    org TEXT NOT NULL,
    handle TEXT NOT NULL,
    record_json TEXT NOT NULL,
    issued_at INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (org, handle),
    FOREIGN KEY (org, handle) REFERENCES identity_keys (org, handle)
);
