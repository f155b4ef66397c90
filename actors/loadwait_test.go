package actors

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// downStore refuses claims and loads as unavailable while down is set, counting them. Past
// downTries it comes back by itself: a session that spins on it ends, and its test fails on
// the count instead of never ending (synctest's clock stands still while anything runs).
type downStore struct {
	persistence.Store
	down          atomic.Bool
	claims, loads atomic.Int32
}

const downTries = 200

func (s *downStore) refuses(n int32) bool {
	if n > downTries {
		s.down.Store(false)
	}
	return s.down.Load()
}

func (s *downStore) Claim(ctx context.Context, key, owner string, at time.Time, seen *persistence.ClaimSeen) (persistence.Claimed, error) {
	if s.refuses(s.claims.Add(1)) {
		return persistence.Claimed{}, fmt.Errorf("claim %s: %w", key, persistence.ErrUnavailable)
	}
	return s.Store.Claim(ctx, key, owner, at, seen)
}

func (s *downStore) LoadSession(ctx context.Context, key string, historyLimit, pendingLimit int) (*persistence.Snapshot, error) {
	if s.refuses(s.loads.Add(1)) {
		return nil, fmt.Errorf("load %s: %w", key, persistence.ErrUnavailable)
	}
	return s.Store.LoadSession(ctx, key, historyLimit, pendingLimit)
}

// TestSessionWaitsForTheDatabaseToLoad: a session whose claim or load the database refuses as
// unavailable (PostgreSQL restarting under a cluster) waits and tries again each second,
// refusing messages with "unavailable" meanwhile, and loads once the database answers. Before,
// it crashed at every try: the messages that kept coming for its key started it again at once
// each time it crashed out, thousands of times a second (a cluster soak's PostgreSQL restart).
func TestSessionWaitsForTheDatabaseToLoad(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fencing bool
	}{{"claim (cluster)", true}, {"load", false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
					return &agents.Response{Text: "echo: " + req.Messages[0].Text}, nil
				})
				var store *downStore
				w := newManagerWorld(t, echo, func(d *Deps) {
					store = &downStore{Store: d.Store}
					store.down.Store(true)
					d.Store, d.Fencing = store, tc.fencing
				})
				tries := func() int32 {
					if tc.fencing {
						return store.claims.Load()
					}
					return store.loads.Load()
				}
				for i := range 20 {
					r := w.deliver(t, fmt.Sprint("m", i), "while the database is down")
					if r.ErrorCode != "unavailable" {
						t.Errorf("message %d while the database is down: %+v, want refused as unavailable", i, r)
					}
				}
				time.Sleep(10 * time.Second)
				synctest.Wait()
				if n := tries(); n > 12 {
					t.Errorf("the session tried to start %d times in 10 s of outage, want about one a second", n)
				}
				act, _ := w.system.Root.RequestFuture(w.manager, &ListActive{}, time.Hour).Result()
				if !slices.Contains(act.(*ActiveList).Keys, w.key) {
					t.Errorf("the waiting session is not in memory: it crashed out")
				}

				store.down.Store(false)
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if r := w.deliver(t, "after", "the database is back"); r.ErrorCode != "" || r.Disposition != platforms.Started {
					t.Fatalf("message once the database answers: %+v, want started", r)
				}
				w.awaitTurnEnds(1)
			})
		})
	}
}
