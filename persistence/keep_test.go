package persistence_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// TestWriteBehindAKeptRefusedWriteIsRefused: the store refuses a sender's write of outbox seq 1,
// as a full disk does, while the sender's next write (seq 2) waits behind it, and would take
// that one (room freed between two batches). When the sender keeps the refused write to send it
// again (Write.Keep: a session's turn result), the write behind it is refused too, so that seq 2
// never commits ahead of seq 1; sent again with nothing unacknowledged before it, the kept write
// is taken, and so is the next. A write behind a refused one its sender does not keep is taken,
// as before. Before, seq 2 was taken ahead of seq 1, and an event stream that read it skipped
// seq 1 when it came.
func TestWriteBehindAKeptRefusedWriteIsRefused(t *testing.T) {
	for _, keep := range []bool{true, false} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentgate.db"), sqlite.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				quiet := slog.New(slog.DiscardHandler)
				system := quietSystem(t, quiet)
				defer system.Shutdown()
				disk := &refusesSeq{Store: st, seq: 1, gate: make(chan struct{})}
				disk.full.Store(true)
				pid := system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(t.Context(), disk,
					persistence.ActorOptions{MaxBatch: 64, Log: quiet})))
				defer func() { _ = system.Root.StopFuture(pid).Wait() }()
				results := make(chan *persistence.WriteResult, 8)
				sender := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) { // one sender, as a session is
					switch m := c.Message().(type) {
					case *persistence.Write:
						c.Request(pid, m)
					case *persistence.WriteResult:
						results <- m
					}
				}))
				answer := func() *persistence.WriteResult {
					synctest.Wait()
					select {
					case r := <-results:
						return r
					default:
						t.Fatal("a write is not answered")
						return nil
					}
				}
				system.Root.Send(sender, &persistence.Write{ID: 1, Ops: []persistence.Op{session("s1", "k1", t0)}})
				if r := answer(); r.Err != nil {
					t.Fatal(r.Err)
				}

				system.Root.Send(sender, &persistence.Write{ID: 2, Ops: outbox(1), Keep: keep})
				system.Root.Send(sender, &persistence.Write{ID: 3, Ops: outbox(2), After: true})
				synctest.Wait() // seq 1 waits in its commit, and seq 2 behind it
				close(disk.gate)
				if r := answer(); r.ID != 2 || !errors.Is(r.Err, persistence.ErrUnavailable) {
					t.Fatalf("the write of seq 1: %+v, want it refused as unavailable", r)
				}
				r := answer()
				if keep && (r.ID != 3 || !errors.Is(r.Err, persistence.ErrUnavailable)) {
					t.Errorf("the write of seq 2, behind seq 1 refused and kept: %+v, want it refused as unavailable", r)
				}
				if !keep && (r.ID != 3 || r.Err != nil) {
					t.Errorf("the write of seq 2, behind seq 1 refused and not kept: %+v, want it taken", r)
				}
				if last, err := st.LastOutboxSeq(t.Context(), "k1"); err != nil || keep && last != 0 {
					t.Errorf("the key's last outbox seq while seq 1 is refused = %d (%v), want 0", last, err)
				}
				if !keep {
					return
				}

				disk.full.Store(false)
				system.Root.Send(sender, &persistence.Write{ID: 4, Ops: outbox(1), Keep: true})
				system.Root.Send(sender, &persistence.Write{ID: 5, Ops: outbox(2), After: true})
				for _, id := range []uint64{4, 5} {
					if r := answer(); r.ID != id || r.Err != nil {
						t.Errorf("sent again: %+v, want write %d taken", r, id)
					}
				}
				es, err := st.OutboxAfter(t.Context(), "k1", 0, 10)
				if err != nil {
					t.Fatal(err)
				}
				var seqs []int64
				for _, e := range es {
					seqs = append(seqs, e.Seq)
				}
				if !slices.Equal(seqs, []int64{1, 2}) {
					t.Errorf("the outbox holds seqs %v, want [1 2]", seqs)
				}
			})
		})
	}
}

// refusesSeq refuses every commit that holds the outbox entry seq, as a full disk does
// (persistence.ErrUnavailable for each group), while full is set; the first such commit waits
// for gate. It takes every other commit.
type refusesSeq struct {
	persistence.Store
	seq   int64
	gate  chan struct{}
	full  atomic.Bool
	first sync.Once
}

func (d *refusesSeq) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	holds := func(op persistence.Op) bool {
		o, ok := op.(*persistence.AddOutbox)
		return ok && o.Entry.Seq == d.seq
	}
	if !d.full.Load() || !slices.ContainsFunc(groups, func(g []persistence.Op) bool { return slices.ContainsFunc(g, holds) }) {
		return d.Store.Commit(ctx, groups)
	}
	d.first.Do(func() { <-d.gate })
	errs := make([]error, len(groups))
	for i := range errs {
		errs[i] = fmt.Errorf("%w: disk full (test)", persistence.ErrUnavailable)
	}
	return errs
}

// outbox is the write of the pending outbox entry seq of key k1 (session s1).
func outbox(seq int64) []persistence.Op {
	return []persistence.Op{&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k1", Seq: seq, SessionID: "s1",
		Kind: "reply", Text: fmt.Sprint("reply ", seq), Platform: "http", ChatType: "dm", ChatID: "c",
		State: persistence.DeliveryPending, CreatedAt: t0}}}
}
