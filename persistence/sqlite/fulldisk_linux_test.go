package sqlite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestOpenOnAFullDiskSaysTheDiskIsFull: a database stopped cleanly (which leaves no -wal or
// -shm file) on a disk that is full since is refused by Open with an error that says the disk
// is full and what to do, and once the disk has room again it opens. Before, a daemon started
// there said only "start: open store: open …: check the database: disk I/O error (4874)"
// (SQLite cannot size the -shm file), every second under systemd, which reads as a damaged
// database, and which docs/RUNBOOK.md did not list (found by a disk-full soak of the binary).
//
// The test runs itself again inside user and mount namespaces (unshare), where it mounts a
// small tmpfs and fills it; where they cannot be made, it is skipped.
func TestOpenOnAFullDiskSaysTheDiskIsFull(t *testing.T) {
	mnt := testutil.TmpfsOfItsOwn(t, "4m")
	if mnt == "" {
		return
	}
	ctx := context.Background()
	path := filepath.Join(mnt, "agentgate.db")
	s, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	balloon := filepath.Join(mnt, "balloon")
	testutil.MustFill(t, balloon)

	for _, tt := range []struct {
		name  string
		opts  Options
		again string
	}{
		{"daemon", Options{}, "then start again"},
		{"admin command", Options{NoMigrate: true, MustWrite: true}, "then run the command again"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Open(ctx, path, tt.opts)
			if err == nil {
				s.Close()
				t.Fatal("Open on a full disk succeeded, want it refused")
			}
			want := "the disk holding " + mnt + " is full ("
			if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tt.again) {
				t.Errorf("Open = %v\nwant it to say %q and %q", err, want, tt.again)
			}
		})
	}

	if err := os.Remove(balloon); err != nil {
		t.Fatal(err)
	}
	s, err = Open(ctx, path, Options{})
	if err != nil {
		t.Fatalf("Open once the disk has room: %v", err)
	}
	defer s.Close()
	if _, err := s.Session(ctx, "s1"); err != nil {
		t.Errorf("Session(s1): %v", err)
	}
}

// TestCheckSpaceOfADiskNearlyFull: CheckSpace warns of a file system with less than LowSpace
// free, once for the data directory and the database on it (a data directory not made yet
// counts as its parent), saying whether the database is on it, and calls it full once less
// than NoSpace is: nothing can be written. Before, check-config and serve's start said nothing
// of a disk nearly full, which the writes found.
func TestCheckSpaceOfADiskNearlyFull(t *testing.T) {
	mnt := testutil.TmpfsOfItsOwn(t, "16m")
	if mnt == "" {
		return
	}
	data, db := filepath.Join(mnt, "data", "not-made-yet"), filepath.Join(mnt, "agentgate.db")
	check := func(full bool) {
		t.Helper()
		errs := CheckSpace(data, db)
		var se *SpaceError
		if len(errs) != 1 || !errors.As(errs[0], &se) || se.Dir != data || se.Full != full || !se.Database || se.Free >= LowSpace {
			t.Fatalf("CheckSpace(%s, %s) = %v, want one *SpaceError of %s with Full %v, of the database's disk", data, db, errs, data, full)
		}
		want := "has only "
		if full {
			want = "is full (0 KiB free to this user"
		}
		if !strings.Contains(errs[0].Error(), "the disk holding "+data+" "+want) {
			t.Errorf("CheckSpace's error = %v, want it to say %q", errs[0], want)
		}
	}
	check(false)
	testutil.MustFill(t, filepath.Join(mnt, "balloon"))
	check(true)
	// The database on another disk: the data directory's is full, but serve can start.
	elsewhere := filepath.Join(t.TempDir(), "agentgate.db")
	errs := CheckSpace(data, elsewhere)
	var se *SpaceError
	if len(errs) != 1 || !errors.As(errs[0], &se) || !se.Full || se.Database ||
		!strings.Contains(se.Error(), "the writes the database refuses cannot wait in the spool") {
		t.Errorf("CheckSpace(%s, %s) = %v, want one *SpaceError of %s, full, not of the database's disk", data, elsewhere, errs, data)
	}
}
