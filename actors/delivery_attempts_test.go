package actors

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/platformtest"
	"github.com/asynkron/protoactor-go/actor"
)

// flakyPlatform is a fake whose first sends fail: transient of them as may pass (a 503), then,
// if refuse is set, one refused for good (platforms.ErrUndeliverable).
type flakyPlatform struct {
	*platformtest.Fake
	transient atomic.Int32
	refuse    atomic.Bool
}

func (p *flakyPlatform) Send(ctx context.Context, out *platforms.Outbound) error {
	if p.transient.Add(-1) >= 0 {
		return errors.New("503 service unavailable")
	}
	if p.refuse.CompareAndSwap(true, false) {
		return fmt.Errorf("403 missing access: %w", platforms.ErrUndeliverable)
	}
	return p.Fake.Send(ctx, out)
}

// attemptsWorld is a platform actor over a flakyPlatform, whose marks go through the
// persistence actor (with a spool) into a real SQLite store, through an Outage.
type attemptsWorld struct {
	store  *sqlite.Store
	out    *storetest.Outage
	spool  *spool.Spool
	system *actor.ActorSystem
	p      *flakyPlatform
	d      *Deps
	pid    *actor.PID
}

// newAttemptsWorld starts an attemptsWorld and records in its store the pending outbox entry
// seq 1 of key k1, with attempts counted already. Call it inside synctest.Test.
func newAttemptsWorld(t *testing.T, attempts int) *attemptsWorld {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	dir := t.TempDir()
	store, err := sqlite.Open(ctx, filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sp, err := spool.Open(filepath.Join(dir, "spool"))
	if err != nil {
		t.Fatal(err)
	}
	storetest.MustCommit(t, store,
		&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k1", Seq: 1, SessionID: "s1", Kind: "reply",
			Text: "reply 1", Platform: "fake", ChatType: "dm", ChatID: "c1", State: persistence.DeliveryPending,
			Attempts: attempts, CreatedAt: time.Now()}})
	system, quiet := quietSystem(t)
	w := &attemptsWorld{store: store, out: &storetest.Outage{}, spool: sp, system: system,
		p: &flakyPlatform{Fake: platformtest.NewFake("fake")}}
	d := &Deps{Ctx: ctx, Store: store, Log: quiet, Metrics: metrics.New("fake")}
	w.d = d
	d.Persist = system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, w.out.Wrap(store),
		persistence.ActorOptions{MaxBatch: 64, Spool: sp, Spooling: &d.Spooling, ReplayEvery: time.Second})))
	w.pid = system.Root.Spawn(NewPlatform(d, w.p, &PlatformHealth{}))
	t.Cleanup(func() {
		_ = system.Root.PoisonFuture(w.pid).Wait()
		_ = system.Root.PoisonFuture(d.Persist).Wait()
		system.Shutdown()
		if err := store.Close(); err != nil {
			t.Error(err)
		}
		cancel()
	})
	return w
}

// send hands the world's outbox entry to the platform actor, as a loading session does (with the
// attempts the store counts for it), and waits a minute for its sends, retries and marks.
func (w *attemptsWorld) send(t *testing.T) {
	t.Helper()
	es, err := w.store.OutboxAfter(t.Context(), "k1", 0, 0)
	if err != nil || len(es) != 1 {
		t.Fatalf("OutboxAfter(k1) = %v, %v; want the one entry", es, err)
	}
	w.system.Root.Send(w.pid, &SendOutbound{Out: OutboundFromEntry(&es[0]), Again: true, Attempts: es[0].Attempts})
	time.Sleep(time.Minute)
	synctest.Wait()
}

// entry returns the world's outbox entry as stored.
func (w *attemptsWorld) entry(t *testing.T) persistence.OutboxEntry {
	t.Helper()
	es, err := w.store.OutboxAfter(t.Context(), "k1", 0, 0)
	if err != nil || len(es) != 1 {
		t.Fatalf("OutboxAfter(k1) = %v, %v; want the one entry", es, err)
	}
	return es[0]
}

// TestDeliveryRetriedCountsItsTries: a reply whose sends fail and are retried shows in the store,
// once delivered (or refused for good), the sends tried for it, each once, counted on from the
// attempts its outbox entry had when it was loaded (an earlier run's). Before, its mark counted
// one attempt, whatever the tries.
func TestDeliveryRetriedCountsItsTries(t *testing.T) {
	tests := []struct {
		name         string
		stored       int  // attempts of the entry as loaded
		transient    int  // sends that fail and are retried
		refuse       bool // then one refused for good
		wantState    string
		wantAttempts int
	}{
		{"delivered at once", 0, 0, false, persistence.DeliveryDelivered, 1},
		{"delivered at the fourth try", 0, 3, false, persistence.DeliveryDelivered, 4},
		{"refused for good at the third try", 0, 2, true, persistence.DeliveryFailed, 3},
		{"delivered at the second try after two earlier", 2, 1, false, persistence.DeliveryDelivered, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newAttemptsWorld(t, tt.stored)
				w.p.transient.Store(int32(tt.transient))
				w.p.refuse.Store(tt.refuse)
				w.send(t)
				if e := w.entry(t); e.State != tt.wantState || e.Attempts != tt.wantAttempts {
					t.Errorf("outbox entry %s with %d attempts, want %s with %d", e.State, e.Attempts, tt.wantState, tt.wantAttempts)
				}
			})
		})
	}
}

