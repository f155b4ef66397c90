package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCheckConfigSpoolDirNotWritable: a spool directory in data_dir that this user may not
// write (left by a run as root, a read-only bind mount) is refused by check-config at
// data_dir's line, and by serve before it opens the database. Before, check-config said
// "config ok", and serve refused only once it had made and written the database. As root, which
// may write anything, the commands run as nobody, from the built binary.
func TestCheckConfigSpoolDirNotWritable(t *testing.T) {
	dir, bin, uid := dirForAccessTests(t)
	root := bin != ""
	data := filepath.Join(dir, "data")
	spool := filepath.Join(data, "spool")
	if err := os.MkdirAll(spool, 0o755); err != nil {
		t.Fatal(err)
	}
	if root {
		// The data directory is the service user's; the spool stays root's, 0755.
		if err := os.Chown(data, uid, uid); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := os.Chmod(spool, 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(spool, 0o700) }) // for t.TempDir's removal
	}
	// A bound on a failure, not a wait for an effect: a serve that is not refused runs on.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	agentgate := func(args ...string) (stderr string, err error) {
		t.Helper()
		if !root {
			var out, errOut strings.Builder
			err = run(ctx, args, &out, &errOut)
			return errOut.String(), err
		}
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var out strings.Builder
		cmd.Stderr = &out
		err = cmd.Run()
		return out.String(), err
	}
	path := filepath.Join(dir, "agentgate.yaml")
	if err := os.WriteFile(path, []byte("data_dir: "+data+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	problem := fmt.Sprintf("%s:1: data_dir: %q: its spool directory %s is not writable by this user, uid %d (permission denied): "+
		"give it to the daemon's user (chown -R), or set another data_dir", path, data, spool, uid)
	if stderr, err := agentgate("check-config", "--config", path); err == nil || !strings.Contains(stderr, problem+"; serve refuses to start with it\n") {
		t.Errorf("check-config = %v, stderr %q; want an error and %q", err, stderr, problem+"; serve refuses to start with it")
	}
	stderr, err := agentgate("serve", "--config", path, "--http-addr", "127.0.0.1:0")
	if ctx.Err() != nil {
		t.Fatalf("serve ran on with a spool it may not write: %s", stderr)
	}
	if err == nil || !strings.Contains(stderr+fmt.Sprint(err), problem) {
		t.Errorf("serve = %v, stderr %q; want it refused with %q", err, stderr, problem)
	}
	if _, err := os.Stat(filepath.Join(data, "agentgate.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after the refused serve, agentgate.db: %v; want it not made", err)
	}
}
