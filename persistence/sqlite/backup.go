package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Backup writes a consistent copy of the database at path to out, also while a daemon writes
// it: one VACUUM INTO from a read-only connection, which copies the state of one read
// transaction (the committed writes in the WAL included) into a compact new database. The copy
// is made in a temporary file beside out, checked (PRAGMA quick_check and the schema version),
// synced and only then given the name out (never replacing a file that took it meanwhile), so
// out is either a whole, checked backup or absent. out must not exist. It returns the backup's size in bytes.
//
// Copying the database file while a daemon runs is not a backup: the committed writes not yet
// checkpointed live in the -wal file, and a copy of the two taken at different moments is
// inconsistent.
func Backup(ctx context.Context, path, out string) (int64, error) {
	n, err := backup(ctx, path, out)
	if err != nil {
		return 0, fmt.Errorf("back up %s to %s: %w", path, out, err)
	}
	return n, nil
}

func backup(ctx context.Context, path, out string) (int64, error) {
	// Abs drops a trailing slash: "backups/" would become a file named backups.
	if strings.HasSuffix(out, string(filepath.Separator)) {
		return 0, fmt.Errorf("%s names a directory: give the backup's file name, such as %s", out, filepath.Join(out, "agentgate.db"))
	}
	src, err := filepath.Abs(path)
	if err != nil {
		return 0, err
	}
	dst, err := filepath.Abs(out)
	if err != nil {
		return 0, err
	}
	if err := checkTestGuard(src); err != nil {
		return 0, err
	}
	if _, err := os.Stat(src); err != nil {
		return 0, err
	}
	// The temporary file's error would name the temporary file, not what is wrong.
	if info, err := os.Stat(filepath.Dir(dst)); errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("directory %s does not exist: create it first", filepath.Dir(dst))
	} else if err == nil && !info.IsDir() {
		return 0, fmt.Errorf("%s is not a directory", filepath.Dir(dst))
	}
	if info, err := os.Lstat(dst); err == nil && info.IsDir() {
		return 0, fmt.Errorf("%s is a directory: give the backup's file name, such as %s", out, filepath.Join(out, "agentgate.db"))
	} else if err == nil {
		return 0, fmt.Errorf("%s exists: back up to a new file", out)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	// VACUUM INTO writes a file that is empty or absent; an empty temporary file reserves a
	// unique name beside out, on the same file system, for the rename.
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*.partial")
	if err != nil {
		return 0, err
	}
	tmpPath := tmp.Name()
	if err := tmp.Close(); err != nil {
		return 0, err
	}
	done := false
	defer func() {
		if !done {
			_ = os.Remove(tmpPath)
		}
	}()

	db, version, err := openSource(ctx, src)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", tmpPath); err != nil {
		return 0, err
	}
	if err := endRunIn(ctx, tmpPath); err != nil {
		return 0, err
	}
	if err := verifyBackup(ctx, tmpPath, version); err != nil {
		return 0, err
	}
	if err := syncPath(tmpPath); err != nil {
		return 0, err
	}
	if err := takeName(tmpPath, dst); err != nil {
		return 0, err
	}
	done = true
	if err := syncPath(filepath.Dir(dst)); err != nil {
		return 0, err
	}
	info, err := os.Stat(dst)
	if err != nil {
		return 0, err
	}
	return info.Size(), nil
}

// openSource opens the database at src to be backed up, read-only, and reads its schema
// version: as immutable where only that reads it (immutableFallback).
func openSource(ctx context.Context, src string) (*sql.DB, int, error) {
	open := func(params ...string) (*sql.DB, int, error) {
		// mode=ro without query_only: query_only refuses VACUUM INTO, although it writes only
		// the new file.
		db, err := sql.Open("sqlite", dsn(src, append([]string{"mode=ro", "_pragma=busy_timeout(5000)"}, params...)...))
		if err != nil {
			return nil, 0, err
		}
		db.SetMaxOpenConns(1)
		version, err := schemaVersion(ctx, db)
		if err != nil {
			db.Close()
			return nil, 0, err
		}
		return db, version, nil
	}
	db, version, err := open()
	if err != nil {
		var immutable string
		if immutable, err = immutableFallback(src, err); immutable != "" {
			db, version, err = open(immutable)
		}
	}
	if err != nil {
		return nil, 0, explainAccess(err, src, false)
	}
	return db, version, nil
}

// takeName gives the file at tmp the name dst, which must not exist, and removes tmp. A hard
// link takes the name or fails if it is taken, at once: the check at the start of backup comes
// long before, and a rename would replace a file written meanwhile (another backup to the same
// name). Where the file system has no hard links, the name is checked again and renamed to.
func takeName(tmp, dst string) error {
	err := os.Link(tmp, dst)
	if err == nil {
		_ = os.Remove(tmp) // dst holds the copy; a leftover tmp is only a name too many
		return nil
	}
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s exists: back up to a new file", dst)
	}
	if _, lerr := os.Lstat(dst); lerr == nil {
		return fmt.Errorf("%s exists: back up to a new file", dst)
	}
	return os.Rename(tmp, dst)
}

// endRunIn ends, in the copy at path, the daemon run the database recorded (daemon_run,
// migration 0013): the copy of a running daemon's database holds its run as begun, and a daemon
// started on the restored copy would count an unclean stop that never happened against every
// session's head pending message. (A copy taken after a crash, before the next start, loses
// that one count: a restore is an operator's deliberate start.)
func endRunIn(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		return err
	}
	defer db.Close()
	var tables int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'daemon_run'`).Scan(&tables); err != nil {
		return fmt.Errorf("end the recorded run in the backup: %w", err)
	}
	if tables == 0 {
		return nil // a database from before migration 0013
	}
	if _, err := db.ExecContext(ctx, `UPDATE daemon_run SET run = '' WHERE one = 1`); err != nil {
		return fmt.Errorf("end the recorded run in the backup: %w", err)
	}
	return nil
}

// schemaVersion is the schema version of an agentgate database (its last migration).
func schemaVersion(ctx context.Context, db *sql.DB) (int, error) {
	var v int
	err := db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v)
	var se *sqlite.Error
	if errors.As(err, &se) && (se.Code()&0xff == sqlite3.SQLITE_ERROR || se.Code()&0xff == sqlite3.SQLITE_NOTADB) {
		return 0, fmt.Errorf("not an agentgate database? %w", err) // (no such table, or no database)
	}
	return v, err
}

// verifyBackup opens the new file read-only and checks its pages and its schema version.
func verifyBackup(ctx context.Context, path string, version int) error {
	db, err := sql.Open("sqlite", dsn(path, "mode=ro"))
	if err != nil {
		return err
	}
	defer db.Close()
	var res string
	if err := db.QueryRowContext(ctx, "PRAGMA quick_check").Scan(&res); err != nil {
		return fmt.Errorf("check the backup: %w", err)
	}
	if !strings.EqualFold(res, "ok") {
		return fmt.Errorf("check the backup: quick_check says %q", res)
	}
	if v, err := schemaVersion(ctx, db); err != nil || v != version {
		return fmt.Errorf("check the backup: schema version %d (%v), want %d", v, err, version)
	}
	return nil
}

// syncPath fsyncs a file or a directory.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
