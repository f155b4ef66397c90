package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/testutil"
)

// TestStartWarnsOfADiskNearlyFull: a daemon started on a data directory whose disk has less
// than sqlite.LowSpace free (16 MiB here) says so at start, and serves. Before, the disk was
// found full only when the writes failed on it.
func TestStartWarnsOfADiskNearlyFull(t *testing.T) {
	mnt := testutil.TmpfsOfItsOwn(t, "16m")
	if mnt == "" {
		return
	}
	var logs testutil.Buffer
	data := filepath.Join(mnt, "data")
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: data, logs: &logs})
	r.stop(t)
	want := `level=WARN msg="the disk holding the data directory or the database is nearly full; writes are refused once it is full" ` +
		`err="the disk holding ` + data + ` has only `
	if got := logs.String(); strings.Count(got, want) != 1 {
		t.Errorf("log of a start on a disk with 16 MiB free:\n%s\nwant %q once", got, want)
	}
}

// TestStartWarnsOfTheDiskALinkedDatabaseIsOn: a daemon whose data directory's agentgate.db is a
// link to a file on another disk, with less than sqlite.LowSpace free (16 MiB here), says so
// at start: SQLite writes the database, its -wal and its -shm at the link's target. Before, it
// looked at the data directory's disk only.
func TestStartWarnsOfTheDiskALinkedDatabaseIsOn(t *testing.T) {
	mnt := testutil.TmpfsOfItsOwn(t, "16m")
	if mnt == "" {
		return
	}
	data := t.TempDir() // on the test's own disk
	if err := os.Symlink(filepath.Join(mnt, "agentgate.db"), filepath.Join(data, "agentgate.db")); err != nil {
		t.Fatal(err)
	}
	var logs testutil.Buffer
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: data, logs: &logs})
	r.stop(t)
	want := `level=WARN msg="the disk holding the data directory or the database is nearly full; writes are refused once it is full" ` +
		`err="the disk holding ` + mnt + ` has only `
	if got := logs.String(); strings.Count(got, want) != 1 {
		t.Errorf("log of a start on a database linked to a disk with 16 MiB free:\n%s\nwant %q once", got, want)
	}
}
