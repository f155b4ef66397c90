-- 0006: the search index is filled in bulk, outside the transactions that write the transcript
-- (index.go). fts_watermark holds the highest messages.id the indexer has dealt with: every
-- message with an id at or below it was indexed (or its indexing failed, which is logged and
-- never retried), every message above it waits to be indexed. The indexer advances it in the
-- same transaction as the index entries it adds, so a crash loses nothing: the next Open indexes
-- what lies above it. PruneSessions lowers it when it deletes the highest rows, so that the rowids
-- SQLite then hands out again are above it.
CREATE TABLE fts_watermark (
    id      INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    last_id INTEGER NOT NULL
);

-- Until now Commit indexed every message in its own transaction: all rows are dealt with.
INSERT INTO fts_watermark (id, last_id) SELECT 1, COALESCE(MAX(id), 0) FROM messages;
