package sqlite

import (
	"database/sql/driver"
	"errors"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
)

// ErrBadQuery wraps a Search query the full-text index refuses (FTS5 syntax, an unknown column
// filter), as opposed to a failing database.
var ErrBadQuery = errors.New("not a full-text query")

// isQueryError reports whether err is SQLite's generic SQL error, which is what a malformed
// MATCH expression gives.
func isQueryError(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_ERROR
}

// isBusy reports whether err is SQLite's SQLITE_BUSY (or SQLITE_LOCKED): another connection
// holds the lock the statement needed, for longer than the busy timeout.
func isBusy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	c := se.Code() & 0xff
	return c == sqlite3.SQLITE_BUSY || c == sqlite3.SQLITE_LOCKED
}

// IsUnavailable reports whether err means the database cannot be written right now (busy or
// locked, read-only or permission denied, disk full, I/O error, cannot open, corrupt, out of
// memory, or a dropped connection), as opposed to a problem with the write itself (a constraint,
// a duplicate, bad SQL). The spool uses it to decide whether to keep a write on disk and retry.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) {
		return true
	}
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff { // the primary result code of an extended one
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM,
		sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_CORRUPT,
		sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_PROTOCOL:
		return true
	}
	return false
}

// markUnavailable also wraps persistence.ErrUnavailable around an error that means the database
// cannot be used right now (IsUnavailable), unless it already does.
func markUnavailable(err error) error { return sqlstore.WrapUnavailable(err, IsUnavailable) }
