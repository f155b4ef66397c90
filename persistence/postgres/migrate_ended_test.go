package postgres

import (
	"context"
	"errors"
	"testing"

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
