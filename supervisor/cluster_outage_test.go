//go:build !race

package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestClusterOutageCountsNoDeath: a member cut off from the database for longer than
// member_ttl while it runs a turn stops itself, and its message stays pending. The outage is
// no restart of the server (a failover or a network cut looks the same), so the server's start
// time does not explain it. The member started again on the same data directory records the
// stop before it claims anything, and its claim of the key counts no death: the message, run
// again and answered, has no attempt against it. Before, each such outage added one, and the
// third quarantined the message.
func TestClusterOutageCountsNoDeath(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	dir := t.TempDir()
	var calls atomic.Int32
	started := make(chan struct{})
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		if calls.Add(1) == 1 {
			close(started)
			<-ctx.Done() // runs until the member stops
			return nil, ctx.Err()
		}
		return &agents.Response{Text: "ok " + req.Messages[0].Text}, nil
	})
	member := func() *runtime {
		return MustStartDaemon(t, agent, daemonOpts{dir: dir, drain: time.Second, tweak: clusterOn(dsn)})
	}
	r := member()
	r.inject(t, dm, "m1", "work")
	<-started

	restore := pgtest.Cut(t, dsn)
	select {
	case err := <-r.d.Fatal():
		if !strings.Contains(err.Error(), "no renewal") {
			t.Errorf("Fatal: %v, want the failed renewals named", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a member cut off from the database for 30s still runs")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_ = r.d.Stop(ctx) // its leave and its clean stop fail: the database is still out
	if notes, _ := os.ReadDir(filepath.Join(dir, selfStopDir)); len(notes) != 1 {
		t.Errorf("%d notes of the stop in the data directory, want 1", len(notes))
	}
	restore()

	r = member()
	defer r.stop(t)
	r.waitReplyTo(t, "m1")
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var attempts int
	if err := conn.QueryRow(t.Context(), `SELECT attempts FROM messages WHERE message_id = 'm1'`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Errorf("message m1 has %d attempts after an outage of the database, want 0: the outage was counted as a death", attempts)
	}
	if notes, _ := os.ReadDir(filepath.Join(dir, selfStopDir)); len(notes) != 0 {
		t.Errorf("%d notes left in the data directory after the start that recorded them, want 0", len(notes))
	}
}
