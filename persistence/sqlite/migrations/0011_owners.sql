-- 0011: who owns each session key (Store.Claim): the epoch a write group's Fence is checked
-- against. Rows are never deleted, so a key's epoch never goes back.
-- IF NOT EXISTS: tests that re-run migrations from an earlier version find it.
CREATE TABLE IF NOT EXISTS owners (
    key        TEXT    PRIMARY KEY,
    epoch      INTEGER NOT NULL,
    owner      TEXT    NOT NULL DEFAULT '',
    claimed_at INTEGER
) WITHOUT ROWID;
