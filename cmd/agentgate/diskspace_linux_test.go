package main

import (
	"os"
	"path/filepath"
	"strings"
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

	testutil.MustFill(t, filepath.Join(mnt, "balloon"))
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
	data := testutil.DataDirLinkedTo(t, mnt)
	stdout, stderr, err := runCmd(t, "check-config", "--data-dir", data)
	if err != nil || !strings.Contains(stdout, "config ok") ||
		!strings.Contains(stderr, "warning: data_dir: the disk holding "+mnt+" has only ") {
		t.Errorf("check-config of a database linked to a disk with 16 MiB free = %v\nstdout: %s\nstderr: %s\n"+
			"want config ok, and a warning of the disk of %s", err, stdout, stderr, mnt)
	}
}

// TestCheckConfigTakesAFullDiskWithoutTheDatabase: a data_dir on a disk full to the last
// block, with the SQLite database on another disk (store.dsn), is a warning, not a refusal:
// serve starts and serves on it (only the spool, which takes the writes the database
// refuses, and the HTTP address's files are there), so check-config exits 0, and its warning
// says what a full data_dir costs, not that the database cannot be opened. Before, it refused
// the configuration, saying "serve refuses to start with it", which serve did not.
func TestCheckConfigTakesAFullDiskWithoutTheDatabase(t *testing.T) {
	mnt := testutil.TmpfsOfItsOwn(t, "1m")
	if mnt == "" {
		return
	}
	data := filepath.Join(mnt, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	testutil.MustFill(t, filepath.Join(mnt, "balloon"))
	db := filepath.Join(t.TempDir(), "agentgate.db") // on the test's own disk
	cfgFile := filepath.Join(t.TempDir(), "agentgate.yaml")
	if err := os.WriteFile(cfgFile, []byte("store:\n  dsn: "+db+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := runCmd(t, "check-config", "--config", cfgFile, "--data-dir", data)
	if err != nil || !strings.Contains(stdout, "config ok") ||
		!strings.Contains(stderr, "warning: data_dir: the disk holding "+data+" is full (") ||
		strings.Contains(stderr, "serve refuses") || strings.Contains(stderr, "shared-memory") {
		t.Errorf("check-config of a full data_dir without the database = %v\nstdout: %s\nstderr: %s\n"+
			"want config ok, and a warning that the disk of data_dir is full, of no database file", err, stdout, stderr)
	}
}

// TestCheckConfigOfADiskNearlyFullWithoutSQLite: of a data_dir on a disk with less than
// sqlite.LowSpace free (16 MiB here), check-config warns a single daemon on PostgreSQL of its
// spool alone (there is no SQLite write-ahead log), and says nothing to a cluster member, which
// keeps no spool there and whose serve does not look at the disk either. Before, both were
// warned of "the database's write-ahead log".
func TestCheckConfigOfADiskNearlyFullWithoutSQLite(t *testing.T) {
	mnt := testutil.TmpfsOfItsOwn(t, "16m")
	if mnt == "" {
		return
	}
	data, dir := filepath.Join(mnt, "data"), t.TempDir()
	cert, key, ca := mustClusterFiles(t, dir)
	pg := "data_dir: " + data + "\nstore: {driver: postgres, dsn: \"postgres://db.invalid/agentgate?search_path=public\"}\n"
	for _, tt := range []struct {
		name, yaml string
		want       string // on stderr; "" for nothing
	}{
		{"a single daemon", pg, ":1: data_dir: the disk holding " + data + " has only "},
		{"a cluster member", pg + "cluster:\n  enabled: true\n  tls: {cert_file: " + cert + ", key_file: " + key + ", ca_file: " + ca + "}\n", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			stdout, stderr, err := runCmd(t, "check-config", "--config", path)
			if err != nil || stdout != "config ok\n" || strings.Contains(stderr, "write-ahead log") ||
				(tt.want == "") != (stderr == "") || !strings.Contains(stderr, tt.want) {
				t.Errorf("check-config = %v\nstdout: %s\nstderr: %s\nwant config ok, and on stderr %q, of no write-ahead log", err, stdout, stderr, tt.want)
			}
		})
	}
}
