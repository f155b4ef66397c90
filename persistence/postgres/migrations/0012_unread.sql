-- 0012: unread places (persistence.Unread; the SQLite store's 0015): where a platform that reads
-- its chats' history back after a disconnection (Discord) failed to read, so that the next
-- process, or the member that takes the gateway over, reads from there. A record lives from the
-- failed read until a read gets past it (ClearUnread).
CREATE TABLE unread (
    platform   TEXT   NOT NULL,
    chat_id    TEXT   NOT NULL,
    scope_id   TEXT   NOT NULL DEFAULT '',
    after_id   TEXT   NOT NULL DEFAULT '',
    created_at BIGINT,
    PRIMARY KEY (platform, chat_id)
);
