-- 0010: records of streaming replies' drafts posted on a platform and not yet finished, so that
-- a restart can remove the drafts its predecessor left half written. A record lives from the
-- draft's first post until its turn finishes it (CloseDraft deletes it).
-- IF NOT EXISTS: tests that re-run migrations from an earlier version find it.
CREATE TABLE IF NOT EXISTS drafts (
    platform    TEXT    NOT NULL,
    id          TEXT    NOT NULL,
    session_key TEXT    NOT NULL DEFAULT '',
    turn_id     TEXT    NOT NULL DEFAULT '',
    chat_type   TEXT    NOT NULL DEFAULT '',
    chat_id     TEXT    NOT NULL DEFAULT '',
    thread_id   TEXT    NOT NULL DEFAULT '',
    run         TEXT    NOT NULL DEFAULT '',
    created_at  INTEGER,
    PRIMARY KEY (platform, id)
) WITHOUT ROWID;
