package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"log/slog"
	"time"

	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations returns the embedded migrations in version order.
func migrations() ([]sqlstore.Migration, error) {
	return sqlstore.Migrations(migrationFS, "migrations/*.sql")
}

// migrate applies the embedded migrations that the database lacks, in order, in one write
// transaction, and records each in schema_migrations. A database migrated by a newer binary is
// refused. It logs each migration it applies and how long they took together (a migration that
// rebuilds a table takes a while on a large store, and the daemon does not listen meanwhile).
//
// They run with foreign keys on, and a database may hold rows of no session: what a prune step
// left of the sessions it deleted, until the next step (PruneStep; a stop in between leaves them
// until the next start's first step). A migration that copies messages or turn_usage into a new
// table that references sessions would fail on them, and the daemon would not start: such a
// migration deletes them first, with their search index entries (as pruner.messages does:
// leaving a message's entry behind corrupts the index).
//
// ctx ends the wait for the write lock (beginUncut), which another process may hold, but not
// the transaction once begun: it runs to its end, as a cut would roll all of it back, to be
// done again from the start at the next Open (Open returns ErrMigratedThenEnded then, when it
// applied any). It returns how many migrations it applied (committed): zero when the database
// had them all, which the stop's line tells apart (the daemon's).
func migrate(ctx context.Context, w *sql.DB, log *slog.Logger) (applied int, err error) {
	ms, err := migrations()
	if err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	tx, err := beginUncut(ctx, w)
	if err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	ctx = context.WithoutCancel(ctx)
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER NOT NULL PRIMARY KEY,
		applied_at INTEGER NOT NULL
	)`); err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	var current int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	if latest := ms[len(ms)-1].Version; current > latest {
		return 0, fmt.Errorf("migrate: database schema version %d is newer than this binary's %d", current, latest)
	}
	start := time.Now()
	for _, m := range ms {
		if m.Version <= current {
			continue
		}
		if current > 0 { // a new database gets every migration: nothing to tell
			log.Info("migrating the schema", "migration", m.Name)
		}
		applied++
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return 0, fmt.Errorf("migrate %s: %w", m.Name, err)
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`,
			m.Version, time.Now().UnixNano()); err != nil {
			return 0, fmt.Errorf("migrate %s: %w", m.Name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	if applied > 0 && current > 0 {
		log.Info("schema migrated", "from", current, "to", ms[len(ms)-1].Version, "took", time.Since(start).Round(time.Millisecond))
	}
	return applied, nil
}

// beginUncut begins a write transaction on w (BEGIN IMMEDIATE: the writer's _txlock) whose
// wait for the write lock ctx ends, as modernc.org/sqlite's busy handler gives up once the
// statement's ctx is done (with ctx's error), but which ctx does not end once begun: database/sql
// rolls a transaction back as soon as its BeginTx's ctx ends. A ctx that ends as the BEGIN
// returns rolls back the transaction, which holds nothing yet, and beginUncut returns ctx's error.
func beginUncut(ctx context.Context, w *sql.DB) (*sql.Tx, error) {
	// txCtx's parent never ends: nothing is left to release once the transaction ends.
	txCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	tx, err := w.BeginTx(txCtx, nil)
	if !stop() { // ctx ended during the BEGIN, or as it returned: cancel ends the transaction
		if err == nil {
			_ = tx.Rollback()
		}
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	return tx, nil
}

// checkSchema reports an error unless every embedded migration has been applied (a read-only
// store cannot migrate, and must not: an older daemon may be running on the file). The error
// says how to migrate, for an operator who runs a newer binary's admin commands first.
func checkSchema(ctx context.Context, r *sql.DB) error {
	current, latest, err := schemaVersions(ctx, r)
	if err != nil {
		return err
	}
	if current < latest {
		return fmt.Errorf("check schema: database schema version %d, want %d: an older agentgate wrote it; start this version's daemon on it once to migrate it", current, latest)
	}
	return nil
}

// checkSchemaToWrite is checkSchema for a store that writes without migrating
// (Options.NoMigrate): a newer schema is refused too, as migrate refuses it, since this
// binary's writes may not be what that schema expects.
func checkSchemaToWrite(ctx context.Context, w *sql.DB) error {
	if err := checkSchema(ctx, w); err != nil {
		return err
	}
	current, latest, err := schemaVersions(ctx, w)
	if err != nil {
		return err
	}
	if current > latest {
		return fmt.Errorf("check schema: database schema version %d is newer than this binary's %d", current, latest)
	}
	return nil
}

// schemaVersions returns the database's schema version and this binary's.
func schemaVersions(ctx context.Context, db *sql.DB) (current, latest int, err error) {
	ms, err := migrations()
	if err != nil {
		return 0, 0, fmt.Errorf("check schema: %w", err)
	}
	if err := db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return 0, 0, fmt.Errorf("check schema: %w", err)
	}
	return current, ms[len(ms)-1].Version, nil
}
