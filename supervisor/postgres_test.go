package supervisor

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestPostgresUnavailableSpoolsAndDrains is TestDatabaseLockedSpoolsAndDrains on PostgreSQL:
// the daemon's database stops taking connections and its connections are cut in the middle of
// a load (what a server restart or a network cut looks like to it). Intake goes on into the
// spool, and once the database is back the spool drains: every acknowledged message is stored
// and answered exactly once, in order.
func TestPostgresUnavailableSpoolsAndDrains(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := startOn(t, t.TempDir(), 10*time.Second, echo.New(), func(c *config.Config) {
		c.Store.Driver, c.Store.DSN = "postgres", dsn
	})
	defer r.stop(t)
	spoolsAndDrains(t, r, func(t *testing.T) func() { return cutDatabase(t, dsn) })
}

// cutDatabase makes the database of dsn refuse new connections and terminates the ones it has,
// until the returned function lets connections in again.
func cutDatabase(t *testing.T, dsn string) (restore func()) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := cfg.Database
	db := pgx.Identifier{name}.Sanitize()
	cfg.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+db+` WITH ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, name); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			if _, err := admin.Exec(ctx, `ALTER DATABASE `+db+` WITH ALLOW_CONNECTIONS true`); err != nil {
				t.Errorf("let connections in again: %v", err)
			}
			admin.Close(ctx)
		})
	}
	t.Cleanup(restore)
	return restore
}
