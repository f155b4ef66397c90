package sqlite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
