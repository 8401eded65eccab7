-- relay version 7 -> 8: the storage probe. Existing tables are untouched.

-- One row the relay rewrites to learn whether its storage takes writes again after a failure
-- (a full disk, a read-only filesystem): a read answers even then, so only a write can tell.
-- The ballast is as large as the largest answer the relay stores, so that a probe fitting in
-- what the database file already has does not end the failure while such a write still fails.
CREATE TABLE store_probe (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    written_at REAL NOT NULL,
    ballast BLOB
);
