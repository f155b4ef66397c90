package supervisor

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	agtest "github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
)

// TestMemberWarnsOfASpoolLeftInItsDataDirectory: a member of a shared store (a cluster member)
// whose data directory holds a spool a single daemon left there says at its start, in one WRN
// line, that it never replays it, how many batches it holds, and what to do; it leaves the
// batches where they are. A member whose data directory holds no spool says nothing of one.
// Before, nothing said that these writes were in no database.
func TestMemberWarnsOfASpoolLeftInItsDataDirectory(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	onDSN := func(c *config.Config) { c.Store.Driver, c.Store.DSN = "postgres", dsn }
	const line = "a single daemon's spool is left in the data directory, and a cluster member never replays it"

	dir := t.TempDir()
	spoolDir := filepath.Join(dir, "spool")
	sp, err := spool.Open(spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, title := range []string{"one", "two"} {
		if _, err := sp.Append([][]persistence.Op{{&persistence.SetTitle{SessionID: "s1", Title: title}}}); err != nil {
			t.Fatal(err)
		}
	}
	var logs agtest.Buffer
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, shared: true, logs: &logs, tweak: onDSN})
	r.stop(t)
	var warned []string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, line) {
			warned = append(warned, l)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "level=WARN") || !strings.Contains(warned[0], "dir="+spoolDir) ||
		!strings.Contains(warned[0], "batches=2") || !strings.Contains(warned[0], "start that single daemon once on this data_dir") {
		t.Errorf("a member's start on a data directory with 2 spooled batches logged %q; want one WRN line with dir=%s batches=2 and what to do; log:\n%s",
			warned, spoolDir, logs.String())
	}
	if n, err := spool.Waiting(spoolDir); err != nil || n != 2 {
		t.Errorf("after the member ran, the spool holds %d batch(es) (%v), want the 2 left as they were", n, err)
	}

	var quiet agtest.Buffer
	r = MustStartDaemon(t, echo.New(), daemonOpts{shared: true, logs: &quiet, tweak: onDSN})
	r.stop(t)
	if strings.Contains(quiet.String(), "spool") {
		t.Errorf("a member's start on a data directory without a spool logged of one:\n%s", quiet.String())
	}
}
