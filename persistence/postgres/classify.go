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
