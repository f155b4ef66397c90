package persistence_test

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/persistence"
)

// TestKeptRefusalsAreToldWhenTheStoreTakesAWrite: a sender answered a write it keeps (Write.Keep:
// a session's turn result) refused as unavailable is told once the store takes a write again,
// another sender's (persistence.WritesTaken), once per refusal; a write the store refuses tells
// it nothing, nor is a sender told whose refused write it does not keep. So a session that holds
// a refused turn result writes it again as soon as the store takes writes, not at the end of its
// pause (up to 10 s). The store is a cluster member's (no spool: the database takes the write)
// or a single daemon's on a full disk (its spool takes the write once it has room again).
func TestKeptRefusalsAreToldWhenTheStoreTakesAWrite(t *testing.T) {
	for _, spooled := range []bool{false, true} {
		t.Run(fmt.Sprintf("spool=%v", spooled), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newBrokenWorld(t, persistence.ActorOptions{}, nil)
				pid := w.pid
				if !spooled {
					quiet := slog.New(slog.DiscardHandler)
					pid = w.system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(t.Context(), w.out,
						persistence.ActorOptions{MaxBatch: 64, Log: quiet})))
					t.Cleanup(func() { _ = w.system.Root.StopFuture(pid).Wait() })
				}
				keeper, other := newWriter(w.system, pid), newWriter(w.system, pid)
				if err := keeper.write(t, &persistence.Write{ID: 1, Ops: []persistence.Op{session("s1", "k1", t0)}}); err != nil {
					t.Fatal(err)
				}
				if err := other.write(t, &persistence.Write{ID: 2, Ops: []persistence.Op{session("s2", "k2", t0)}}); err != nil {
					t.Fatal(err)
				}

				w.out.Down.Store(true) // the database refuses writes; on a full disk the spool too
				w.broken.append.Store(true)
				if err := keeper.write(t, &persistence.Write{ID: 3, Ops: outbox(1), Keep: true}); !errors.Is(err, persistence.ErrUnavailable) {
					t.Fatalf("the kept write in the outage: %v, want it refused as unavailable", err)
				}
				if err := other.write(t, &persistence.Write{ID: 4, Ops: []persistence.Op{userMessage("s2", 1, "o1")}}); !errors.Is(err, persistence.ErrUnavailable) {
					t.Fatalf("another write in the outage: %v, want it refused as unavailable", err)
				}
				if n := keeper.taken(); n != 0 {
					t.Errorf("told %d times that the store takes writes while it refused them, want 0", n)
				}

				if spooled {
					w.broken.append.Store(false) // room on the disk: the spool takes writes
				} else {
					w.out.Down.Store(false) // the database answers again
				}
				if err := other.write(t, &persistence.Write{ID: 5, Ops: []persistence.Op{userMessage("s2", 1, "o1")}}); err != nil {
					t.Fatalf("another write once the store takes writes: %v", err)
				}
				if n := keeper.taken(); n != 1 {
					t.Errorf("the sender of the kept write refused was told %d times that the store takes writes, want once", n)
				}
				if n := other.taken(); n != 0 {
					t.Errorf("the sender of a refused write it does not keep was told %d times, want 0", n)
				}
				if err := other.write(t, &persistence.Write{ID: 6, Ops: []persistence.Op{userMessage("s2", 2, "o2")}}); err != nil {
					t.Fatal(err)
				}
				if n := keeper.taken(); n != 0 {
					t.Errorf("told %d times more at the next write taken, want once in all", n)
				}
			})
		})
	}
}

// TestKeptRefusalsAreToldWhenTheStoreRecovers: a sender answered a write it keeps refused as
// unavailable is told at once when the actor hears that the store takes writes again
// (persistence.StoreRecovered: a cluster member's PostgreSQL store took its daemon lock again),
// with no write taken, once per refusal; a sender whose refused write it does not keep is not
// told. Before, the only sign was a write taken: a cluster member's stopping session, trying
// its held turn result again once a second, came just after the retake, once another member
// had claimed the key, and the result was refused for good (its message ran twice; a soak).
func TestKeptRefusalsAreToldWhenTheStoreRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newBrokenWorld(t, persistence.ActorOptions{}, nil)
		quiet := slog.New(slog.DiscardHandler)
		pid := w.system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(t.Context(), w.out,
			persistence.ActorOptions{MaxBatch: 64, Log: quiet}))) // no spool, as a cluster member's
		t.Cleanup(func() { _ = w.system.Root.StopFuture(pid).Wait() })
		keeper, other := newWriter(w.system, pid), newWriter(w.system, pid)
		if err := keeper.write(t, &persistence.Write{ID: 1, Ops: []persistence.Op{session("s1", "k1", t0)}}); err != nil {
			t.Fatal(err)
		}

		w.out.Down.Store(true) // the daemon lock is lost: every write is refused
		if err := keeper.write(t, &persistence.Write{ID: 2, Ops: outbox(1), Keep: true}); !errors.Is(err, persistence.ErrUnavailable) {
			t.Fatalf("the kept write in the outage: %v, want it refused as unavailable", err)
		}
		if err := other.write(t, &persistence.Write{ID: 3, Ops: []persistence.Op{session("s2", "k2", t0)}}); !errors.Is(err, persistence.ErrUnavailable) {
			t.Fatalf("another write in the outage: %v, want it refused as unavailable", err)
		}

		w.out.Down.Store(false) // the lock is taken again; no write comes
		w.system.Root.Send(pid, &persistence.StoreRecovered{})
		if n := keeper.taken(); n != 1 {
			t.Errorf("the sender of the kept write refused was told %d times that the store recovered, want once", n)
		}
		if n := other.taken(); n != 0 {
			t.Errorf("the sender of a refused write it does not keep was told %d times, want 0", n)
		}
		w.system.Root.Send(pid, &persistence.StoreRecovered{})
		if err := other.write(t, &persistence.Write{ID: 4, Ops: []persistence.Op{session("s2", "k2", t0)}}); err != nil {
			t.Fatal(err)
		}
		if n := keeper.taken(); n != 0 {
			t.Errorf("told %d times more at the next recovery and write taken, want once in all", n)
		}
	})
}

// writer is a sender of writes to the persistence actor, as a session is: an actor that keeps
// its answers, and counts the WritesTaken it is told.
type writer struct {
	root    *actor.RootContext
	pid     *actor.PID
	results chan *persistence.WriteResult
	told    chan struct{}
}

func newWriter(system *actor.ActorSystem, persist *actor.PID) *writer {
	w := &writer{root: system.Root, results: make(chan *persistence.WriteResult, 8), told: make(chan struct{}, 8)}
	w.pid = system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *persistence.Write:
			c.Request(persist, m)
		case *persistence.WriteResult:
			w.results <- m
		case *persistence.WritesTaken:
			w.told <- struct{}{}
		}
	}))
	return w
}

// write sends m through the writer and returns its answer, once everything it set off is done.
func (w *writer) write(t *testing.T, m *persistence.Write) error {
	t.Helper()
	w.root.Send(w.pid, m)
	synctest.Wait()
	select {
	case r := <-w.results:
		if r.ID != m.ID {
			t.Fatalf("write %d answered %+v", m.ID, r)
		}
		return r.Err
	default:
		t.Fatalf("write %d is not answered", m.ID)
		return nil
	}
}

// taken is how many WritesTaken the writer was told since it was last asked.
func (w *writer) taken() int {
	synctest.Wait()
	n := 0
	for {
		select {
		case <-w.told:
			n++
		default:
			return n
		}
	}
}
