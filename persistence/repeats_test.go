package persistence_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// brokenSpool is a real spool whose Append or Remove fails on demand (a full disk, a
// directory the daemon's user cannot write).
type brokenSpool struct {
	*spool.Spool
	append, remove atomic.Bool
}

var errDiskFull = errors.New("no space left on device")

func (s *brokenSpool) Append(groups [][]persistence.Op) (string, error) {
	if s.append.Load() {
		return "", errDiskFull
	}
	return s.Spool.Append(groups)
}

func (s *brokenSpool) Remove(names ...string) error {
	if s.remove.Load() {
		return errDiskFull
	}
	return s.Spool.Remove(names...)
}

// brokenWorld is the persistence actor over a real SQLite store in t.TempDir() that goes down
// on demand (out) and a real spool that fails on demand (broken), logging into logs.
type brokenWorld struct {
	t      *testing.T
	st     *sqlite.Store
	sp     *spool.Spool
	broken *brokenSpool
	out    *storetest.Outage
	system *actor.ActorSystem
	pid    *actor.PID
	logs   *testutil.Buffer
}

// quietSystem returns an actor system that logs to quiet. When the test ends it waits out
// protoactor's dead-letter log throttle, as the actors package's quietSystem does: the first
// dead letter of an interval (a timer's message to the actor the test stopped) starts a
// goroutine that waits for the interval on a ticker, and a synctest bubble that ends while one
// waits panics ("blocked goroutines remain": TestAWriteBehindTheSpoolIsRefusedWhenTheSpoolFails
// in a CI run). The interval is a millisecond, so outside a bubble the wait costs nothing.
func quietSystem(t *testing.T, quiet *slog.Logger) *actor.ActorSystem {
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }),
		actor.WithDeadLetterThrottleInterval(time.Millisecond))
	t.Cleanup(func() { time.Sleep(2 * time.Millisecond) }) // registered before the system's stop, so it runs after it
	return system
}

// newBrokenWorld starts the actor with opts (MaxBatch 64, the broken spool, a replay each
// second and the logs filled in) over the store that store makes of the outage (nil: the
// outage itself). Its cleanups, run in the synctest bubble of t, stop the actor, then the
// actor system, then close the store.
func newBrokenWorld(t *testing.T, opts persistence.ActorOptions, store func(*storetest.Outage) persistence.Store) *brokenWorld {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sp, err := spool.Open(filepath.Join(dir, "spool"))
	if err != nil {
		t.Fatal(err)
	}
	w := &brokenWorld{t: t, st: st, sp: sp, broken: &brokenSpool{Spool: sp}, out: &storetest.Outage{Store: st}, logs: &testutil.Buffer{}}
	quiet := slog.New(slog.DiscardHandler)
	w.system = quietSystem(t, quiet)
	t.Cleanup(w.system.Shutdown)
	var s persistence.Store = w.out
	if store != nil {
		s = store(w.out)
	}
	opts.MaxBatch, opts.Spool, opts.ReplayEvery = 64, w.broken, time.Second
	opts.Log = slog.New(slog.NewTextHandler(w.logs, nil))
	w.pid = w.system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(t.Context(), s, opts)))
	t.Cleanup(func() { _ = w.system.Root.StopFuture(w.pid).Wait() })
	return w
}

// write sends the write group ops as write id and returns the actor's answer.
func (w *brokenWorld) write(id uint64, ops ...persistence.Op) error {
	w.t.Helper()
	return w.send(&persistence.Write{ID: id, Ops: ops})
}

// send sends m and returns the actor's answer; no answer within a minute fails the test.
func (w *brokenWorld) send(m *persistence.Write) error {
	w.t.Helper()
	res, err := w.system.Root.RequestFuture(w.pid, m, time.Minute).Result()
	if err != nil {
		w.t.Fatalf("write %d: %v", m.ID, err)
	}
	return res.(*persistence.WriteResult).Err
}

// TestLastingSpoolFailuresAreNotLoggedEachTime: a spool failure that lasts is logged once a
// minute, with how often it repeated meanwhile, not at every commit or replay tick. Before,
// a replayed batch the spool could not remove logged an ERR line every second for as long as
// it lasted, and a full disk one per commit.
func TestLastingSpoolFailuresAreNotLoggedEachTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newBrokenWorld(t, persistence.ActorOptions{}, nil)
		out, broken, sp, logs, write := w.out, w.broken, w.sp, w.logs, w.write
		count := func(msg string) int { return strings.Count(logs.String(), msg) }

		if err := write(1, session("s1", "k1", t0)); err != nil {
			t.Fatal(err)
		}
		// The database and the disk are full: each write is refused, and said once.
		out.Down.Store(true)
		broken.append.Store(true)
		for i := range 10 {
			if err := write(uint64(2+i), userMessage("s1", int64(1+i), "m"+string(rune('a'+i)))); !errors.Is(err, persistence.ErrUnavailable) {
				t.Fatalf("write during the outage: %v, want ErrUnavailable", err)
			}
			time.Sleep(time.Second)
		}
		if n := count("database and spool both failed"); n != 1 {
			t.Errorf("10 refused writes within a minute logged %d lines, want 1:\n%s", n, logs.String())
		}
		// The disk has room again, the database not yet: a write is spooled; then the
		// database comes back, but the replayed batch cannot be removed.
		broken.append.Store(false)
		if err := write(20, userMessage("s1", 20, "mz")); err != nil {
			t.Fatal(err)
		}
		broken.remove.Store(true)
		out.Down.Store(false)
		time.Sleep(2*time.Minute + 500*time.Millisecond) // about 120 replay ticks
		synctest.Wait()
		if n := count("cannot remove a replayed spool batch"); n < 2 || n > 3 {
			t.Errorf("2 minutes of failing removes logged %d lines, want 2 or 3 (one a minute):\n%s", n, logs.String())
		}
		if !strings.Contains(logs.String(), "repeats=") {
			t.Errorf("no line counts the repeats held back:\n%s", logs.String())
		}
		broken.remove.Store(false)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if sp.Len() != 0 {
			t.Errorf("spool holds %d batches once removes work, want 0", sp.Len())
		}
	})
}
