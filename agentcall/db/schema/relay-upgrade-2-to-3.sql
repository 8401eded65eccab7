-- relay version 2 -> 3: jobs.lapsed. Existing rows are kept and marked not lapsed: a job a
-- version 2 relay failed keeps its verdict (the conservative reading of a row that cannot say).

-- lapsed: the relay failed the running job when its lease lapsed (its listener reported
-- nothing), so a result the listener sends before expiry may still replace that verdict.
ALTER TABLE jobs ADD COLUMN lapsed INTEGER NOT NULL DEFAULT 0 CHECK (lapsed IN (0, 1)
    AND (lapsed = 0 OR (state = 'failed' AND reason = 'indeterminate_execution')));
