//go:build !race

// A cluster member's start: without -race, as cluster_test.go says why.

package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
)

// TestClusterStopWhileTheStartJoins: a stop asked for (Options.Stop: serve's first stop signal)
// while a member's start registers in the members table (here held by an admin transaction, as
// a database that does not answer would) ends the join at once: Start returns ErrStopped, says
// why, and the member is not registered. Before, the stop was acted on only once the join was
// over: its registration waited out member_ttl and the start failed ("membership: register:
// context deadline exceeded"; serve exited 1).
func TestClusterStopWhileTheStartJoins(t *testing.T) {
	ctx := t.Context()
	dsn, admin, tx := membersLocked(t)
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = t.TempDir(), "127.0.0.1:0"
	clusterOn(dsn)(cfg)
	cfg.Cluster.MemberTTL = 30 * time.Second // the join's bound
	var logs testutil.Buffer
	stop := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		d, err := Start(ctx, cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Agent: echo.New(), Stop: stop})
		if err == nil {
			err = errors.New("Start returned a daemon")
			_ = d.Stop(context.Background())
		}
		started <- err
	}()
	waitUntil(t, func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND NOT granted
			AND relation = 'members'::regclass`).Scan(&n)
		return err == nil && n > 0
	})
	close(stop)
	select {
	case err := <-started:
		if !errors.Is(err, ErrStopped) {
			t.Fatalf("Start = %v after a stop during its join, want ErrStopped:\n%s", err, logs.String())
		}
	case <-time.After(cfg.Cluster.MemberTTL / 2):
		t.Fatalf("Start went on joining the cluster after the stop:\n%s", logs.String())
	}
	const said = "asked to stop during the start while it joined the cluster; stopped without joining"
	if got := logs.String(); !strings.Contains(got, said) || strings.Contains(got, "joined the cluster cluster=") {
		t.Errorf("the start's log:\n%s\nwant %q, and no join", got, said)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var members int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM members`).Scan(&members); err != nil {
		t.Fatal(err)
	}
	if members != 0 {
		t.Errorf("%d members registered after a stop during the join, want none", members)
	}
}
