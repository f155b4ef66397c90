package supervisor

import (
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
	data := filepath.Join(mnt, "data")
	checkStartWarnsOfTheDisk(t, data, data, "a disk with 16 MiB free")
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
	checkStartWarnsOfTheDisk(t, testutil.DataDirLinkedTo(t, mnt), mnt, "a database linked to a disk with 16 MiB free")
}

// checkStartWarnsOfTheDisk starts a daemon on the data directory dir and stops it, and checks
// that its log warned once of the disk holding disk, nearly full; of says what dir is on.
func checkStartWarnsOfTheDisk(t *testing.T, dir, disk, of string) {
	t.Helper()
	var logs testutil.Buffer
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, logs: &logs})
	r.stop(t)
	want := `level=WARN msg="the disk holding the data directory or the database is nearly full; writes are refused once it is full" ` +
		`err="the disk holding ` + disk + ` has only `
	if got := logs.String(); strings.Count(got, want) != 1 {
		t.Errorf("log of a start on %s:\n%s\nwant %q once", of, got, want)
	}
}
