// Package postgres is the PostgreSQL persistence.Store (github.com/jackc/pgx/v5): an
// alternative to SQLite for a single daemon, and the shared store of cluster mode. It passes
// the same conformance suite (persistence/storetest) as the SQLite store and keeps the same
// rows: times are BIGINT unix nanoseconds, identity columns are immutable (a trigger), and rows
// are deleted only by PruneSessions and PruneStep.
//
// Commit sends a whole batch of groups as one pipelined pgx.Batch inside one transaction, so a
// batch costs one round trip plus its COMMIT, whatever its size. Groups rarely fail; when one
// does, the transaction is rolled back and the batch runs again with a SAVEPOINT per group, so
// that each group stays atomic on its own (as in the SQLite store).
//
// Reads run on the same connection pool as writes, each in its own snapshot where it reads more
// than one statement (LoadSession sends its seven queries as one batch in a REPEATABLE READ,
// read-only transaction). Everything is safe for concurrent use.
//
// Every call is bounded (Options.Timeout): a server that does not answer fails it with
// persistence.ErrUnavailable. An exclusive store (a daemon's) holds an advisory lock for as
// long as it is open, so that two daemons never share one database; taking the lock raises its
// epoch (migration 0006; a retake with no other holder between keeps it, migration 0020), and
// every write transaction of the store checks the epoch it took first (and the id of the raise
// that made it, migration 0021), so one whose lock connection died commits nothing once another
// daemon has the lock.
// A shared store (a cluster member's) holds the same lock shared: members do not exclude each
// other, but a single daemon and they do. Members fence their writes per session key (Claim).
// Lease hands out leases that one process holds at a time (a cluster's Discord gateway); taking
// one raises its epoch (migration 0017), and what only the holder may write (the clear of an
// unread place) changes nothing once a later holder has raised it.
//
// Search is full-text search over message content in web-search query syntax (the SQLite
// store's takes FTS5 syntax). It scans the messages: there is no index unless an operator
// creates one (see Search), because indexing every message halved the commit rate.
//
// This package imports persistence, persistence/internal/sqlstore (what it shares with the
// SQLite store) and internal/logging only, and pgx.
package postgres
