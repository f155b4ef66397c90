package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
)

// A database file deleted or replaced under the open store (rm -r of the data directory,
// `mv other.db agentgate.db`, a restore done while the daemon runs, systemd-tmpfiles, a
// container's volume swapped) is no error to SQLite: its connections keep their descriptors
// on the old file, and every commit succeeded into a file that no one can open again and that
// goes when the daemon stops. The daemon acknowledged messages, and sent replies, for hours
// into it, and all of it was lost at the next start, silently (found by black-box soaks). So
// Open records the identity of the file it opened (device and inode), each commit and each
// Ping check that the path still names it (checkFile), and from the first check that finds it
// gone the store writes no more (Store.gone). Every write transaction commits through
// commitChecked, which looks after each commit: the record of a run, a claim, a pardon, a pull
// back, a prune step and a pass of the search index as much as Commit's batches
// (TestEveryWriteCommitsThroughCommitChecked keeps it so).

// msgGone is the line of a database file found deleted or replaced while the store is open
// (reportGone).
const msgGone = "the database file was deleted or replaced while the daemon ran; writes wait in the spool: stop the daemon and put the database back"

// goneError is the error of every write, and of Ping, once the store has found the database
// file deleted or replaced: what happened, what became of the writes, and what to do. It wraps
// persistence.ErrFileGone and persistence.ErrUnavailable (the writes wait in the spool).
type goneError struct {
	path     string
	replaced bool // another file is at path; else nothing is
	// command: the store is an admin command's (Options.MustWrite), which has no spool to keep
	// its writes and no daemon to stop: its words are the command's.
	command bool
}

func (e *goneError) Error() string {
	what := "deleted"
	if e.replaced {
		what = "replaced by another file (renamed over, or restored while the daemon ran)"
	}
	if e.command {
		// Before, such a command's write went into the old file and it said it was done
		// (pardoned, reset, requeued) of a change no later start would see.
		if e.replaced {
			what = "replaced by another file"
		}
		return fmt.Sprintf("the database file %s was %s while this command ran: what the command wrote went to "+
			"the old file, which no one can open again, not to the file now at that path: put the database back at "+
			"that path and run the command again", e.path, what)
	}
	return fmt.Sprintf("the database file %s was %s: the daemon still has the old file open, which no one can open "+
		"again and which goes when the daemon stops, and writes no more to it; its writes wait in the spool "+
		"(if the spool cannot be written either, as when the whole data directory was deleted, new messages are refused, "+
		"HTTP 503, and nothing acknowledged is lost): stop the daemon, put the database back at that path, and start: "+
		`the spool's writes are replayed into it (docs/RUNBOOK.md, "the database file was deleted or replaced")`, e.path, what)
}

func (e *goneError) Unwrap() []error {
	return []error{persistence.ErrFileGone, persistence.ErrUnavailable}
}

// isGone reports whether err is a goneError.
func isGone(err error) bool {
	var ge *goneError
	return errors.As(err, &ge)
}

// checkFile reports whether the store's path still names the file it opened (Store.file),
// after a commit (or one that failed unavailable) and in Ping: nil if it does, or if the path
// cannot be looked at for another reason (which says nothing of the file; the next commit
// looks again), else the goneError, which it keeps for the store's lifetime, as the store
// keeps a corrupt database's error: a file put back while the daemon runs is not trusted
// again until a start checks it. It costs one stat(2) on the commit path, about 0.6 µs, where
// a commit of one turn takes 300 µs or more for its fsyncs (BenchmarkCommitTurns does not
// tell the two apart). It is safe for concurrent use.
func (s *Store) checkFile() error {
	if g := s.gone.Load(); g != nil {
		return g
	}
	if s.file == nil { // a read-only store's Commit never gets here
		return nil
	}
	fi, err := os.Stat(s.path)
	var gone *goneError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		gone = &goneError{path: s.path, command: s.mustWrite}
	case err != nil:
		return nil
	case !os.SameFile(fi, s.file):
		gone = &goneError{path: s.path, replaced: true, command: s.mustWrite}
	default:
		return nil
	}
	if s.gone.CompareAndSwap(nil, gone) && s.onCorrupt != nil {
		s.onCorrupt()
	}
	return s.gone.Load()
}

// committer is a write transaction on the writer's connection: a *sql.Tx, or the driver.Tx of
// Commit's batches (commitOn).
type committer interface{ Commit() error }

