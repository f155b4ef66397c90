-- 0005: model token usage. A session sums what its turns used; turn_usage records each turn
-- once, which is what makes AddUsage idempotent (a re-sent write finds its turn recorded and
-- adds nothing).
ALTER TABLE sessions ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;

CREATE TABLE turn_usage (
    session_id    TEXT    NOT NULL REFERENCES sessions (id),
    turn_id       TEXT    NOT NULL,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, turn_id)
) WITHOUT ROWID;
