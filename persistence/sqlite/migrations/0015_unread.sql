-- 0015: unread places (persistence.Unread): where a platform that reads its chats' history back
-- after a disconnection (Discord) failed to read, so that the next process reads from there.
-- Live messages taken since move the chat's newest stored message past the place, and without
-- the record a restart (or another cluster member taking the gateway over) lost what was said
-- there. A record lives from the failed read until a read gets past it (ClearUnread).
-- IF NOT EXISTS: tests that re-run migrations from an earlier version find it.
CREATE TABLE IF NOT EXISTS unread (
    platform   TEXT    NOT NULL,
    chat_id    TEXT    NOT NULL,
    scope_id   TEXT    NOT NULL DEFAULT '',
    after_id   TEXT    NOT NULL DEFAULT '',
    created_at INTEGER,
    PRIMARY KEY (platform, chat_id)
) WITHOUT ROWID;
