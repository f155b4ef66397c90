// Package sqlite is the default persistence.Store of agentgate, on modernc.org/sqlite (pure Go,
// FTS5 included).
//
// A Store owns two connection pools on one database file in WAL mode: a single writer connection
// (Commit, Ping, migrations and the checkpointer) and a pool of query_only reader connections, so
// reads run concurrently with writes. Commit applies a whole batch of groups in one BEGIN
// IMMEDIATE transaction, each group inside its own SAVEPOINT, and is serialised by a mutex.
//
// Concurrency: one background goroutine per writable Store, the checkpointer, runs WAL
// checkpoints off the commit path (wal_autocheckpoint is 0 on the writer); Close stops it before
// it closes the pools. A writable Store holds an exclusive flock on "<path>.lock" for its lifetime,
// so two processes never write the same file; OpenReadOnly takes no lock and serves the admin CLI
// while the daemon runs.
//
// Under go test, Open and OpenReadOnly refuse the default data directory (<cwd>/data) and the
// directory named by AGENTGATE_PRODUCTION_DATA_DIR.
//
// The package imports persistence only; it must not import actors, supervisor or platforms.
package sqlite
