package supervisor

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// TestStopDuringTheStartsOpenSaysWhatItWrote: a stop asked for while the start opens the SQLite
// store (here as the store logs a step of its opening) stops the start (ErrStopped), and its
// line says what the opening wrote: the schema's migrations when it applied any (a new
// database's, or an older binary's database's, whether the stop came during the migration,
// which finishes first, or once the store had opened), and that there was nothing to migrate
// otherwise; no run is recorded either way. An opening that fails for real as the stop comes
// (a migration that fails) fails the start with its failure (exit 1), not as a stop: before,
// the stop's ErrStopped hid it, and the daemon exited 0. Before, a stop that came just after a migration's
// commit could say "stopped without writing anything", and one with nothing to migrate said
// "the opening, its migrations included, finished first".
func TestStopDuringTheStartsOpenSaysWhatItWrote(t *testing.T) {
	const (
		migratedLine = "asked to stop during the start while it opened the store; the schema's migrations had been applied " +
			"(one that has begun finishes first), no conversation or run written; stopped before the daemon served"
		nothingLine = "asked to stop during the start while it opened the store; it had nothing to migrate, " +
			"and no conversation or run was written; stopped before the daemon served"
	)
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, path string) // the database the start finds
		at     string                          // the store's line the stop comes at
		want   string                          // the stop's line; or, with fails, what Start's error says
		fails  bool                            // the opening fails for real as the stop comes
	}{
		{"a new database, stopped once it opened", func(*testing.T, string) {}, "store opened: a new, empty database", migratedLine, false},
		{"an older binary's database, stopped during its migration", func(t *testing.T, path string) {
			testutil.SQLiteSchemaOneMigrationShort(t, path, "../persistence/sqlite/migrations")
		}, "schema migrated", migratedLine, false},
		{"an older binary's database, stopped once it opened", func(t *testing.T, path string) {
			testutil.SQLiteSchemaOneMigrationShort(t, path, "../persistence/sqlite/migrations")
		}, "store opened", migratedLine, false},
		{"a database at this schema, stopped once it opened", func(t *testing.T, path string) {
			s, err := sqlite.Open(t.Context(), path, sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
		}, "store opened", nothingLine, false},
		{"an older binary's database whose migration fails, stopped during it", func(t *testing.T, path string) {
			testutil.SQLiteSchemaOneMigrationShort(t, path, "../persistence/sqlite/migrations")
			db, err := sql.Open("sqlite", "file:"+path)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.Exec(`ALTER TABLE sessions ADD COLUMN reset_due_at INTEGER`); err != nil { // what the last migration adds
				t.Fatal(err)
			}
		}, "migrating the schema", "duplicate column name", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.DataDir, cfg.HTTP.Addr = t.TempDir(), "127.0.0.1:0"
			tc.before(t, cfg.DSN())
			stop := make(chan struct{})
			logs := &logSignal{want: tc.at, ready: stop}
			d, err := Start(t.Context(), cfg, slog.New(slog.NewTextHandler(logs, nil)), Options{Agent: echo.New(), Stop: stop})
			if err == nil {
				_ = d.Stop(context.Background())
			}
			if tc.fails {
				// The failure wins over the stop: the start fails (exit 1) with it.
				if err == nil || errors.Is(err, ErrStopped) || errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Start = %v after a stop as the store logged %q and its opening failed, want the failure (%q)", err, tc.at, tc.want)
				}
				if got := logs.String(); strings.Contains(got, "asked to stop") {
					t.Errorf("the start's log says it stopped, though its opening failed:\n%s", got)
				}
				return
			}
			if !errors.Is(err, ErrStopped) {
				t.Fatalf("Start = %v after a stop as the store logged %q, want ErrStopped:\n%s", err, tc.at, logs.String())
			}
			got := logs.String()
			if !strings.Contains(got, tc.want) {
				t.Errorf("the start's log:\n%s\nwant %q", got, tc.want)
			}
			for _, never := range []string{"stopped without writing anything", "agentgate started", "level=WARN", "level=ERROR"} {
				if strings.Contains(got, never) {
					t.Errorf("the start's log says %q:\n%s", never, got)
				}
			}
			s, err := sqlite.OpenReadOnly(t.Context(), cfg.DSN()) // refused below this binary's schema
			if err != nil {
				t.Fatalf("the database after the stopped start: %v", err)
			}
			s.Close()
			db, err := sql.Open("sqlite", "file:"+cfg.DSN()+"?mode=ro")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var run string
			if err := db.QueryRow(`SELECT run FROM daemon_run WHERE one = 1`).Scan(&run); err != nil || run != "" {
				t.Errorf("run recorded by the stopped start = %q, %v; want none", run, err)
			}
		})
	}
}
