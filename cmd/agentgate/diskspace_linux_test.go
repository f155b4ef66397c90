package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentgate/agentgate/internal/testutil"
)

// TestCheckConfigSaysTheDiskIsNearlyFull: check-config warns of a data_dir on a disk with
// less than sqlite.LowSpace free (16 MiB here), and says "config ok"; on a disk full to the
// last block it refuses the configuration (exit 1), as nothing can be written there. Before, it
// said "config ok" alone of both, and the disk was found full only when writes failed.
func TestCheckConfigSaysTheDiskIsNearlyFull(t *testing.T) {
	mnt := testutil.TmpfsOfItsOwn(t, "16m")
	if mnt == "" {
		return
	}
	data := filepath.Join(mnt, "data")
	stdout, stderr, err := runCmd(t, "check-config", "--data-dir", data)
	if err != nil || !strings.Contains(stdout, "config ok") ||
		!strings.Contains(stderr, "warning: data_dir: the disk holding "+data+" has only ") {
		t.Errorf("check-config on a disk with 16 MiB free = %v\nstdout: %s\nstderr: %s\nwant config ok, and a warning of the disk", err, stdout, stderr)
	}

	f, err := os.Create(filepath.Join(mnt, "balloon"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for err == nil {
		_, err = f.Write(chunk)
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatal(err)
	}
	stdout, stderr, err = runCmd(t, "check-config", "--data-dir", data)
	if err == nil || strings.Contains(stdout, "config ok") ||
		!strings.Contains(stderr, "data_dir: the disk holding "+data+" is full (") ||
		!strings.Contains(stderr, "nothing can be written") {
		t.Errorf("check-config on a full disk = %v\nstdout: %s\nstderr: %s\nwant it refused, saying the disk is full", err, stdout, stderr)
	}
}

// TestCheckConfigLooksAtTheDiskALinkedDatabaseIsOn: check-config warns of the disk that the
// database's file is on when data_dir's agentgate.db is a link to a file on another disk (not
// made yet: serve makes it at the link's target), which has less than sqlite.LowSpace free (16
// MiB here): SQLite writes the database, its -wal and its -shm there, not in data_dir. Before,
// it looked at data_dir's disk only, and said "config ok" alone.
func TestCheckConfigLooksAtTheDiskALinkedDatabaseIsOn(t *testing.T) {
	mnt := testutil.TmpfsOfItsOwn(t, "16m")
	if mnt == "" {
		return
	}
	data := t.TempDir() // on the test's own disk
	if err := os.Symlink(filepath.Join(mnt, "agentgate.db"), filepath.Join(data, "agentgate.db")); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := runCmd(t, "check-config", "--data-dir", data)
	if err != nil || !strings.Contains(stdout, "config ok") ||
		!strings.Contains(stderr, "warning: data_dir: the disk holding "+mnt+" has only ") {
		t.Errorf("check-config of a database linked to a disk with 16 MiB free = %v\nstdout: %s\nstderr: %s\n"+
			"want config ok, and a warning of the disk of %s", err, stdout, stderr, mnt)
	}
}
