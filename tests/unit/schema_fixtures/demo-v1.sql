-- Synthetic schema for the engine tests, version 1.
CREATE TABLE notes (
    id INTEGER PRIMARY KEY,
    body TEXT NOT NULL
);
