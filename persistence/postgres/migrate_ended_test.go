package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestOpenEndedDuringAMigrationWithNothingToMigrate: an Open whose ctx ends (the daemon's stop)
// during the migration's transaction of a database at this binary's schema (here held, after
// the migration's advisory lock, by an admin transaction that locks schema_migrations) returns
// ctx's error, not ErrMigratedThenEnded: nothing was migrated, nothing written, and the
// daemon's stop says so. Before, it was ErrMigratedThenEnded, and the daemon said "the
// opening, its migrations included, finished first". Migrated says what each Open applied.
func TestOpenEndedDuringAMigrationWithNothingToMigrate(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.NewDatabase(t)
	s, err := Open(ctx, dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Migrated(); got != len(ms) {
		t.Errorf("Migrated() of a new database's Open = %d, want %d", got, len(ms))
	}
	_ = s.Close()

	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE schema_migrations IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	openCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	opened := openAside(openCtx, dsn, Options{Exclusive: true})
	awaitWaiter(t, admin, "the migration", "schema_migrations", `SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND NOT granted
		AND relation = 'schema_migrations'::regclass`)
	cancel()
	if err := tx.Commit(ctx); err != nil { // the migration's transaction goes on, and finds nothing to do
		t.Fatal(err)
	}
	if err := <-opened; !errors.Is(err, context.Canceled) || errors.Is(err, ErrMigratedThenEnded) {
		t.Fatalf("Open = %v after its ctx ended during a migration with nothing to migrate, want context.Canceled and not ErrMigratedThenEnded", err)
	}
	s, err = Open(ctx, dsn, Options{Exclusive: true}) // its daemon lock let go of
	if err != nil {
		t.Fatalf("Open after the cut one = %v", err)
	}
	if got := s.Migrated(); got != 0 {
		t.Errorf("Migrated() of an Open with nothing to migrate = %d, want 0", got)
	}
	_ = s.Close()
}

// TestOpenFailedForRealAsAStopCameIsNoStop: an exclusive Open of an older binary's database
// (one migration short) migrates it, then raises the daemon lock's epoch, whose UPDATE waits
// here for an admin transaction that holds daemon_epoch's row. A stop as it waits cuts the
// raise: Open returns ErrMigratedThenEnded and ctx's error (pgx's error for the cut statement
// is ctx's: endedByCtx), and the daemon exits 0 as a stop. A real failure that a stop meets
// (the lock's connection lost as the raise waits, its backend terminated, and the stop coming
// as Open fails) is Open's error as without the stop, saying how many migrations it applied
// first, and the daemon's start fails with it (exit 1). Before, it was dropped for
// ErrMigratedThenEnded, and the daemon exited 0 saying it had stopped. Either way the
// migration was committed.
func TestOpenFailedForRealAsAStopCameIsNoStop(t *testing.T) {
	const raise = `UPDATE daemon_epoch SET epoch = epoch + 1, exclusive = true%`
	for _, tc := range []struct {
		name string
		lost bool // the lock's connection is lost as the raise waits, the stop coming as Open fails
	}{
		{"a stop as the epoch's raise waits", false},
		{"the lock's connection lost as the raise waits, a stop coming as Open fails", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			dsn := pgtest.NewDatabase(t)
			admin, watch := mustConn(t, dsn), mustConn(t, dsn)
			latest := pgtest.SchemaOneMigrationShort(t, ctx, admin, "migrations")
			tx, err := admin.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			if _, err := tx.Exec(ctx, `SELECT epoch FROM daemon_epoch FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			openCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			opts := Options{Exclusive: true}
			if tc.lost {
				opts.openStep = func(step string) {
					if step == "failed" {
						cancel()
					}
				}
			}
			opened := openAside(openCtx, dsn, opts)
			awaitWaiter(t, watch, "the epoch's raise", "daemon_epoch's row", `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE $1`, raise)
			if tc.lost {
				var n int
				if err := watch.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND query LIKE $1`, raise).Scan(&n); err != nil || n != 1 {
					t.Fatalf("terminate the lock's backend: %d, %v", n, err)
				}
			} else {
				cancel()
			}
			var got error
			select {
			case got = <-opened:
			case <-time.After(30 * time.Second):
				t.Fatal("Open did not return")
			}
			if openCtx.Err() == nil {
				t.Fatalf("Open = %v before the stop came: the test does not test", got)
			}
			if !tc.lost {
				if !errors.Is(got, ErrMigratedThenEnded) || !errors.Is(got, context.Canceled) {
					t.Errorf("Open = %v after a stop cut the epoch's raise, want ErrMigratedThenEnded and context.Canceled", got)
				}
			} else if errors.Is(got, context.Canceled) || errors.Is(got, ErrMigratedThenEnded) ||
				!strings.Contains(got.Error(), "raise the daemon lock's epoch") ||
				!strings.Contains(got.Error(), "after it applied 1 migrations") {
				t.Errorf("Open = %v after the lock's connection was lost as a stop came, want the raise's failure, after 1 migration, neither context.Canceled nor ErrMigratedThenEnded", got)
			}
			var version int
			if err := watch.QueryRow(ctx, `SELECT max(version) FROM schema_migrations`).Scan(&version); err != nil {
				t.Fatal(err)
			}
			if version != latest {
				t.Errorf("schema version %d after the Open, want %d (the migration committed)", version, latest)
			}
		})
	}
}
