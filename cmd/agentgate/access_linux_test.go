package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence/sqlite"
)

// TestUnusableDatabaseNamesTheFile: a database the daemon's user may not use (a restore copied
// as root, a -wal file left read-only) stops serve and backup with an error that names the
// file and the user. Before, it said only SQLite's "unable to open database file (14)", and
// backup asked whether it was an agentgate database at all (found by an audit).
func TestUnusableDatabaseNamesTheFile(t *testing.T) {
	dir, bin := dirForAnotherUser(t, MustBuild(t))
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(data, "agentgate.db")
	s, err := sqlite.Open(t.Context(), db, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{db + ".lock", db + "-wal", db + "-shm"} { // a restore copies the database alone
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	as := func(cmd *exec.Cmd) *exec.Cmd { return cmd }
	if os.Geteuid() == 0 {
		// The data directory is the service user's; the database stays root's, 0600, as a
		// restore made as root leaves it.
		const nobody = 65534
		for _, p := range []string{dir, data} {
			if err := os.Chown(p, nobody, nobody); err != nil {
				t.Fatal(err)
			}
		}
		as = func(cmd *exec.Cmd) *exec.Cmd {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
			return cmd
		}
	} else if err := os.Chmod(db, 0); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"serve", "--data-dir", data, "--http-addr", "127.0.0.1:0"},
		{"backup", "--data-dir", data, filepath.Join(dir, "copy.db")},
	} {
		out, err := as(exec.Command(bin, args...)).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Errorf("agentgate %s: %v, want it to run and refuse: %s", args[0], err, out)
			continue
		}
		if err == nil {
			t.Errorf("agentgate %s: succeeded, want it refused: %s", args[0], out)
			continue
		}
		if !strings.Contains(string(out), "by this user, uid ") || !strings.Contains(string(out), ": agentgate.db") {
			t.Errorf("agentgate %s: %s\nwant it to name agentgate.db and the user", args[0], out)
		}
		if strings.Contains(string(out), "not an agentgate database") {
			t.Errorf("agentgate %s: %s\nwant no doubt about what the file is", args[0], out)
		}
	}
}

// dirForAccessTests is the directory of a test of what this user may write, and the uid its
// commands run as: as root, which may write anything, a directory for nobody, with bin the built
// binary to run as nobody there (dirForAnotherUser); else a temporary directory, bin "".
func dirForAccessTests(t *testing.T) (dir, bin string, uid int) {
	t.Helper()
	if os.Geteuid() != 0 {
		return t.TempDir(), "", os.Getuid()
	}
	dir, bin = dirForAnotherUser(t, MustBuild(t))
	return dir, bin, 65534 // nobody
}

// dirForAnotherUser makes a directory another user may enter (a test as root runs the daemon
// as nobody there), with a copy of the binary bin in it that user may run.
func dirForAnotherUser(t *testing.T, bin string) (dir, copied string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "agentgate-user-") // not t.TempDir: its parents are root's alone
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	copied = filepath.Join(dir, "agentgate")
	if err := os.WriteFile(copied, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, copied
}

// TestUnwritableSpoolStopsTheStart: a spool directory the daemon's user may read but not write
// (left by a run as root) stops the start with an error that names it. Before, the daemon ran,
// and the first time the database refused a write nothing could wait in the spool: the write
// was refused where it should have been kept (found by an audit).
func TestUnwritableSpoolStopsTheStart(t *testing.T) {
	dir, bin := dirForAnotherUser(t, MustBuild(t))
	data := filepath.Join(dir, "data")
	spool := filepath.Join(data, "spool")
	if err := os.MkdirAll(spool, 0o755); err != nil {
		t.Fatal(err)
	}
	// A bound on a failure, not a wait for an effect: before, serve ran on.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "serve", "--data-dir", data, "--http-addr", "127.0.0.1:0")
	if os.Geteuid() == 0 {
		// The data directory is the service user's; the spool stays root's, 0755.
		const nobody = 65534
		for _, p := range []string{dir, data} {
			if err := os.Chown(p, nobody, nobody); err != nil {
				t.Fatal(err)
			}
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	} else if err := os.Chmod(spool, 0o555); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("serve ran on with a spool it may not write: %s", out)
	}
	if err == nil || cmd.ProcessState == nil {
		t.Fatalf("serve: %v, want it to run and refuse: %s", err, out)
	}
	if got := string(out); !strings.Contains(got, spool+" is not writable by this user, uid ") {
		t.Errorf("serve: %s\nwant it to name the spool directory and the user", got)
	}
}
