-- state version 2 -> 3: the listener's execution journal for mailbox jobs. Existing tables are
-- untouched.

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
