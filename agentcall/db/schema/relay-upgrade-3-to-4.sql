-- relay version 3 -> 4: members' last_seen and removal. Existing members are active and have
-- not been seen yet (the relay writes last_seen from now on).

-- last_seen: when a socket of this member last opened or closed (written in batches).
ALTER TABLE members ADD COLUMN last_seen REAL;

-- removed_at: an admin removed the member; the row stays so the handle stays reserved.
ALTER TABLE members ADD COLUMN removed_at REAL;

ALTER TABLE members ADD COLUMN removed_by TEXT CHECK (removed_by IS NULL OR removed_at IS NOT NULL);
