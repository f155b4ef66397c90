package supervisor

import (
	"os"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
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
	spoolsAndDrains(t, r, func(t *testing.T) func() { return pgtest.Cut(t, dsn) })
}
