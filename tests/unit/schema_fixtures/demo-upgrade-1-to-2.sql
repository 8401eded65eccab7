-- v2 adds a column, a second table with a foreign key, an index and a trigger.
ALTER TABLE notes ADD COLUMN created_at REAL;

CREATE TABLE tags (
    note_id INTEGER NOT NULL REFERENCES notes (id),
    tag TEXT NOT NULL,
    PRIMARY KEY (note_id, tag)
);

CREATE INDEX tags_by_tag ON tags (tag);

CREATE TRIGGER notes_body_kept BEFORE UPDATE OF body ON notes
BEGIN
    SELECT RAISE(ABORT, 'note bodies are never edited');
END;
