-- The relay's registry, version 8: version 7 plus the storage probe (store_probe). Version 7
-- added members' signed cards, version 6 legal holds on audit rows, version 5 recovery (an
-- identity record may be re-signed to name a recovery key; recovery_links). Times are seconds
-- since the Unix epoch.
-- The engine adds the version table; agentcall/relay/store.py holds every query.

CREATE TABLE orgs (
    org TEXT PRIMARY KEY NOT NULL,
    created_at REAL NOT NULL
);

-- One row per enrolled installation. Only the SHA-256 of its bearer token is kept.
-- offline_delivery: the member's opt-in to the offline mailbox, off unless they turned it on.
-- last_seen: when a socket of this member last opened or closed (written in batches).
-- removed_at: an admin removed the member. The row stays so the handle stays reserved (nobody
-- else takes it and is mistaken for the old owner); its token no longer authenticates and its
-- keys are no longer served. Releasing the handle deletes the row and its keys.
CREATE TABLE members (
    org TEXT NOT NULL REFERENCES orgs (org),
    handle TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('member', 'admin')),
    token_hash TEXT NOT NULL,
    agent_kind TEXT CHECK (agent_kind IS NULL OR agent_kind IN ('claude', 'codex', 'command')),
    created_at REAL NOT NULL,
    offline_delivery INTEGER NOT NULL DEFAULT 0 CHECK (offline_delivery IN (0, 1)),
    last_seen REAL,
    removed_at REAL,
    removed_by TEXT CHECK (removed_by IS NULL OR removed_at IS NOT NULL),
    PRIMARY KEY (org, handle)
);

-- One-time invites, keyed by the SHA-256 of the secret; the secret itself is never stored.
-- Invite times are whole seconds because the API shows them as integers.
CREATE TABLE invites (
    id TEXT PRIMARY KEY NOT NULL,
    org TEXT NOT NULL REFERENCES orgs (org),
    role TEXT NOT NULL CHECK (role IN ('member', 'admin')),
    created_by TEXT,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    description TEXT,
    used_at REAL,
    used_by TEXT,
    revoked_at REAL,
    CHECK (used_at IS NULL OR revoked_at IS NULL)
);

CREATE INDEX invites_by_org ON invites (org, created_at);

-- The identity key of a member. Its record may be re-signed by the same key (to name a new
-- recovery key), never changed to another key: only a recovery replaces the row, with a link.
CREATE TABLE identity_keys (
    org TEXT NOT NULL,
    handle TEXT NOT NULL,
    record_json TEXT NOT NULL,
    identity_pub TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (org, handle),
    FOREIGN KEY (org, handle) REFERENCES members (org, handle)
);

CREATE TRIGGER identity_pub_never_changes BEFORE UPDATE ON identity_keys
WHEN NEW.identity_pub != OLD.identity_pub
BEGIN
    SELECT RAISE(ABORT, 'identity keys are never replaced');
END;

-- Each recovery of a member, oldest first: the old identity's last record (naming the recovery
-- key) and the statement that key signed. Served with the keys, so a caller who pinned an
-- earlier identity can walk to the current one. Deleted with the keys when a member goes.
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

-- Encryption keys by epoch; a new epoch must be above every stored one (clients pin epochs).
CREATE TABLE encryption_keys (
    org TEXT NOT NULL,
    handle TEXT NOT NULL,
    epoch INTEGER NOT NULL CHECK (epoch >= 1),
    key_id TEXT NOT NULL,
    record_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (org, handle, epoch),
    FOREIGN KEY (org, handle) REFERENCES identity_keys (org, handle)
);

CREATE TRIGGER encryption_epochs_only_go_up BEFORE INSERT ON encryption_keys
WHEN NEW.epoch <= (
    SELECT COALESCE(MAX(epoch), 0) FROM encryption_keys
    WHERE org = NEW.org AND handle = NEW.handle
)
BEGIN
    SELECT RAISE(ABORT, 'encryption key epochs only go up');
END;

