package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
)

// TestOfflineWriteLockedDatabase: with the daemon stopped and another process holding the
// database's write lock (a sqlite3 shell in a transaction), each writing command fails at its
// open, in the one wait for the lock that the open's check makes (Options.MustWrite), with an
// error that names the database, the way to find the process, and that nothing was changed.
// Before, each of the command's writes waited out the lock in turn: 15 to 20 s, then "database
// is locked (5)". A lock held briefly (a checkpoint) is waited for: the command then runs.
//
// What shows it is structural: the error is the open's check's (it ends with "take the write
// lock: database is locked"), and the database's files are as they were, byte for byte. The
// time is a check of the wait's count, not of the machine's speed: SQLite's busy handler sleeps
// its busy timeout, 5 s, in steps that never end early, so a command that waited once took at
// least 5 s, and one that waited twice at least 10 s, however fast the machine; the bounds
// fail only on a machine that spends 5 s more on the wait's lock attempts.
func TestOfflineWriteLockedDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the store's 5 s busy timeout")
	}
	const busy = 5 * time.Second // the writer's busy timeout (its DSN's busy_timeout)
	dir := MustSeedSessions(t)
	path := filepath.Join(dir, "agentgate.db")
	unlock := testutil.LockSQLite(t, path)
	before := databaseFiles(t, path)
	for _, args := range [][]string{
		{"pardon", "--all"},
		{"reset", keyA},
		{"requeue", keyA, "m4"},
	} {
		start := time.Now()
		out, stderr, err := runSessions(t, append(args, "--data-dir", dir)...)
		took := time.Since(start)
		if w := "open " + path + ": the database is locked by another process (SQLITE_BUSY): "; err == nil || !strings.HasPrefix(err.Error(), w) ||
			!strings.Contains(err.Error(), "held its write lock for 5 s; end it (fuser "+path+") and run the command again (nothing was changed): ") ||
			!strings.HasSuffix(err.Error(), ": take the write lock: database is locked (5) (SQLITE_BUSY)") || out != "" || stderr != "" {
			t.Errorf("sessions %s with the database locked = %v, stdout %q, stderr %q; want the open's check to fail with the error %q…, "+
				"naming fuser and that nothing was changed, and nothing else said", strings.Join(args, " "), err, out, stderr, w)
		}
		if took < busy || took >= 2*busy {
			t.Errorf("sessions %s with the database locked failed after %v; want one wait of the busy timeout, %v (two take %v or more)",
				strings.Join(args, " "), took.Round(time.Millisecond), busy, 2*busy)
		}
	}
	if after := databaseFiles(t, path); after != before {
		t.Errorf("the database's files changed under the commands that failed (%s, then %s); want nothing changed", before, after)
	}
	unlock()

	// Held briefly: the pardon waits for it, as a commit does.
	unlock = testutil.LockSQLite(t, path)
	time.AfterFunc(500*time.Millisecond, unlock)
	if out, _ := MustRunSessions(t, "pardon", "--all", "--data-dir", dir); !strings.HasPrefix(out, "pardoned ") {
		t.Errorf("pardon with the database locked for 0.5 s printed %q, want it pardoned", out)
	}
}

// databaseFiles returns what the SQLite database at path holds on disk, its file and its WAL,
// in a form to compare (a write, committed or not, changes the WAL).
func databaseFiles(t *testing.T, path string) string {
	t.Helper()
	var files []string
	for _, p := range []string{path, path + "-wal"} {
		data, err := os.ReadFile(p)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		files = append(files, fmt.Sprintf("%s: %d bytes, sha256 %x", filepath.Base(p), len(data), sha256.Sum256(data)))
	}
	return strings.Join(files, "; ")
}
