// Package sqlite is the default persistence.Store of agentgate, on modernc.org/sqlite (pure Go,
// FTS5 included).
//
// A Store owns two connection pools on one database file in WAL mode: a single writer connection
// (Commit, Ping, migrations, search indexing and the checkpointer) and a pool of query_only
// reader connections, so reads run concurrently with writes. Commit applies a whole batch of
// groups in one BEGIN IMMEDIATE transaction, each group atomic on its own (when a group fails,
// the batch runs again with each group inside its own SAVEPOINT), and is serialised by a mutex.
//
// Concurrency: one background goroutine per writable Store, the checkpointer, runs WAL
// checkpoints off the commit path (wal_autocheckpoint is 0 on the writer), each second and when
// a Commit finds 1,000 pages written since the last; Close stops it before it closes the pools;
// the search indexing timer (below) runs its passes on a timer's goroutine.
//
// Open checks every page of the database (PRAGMA quick_check) before anything writes to it, and
// refuses a corrupt one. A corruption met later counts as the database being unavailable (the
// writes it refuses wait in the spool) and is logged at Error by the store, which alone can tell
// it from an outage that passes.
// A writable Store holds an exclusive flock on "<path>.lock" for its lifetime, so two processes
// never write the same file; OpenReadOnly takes no lock and serves the admin CLI while the
// daemon runs.
//
// Op semantics beyond the persistence contract, all chosen so that a re-sent write is harmless:
// a user message stored with an empty status is pending, an outbox entry with an empty state is
// pending; a delivered outbox entry stays delivered; EndSession needs a time; TouchSession with
// the zero time does nothing; an AppendMessage whose (session id, seq) holds a different row
// fails with ErrConflict. SetAttempts, and MarkDelivery with its Attempt, keep the larger count;
// only what an older binary's spool may hold counts each application (IncrementAttempts, and a
// MarkDelivery without its Attempt, of a non-delivered entry); a pending MarkDelivery only counts,
// and leaves the entry's state as it is; AddUsage adds a turn's tokens to its
// session once (turn_usage remembers the turns recorded). Pending messages are the active ones:
// an archived message is never re-run.
//
// Search indexing (index.go): a commit does not index its messages for Search. They are
// indexed in bulk, in a transaction of their own, by the Commit that finds Options.IndexRows of
// them waiting, by a timer once the oldest has waited Options.IndexDelay (so a read-only Search
// beside a quiet daemon finds its last messages), and before Search answers, on Close and on
// Open. fts_watermark (migration 0006) records, in the same transaction as the index entries,
// the highest message id dealt with, so a crash between a commit and its indexing loses
// nothing. Indexing runs under the commit mutex on the writer connection, and its failures are
// logged, rate-limited, and never fail a write.
//
// Rows are deleted in one place only, the prune steps (prune.go): ended sessions older than the
// retention, with their messages, turn usage and search index entries, and only when every
// safety check passes (see pruneCandidatesSQL). A step runs under the commit mutex, like
// Commit, and deletes a bounded number of rows, so that commits wait for it briefly.
//
// Times are stored as INTEGER unix nanoseconds; the zero time is NULL. A stored time that is
// NULL, not positive or unreadable reads as the zero time ("long ago"), never as now.
//
// Under go test, Open and OpenReadOnly refuse the default data directory (<cwd>/data) and the
// directory named by AGENTGATE_PRODUCTION_DATA_DIR.
//
// Of agentgate it imports only persistence and internal/logging; it must not import actors,
// supervisor or platforms.
package sqlite
