-- v3 makes created_at NOT NULL, which SQLite can only do by rebuilding the table while the
-- tags table still points at it (the engine turns foreign keys off during upgrades).
CREATE TABLE notes_new (
    id INTEGER PRIMARY KEY,
    body TEXT NOT NULL,
    created_at REAL NOT NULL
);

INSERT INTO notes_new (id, body, created_at) SELECT id, body, COALESCE(created_at, 0) FROM notes;

DROP TABLE notes;

ALTER TABLE notes_new RENAME TO notes;

CREATE TRIGGER notes_body_kept BEFORE UPDATE OF body ON notes
BEGIN
    SELECT RAISE(ABORT, 'note bodies are never edited');
END;

CREATE INDEX notes_by_time ON notes (created_at);