// TestStopRecordsTheTriesOfAReplyStillPending: a reply whose sends keep failing when the daemon
// stops stays pending, to be sent again at the next start, with the sends tried for it
// counted; the next run, which gets it with those attempts from its loading session, counts its
// tries on from them. Before, the stop recorded nothing: the entry showed 0 attempts, and 1
// once the next run delivered it at its first try.
func TestStopRecordsTheTriesOfAReplyStillPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newAttemptsWorld(t, 0)
		const failing = 100
		w.p.transient.Store(failing)
		w.send(t) // a minute of tries, which all fail
		tried := failing - int(w.p.transient.Load())
		if tried < 2 {
			t.Fatalf("%d sends tried in a minute, want a few", tried)
		}
		if err := w.system.Root.PoisonFuture(w.pid).Wait(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // the persistence actor's commit of the stop's marks
		synctest.Wait()
		if e := w.entry(t); e.State != persistence.DeliveryPending || e.Attempts != tried {
			t.Errorf("outbox entry %s with %d attempts after the stop, want pending with %d (its tries)", e.State, e.Attempts, tried)
		}

		w.p.transient.Store(0)
		w.pid = w.system.Root.Spawn(NewPlatform(w.d, w.p, &PlatformHealth{})) // the next run's
		w.send(t)
		if e := w.entry(t); e.State != persistence.DeliveryDelivered || e.Attempts != tried+1 {
			t.Errorf("outbox entry %s with %d attempts once the next run delivered it, want delivered with %d", e.State, e.Attempts, tried+1)
		}
	})
}

// TestReplayedDeliveryMarkCountsOnce: the write of a reply's mark commits, but its answer is
// lost (a connection that broke after COMMIT), so the persistence actor spools it and replays
// it: the mark is applied twice. The entry counts each of its tries once. Before, the replay
// counted its last attempt again.
func TestReplayedDeliveryMarkCountsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newAttemptsWorld(t, 0)
		w.p.transient.Store(2)
		w.p.refuse.Store(true) // a failed mark: a delivered one re-applies as a no-op anyway
		w.out.Lost.Store(1)
		w.send(t)
		if n := w.out.Lost.Load(); n != 0 {
			t.Fatalf("%d lost commit answers left, want the mark's write to have lost its", n)
		}
		if n := w.spool.Len(); n != 0 {
			t.Fatalf("%d batches in the spool, want the mark replayed", n)
		}
		if e := w.entry(t); e.State != persistence.DeliveryFailed || e.Attempts != 3 {
			t.Errorf("outbox entry %s with %d attempts once its mark was replayed, want failed with 3 (its tries)", e.State, e.Attempts)
		}
	})
}

// TestUnconfirmedReplyIsHandedOverWithItsAttempts: a session that loads a reply its store shows
// unconfirmed hands it to its platform with the delivery attempts the store counts for it, for
// the platform actor to count its tries on from (TestDeliveryRetriedCountsItsTries).
func TestUnconfirmedReplyIsHandedOverWithItsAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo"}, nil
		})
		w := newManagerWorldAt(t, path, echo, nil)
		w.deliver(t, "m1", "one")
		first := <-w.sent // the world's platform marks nothing: it stays unconfirmed
		w.stop()
		store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		storetest.MustCommit(t, store, &persistence.MarkDelivery{SessionKey: w.key, Seq: first.Out.Seq,
			State: persistence.DeliveryPending, At: time.Now(), Attempt: 2}) // two tries of an earlier run
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}

		w = newManagerWorldAt(t, path, echo, nil)
		w.deliver(t, "m2", "two")
		for {
			select {
			case m := <-w.sent:
				if m.Out.Seq != first.Out.Seq {
					continue
				}
				if !m.Again || m.Attempts != 2 {
					t.Errorf("unconfirmed reply handed over with again=%v attempts=%d, want again with 2", m.Again, m.Attempts)
				}
				return
			case <-time.After(time.Minute):
				t.Fatal("the unconfirmed reply was not handed over within a minute")
			}
		}
	})
}
