-- state version 3 -> 4: the caller's sent mailbox jobs. Existing tables are untouched.

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
