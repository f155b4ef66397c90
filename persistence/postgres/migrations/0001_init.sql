-- 0001: the schema of the SQLite store's migrations 0001–0009, as PostgreSQL has it from the
-- start. Times are BIGINT unix nanoseconds (UTC; timestamptz keeps only microseconds, and the
-- stores must round-trip the same values); NULL means "never".

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
    started_at       BIGINT,
    last_activity_at BIGINT,
    ended_at         BIGINT,
    end_reason       TEXT    NOT NULL DEFAULT '',
    prev_session_id  TEXT    NOT NULL DEFAULT '',
    title            TEXT    NOT NULL DEFAULT '',
    epoch            BIGINT  NOT NULL DEFAULT 0,
    queue_mode       TEXT    NOT NULL DEFAULT '',
    input_tokens     BIGINT  NOT NULL DEFAULT 0,
    output_tokens    BIGINT  NOT NULL DEFAULT 0
);

CREATE INDEX sessions_key ON sessions (key);
-- Open sessions by last activity, oldest first (IdleSessions).
CREATE INDEX sessions_open_activity ON sessions (last_activity_at, id) WHERE ended_at IS NULL;
-- Ended sessions by end time, oldest first (PruneSessions).
CREATE INDEX sessions_ended ON sessions (ended_at, id) WHERE ended_at IS NOT NULL;

CREATE FUNCTION sessions_identity_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'session identity is immutable' USING ERRCODE = 'integrity_constraint_violation';
END
$$;

-- Fires when an UPDATE names an identity column at all, as the SQLite trigger does.
CREATE TRIGGER sessions_identity_immutable
BEFORE UPDATE OF id, key, platform, chat_type, chat_id, thread_id, user_id, user_name, scope_id,
                 profile
ON sessions FOR EACH ROW EXECUTE FUNCTION sessions_identity_immutable();

-- messages: the transcript. (session_id, seq) is the identity; id is the order rows were stored
-- in (RecentChats walks it backwards).
CREATE TABLE messages (
    id         BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT    NOT NULL REFERENCES sessions (id),
    seq        BIGINT  NOT NULL,
    role       TEXT    NOT NULL,
    content    TEXT    NOT NULL DEFAULT '',
    platform   TEXT    NOT NULL DEFAULT '',
    chat_id    TEXT    NOT NULL DEFAULT '',
    message_id TEXT    NOT NULL DEFAULT '',
    turn_id    TEXT    NOT NULL DEFAULT '',
    status     TEXT    NOT NULL DEFAULT '',
    active     BOOLEAN NOT NULL DEFAULT TRUE,
    archived   BOOLEAN NOT NULL DEFAULT FALSE,
    attempts   INTEGER NOT NULL DEFAULT 0,
    created_at BIGINT,
    user_id    TEXT    NOT NULL DEFAULT '',
    user_name  TEXT    NOT NULL DEFAULT '',
    UNIQUE (session_id, seq)
);

-- One user row per platform message: how duplicate inbound messages are detected.
CREATE UNIQUE INDEX messages_inbound ON messages (platform, chat_id, message_id)
    WHERE role = 'user' AND message_id <> '';

-- Pending lookups (LoadSession, Recoverable, ListSessions).
CREATE INDEX messages_pending ON messages (session_id, seq)
    WHERE role = 'user' AND status = 'pending' AND active;

-- routing: session key → current session id, one UPSERT per change, monotonic generation.
CREATE TABLE routing (
    key        TEXT   NOT NULL PRIMARY KEY,
    session_id TEXT   NOT NULL,
    generation BIGINT NOT NULL,
    updated_at BIGINT
);

-- The keys that route to a session: a routed session is never pruned.
CREATE INDEX routing_session ON routing (session_id);

-- outbox: replies and notices, recorded before they are sent. seq grows per session key across
-- incarnations and is the SSE event id. New replies are appended (id), so a delivery mark
-- updates a recent page; only the key index and the undelivered index are written per key.
CREATE TABLE outbox (
    id           BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_key  TEXT    NOT NULL,
    seq          BIGINT  NOT NULL,
    session_id   TEXT    NOT NULL DEFAULT '',
    kind         TEXT    NOT NULL DEFAULT '',
    text         TEXT    NOT NULL DEFAULT '',
    turn_id      TEXT    NOT NULL DEFAULT '',
    in_reply_to  TEXT[]  NOT NULL DEFAULT '{}',
    platform     TEXT    NOT NULL DEFAULT '',
    chat_type    TEXT    NOT NULL DEFAULT '',
    chat_id      TEXT    NOT NULL DEFAULT '',
    thread_id    TEXT    NOT NULL DEFAULT '',
    user_id      TEXT    NOT NULL DEFAULT '',
    state        TEXT    NOT NULL DEFAULT 'pending',
    attempts     INTEGER NOT NULL DEFAULT 0,
    created_at   BIGINT,
    delivered_at BIGINT,
    UNIQUE (session_key, seq)
);

-- What is not delivered (pending, failed, or any other value, which errs on the side of sending
-- again and of keeping a session) is found by key.
CREATE INDEX outbox_undelivered ON outbox (session_key, seq) WHERE state <> 'delivered';

-- turn_usage records each turn's model tokens once, which is what makes AddUsage idempotent.
CREATE TABLE turn_usage (
    session_id    TEXT   NOT NULL REFERENCES sessions (id),
    turn_id       TEXT   NOT NULL,
    input_tokens  BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, turn_id)
);
