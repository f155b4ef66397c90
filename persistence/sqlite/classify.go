package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
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

// endedByCtx reports whether err is what a step of Open gives when its ctx ends: ctx's error
// (database/sql's, or the busy handler's, which gives up with it), or SQLite's
// SQLITE_INTERRUPT, which modernc.org/sqlite makes a statement end with once its ctx is done.
func endedByCtx(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_INTERRUPT
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
// memory, a dropped connection, or the database file deleted or replaced), as opposed to a
// problem with the write itself (a constraint, a duplicate, bad SQL). The spool uses it to
// decide whether to keep a write on disk and retry.
//
// A corrupt file (SQLITE_CORRUPT, SQLITE_NOTADB) never mends by itself, but it counts too: the
// writes it refuses are no fault of their own, and so wait in the spool, acknowledged, for a
// database that takes them (one salvaged with .recover), instead of being refused for good
// and set aside. The store names it as corruption itself (reportCorrupt), since its callers
// see only an outage.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || isGone(err) {
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

// isCorrupt reports whether err is SQLite's SQLITE_CORRUPT ("database disk image is
// malformed") or SQLITE_NOTADB ("file is not a database"): the file is damaged, or is no
// SQLite database.
func isCorrupt(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	c := se.Code() & 0xff
	return c == sqlite3.SQLITE_CORRUPT || c == sqlite3.SQLITE_NOTADB
}

// corruptFix ends the error of a database found corrupt at Open: what to do about it.
const corruptFix = `restore a backup, or salvage what it holds with sqlite3's .recover (docs/RUNBOOK.md, "the database is corrupt")`

// explainCorrupt returns err, an error of opening the database, in an operator's words when
// SQLite found the file damaged or no database at all, and unchanged otherwise. Before, a
// truncated file stopped the start with "migrate: database disk image is malformed (11)",
// which named neither the damage nor the way out (found by an operations walkthrough).
func explainCorrupt(err error) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_CORRUPT:
		return fmt.Errorf("the database is corrupt (%w): %s", err, corruptFix)
	case sqlite3.SQLITE_NOTADB:
		// Also a mistyped path that names some other file.
		return fmt.Errorf("the file is not a SQLite database, or its first page is damaged (%w): "+
			"check data_dir and store.dsn; if it is agentgate's database, %s", err, corruptFix)
	}
	return err
}

// fullBelow is the free space under which a disk is called full when SQLite fails to write to
// it: a start needs more than its -shm file's 32 KiB, and the first commits more again.
const fullBelow = 1 << 20

// explainFull returns err, an error of opening the database at path, with the disk named as full
// when SQLite could not write (SQLITE_FULL, or SQLITE_IOERR: the -shm file of a database stopped
// cleanly cannot be sized on a full disk) and the disk that holds path has less than fullBelow
// free; again is what to do once it has room. Before, a daemon started on a full disk said only
// "check the database: disk I/O error (4874)", each second under systemd, which reads as a
// damaged database (found by a disk-full soak of the binary).
func explainFull(err error, path, again string) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	if c := se.Code() & 0xff; c != sqlite3.SQLITE_FULL && c != sqlite3.SQLITE_IOERR {
		return err
	}
	dir := filepath.Dir(path)
	free, ok := freeBytes(dir)
	if !ok || free >= fullBelow {
		return err
	}
	return fmt.Errorf("the disk holding %s is full (%d bytes free to this user, uid %d): free space on it (df -h %s), then %s (%w)",
		dir, free, os.Getuid(), dir, again, err)
}

// explainCheckFailure words err, the quick_check query failing with a plain SQL error, which
// the statement itself cannot: a virtual table's own check failed it, as a damaged database's
// (FTS5's "invalid fts5 file format": the search index's shadow tables damaged as other pages
// are, or written by a newer SQLite, whose format this one cannot read; its own 'rebuild'
// cannot open it then). Before, a start said only "SQL logic error".
func explainCheckFailure(err error) error {
	var se *sqlite.Error
	switch {
	case !errors.As(err, &se) || se.Code()&0xff != sqlite3.SQLITE_ERROR:
		return err
	case strings.Contains(err.Error(), "fts5"):
		return fmt.Errorf("the database's search index cannot be read (%w): it is damaged, or a newer SQLite wrote it: %s", err, corruptFix)
	default:
		return fmt.Errorf("the database is corrupt (%w): %s", err, corruptFix)
	}
}

// msgCorrupt is the line of a database found corrupt while the daemon runs (reportCorrupt).
const msgCorrupt = "the database is corrupt; stop the daemon and restore a backup"

// reportCorrupt logs, at Error and at most once a minute, that the database is corrupt when
// err, an error of this store's database, says so. The error itself goes back to callers that
// take it for an outage and try again (IsUnavailable), and their lines said only that: a
// daemon whose file was damaged answered every message 503 for ever, its log speaking of a
// full or read-only disk (found by an operations walkthrough). The first such error is kept for
// Ping, and Options.Corrupt is called then: before, /readyz said the store was ready and no
// metric moved while every new chat was refused.
func (s *Store) reportCorrupt(err error) {
	if !isCorrupt(err) {
		return
	}
	if s.corrupt.CompareAndSwap(nil, &err) && s.onCorrupt != nil {
		s.onCorrupt()
	}
	s.corruptWarn.LogQuiet(s.log, slog.LevelError, msgCorrupt, "path", s.path, logging.Err(err))
}

// corruptError is Ping's error once the store has found its database damaged: what SQLite
// said, and what to do. It wraps persistence.ErrCorrupt.
type corruptError struct{ err error }

func (e *corruptError) Error() string {
	return fmt.Sprintf("the database is corrupt (%v): stop the daemon, then %s", e.err, corruptFix)
}

func (e *corruptError) Unwrap() error { return persistence.ErrCorrupt }

// unavailable is markUnavailable for an error of this store's database: a corrupt one is also
// reported (reportCorrupt), as is a database file found deleted or replaced (reportGone: the
// write that found it may be a claim, the record of a run, a prune step, not a Commit), and a
// lock an admin command's write waited out is explained (explainLocked).
func (s *Store) unavailable(err error) error {
	s.reportCorrupt(err)
	if isGone(err) {
		s.reportGone(err)
	}
	return s.explainLocked(markUnavailable(err))
}

// lockedError is the error of a write lock another process held for the writer's whole busy
// timeout: who may hold it, and what to do. It wraps the error it explains.
type lockedError struct {
	path  string
	again string // what to do once it is ended: "start again", "run the command again"
	err   error
}

func (e *lockedError) Error() string {
	return fmt.Sprintf("the database is locked by another process (SQLITE_BUSY): a connection outside agentgate "+
		"(a sqlite3 shell in a transaction, a backup or sync tool) held its write lock for 5 s; end it (fuser %s) "+
		"and %s: %v", e.path, e.again, e.err)
}

func (e *lockedError) Unwrap() error { return e.err }

// explainLocked words err, a write's error, as Open words a lock it met (lockedError) when the
// store is an admin command's (Options.MustWrite) and err is the lock: one taken after the
// open's check. Before, the command said only "database is locked (5) (SQLITE_BUSY)". It does
// not say that nothing was changed: the command's earlier writes (a spool replayed first) may
// have been.
func (s *Store) explainLocked(err error) error {
	var le *lockedError
	if !s.mustWrite || !isBusy(err) || errors.As(err, &le) {
		return err
	}
	return &lockedError{path: s.path, again: "run the command again", err: err}
}
