-- state version 4 -> 5: the callees' key records the caller keeps. Existing tables are untouched.

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
