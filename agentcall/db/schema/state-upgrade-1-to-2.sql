-- state version 1 -> 2: the conversation tables (callee bindings and the caller's open
-- conversations). Existing pins and replay reservations are untouched.

-- Conversations this installation answers (callee side). The agent session is the agent CLI's
-- own id for resuming; it never leaves this machine.
CREATE TABLE contexts (
    context_id TEXT PRIMARY KEY NOT NULL,
    caller TEXT NOT NULL,
    task TEXT NOT NULL,
    agent_kind TEXT NOT NULL,
    workdir TEXT NOT NULL,
    agent_session TEXT NOT NULL,
    turns INTEGER NOT NULL,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL
);

CREATE INDEX contexts_by_last_used ON contexts (last_used_at);

-- Conversations this installation opened as a caller: one open conversation per peer and task.
CREATE TABLE contexts_out (
    relay_origin TEXT NOT NULL,
    peer TEXT NOT NULL,
    task TEXT NOT NULL,
    context_id TEXT NOT NULL UNIQUE,
    last_at REAL NOT NULL,
    PRIMARY KEY (relay_origin, peer, task)
);
