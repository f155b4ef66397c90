package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/jackc/pgx/v5"
)

// migrationHeld makes dsn's schema one migration short of this binary's, as an older binary
// left it, and holds schema_migrations against writes in an admin transaction: a start's
// migration applies the last file, then waits to record it. It returns the admin connection,
// the latest version and release, which commits the transaction (the migration goes on). waiting reports whether
// the migration waits.
func migrationHeld(t *testing.T, dsn string) (admin *pgx.Conn, latest int, waiting func() bool, release func()) {
	t.Helper()
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	latest = pgtest.SchemaOneMigrationShort(t, ctx, admin, "../persistence/postgres/migrations")
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE schema_migrations IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	waiting = func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND NOT granted
			AND relation = 'schema_migrations'::regclass`).Scan(&n)
		return err == nil && n > 0
	}
	release = func() {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return admin, latest, waiting, release
}

// TestStartsContextEndedWhileItMigratesFails: the ctx Start was given (not Options.Stop) ending
// while the start migrates PostgreSQL lets the migration finish, and the start fails with
// postgres.ErrMigratedThenEnded: nothing recorded, the schema at this binary's version. Before,
// only a stop asked for by Options.Stop was looked for then: the start went on with no store
// (postgres.Open had returned none), and panicked at its first use of it.
func TestStartsContextEndedWhileItMigratesFails(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	admin, latest, waiting, release := migrationHeld(t, dsn)
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = t.TempDir(), "127.0.0.1:0"
	cfg.Store.Driver, cfg.Store.DSN = "postgres", dsn
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	started := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				started <- fmt.Errorf("Start panicked: %v", p)
			}
		}()
		d, err := Start(ctx, cfg, slog.New(slog.DiscardHandler), Options{Agent: echo.New()})
		if err == nil {
			err = errors.New("Start returned a daemon")
			_ = d.Stop(context.Background())
		}
		started <- err
	}()
	waitUntil(t, waiting)
	cancel()
	release()
	select {
	case err := <-started:
		if !errors.Is(err, postgres.ErrMigratedThenEnded) || !errors.Is(err, context.Canceled) || errors.Is(err, ErrStopped) {
			t.Fatalf("Start = %v after its ctx ended during the migration, want postgres.ErrMigratedThenEnded (and context.Canceled)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Start did not return after its ctx ended")
	}
	var version int
	if err := admin.QueryRow(t.Context(), `SELECT max(version) FROM schema_migrations`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	var run string
	if err := admin.QueryRow(t.Context(), `SELECT run FROM daemon_run`).Scan(&run); err != nil {
		t.Fatal(err)
	}
	if run != "" {
		t.Errorf("run %q recorded after a start whose ctx ended, want none", run)
	}
	if version != latest {
		t.Errorf("schema version %d after the start, want %d (the migration finished)", version, latest)
	}
}
