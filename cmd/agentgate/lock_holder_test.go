package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/flock"
	"github.com/agentgate/agentgate/supervisor"
)

// TestServeNamesWhatHoldsTheDataDir: the process that holds the data directory's lock records
// what it is in the lock file, and a daemon refused for it names that: an admin command (a
// pardon holds it for under a second) is to be waited for, another daemon stopped. A record
// that names no live holder (one the last holder left) gives both. Before, a daemon started
// while sessions pardon ran was told that another daemon kept its spool there.
func TestServeNamesWhatHoldsTheDataDir(t *testing.T) {
	dir := MustSeedSessions(t)
	lockFile := filepath.Join(dir, supervisor.DirLockFile)
	serve := func(t *testing.T) string {
		t.Helper()
		_, _, err := runCmd(t, "serve", "--data-dir", dir, "--http-addr", "127.0.0.1:0")
		if err == nil {
			t.Fatal("serve on a data directory another process holds started")
		}
		return err.Error()
	}
	const locked = "persistence: store in use by another agentgate process"

	// What the pardon records of itself while it holds the directory.
	MustRunSessions(t, "pardon", "--all", "--data-dir", dir)
	if b, err := os.ReadFile(lockFile); err != nil || string(b) != fmt.Sprintf("sessions pardon %d\n", os.Getpid()) {
		t.Errorf("the lock file after a pardon holds %q (%v), want the pardon's record", b, err)
	}

	// A pardon that holds the directory for longer than a start waits for it (30 s:
	// supervisor's TestStartWaitsForAnAdminCommand) is named so.
	held := &supervisor.DataDirInUse{Path: lockFile, Holder: "sessions pardon", PID: os.Getpid()}
	want := fmt.Sprintf("start: data directory in use by another process (%s held by agentgate sessions pardon, pid %d, "+
		"an admin command that ends in seconds): %s: start agentgate again once it is done", lockFile, os.Getpid(), locked)
	if got := startError(context.Background(), config.Default(), fmt.Errorf("start: %w", held)).Error(); got != want {
		t.Errorf("serve while a pardon holds the data directory:\n got %s\nwant %s", got, want)
	}

	lock, err := supervisor.LockDataDir(dir, supervisor.HolderDaemon)
	if err != nil {
		t.Fatal(err)
	}
	want = fmt.Sprintf("start: data directory in use by another process (%s held by the agentgate daemon of pid %d, which keeps its spool there; "+
		"give each daemon its own --data-dir): %s: stop it, or give this one another --data-dir", lockFile, os.Getpid(), locked)
	if got := serve(t); got != want {
		t.Errorf("serve while a daemon holds the data directory:\n got %s\nwant %s", got, want)
	}
	lock.Close()

	// The record a process that is gone left, under a lock taken by one that has not written
	// its own yet (an older agentgate never does).
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lockFile, fmt.Appendf(nil, "daemon %d\n", gone.Process.Pid), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := flock.Open(lockFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want = fmt.Sprintf("start: data directory in use by another process (%s held: another agentgate daemon keeps its spool there, "+
		"give each daemon its own --data-dir; or an admin command such as agentgate sessions pardon, which ends in seconds): %s: "+
		"stop it, or give this one another --data-dir", lockFile, locked)
	if got := serve(t); got != want {
		t.Errorf("serve beside a record of a process that is gone:\n got %s\nwant %s", got, want)
	}
}