CREATE TRIGGER encryption_keys_never_rewritten BEFORE UPDATE ON encryption_keys
BEGIN
    SELECT RAISE(ABORT, 'encryption key records are never rewritten');
END;

-- Metadata only: never message content, tokens or invite secrets.
CREATE TABLE audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    org TEXT NOT NULL,
    event TEXT NOT NULL,
    actor TEXT,
    target TEXT,
    call_id TEXT,
    detail TEXT
);

CREATE INDEX audit_by_org ON audit (org, id);

CREATE INDEX audit_by_org_time ON audit (org, at);

-- Legal holds (agentcall audit hold): retention prunes none of the audit rows a hold covers,
-- nor the invites. handle '' holds the whole organisation; any other handle holds the rows
-- naming it as actor or target (a handle, not a member: its events outlive its removal).
CREATE TABLE audit_holds (
    org TEXT NOT NULL REFERENCES orgs (org),
    handle TEXT NOT NULL,
    set_at REAL NOT NULL,
    set_by TEXT NOT NULL,
    note TEXT,
    PRIMARY KEY (org, handle)
);

-- The offline mailbox (agentcall/relay/mailbox.py): one row per job, exactly the fields of
-- mailbox.Job: metadata and sizes, never a sealed byte. A row is forgotten 24 h after expiry.
-- lapsed: the relay failed the running job when its lease lapsed (its listener reported
-- nothing), so a result the listener sends before expiry may still replace that verdict.
CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY NOT NULL,
    org TEXT NOT NULL,
    caller TEXT NOT NULL,
    callee TEXT NOT NULL,
    request_bytes INTEGER NOT NULL CHECK (request_bytes > 0),
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    state TEXT NOT NULL CHECK (state IN
        ('queued', 'delivered', 'running', 'answered', 'failed', 'cancelled', 'expired')),
    reason TEXT CHECK (reason IS NULL OR reason IN
        ('delivery_failed', 'indeterminate_execution', 'revoked', 'rejected')),
    attempts INTEGER NOT NULL CHECK (attempts >= 0),
    lease_until REAL,
    answer_bytes INTEGER,
    cancel_requested INTEGER NOT NULL CHECK (cancel_requested IN (0, 1)),
    holds_ciphertext INTEGER NOT NULL CHECK (holds_ciphertext IN (0, 1)),
    last_delivery INTEGER NOT NULL CHECK (last_delivery >= 0),
    lapsed INTEGER NOT NULL DEFAULT 0 CHECK (lapsed IN (0, 1)
        AND (lapsed = 0 OR (state = 'failed' AND reason = 'indeterminate_execution')))
);

-- The jobs a callee is sent (delivery, caps) and a caller sent (caps), newest first for lists.
CREATE INDEX jobs_by_callee ON jobs (org, callee, created_at);

CREATE INDEX jobs_by_caller ON jobs (org, caller, created_at);

-- What the sweep looks for: lapsing leases, expiry and forgetting.
CREATE INDEX jobs_by_lease ON jobs (lease_until) WHERE lease_until IS NOT NULL;

CREATE INDEX jobs_by_expiry ON jobs (expires_at);

-- The sealed bytes of a job, apart from its metadata: the encoded request envelope until the
-- job is answered or ends, then the answer envelope with its terminal until expiry. Ciphertext
-- and clear routing headers only; the relay holds no key that opens them.
CREATE TABLE job_sealed (
    job_id TEXT PRIMARY KEY NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    request BLOB,
    answer BLOB,
    terminal TEXT CHECK (terminal IS NULL OR terminal IN ('completed', 'failed')),
    CHECK ((answer IS NULL) = (terminal IS NULL)),
    CHECK (request IS NOT NULL OR answer IS NOT NULL)
);

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

-- One row the relay rewrites to learn whether its storage takes writes again after a failure
-- (a full disk, a read-only filesystem): a read answers even then, so only a write can tell.
-- The ballast is as large as the largest answer the relay stores, so that a probe fitting in
-- what the database file already has does not end the failure while such a write still fails.
CREATE TABLE store_probe (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    written_at REAL NOT NULL,
    ballast BLOB
);
