package persistence_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// panicOnce is a store whose next commit panics once armed.
type panicOnce struct {
	persistence.Store
	armed atomic.Bool
}

func (p *panicOnce) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if p.armed.CompareAndSwap(true, false) {
		panic("commit (test)")
	}
	return p.Store.Commit(ctx, groups)
}

// TestRestartRefusesWritesBehindLostOnes: a restart of the persistence actor raises its
// incarnation, and the new incarnation refuses (ErrResend) a write sent to the old one behind
// unacknowledged writes of its sender, which the restart may have lost; it takes a write sent
// with nothing unacknowledged before it, and one sent to itself.
func TestRestartRefusesWritesBehindLostOnes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		quiet := slog.New(slog.DiscardHandler)
		system := quietSystem(t, quiet)
		defer system.Shutdown()
		store := &panicOnce{Store: st}
		var inc atomic.Uint64
		pid := system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(t.Context(), store,
			persistence.ActorOptions{MaxBatch: 64, Log: quiet, Incarnation: &inc})))
		defer func() { _ = system.Root.StopFuture(pid).Wait() }()

		store.armed.Store(true)
		lost := system.Root.RequestFuture(pid, &persistence.Write{ID: 1, Ops: []persistence.Op{session("s1", "k1", t0)}}, time.Hour)
		synctest.Wait() // the commit panicked and the actor restarted
		if got := inc.Load(); got != 1 {
			t.Fatalf("incarnation after a restart = %d, want 1", got)
		}
		tests := []struct {
			name  string
			write *persistence.Write
			want  error
		}{
			{"behind unacknowledged writes, sent before the restart", &persistence.Write{ID: 2, Incarnation: 0, After: true}, persistence.ErrResend},
			{"nothing unacknowledged before it", &persistence.Write{ID: 3, Incarnation: 0}, nil},
			{"sent after the restart", &persistence.Write{ID: 4, Incarnation: 1, After: true}, nil},
		}
		for _, tc := range tests {
			tc.write.Ops = []persistence.Op{&persistence.SetTitle{SessionID: "s1", Title: tc.name}}
			res, err := system.Root.RequestFuture(pid, tc.write, time.Minute).Result()
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if got := res.(*persistence.WriteResult).Err; !errors.Is(got, tc.want) || (tc.want == nil && got != nil) {
				t.Errorf("%s: error = %v, want %v", tc.name, got, tc.want)
			}
		}
		if _, err := lost.Result(); err == nil {
			t.Error("the write whose commit panicked was answered; want it lost with the restart")
		}
	})
}