// commitChecked commits tx, a write transaction on the writer's connection, then checks that
// the path still names the file it went to (checkFile). It is the one way the store's writes
// commit. A transaction committed to a file deleted or replaced meanwhile succeeded into a file
// that no one can open again and that goes when the store closes: its caller must claim
// nothing of it (a message stored, a run recorded, a key claimed, a pardon done), and gets the
// goneError instead, to wrap as its other errors (and, once wrapped, to pass to unavailable,
// which logs it). Before, only Commit looked: BeginRun, EndRun, Claim, PullBack, Pardon, the
// prune steps and the search index's passes reported their writes done into the old file.
func (s *Store) commitChecked(tx committer) error {
	if err := tx.Commit(); err != nil {
		return err
	}
	return s.checkFile()
}

// reportGone logs msgGone, at Error and at most once a minute: the commits a gone file
// refuses are tried again each second by the spool's replay.
func (s *Store) reportGone(err error) {
	s.goneWarn.LogQuiet(s.log, slog.LevelError, msgGone, "path", s.path, logging.Err(err))
}

// emptyLostWAL folds the write-ahead log into the old file, deleted or replaced, and empties
// the log, as the store closes. SQLite checkpoints at its last close only a database file
// still at its path, and leaves the log otherwise: <path>-wal, still this store's, was then
// replayed into whatever file was put at the path (a backup restored, the file renamed over
// it) by the next open, its pages written over that database's (sqlite.org/howtocorrupt.html,
// "mispairing database files and hot journals"). The log and the old file are this store's
// own descriptors: a log that another file brought along to the path is not touched. It runs
// on the writer's connection, or on a reader's if the writer's was dropped since the file went
// (a new one cannot open it: noCreate), before the readers are closed.
func (s *Store) emptyLostWAL() error {
	err := truncateWAL(s.writer)
	if err != nil && s.reader != nil {
		if rerr := truncateWAL(s.reader); rerr == nil {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("empty the write-ahead log of the old database file: %w", err)
	}
	return nil
}

// truncateWAL runs a TRUNCATE checkpoint on a connection of db.
func truncateWAL(db *sql.DB) error {
	var busy, frames, moved int
	err := db.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &frames, &moved)
	if err == nil && busy != 0 {
		err = errors.New("the database is busy")
	}
	return err
}

// sqliteDriver is the driver registered as "sqlite", which the store's connectors open with.
var sqliteDriver = func() driver.Driver {
	db, _ := sql.Open("sqlite", "") // connects nothing
	defer db.Close()
	return db.Driver()
}()

// openPlain opens a pool of the "sqlite" driver on dsn, for a store that writes nothing
// (OpenReadOnly).
func openPlain(dsn string) *sql.DB { return sql.OpenDB(fileConnector{dsn: dsn}) }

// openDB opens a pool on dsn whose every connection opened after Open is on the file Open
// opened (fileConnector).
func (s *Store) openDB(dsn string) *sql.DB { return sql.OpenDB(fileConnector{s: s, dsn: dsn}) }

// fileConnector opens the connections of a pool on dsn, and, for a store s that has opened its
// database (Store.file), only while the path names that file: checkFile looks before and after
// the driver opens it, and a connection opened otherwise is closed and fails with the
// goneError, unavailable. A connection a pool opened after another file was renamed over the
// database (the writer's dropped by a setting that could not be restored, a reader's as the
// reads grew) opened that file, paired with the old file's write-ahead log, still at the path:
// the commit that found the file replaced went into it, and the TRUNCATE checkpoint of the
// store's close (emptyLostWAL), on that connection, wrote the old file's pages over it: a backup
// restored while the daemon ran was lost (TestReplacedFileNotWrittenByANewConnection). noCreate
// keeps a connection from making a deleted file again; this, from opening another.
type fileConnector struct {
	s   *Store
	dsn string
}

func (c fileConnector) Connect(context.Context) (driver.Conn, error) {
	check := func() error {
		if c.s == nil {
			return nil
		}
		err := c.s.checkFile() // nil until Open has recorded the file (Store.file)
		if err != nil {
			// A read may be the first to find it: logged at once, as by a commit or Ping
			// (TestReplacedFileFoundByARead).
			c.s.reportGone(err)
		}
		return err
	}
	if err := check(); err != nil {
		return nil, err
	}
	dc, err := sqliteDriver.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	if err := check(); err != nil { // the path renamed over as the driver opened it
		_ = dc.Close()
		return nil, err
	}
	return dc, nil
}

func (c fileConnector) Driver() driver.Driver { return sqliteDriver }
