package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
)

// TestSIGTERMWhileTheStartWaitsForTheSQLiteLock: a SIGTERM while the start's open of the SQLite
// database waits for its write lock, which another process holds (here a connection of the
// test's in a transaction, as a sqlite3 shell, an offline admin command or a backup would),
// ends the wait at once: the daemon exits 0, says it stopped while it opened the store, and
// wrote nothing (the database's files are as they were). The lock is let go of only after the
// exit. Before, the open did not hear the stop (its ctx was cut off from it): the signal was
// acted on only once the writer's busy timeout (5 s) ran out, and the start failed then, exit
// 1, "the database is locked by another process".
func TestSIGTERMWhileTheStartWaitsForTheSQLiteLock(t *testing.T) {
	dir := MustSeedSessions(t)
	path := filepath.Join(dir, "agentgate.db")
	unlock := testutil.LockSQLite(t, path)
	before := databaseFiles(t, path)
	stderr, cmd, done := startingServeIn(t, dir)
	// The start's open has connected to the database once the daemon holds the file open: it
	// checks its pages (a read, which the lock does not hold back) and waits for the lock.
	waitFor(t, 30*time.Second, func() bool { return holdsOpen(cmd.Process.Pid, path) })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := exitWithin(t, done, 20*time.Second)
	unlock()
	if err != nil {
		t.Errorf("exit after a SIGTERM while the start waited for the database's write lock: %v, want 0", err)
	}
	log := stderr.String()
	if !inOrder(log, "signal received during the start",
		"asked to stop during the start while it opened the store (connecting to the database, waiting for its lock, or checking it and its schema); stopped without writing anything") {
		t.Errorf("the daemon's log does not say, in order, that it heard the signal and stopped while it opened the store:\n%s", log)
	}
	for _, never := range []string{"agentgate started", "locked by another process", "start: open store"} {
		if strings.Contains(log, never) {
			t.Errorf("the daemon's log says %q:\n%s", never, log)
		}
	}
	if after := databaseFiles(t, path); after != before {
		t.Errorf("the database's files changed under a start stopped while it waited for the lock (%s, then %s); want nothing written", before, after)
	}
}

// holdsOpen reports whether the process pid has the file path open (Linux: /proc/pid/fd).
func holdsOpen(pid int, path string) bool {
	fds := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	entries, err := os.ReadDir(fds)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join(fds, e.Name())); err == nil && target == path {
			return true
		}
	}
	return false
}
