package persistence_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// spoolWorld is a persistence actor with a spool over a real SQLite store that can fail.
type spoolWorld struct {
	system *actor.ActorSystem
	pid    *actor.PID
	store  *sqlite.Store
	out    *storetest.Outage
	dir    string
}

// newSpoolWorld starts one inside the caller's synctest bubble; ctx is the daemon's context.
func newSpoolWorld(t *testing.T, ctx context.Context) *spoolWorld {
	return startSpoolWorld(t, ctx, t.TempDir(), slog.New(slog.DiscardHandler), nil, false)
}

// startSpoolWorld starts a persistence actor with a spool over a real SQLite store in dir,
// logging to log, with the daemon's Spooling flag (may be nil) and its store down or not
// when it starts. Each tune, if any, changes the actor's options before it starts.
func startSpoolWorld(t *testing.T, ctx context.Context, dir string, log *slog.Logger, spooling *atomic.Bool, down bool,
	tune ...func(*persistence.ActorOptions)) *spoolWorld {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sp, err := spool.Open(filepath.Join(dir, "spool"))
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	w := &spoolWorld{
		system: quietSystem(t, quiet),
		store:  st, out: &storetest.Outage{Store: st}, dir: dir,
	}
	w.out.Down.Store(down)
	o := persistence.ActorOptions{MaxBatch: 64, Spool: sp, Spooling: spooling, ReplayEvery: time.Second, Log: log}
	for _, f := range tune {
		f(&o)
	}
	w.pid = w.system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, w.out, o)))
	return w
}

func (w *spoolWorld) close(t *testing.T) {
	_ = w.system.Root.StopFuture(w.pid).Wait()
	w.system.Shutdown()
	if err := w.store.Close(); err != nil {
		t.Error(err)
	}
}

func (w *spoolWorld) write(t *testing.T, id uint64, ops ...persistence.Op) {
	t.Helper()
	res, err := w.system.Root.RequestFuture(w.pid, &persistence.Write{ID: id, Ops: ops}, time.Minute).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := res.(*persistence.WriteResult).Err; err != nil {
		t.Fatalf("write %d: %v", id, err)
	}
}

func (w *spoolWorld) files(sub string) int {
	entries, _ := os.ReadDir(filepath.Join(w.dir, "spool", sub))
	n := 0
	for _, e := range entries {
		if e.Type().IsRegular() && filepath.Ext(e.Name()) == ".json" {
			n++
		}
	}
	return n
}

var t0 = time.Unix(1_700_000_000, 0)

// spooledResume writes session x of key k, ended by /new, and its successor y; then, with the
// database down, the /resume of x (y ended, x reopened and routed), which goes to the spool.
func (w *spoolWorld) spooledResume(t *testing.T) {
	t.Helper()
	end := t0.Add(time.Minute)
	w.write(t, 1, session("x", "k", t0), &persistence.EndSession{SessionID: "x", Reason: persistence.EndNewCommand, At: end},
		session("y", "k", end), &persistence.PutRoute{Route: persistence.Route{Key: "k", SessionID: "y", Generation: 2, UpdatedAt: end}})
	w.out.Down.Store(true)
	w.write(t, 2, &persistence.EndSession{SessionID: "y", Reason: persistence.EndSwitched, At: end},
		&persistence.ReopenSession{SessionID: "x"},
		&persistence.PutRoute{Route: persistence.Route{Key: "k", SessionID: "x", Generation: 3, UpdatedAt: end}})
}

func session(id, key string, at time.Time) *persistence.CreateSession {
	return &persistence.CreateSession{Session: persistence.Session{ID: id, Key: key, Platform: "http", StartedAt: at, LastActivityAt: at}}
}

func userMessage(sid string, seq int64, id string) *persistence.AppendMessage {
	return &persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: seq, Role: persistence.RoleUser,
		Content: "hello", Platform: "http", ChatID: "c", MessageID: id, Status: persistence.StatusPending, Active: true, CreatedAt: t0}}
}

// TestReplayDuringAStopKeepsTheSpool: a replay that runs while the daemon stops (its context
// ended) leaves the acknowledged writes in the spool for the next start; it does not set them
// aside as if the database had refused them.
func TestReplayDuringAStopKeepsTheSpool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		w := newSpoolWorld(t, ctx)
		defer w.close(t)
		w.write(t, 1, session("s1", "k1", t0))
		w.out.Down.Store(true)
		w.write(t, 2, userMessage("s1", 1, "m1")) // spooled, acknowledged
		cancel()                                  // the daemon stops…
		w.out.Down.Store(false)                   // …as the database comes back
		time.Sleep(5 * time.Second)               // replay ticks run
		synctest.Wait()
		if n := w.files("failed"); n != 0 {
			t.Errorf("%d spooled batches set aside during a stop, want none", n)
		}
		if n := w.files(""); n != 1 {
			t.Errorf("%d batches in the spool, want the 1 written", n)
		}
	})
}

// TestPruneWaitsForTheSpool: a prune while writes wait in the spool replays them first (they
// may reopen or write to a session it would delete), and does nothing while they still wait.
func TestPruneWaitsForTheSpool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newSpoolWorld(t, t.Context())
		defer w.close(t)
		w.spooledResume(t) // and a message in x, spooled too
		w.write(t, 3, userMessage("x", 1, "m1"))
		w.out.Down.Store(false)
		res, err := w.system.Root.RequestFuture(w.pid, &persistence.Prune{Before: t0.Add(24 * time.Hour)}, time.Minute).Result()
		if err != nil {
			t.Fatal(err)
		}
		if p := res.(*persistence.Pruned); p.Err != nil || p.Sessions > 1 {
			t.Errorf("prune: %+v, want at most y (ended, no longer routed) deleted", p)
		}
		time.Sleep(5 * time.Second) // the replay
		synctest.Wait()
		if tr, err := w.store.Transcript(context.Background(), "x"); err != nil || len(tr) != 1 {
			t.Errorf("the resumed session's transcript: %d rows, %v; want its message", len(tr), err)
		}
		if n := w.files("failed"); n != 0 {
			t.Errorf("%d spooled batches set aside, want none", n)
		}
	})
}

// TestPruneIsPutOffWhileTheSpoolWaits: while the database still refuses writes, a prune deletes
// nothing.
func TestPruneIsPutOffWhileTheSpoolWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newSpoolWorld(t, t.Context())
		defer w.close(t)
		w.spooledResume(t)
		res, err := w.system.Root.RequestFuture(w.pid, &persistence.Prune{Before: t0.Add(24 * time.Hour)}, time.Minute).Result()
		if err != nil {
			t.Fatal(err)
		}
		if p := res.(*persistence.Pruned); p.Sessions != 0 {
			t.Errorf("a prune with writes waiting in the spool deleted %d sessions, want none", p.Sessions)
		}
		if _, err := w.store.Session(context.Background(), "x"); err != nil {
			t.Errorf("Session(x): %v, want it kept for the spooled /resume", err)
		}
		w.out.Down.Store(false)
		time.Sleep(5 * time.Second)
		synctest.Wait()
	})
}
