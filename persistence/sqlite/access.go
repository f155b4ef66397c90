package sqlite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// explainAccess adds to err, a failure to open or write the database at path, the files this
// process may not use, when SQLite's own words name none: "attempt to write a readonly
// database (8)" or "unable to open database file (14)" said neither that the database's -wal
// file (left read-only by an earlier run) nor a restored copy owned by root was the cause
// (found by an audit). write asks about writing them (a daemon), else about reading them.
func explainAccess(err error, path string, write bool) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM:
	default:
		return err
	}
	flag, verb := os.O_RDONLY, "readable"
	if write {
		flag, verb = os.O_RDWR, "writable"
	}
	var denied []string
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		f, oerr := os.OpenFile(p, flag, 0)
		if oerr == nil {
			f.Close()
		} else if !errors.Is(oerr, os.ErrNotExist) {
			denied = append(denied, filepath.Base(p))
		}
	}
	if write {
		// SQLite creates the -wal and -shm files beside the database.
		if f, cerr := os.CreateTemp(filepath.Dir(path), ".agentgate-access-*"); cerr == nil {
			f.Close()
			os.Remove(f.Name())
		} else {
			denied = append(denied, "its directory "+filepath.Dir(path))
		}
	}
	if len(denied) == 0 {
		return err
	}
	return fmt.Errorf("%w (not %s by this user, uid %d: %s; the database, its -wal and -shm files and, to write, their directory must be)",
		err, verb, os.Getuid(), strings.Join(denied, ", "))
}

// immutableFallback is for a read-only open of the database at path that SQLite refused with
// err. It returns the DSN parameter that reads the database all the same, "immutable=1", where
// that is right; otherwise "" and err, with the reason it cannot be read there added when that
// is the file system.
//
// A WAL database is read with its -shm file, which SQLite makes beside it if it is not there, to
// find the writes its -wal file holds. On a read-only file system (a snapshot mounted read-only)
// it can make neither, and refused with "unable to open database file (14)" alone even a
// database that a clean stop left with no -wal file at all: backup and the sessions commands
// failed there with no hint why (found by an operations walkthrough). Without a -wal file, or
// with an empty one, the database file holds every write, and nothing changes it on that file
// system: SQLite may read it as immutable, without locks or a -shm file. A -wal file that holds
// writes is not read by an immutable open, which would leave those writes out.
func immutableFallback(path string, err error) (string, error) {
	var se *sqlite.Error
	if !errors.As(err, &se) || se.Code()&0xff != sqlite3.SQLITE_CANTOPEN || !readOnlyFS(filepath.Dir(path)) {
		return "", err
	}
	if fi, serr := os.Stat(path + "-wal"); serr == nil && fi.Size() > 0 {
		name := filepath.Base(path)
		return "", fmt.Errorf("%w (it is on a read-only file system, and its -wal file holds writes that SQLite reads only "+
			"with a -shm file it cannot make there: copy %s and %s-wal to a writable directory and give the command that directory)",
			err, name, name)
	}
	return "immutable=1", nil
}

// readOnlyFS reports whether dir is on a file system mounted read-only: a file cannot be made
// there for that reason (EROFS), not for this user's permissions.
func readOnlyFS(dir string) bool {
	f, err := os.CreateTemp(dir, ".agentgate-access-*")
	if err == nil {
		f.Close()
		os.Remove(f.Name())
		return false
	}
	return errors.Is(err, syscall.EROFS)
}
