package postgres

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
)

// IsUnavailable reports whether err means the database cannot be written right now (the server
// is unreachable, shutting down or starting, out of disk, memory or connections, read-only, an
// I/O error, or a lost connection), as opposed to a problem with the write itself (a constraint,
// a duplicate, bad SQL). The spool uses it to decide whether to keep a write on disk and retry.
// A cancelled or expired context is not unavailability: the caller gave up.
func IsUnavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	// A connection that could not be made cannot serve now, whatever the server said when it
	// refused (a database that takes no connections, 55000; too many clients, 53300).
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code[:2] {
		case "08", // connection exception
			"53", // insufficient resources: disk full, out of memory, too many connections
			"57", // operator intervention: admin or crash shutdown, cannot connect now
			"58": // system error: I/O
			return pe.Code != "57014" // 57014 is a cancelled statement
		}
		switch pe.Code {
		case "25006", // read only SQL transaction (a standby, or default_transaction_read_only)
			"40001", // serialization failure
			"40P01": // deadlock detected
			return true
		}
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	// A connection that broke mid-statement (EOF, reset) surfaces as an untyped error from the
	// pgconn layer; pgconn.SafeToRetry is true only when nothing reached the server, and
	// Timeout for a deadline inside pgconn.
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) || isClosedConn(err)
}

// endedByCtx reports whether err is what a step of Open gives when its ctx ends: ctx's error,
// which pgx wraps for a statement that ctx cut (its context watcher ends the connection's
// read or write with a deadline, and pgconn gives context.Canceled, or a timeout wrapping
// DeadlineExceeded) or that began with ctx done, as pgxpool does for an acquire. Not
// query_canceled (57014): pgx sends the server no cancel request when ctx ends (this store
// keeps its default handler, DeadlineContextWatcherHandler), so a 57014 is a statement_timeout
// or an admin's pg_cancel_backend, a failure of its own. Nor a net timeout as such: a write
// that ctx cut (a server that stopped reading, its connection's buffers full) is ctx's error
// already, pgconn turning the deadline's i/o timeout into it when ctx is done
// (TestOpenCutWhileItWritesIsAStop), and a timeout it leaves as it is came while ctx had not
// ended (TCP's ETIMEDOUT, a keepalive's: a net.Error whose Timeout is true too): a real
// failure, which a stop may meet.
//
// Only such an error is a stop's after Open migrated: a real failure that a stop meets (the
// lock's connection lost as the epoch's raise waits) is Open's error as without the stop, and
// the daemon fails with it (exit 1). Before, it was dropped for ErrMigratedThenEnded, and the
// daemon exited 0 saying it had stopped (TestOpenFailedForRealAsAStopCameIsNoStop).
func endedByCtx(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// isClosedConn reports the errors pgx gives for a connection that is closed or broke.
func isClosedConn(err error) bool {
	msg := err.Error()
	for _, s := range []string{"conn closed", "unexpected EOF", "connection reset", "broken pipe"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// markUnavailable also wraps persistence.ErrUnavailable around an error that means the database
// cannot be used right now (IsUnavailable), unless it already does.
func markUnavailable(err error) error { return sqlstore.WrapUnavailable(err, IsUnavailable) }
