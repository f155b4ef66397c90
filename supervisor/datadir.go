package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

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

// DataDirInUse is LockDataDir's refusal: ErrDataDirInUse and persistence.ErrLocked to
// errors.Is, worded once (before, "data directory locked: persistence: store in use by another
// agentgate process" after "data directory in use by another process" said it three times).
// Holder is what the process that holds the lock recorded in the lock file (HolderDaemon, or
// the admin command's name), and PID its process id; Holder is "" when no live process
// recorded itself (an older agentgate holds it, or the holder took it an instant ago).
type DataDirInUse struct {
	Path   string
	Holder string
	PID    int
}

func (e *DataDirInUse) Error() string {
	switch {
	case e.ByCommand():
		return fmt.Sprintf("data directory in use by another process (%s held by agentgate %s, pid %d, an admin command that ends in seconds): %v",
			e.Path, e.Holder, e.PID, persistence.ErrLocked)
	case e.Holder == HolderDaemon:
		return fmt.Sprintf("data directory in use by another process (%s held by the agentgate daemon of pid %d, which keeps its spool there; "+
			"give each daemon its own --data-dir): %v", e.Path, e.PID, persistence.ErrLocked)
	}
	return fmt.Sprintf("data directory in use by another process (%s held: another agentgate daemon keeps its spool there, "+
		"give each daemon its own --data-dir; or an admin command such as agentgate sessions pardon, which ends in seconds): %v",
		e.Path, persistence.ErrLocked)
}

// ByCommand reports whether an admin command (sessions pardon, reset or requeue) holds the
// lock: it lets go of it within seconds, and nothing need be stopped.
func (e *DataDirInUse) ByCommand() bool { return slices.Contains(lockCommands, e.Holder) }

func (e *DataDirInUse) Is(target error) bool { return target == ErrDataDirInUse }
func (e *DataDirInUse) Unwrap() error        { return persistence.ErrLocked }

// HolderDaemon is the holder a daemon records in the data directory's lock file (LockDataDir).
const HolderDaemon = "daemon"

// lockCommands are the admin commands that take the data directory's lock, as they record
// themselves in its lock file. A record that names neither these nor HolderDaemon is not read
// as one: the file's content reaches the refusal only as one of these words.
var lockCommands = []string{"sessions pardon", "sessions reset", "sessions requeue"}

// recordHolder writes holder and this process's id into f, the lock file just taken, for a
// process refused the lock to name (DataDirInUse). Best effort: a record not written leaves the
// refusal naming both kinds of holder, and the lock is what keeps the second process off.
func recordHolder(f *os.File, holder string) {
	if f.Truncate(0) == nil {
		_, _ = f.WriteAt([]byte(fmt.Sprintf("%s %d\n", holder, os.Getpid())), 0)
	}
}

// readHolder reads what the holder of the lock file path recorded (recordHolder): its holder
// and process id, or "" and 0 when the record names no holder known here, or a process that is
// gone (a record the last holder left, read in the instant before the new one writes its own).
func readHolder(path string) (string, int) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 100 {
		return "", 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	i := strings.LastIndexByte(line, ' ')
	if i < 0 {
		return "", 0
	}
	holder := line[:i]
	pid, err := strconv.Atoi(line[i+1:])
	if err != nil || pid <= 0 || holder != HolderDaemon && !slices.Contains(lockCommands, holder) {
		return "", 0
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return "", 0
	}
	return holder, pid
}

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
// holder is what takes it (HolderDaemon, or the command's name, "sessions pardon"), which the
// lock file records for a process refused meanwhile to name: before, a daemon refused while a
// pardon held the directory for under a second was told another daemon held it.
func LockDataDir(dir, holder string) (*os.File, error) {
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
		who, pid := readHolder(path)
		return nil, &DataDirInUse{Path: path, Holder: who, PID: pid}
	case err != nil:
		return nil, fmt.Errorf("data directory %s: lock: %w", dir, err)
	}
	recordHolder(f, holder)
	return f, nil
}

// adminLockWait bounds how long a daemon's start waits for an admin command that holds the data
// directory (lockDataDirWaiting); adminLockPoll is how often it tries the lock meanwhile.
const (
	adminLockWait = 30 * time.Second
	adminLockPoll = 100 * time.Millisecond
)

// lockDataDirWaiting is LockDataDir for a daemon's start: while an admin command holds the data
// directory (sessions pardon, reset or requeue, which end in seconds), it waits for it, trying
// the lock every adminLockPoll, up to adminLockWait or until ctx ends, and logs once that it
// waits. Before, a start that met a pardon failed and had to be run again. A daemon, or a holder
// that recorded nothing, is refused at once, as before.
func lockDataDirWaiting(ctx context.Context, dir string, log *slog.Logger) (*os.File, error) {
	deadline := time.Now().Add(adminLockWait)
	logged := false
	for {
		f, err := LockDataDir(dir, HolderDaemon)
		var inUse *DataDirInUse
		if err == nil || !errors.As(err, &inUse) || !inUse.ByCommand() || !time.Now().Before(deadline) {
			if err == nil && logged {
				log.Info("the admin command that held the data directory is done; starting")
			}
			return f, err
		}
		if !logged {
			log.Info("an admin command holds the data directory; waiting for it to finish",
				"command", "agentgate "+inUse.Holder, "pid", inUse.PID, "at_most", adminLockWait)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, &lockWaitEnded{err}
		case <-time.After(adminLockPoll):
		}
	}
}

// lockWaitEnded is lockDataDirWaiting's error when its ctx ended the wait for an admin command:
// the admin command's hold (DataDirInUse), which it wraps. A start told to stop tells this
// apart from a refusal that had nothing to wait for (another daemon's lock).
type lockWaitEnded struct{ err error }

func (e *lockWaitEnded) Error() string { return e.err.Error() }
func (e *lockWaitEnded) Unwrap() error { return e.err }
