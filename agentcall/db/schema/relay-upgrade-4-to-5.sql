-- relay version 4 -> 5: recovery. Identity records may be re-signed by the same key to name a
-- recovery key (never changed to another key), and recoveries are kept as links.

DROP TRIGGER identity_keys_never_replaced;

CREATE TRIGGER identity_pub_never_changes BEFORE UPDATE ON identity_keys
WHEN NEW.identity_pub != OLD.identity_pub
BEGIN
    SELECT RAISE(ABORT, 'identity keys are never replaced');
END;

-- Each recovery of a member, oldest first: the old identity's last record (naming the recovery
-- key) and the statement that key signed.
CREATE TABLE recovery_links (
    org TEXT NOT NULL,
    handle TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 1),
    previous_json TEXT NOT NULL,
    statement_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (org, handle, seq),
    FOREIGN KEY (org, handle) REFERENCES members (org, handle)
);
