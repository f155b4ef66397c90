package sqlite

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
)

// TestMustWriteExplainsALockTakenAfterOpen: an admin command's store (Options.MustWrite) checks
// at its open that it can take the write lock; another process (a sqlite3 shell) that takes it
// right after that check makes each of the command's writes wait out the busy timeout. Their
// errors say then what the open's would have: who may hold the lock, the fuser command, and to
// run the command again; they still count as the database unavailable (a spool replay stops on
// them). Before, they said only "database is locked (5) (SQLITE_BUSY)".
func TestMustWriteExplainsALockTakenAfterOpen(t *testing.T) {
	// In a bubble, under its context: modernc.org/sqlite's busy handler then waits in Go
	// timers, on the bubble's clock (see TestOfflineWriteLockedDatabase), not 10 s of real time.
	// The watchdog fails a bubble whose clock a wait on a mutex behind that sleep held still.
	testutil.BubbleTest(t, 2*time.Minute, "a wait on the store's mutex behind the busy handler's sleep holds the bubble's clock still", func(t *testing.T) {
		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "agentgate.db")
		s, err := Open(ctx, path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		s, err = Open(ctx, path, Options{NoMigrate: true, MustWrite: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		unlock := testutil.LockSQLite(t, path) // the second connection, right after the open's check
		defer unlock()

		_, pardonErr := s.Pardon(ctx, "")
		commitErr := s.Commit(ctx, [][]persistence.Op{{&persistence.SetTitle{SessionID: "s1", Title: "t"}}})[0]
		want := "the database is locked by another process (SQLITE_BUSY): a connection outside agentgate " +
			"(a sqlite3 shell in a transaction, a backup or sync tool) held its write lock for 5 s; end it (fuser " + path +
			") and run the command again: "
		for what, err := range map[string]error{"pardon": pardonErr, "commit": commitErr} {
			if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), "database is locked (5) (SQLITE_BUSY)") {
				t.Errorf("%s under a lock taken after the open = %v, want %q…database is locked (5) (SQLITE_BUSY)", what, err, want)
			}
			if !errors.Is(err, persistence.ErrUnavailable) {
				t.Errorf("%s under a lock taken after the open = %v, want it persistence.ErrUnavailable too", what, err)
			}
		}
	})
}
