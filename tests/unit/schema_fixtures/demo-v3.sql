CREATE TABLE tags (
    note_id INTEGER NOT NULL REFERENCES notes (id),
    tag TEXT NOT NULL,
    PRIMARY KEY (note_id, tag)
);

CREATE INDEX tags_by_tag ON tags (tag);

CREATE TABLE notes (
    id INTEGER PRIMARY KEY,
    body TEXT NOT NULL,
    created_at REAL NOT NULL
);

CREATE TRIGGER notes_body_kept BEFORE UPDATE OF body ON notes
BEGIN
    SELECT RAISE(ABORT, 'note bodies are never edited');
END;

CREATE INDEX notes_by_time ON notes (created_at);
