package supervisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentgate/agentgate/internal/flock"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// DirLockFile is the file in the data directory whose lock keeps a second daemon off it. Its
// name does not end in ".lock": the SQLite store locks "<database>.lock", and a database
// named "agentgate" in the data directory would otherwise have its lock on this very file,
// which the daemon, holding both, would find held and refuse to start.
const DirLockFile = "agentgate-dir.flock"

// ErrDataDirInUse is the error of a start refused because another process holds the data
// directory's own lock (LockDataDir): the daemon that uses that directory.
var ErrDataDirInUse = errors.New("data directory locked")

// dataDirInUse is LockDataDir's refusal: ErrDataDirInUse and persistence.ErrLocked to errors.Is,
// worded once (before, "data directory locked: persistence: store in use by another agentgate
// process" after "data directory in use by another process" said it three times).
type dataDirInUse struct{ path string }

func (e *dataDirInUse) Error() string {
	return fmt.Sprintf("data directory in use by another process (%s held: another agentgate daemon keeps its spool there; "+
		"give each daemon its own --data-dir): %v", e.path, persistence.ErrLocked)
}

func (e *dataDirInUse) Is(target error) bool { return target == ErrDataDirInUse }
func (e *dataDirInUse) Unwrap() error        { return persistence.ErrLocked }

// LockDataDir takes an exclusive, non-blocking flock on the data directory's lock file
// (DirLockFile; the directory is created 0700 if missing) for as long as the returned file is
// open. A daemon that keeps a spool holds it: the spool numbers its batches in memory and
// removes the leftovers of interrupted writes when it opens, so two daemons on one spool
// directory overwrite each other's acknowledged writes, and each replays the other's into its
// own database at its next start. The SQLite store's lock file guards the data directory only
// when the database lies in it (a store.dsn may put it elsewhere), and a PostgreSQL store takes
// no lock on it at all: its advisory lock keeps apart daemons on one database and schema, not
// two deployments given the same data directory. Cluster members keep no spool and take no
// lock. The lock is on a regular file opened for writing (flock.Open), not on the directory.
// The writing admin commands (sessions pardon, reset and requeue) take it too, before the
// store's lock, as a daemon takes them (a daemon that is starting holds this one before it
// opens the store), and hold it while they replay the spool.
// It is taken before the store opens, so under go test the default data directory is refused
// as the SQLite store refuses it (sqlite.CheckTestGuard), before anything is made in it.
func LockDataDir(dir string) (*os.File, error) {
	if err := sqlite.CheckTestGuard(dir); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, DirLockFile)
	f, err := flock.Open(path)
	switch {
	case errors.Is(err, flock.ErrHeld):
		return nil, &dataDirInUse{path: path}
	case err != nil:
		return nil, fmt.Errorf("data directory %s: lock: %w", dir, err)
	}
	return f, nil
}
