package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
)

// TestOfflineWriteLockedDatabase: with the daemon stopped and another process holding the
// database's write lock (a sqlite3 shell in a transaction), each writing command fails after
// the 5 s a commit waits for the lock, not after 15 to 20 s of writes that each waited for it,
// with an error that names the database, the way to find the process, and that nothing was
// changed. A lock held briefly (a checkpoint) is waited for: the command then runs.
func TestOfflineWriteLockedDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the store's 5 s busy timeout")
	}
	dir := MustSeedSessions(t)
	path := filepath.Join(dir, "agentgate.db")
	unlock := testutil.LockSQLite(t, path)
	for _, args := range [][]string{
		{"pardon", "--all"},
		{"reset", keyA},
		{"requeue", keyA, "m4"},
	} {
		start := time.Now()
		out, _, err := runSessions(t, append(args, "--data-dir", dir)...)
		took := time.Since(start)
		if w := "open " + path + ": the database is locked by another process (SQLITE_BUSY): "; err == nil || !strings.HasPrefix(err.Error(), w) ||
			!strings.Contains(err.Error(), "held its write lock for 5 s; end it (fuser "+path+") and run the command again (nothing was changed)") || out != "" {
			t.Errorf("sessions %s with the database locked = %v, stdout %q; want the error %q…, naming fuser and that nothing was changed",
				strings.Join(args, " "), err, out, w)
		}
		// 5 s of SQLite's busy handler, and what a loaded machine adds; before, 20 s.
		if took > 9*time.Second {
			t.Errorf("sessions %s with the database locked failed after %v, want about 5 s", strings.Join(args, " "), took.Round(time.Millisecond))
		}
	}
	unlock()

	// Held briefly: the pardon waits for it, as a commit does.
	unlock = testutil.LockSQLite(t, path)
	time.AfterFunc(500*time.Millisecond, unlock)
	if out, _ := MustRunSessions(t, "pardon", "--all", "--data-dir", dir); !strings.HasPrefix(out, "pardoned ") {
		t.Errorf("pardon with the database locked for 0.5 s printed %q, want it pardoned", out)
	}
}
