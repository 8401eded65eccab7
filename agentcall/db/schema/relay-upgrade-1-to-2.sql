-- relay version 1 -> 2: the offline mailbox. Existing rows are kept; every member starts opted out.

-- The member's opt-in to the offline mailbox: off unless they turned it on.
ALTER TABLE members ADD COLUMN offline_delivery INTEGER NOT NULL DEFAULT 0 CHECK (offline_delivery IN (0, 1));

-- The offline mailbox (agentcall/relay/mailbox.py): one row per job, exactly the fields of
-- mailbox.Job: metadata and sizes, never a sealed byte. A row is forgotten 24 h after expiry.
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
    last_delivery INTEGER NOT NULL CHECK (last_delivery >= 0)
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
