-- 0001: the initial schema. Times are INTEGER unix nanoseconds (UTC); NULL means "never".

-- sessions: one row per incarnation. The identity columns are written by the INSERT and never
-- updated (G1); sessions_identity_immutable enforces that in the database itself.
CREATE TABLE sessions (
    id               TEXT    NOT NULL PRIMARY KEY,
    key              TEXT    NOT NULL,
    platform         TEXT    NOT NULL DEFAULT '',
    chat_type        TEXT    NOT NULL DEFAULT '',
    chat_id          TEXT    NOT NULL DEFAULT '',
    thread_id        TEXT    NOT NULL DEFAULT '',
    user_id          TEXT    NOT NULL DEFAULT '',
    user_name        TEXT    NOT NULL DEFAULT '',
    scope_id         TEXT    NOT NULL DEFAULT '',
    profile          TEXT    NOT NULL DEFAULT '',
    started_at       INTEGER,
    last_activity_at INTEGER,
    ended_at         INTEGER,
    end_reason       TEXT    NOT NULL DEFAULT '',
    prev_session_id  TEXT    NOT NULL DEFAULT '',
    title            TEXT    NOT NULL DEFAULT '',
    epoch            INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX sessions_key ON sessions (key);

CREATE TRIGGER sessions_identity_immutable
BEFORE UPDATE OF id, key, platform, chat_type, chat_id, thread_id, user_id, user_name, scope_id,
                 profile
ON sessions
BEGIN
    SELECT RAISE(ABORT, 'session identity is immutable');
END;

-- messages: the transcript. (session_id, seq) is the identity; id is an explicit INTEGER PRIMARY
-- KEY so the rowid that messages_fts points at survives VACUUM. Rows are never deleted.
CREATE TABLE messages (
    id         INTEGER PRIMARY KEY,
    session_id TEXT    NOT NULL REFERENCES sessions (id),
    seq        INTEGER NOT NULL,
    role       TEXT    NOT NULL,
    content    TEXT    NOT NULL DEFAULT '',
    platform   TEXT    NOT NULL DEFAULT '',
    chat_id    TEXT    NOT NULL DEFAULT '',
    message_id TEXT    NOT NULL DEFAULT '',
    turn_id    TEXT    NOT NULL DEFAULT '',
    status     TEXT    NOT NULL DEFAULT '',
    active     INTEGER NOT NULL DEFAULT 1,
    archived   INTEGER NOT NULL DEFAULT 0,
    attempts   INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER,
    UNIQUE (session_id, seq)
);

-- One user row per platform message: how duplicate inbound messages are detected.
CREATE UNIQUE INDEX messages_inbound ON messages (platform, chat_id, message_id)
    WHERE role = 'user' AND message_id <> '';

-- Pending lookups (LoadSession, Recoverable, ListSessions).
CREATE INDEX messages_pending ON messages (session_id, seq)
    WHERE role = 'user' AND status = 'pending' AND active = 1;

-- routing: session key → current session id, one UPSERT per change, monotonic generation.
CREATE TABLE routing (
    key        TEXT    NOT NULL PRIMARY KEY,
    session_id TEXT    NOT NULL,
    generation INTEGER NOT NULL,
    updated_at INTEGER
) WITHOUT ROWID;

-- outbox: replies and notices, recorded before they are sent. seq grows per session key across
-- incarnations and is the SSE event id.
CREATE TABLE outbox (
    session_key  TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    session_id   TEXT    NOT NULL DEFAULT '',
    kind         TEXT    NOT NULL DEFAULT '',
    text         TEXT    NOT NULL DEFAULT '',
    turn_id      TEXT    NOT NULL DEFAULT '',
    in_reply_to  TEXT    NOT NULL DEFAULT '[]',
    platform     TEXT    NOT NULL DEFAULT '',
    chat_type    TEXT    NOT NULL DEFAULT '',
    chat_id      TEXT    NOT NULL DEFAULT '',
    thread_id    TEXT    NOT NULL DEFAULT '',
    user_id      TEXT    NOT NULL DEFAULT '',
    state        TEXT    NOT NULL DEFAULT 'pending',
    attempts     INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER,
    delivered_at INTEGER,
    PRIMARY KEY (session_key, seq)
) WITHOUT ROWID;

CREATE INDEX outbox_undelivered ON outbox (session_key, seq)
    WHERE state IN ('pending', 'failed');

-- Full-text search over message content. External content: the text lives only in messages.
-- It is fed by Commit (no trigger) so that a broken index never blocks a transcript write.
CREATE VIRTUAL TABLE messages_fts USING fts5 (content, content = 'messages', content_rowid = 'id');
