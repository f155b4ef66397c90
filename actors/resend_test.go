package actors

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
)

// panicOnReopen is a store whose commit panics, once armed, when a batch holds a ReopenSession:
// the persistence actor restarts and loses the writes it held.
type panicOnReopen struct {
	persistence.Store
	armed atomic.Bool
}

func (p *panicOnReopen) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	for _, g := range groups {
		for _, op := range g {
			if _, ok := op.(*persistence.ReopenSession); ok && p.armed.CompareAndSwap(true, false) {
				panic("commit of a /resume (test)")
			}
		}
	}
	return p.Store.Commit(ctx, groups)
}

// TestResentWritesKeepTheSessionsOrder: a restart of the persistence actor loses a /resume's
// write, and the session's next write (a /new) must not commit ahead of it when it is sent
// again. Before, the /new committed at once and the /resume 5 s later: it reopened the session
// /new had ended, next to the new one (two open sessions of one key).
func TestResentWritesKeepTheSessionsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo"}, nil
		})
		var faulty *panicOnReopen
		w := newManagerWorldWith(t, filepath.Join(t.TempDir(), "agentgate.db"), echo, nil,
			func(s persistence.Store) persistence.Store {
				faulty = &panicOnReopen{Store: s}
				return faulty
			})
		ctx := context.Background()
		routed := func() string {
			t.Helper()
			synctest.Wait()
			r, err := w.store.Route(ctx, w.key)
			if err != nil {
				t.Fatal(err)
			}
			return r.SessionID
		}
		if r := w.deliver(t, "m1", "hello"); r.ErrorCode != "" {
			t.Fatalf("m1: %+v", r)
		}
		x := routed()
		if r := w.deliver(t, "n1", "/new"); r.ErrorCode != "" {
			t.Fatalf("/new: %+v", r)
		}
		if y := routed(); y == x {
			t.Fatalf("/new kept session %s", x)
		}

		faulty.armed.Store(true)
		resume := w.request("r1", "/resume "+x) // its write is lost with the persistence actor's batch
		if r := w.deliver(t, "n2", "/new"); r.ErrorCode != "" {
			t.Fatalf("second /new: %+v", r)
		}
		res, err := resume.Result()
		if err != nil {
			t.Fatal(err)
		}
		if r := res.(*DeliverResult); r.ErrorCode != "" || !strings.Contains(r.SessionId, x) {
			t.Fatalf("/resume %s: %+v", x, r)
		}
		if faulty.armed.Load() {
			t.Fatal("the /resume's commit did not fail: the test did not restart the persistence actor")
		}
		time.Sleep(time.Minute) // every re-send has run
		z := routed()
		if z == x {
			t.Fatalf("the key routes to %s, the session the second /new ended", x)
		}
		got, err := w.store.Session(ctx, x)
		if err != nil {
			t.Fatal(err)
		}
		if got.EndedAt.IsZero() || got.EndReason != persistence.EndNewCommand {
			t.Errorf("session %s (resumed, then ended by /new): ended %v, reason %q; want ended by /new (the /resume was applied after it)",
				x, got.EndedAt, got.EndReason)
		}
	})
}
