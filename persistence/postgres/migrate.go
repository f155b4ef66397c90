package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations returns the embedded migrations in version order.
func migrations() ([]sqlstore.Migration, error) {
	return sqlstore.Migrations(migrationFS, "migrations/*.sql")
}

// migrateLock is the advisory lock class that serialises migrations of one schema between
// processes (cluster members starting together): "agmg" in ASCII. The lock's second key is the
// schema's hash, so deployments in different schemas of one database never wait for each
// other.
const migrateLock = 0x61676d67

// migrate applies the embedded migrations that the database lacks, in order, in one transaction
// under an advisory lock, and records each in schema_migrations. A database migrated by a newer
// binary is refused. ctx ends only the waits before anything is done: for a connection of the
// pool and its BEGIN (a database that stopped answering after the ping), and for the advisory
// lock (another process migrates). Once the lock is taken the migration runs to its end
// whatever ctx does (Open says why), and the caller looks at ctx then. Before, the BEGIN ran
// with the ctx the migration keeps, and a stop did not end its wait
// (TestOpenEndedWhileTheMigrationBeginsStops). It returns how many migrations it applied
// (committed): zero when the database had them all, which Open's error under a stop tells apart.
func migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (int, error) {
	ms, err := migrations()
	if err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	wait := ctx
	ctx = context.WithoutCancel(ctx)
	start, from, applied := time.Now(), 0, 0
	// pgxpool's ctx for Begin ends only the acquire and the BEGIN, not the transaction.
	err = pgx.BeginFunc(ctx, beginWith{pool, wait}, func(tx pgx.Tx) error {
		// Cut by wait, the statement fails and the transaction, which holds nothing yet, rolls
		// back (pgx closes the connection whose statement its ctx ended).
		if _, err := tx.Exec(wait, `SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))`, int32(migrateLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    INTEGER NOT NULL PRIMARY KEY,
			applied_at BIGINT  NOT NULL
		)`); err != nil {
			return err
		}
		var current int
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
			return err
		}
		if latest := ms[len(ms)-1].Version; current > latest {
			return fmt.Errorf("database schema version %d is newer than this binary's %d", current, latest)
		}
		from = current
		for _, m := range ms {
			if m.Version <= current {
				continue
			}
			if current > 0 { // a new database gets every migration: nothing to tell
				log.Info("migrating the schema", "migration", m.Name)
			}
			applied++
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)`,
				m.Version, time.Now().UnixNano()); err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
		}
		return nil
	})
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "3F000" {
		// invalid_schema_name: no schema of the search_path exists (a DSN's search_path=name
		// the operator has not created), which PostgreSQL words as "no schema has been selected
		// to create in".
		path := "?"
		_ = pool.QueryRow(ctx, `SELECT current_setting('search_path')`).Scan(&path)
		return 0, fmt.Errorf("migrate: no schema of the search_path (%s) exists to create the tables in: create it first (CREATE SCHEMA name, as the owner of the database): %w", path, err)
	}
	if err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	if applied > 0 && from > 0 { // as the SQLite store's: README says an upgrade logs how long it took
		log.Info("schema migrated", "from", from, "to", ms[len(ms)-1].Version, "took", time.Since(start).Round(time.Millisecond))
	}
	return applied, nil
}

// beginWith begins its pool's transactions with ctx, whatever ctx pgx.BeginFunc passes.
type beginWith struct {
	pool *pgxpool.Pool
	ctx  context.Context
}

func (b beginWith) Begin(context.Context) (pgx.Tx, error) { return b.pool.Begin(b.ctx) }

// checkSchema reports an error unless every embedded migration has been applied (see
// Options.NoMigrate); a newer schema is fine for reading.
func checkSchema(ctx context.Context, pool *pgxpool.Pool, _ *slog.Logger) error {
	ms, err := migrations()
	if err != nil {
		return fmt.Errorf("check schema: %w", err)
	}
	var current int
	err = pool.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined table: never migrated
		current, err = 0, nil
	}
	if err != nil {
		return fmt.Errorf("check schema: %w", err)
	}
	if want := ms[len(ms)-1].Version; current < want {
		return fmt.Errorf("check schema: database schema version %d, want %d (start the daemon on it once to migrate)", current, want)
	}
	return nil
}
