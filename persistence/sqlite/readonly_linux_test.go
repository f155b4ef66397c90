package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestReadOnlySnapshot: a data directory on a read-only file system (a snapshot mounted
// read-only) is read by OpenReadOnly and backed up by Backup, as the sessions commands and
// backup do: a database a clean stop left without a -wal file as immutable, and one whose -wal
// file has its -shm beside it with the writes the -wal holds. One whose -wal holds writes but
// has no -shm cannot be read there, which the error says, with what to do. Before, all of them
// failed with "unable to open database file (14)" alone (found by an operations walkthrough).
//
// The test runs itself again inside user and mount namespaces (unshare), where it mounts a
// tmpfs and makes it read-only; where they cannot be made, it is skipped.
func TestReadOnlySnapshot(t *testing.T) {
	mnt := testutil.TmpfsOfItsOwn(t, "16m")
	if mnt == "" {
		return
	}
	ctx := context.Background()
	id := func(name string) string { return "s-" + strings.ReplaceAll(name, " ", "-") }
	dirs := map[string]string{}
	for _, name := range []string{"clean", "wal only", "wal and shm"} {
		dirs[name] = filepath.Join(mnt, strings.ReplaceAll(name, " ", "-"))
		if err := os.Mkdir(dirs[name], 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// clean: a store stopped cleanly, which leaves no -wal file.
	s, err := Open(ctx, filepath.Join(dirs["clean"], "agentgate.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession(id("clean"), "k1")})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The other two: copies of a running store's files, its last write in its -wal file only.
	src := filepath.Join(t.TempDir(), "agentgate.db")
	s, err = Open(ctx, src, Options{CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession(id("wal only"), "k1")})
	if _, err := checkpoint(ctx, s.writer, s.dropWriter, "TRUNCATE"); err != nil {
		t.Fatal(err)
	}
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession(id("wal and shm"), "k2")})
	for name, suffixes := range map[string][]string{"wal only": {"", "-wal"}, "wal and shm": {"", "-wal", "-shm"}} {
		for _, suffix := range suffixes {
			b, err := os.ReadFile(src + suffix)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dirs[name], "agentgate.db"+suffix), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := syscall.Mount("", mnt, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatalf("make the tmpfs read-only: %v", err)
	}

	for _, tt := range []struct {
		name string
		want string // the session read; "" when the database cannot be read
	}{
		{"clean", id("clean")},
		{"wal and shm", id("wal and shm")}, // the write in the -wal file is read
		{"wal only", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dirs[tt.name], "agentgate.db")
			out := filepath.Join(t.TempDir(), "backup.db")
			st, openErr := OpenReadOnly(ctx, path)
			_, backupErr := Backup(ctx, path, out)
			if tt.want == "" {
				const why = "(it is on a read-only file system, and its -wal file holds writes that SQLite reads only with a -shm file " +
					"it cannot make there: copy agentgate.db and agentgate.db-wal to a writable directory and give the command that directory)"
				for what, err := range map[string]error{"OpenReadOnly": openErr, "Backup": backupErr} {
					if err == nil || !strings.Contains(err.Error(), why) {
						t.Errorf("%s = %v, want it to say %q", what, err, why)
					}
				}
				if openErr == nil {
					st.Close()
				}
				return
			}
			if openErr != nil {
				t.Fatalf("OpenReadOnly: %v", openErr)
			}
			defer st.Close()
			if _, err := st.Session(ctx, tt.want); err != nil {
				t.Errorf("Session(%s): %v", tt.want, err)
			}
			if backupErr != nil {
				t.Fatalf("Backup: %v", backupErr)
			}
			b, err := OpenReadOnly(ctx, out)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if _, err := b.Session(ctx, tt.want); err != nil {
				t.Errorf("the backup's Session(%s): %v", tt.want, err)
			}
		})
	}
}
