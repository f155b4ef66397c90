package actors

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms"
)

// TestSessionWaitingForTheDatabaseSaysNothingOfASpool: a session that waits for the database
// to load, with no spool involved (a cluster has none), never says the spool has drained: it
// says once that the database answers again when it has loaded. Before, it logged "the spool
// has drained; the session loads" at each try of an outage, which reads as the database being
// back.
func TestSessionWaitingForTheDatabaseSaysNothingOfASpool(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fencing bool
	}{{"claim (cluster)", true}, {"load", false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
					return &agents.Response{Text: "echo: " + req.Messages[0].Text}, nil
				})
				var logs testutil.Buffer
				var store *downStore
				w := newManagerWorld(t, echo, func(d *Deps) {
					store = &downStore{Store: d.Store}
					store.down.Store(true)
					d.Store, d.Fencing = store, tc.fencing
					d.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
				})
				for i := range 3 {
					if r := w.deliver(t, fmt.Sprint("m", i), "while the database is down"); r.ErrorCode != "unavailable" {
						t.Errorf("message %d while the database is down: %+v, want refused as unavailable", i, r)
					}
				}
				time.Sleep(5 * time.Second)
				synctest.Wait()
				if out := logs.String(); strings.Contains(out, "spool") {
					t.Errorf("a session waiting for the database with no spool speaks of one:\n%s", out)
				}
				if out := logs.String(); strings.Contains(out, "the database answers again") {
					t.Errorf("the database answers again while it is down:\n%s", out)
				}

				store.down.Store(false)
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if r := w.deliver(t, "after", "the database is back"); r.ErrorCode != "" || r.Disposition != platforms.Started {
					t.Fatalf("message once the database answers: %+v, want started", r)
				}
				w.awaitTurnEnds(1)
				out := logs.String()
				if n := strings.Count(out, `msg="the database answers again; the session has loaded"`); n != 1 {
					t.Errorf("%d lines say the database answers again, want 1:\n%s", n, out)
				}
				if strings.Contains(out, "spool") {
					t.Errorf("a session that waited for the database with no spool speaks of one:\n%s", out)
				}
			})
		})
	}
}
