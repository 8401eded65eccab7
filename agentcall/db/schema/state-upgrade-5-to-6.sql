-- state version 5 -> 6: the newest card seen of each peer. Existing tables are untouched.

-- The issue time of the newest card (a peer's signed menu) this installation has shown as
-- genuine, so a relay cannot put an older one in front of it again (agentcall/caller/cardseen.py).
CREATE TABLE seen_cards (
    relay_origin TEXT NOT NULL,
    address TEXT NOT NULL,
    issued_at INTEGER NOT NULL,
    PRIMARY KEY (relay_origin, address)
);
