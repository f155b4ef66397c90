package sqlite

import (
	"database/sql"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
)

// TestLastingCheckpointFailureIsLoggedOnceAMinute: the checkpointer runs every second, so a
// checkpoint that keeps failing logged a WRN line every second for as long as it lasted. It
// is logged once a minute now, with the failures it stands for.
func TestLastingCheckpointFailureIsLoggedOnceAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		db, err := sql.Open("sqlite", dsn(path))
		if err != nil {
			t.Fatal(err)
		}
		db.Close() // every checkpoint fails: sql: database is closed
		var logs testutil.Buffer
		c := startCheckpointer(db, path, time.Second, slog.New(slog.NewTextHandler(&logs, nil)))
		time.Sleep(150 * time.Second)
		c.stop()
		if n := strings.Count(logs.String(), "wal checkpoint failed"); n != 3 {
			t.Errorf("150 failed checkpoints logged %d lines, want 3 (one a minute):\n%s", n, logs.String())
		}
		if !strings.Contains(logs.String(), "failures=60") {
			t.Errorf("no line counts the minute's failures:\n%s", logs.String())
		}
	})
}
