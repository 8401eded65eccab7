-- relay version 5 -> 6: legal holds on audit rows. No hold stands after the upgrade.

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
