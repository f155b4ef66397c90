-- 0008: the outbox becomes an ordinary rowid table, with its key (session_key, seq) as a UNIQUE
-- constraint. As a WITHOUT ROWID table its rows, reply text included, lived in the key's B-tree:
-- every reply inserted into the middle of that tree, next to its key's older entries, and every
-- delivery mark rewrote that page, so each commit wrote one full page of old replies per key it
-- touched. Now a reply is appended at the end of the table, next to the other keys' new replies,
-- its delivery mark updates that recent page, and only the small key index (and the partial
-- index of undelivered entries) is written per key. Same columns, same key, same lookups; rows
-- are copied in creation order, so the table stays in append order.
CREATE TABLE outbox_rowid (
    id           INTEGER PRIMARY KEY,
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
    UNIQUE (session_key, seq)
);

INSERT INTO outbox_rowid (session_key, seq, session_id, kind, text, turn_id, in_reply_to, platform,
                          chat_type, chat_id, thread_id, user_id, state, attempts, created_at,
                          delivered_at)
SELECT session_key, seq, session_id, kind, text, turn_id, in_reply_to, platform, chat_type, chat_id,
       thread_id, user_id, state, attempts, created_at, delivered_at
FROM outbox
ORDER BY created_at, session_key, seq;

DROP TABLE outbox;
ALTER TABLE outbox_rowid RENAME TO outbox;
CREATE INDEX outbox_undelivered ON outbox (session_key, seq) WHERE state <> 'delivered';
