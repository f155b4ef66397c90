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
// count of the waits is read on the bubble's clock, which only the waits move: SQLite's busy
// handler (modernc.org/sqlite's, in Go) sleeps the busy timeout, 5 s, in steps whose last one
// ends on it, so a command that waited once took exactly 5 s there and one that waited twice
// 10 s, whatever the machine (the test takes well under a second of real time).
//
// A command that waits out the lock more than once can also hang the bubble rather than take
// 10 s: Close waits on the store's mutex for the search index's timer, which sleeps in the busy
// handler, and synctest counts no mutex wait as durably blocked, so the bubble's clock stops
// for good (the code before MustWrite, 44d71a6). The watchdog fails the test then, naming it,
// instead of go test's timeout minutes later.
func TestOfflineWriteLockedDatabase(t *testing.T) {
	const busy = 5 * time.Second // the writer's busy timeout (its DSN's busy_timeout)
	dir := MustSeedSessions(t)
	path := filepath.Join(dir, "agentgate.db")
	testutil.BubbleTest(t, lockedBubbleWithin, lockedBubbleHang, func(t *testing.T) {
		unlock := testutil.LockSQLite(t, path)
		before := databaseFiles(t, path)
		for _, args := range [][]string{
			{"pardon", "--all"},
			{"reset", keyA},
			{"requeue", keyA, "m4"},
		} {
			start := time.Now()
			out, stderr, err := runSessionsIn(t.Context(), append(args, "--data-dir", dir)...)
			took := time.Since(start)
			if w := "open " + path + ": the database is locked by another process (SQLITE_BUSY): "; err == nil || !strings.HasPrefix(err.Error(), w) ||
				!strings.Contains(err.Error(), "held its write lock for 5 s; end it (fuser "+path+") and run the command again (nothing was changed): ") ||
				!strings.HasSuffix(err.Error(), ": take the write lock: database is locked (5) (SQLITE_BUSY)") || out != "" || stderr != "" {
				t.Errorf("sessions %s with the database locked = %v, stdout %q, stderr %q; want the open's check to fail with the error %q…, "+
					"naming fuser and that nothing was changed, and nothing else said", strings.Join(args, " "), err, out, stderr, w)
			}
			if took < busy || took >= 2*busy {
				t.Errorf("sessions %s with the database locked failed after %v of waits for the lock (%.1f of the busy timeout, %v); want one wait",
					strings.Join(args, " "), took, float64(took)/float64(busy), busy)
			}
		}
		if after := databaseFiles(t, path); after != before {
			t.Errorf("the database's files changed under the commands that failed (%s, then %s); want nothing changed", before, after)
		}
		unlock()

		// Held briefly: the pardon waits for it, as a commit does, and runs once it is released
		// (while the busy handler sleeps between two tries).
		const held = 500 * time.Millisecond
		unlock = testutil.LockSQLite(t, path)
		time.AfterFunc(held, unlock)
		start := time.Now()
		out, _, err := runSessionsIn(t.Context(), "pardon", "--all", "--data-dir", dir)
		took := time.Since(start)
		if err != nil || !strings.HasPrefix(out, "pardoned ") {
			t.Errorf("pardon with the database locked for %v = %v, printed %q; want it pardoned", held, err, out)
		}
		if took < held || took >= busy {
			t.Errorf("pardon with the database locked for %v ran after %v of waits, want it to wait for the lock and no longer", held, took)
		}
	})
}

// lockedBubbleWithin bounds in real time a bubble that runs sessions commands against a locked
// database (testutil.BubbleTest): they take well under a second; one that hangs never ends.
const lockedBubbleWithin = 2 * time.Minute

// lockedBubbleHang says what most likely hangs such a bubble.
const lockedBubbleHang = "a command waits for the database's lock more than once (its writes or Close, not only the open's check), " +
	"and a wait on the store's mutex behind the busy handler's sleep holds the bubble's clock still"

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
