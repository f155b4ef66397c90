package actors

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// The timers actor keeps one pending prune and one pending scan: a Prune or CheckResets sent by
// hand replaces the pending one instead of starting a second chain of them, and a stopped
// timers actor leaves none behind. A pending tick holds the actor, and through its Deps the
// whole daemon, until it fires: up to PruneEvery (hours) after a stop, in every process that
// starts daemons more than once (tests, agentgate bench, whose heap figures it disturbed).
func TestTimersKeepOnePendingTick(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		system, quiet := quietSystem(t)
		defer system.Shutdown()
		prunes := make(chan struct{}, 100)
		persist := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if _, ok := c.Message().(*persistence.Prune); ok {
				prunes <- struct{}{}
			}
		}))
		count := func() int {
			synctest.Wait()
			n := 0
			for len(prunes) > 0 {
				<-prunes
				n++
			}
			return n
		}
		lateTicks := make(chan any, 100)
		system.EventStream.Subscribe(func(m any) {
			if dl, ok := m.(*actor.DeadLetterEvent); ok {
				switch dl.Message.(type) {
				case *Prune, *CheckResets:
					lateTicks <- dl.Message
				}
			}
		})
		d := &Deps{Persist: persist, Log: quiet, Metrics: metrics.New("fake"),
			Config: SessionConfig{Prune: PrunePolicy{Enabled: true, After: 24 * time.Hour, Every: time.Hour}}}
		pid := system.Root.Spawn(NewTimers(d, nil, time.Minute))
		if n := count(); n != 1 {
			t.Fatalf("%d prunes at start, want 1", n)
		}
		for range 3 {
			system.Root.Send(pid, &Prune{})
			system.Root.Send(pid, &CheckResets{})
		}
		if n := count(); n != 3 {
			t.Fatalf("%d prunes sent by hand ran, want 3", n)
		}
		time.Sleep(time.Hour) // PruneEvery
		if n := count(); n != 1 {
			t.Errorf("%d prunes in the hour after, want 1 (one pending prune, not one chain per Prune sent)", n)
		}
		if err := system.Root.StopFuture(pid).Wait(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Hour) // past the pending scan and prune
		synctest.Wait()
		if n := len(lateTicks); n > 0 {
			t.Errorf("%d scan or prune ticks fired after the timers actor stopped (first: %T), want none", n, <-lateTicks)
		}
	})
}

// TestPruneCatchesUpWithTheBacklog: a prune pass deletes every session that ended before its
// cutoff, however many batches that takes, not one batch a PruneEvery. A store call deletes at
// most a batch (persistence.DefaultPruneLimit, 1000); the pass asked for one and waited a whole
// interval (24 h by default) for the next, so a daemon whose chats ended more sessions a day
// than that never caught up and its database grew for ever with pruning on (a soak ended
// 13,000 sessions in 40 minutes).
func TestPruneCatchesUpWithTheBacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newLongRunWorld(t, streamingAgent, nil)
		const ended = 5
		for i := range ended {
			// A message first: /new keeps a session nothing was said in yet.
			mustAccept(t, "hello", []*actor.Future{w.send(0, fmt.Sprint("m", i), "hello")})
			mustAccept(t, "/new", []*actor.Future{w.send(0, fmt.Sprint("n", i), "/new")})
		}
		time.Sleep(3 * w.d.Config.PassivateAfter) // the replies are delivered and marked
		synctest.Wait()
		key := identity.Key(w.chat(0), w.d.Config.Keys)
		count := func() int {
			t.Helper()
			ss, err := w.d.Store.SessionsOfKey(t.Context(), key, 0)
			if err != nil {
				t.Fatal(err)
			}
			return len(ss)
		}
		if n := count(); n != ended+1 {
			t.Fatalf("%d sessions of the key before pruning, want %d", n, ended+1)
		}

		time.Sleep(2 * time.Hour)
		w.d.Config.Prune = PrunePolicy{Enabled: true, After: time.Hour, Every: 24 * time.Hour, Batch: 2}
		timers := w.system.Root.Spawn(NewTimers(w.d, nil, time.Minute)) // prunes at start
		synctest.Wait()
		if n := count(); n != 1 {
			t.Errorf("%d sessions of the key after a prune pass, want 1 (the current one): the pass stopped after its first batch", n)
		}
		if err := w.system.Root.StopFuture(timers).Wait(); err != nil {
			t.Fatal(err)
		}
	})
}

// heldLoads is a store whose session loads wait until release is closed; entered counts the
// loads that have begun.
type heldLoads struct {
	persistence.Store
	release chan struct{}
	entered atomic.Int64
}

func (s *heldLoads) LoadSession(ctx context.Context, key string, historyLimit, pendingLimit int) (*persistence.Snapshot, error) {
	s.entered.Add(1)
	<-s.release
	return s.Store.LoadSession(ctx, key, historyLimit, pendingLimit)
}

// TestScanNudgesAPageAtATime: the timers' scan nudges the sessions of one page, and reads the
// next only once they have taken their nudges, each loading its session to end it. Before, a
// scan nudged every due session at once: at a daily reset of 100,000 chats, or the first scan
// after a quiet night, a new chat's load waited behind theirs, and its first reply came seconds
// late for the half minute they took.
func TestScanNudgesAPageAtATime(t *testing.T) {
	old := timersBatch
	timersBatch = 3
	t.Cleanup(func() { timersBatch = old })
	synctest.Test(t, func(t *testing.T) {
		var clock atomic.Int64
		t0 := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
		clock.Store(t0.UnixNano())
		policy := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Minute, Notify: true}
		loads := &heldLoads{release: make(chan struct{})}
		w := newManagerWorld(t, gatedAgent("", nil), func(d *Deps) {
			resetsBy(&clock, policy)(d)
			loads.Store = d.Store
			d.Store = loads
		})
		const due = 10
		var ids []string
		for i := range due {
			src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: fmt.Sprint("idle", i), UserID: "u1"}
			key, id := identity.Key(src, w.d.Config.Keys), fmt.Sprint("s", i)
			ids = append(ids, id)
			mustCommit(t, w.store,
				&persistence.CreateSession{Session: persistence.Session{ID: id, Key: key, Platform: "fake", ChatType: identity.ChatDM,
					ChatID: src.ChatID, UserID: "u1", StartedAt: t0.Add(-2 * time.Hour), LastActivityAt: t0.Add(-time.Hour)}},
				&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: id, Generation: 1, UpdatedAt: t0.Add(-2 * time.Hour)}})
		}
		timers := w.system.Root.Spawn(NewTimers(w.d, NewLocalRouter(w.system.Root, w.manager), time.Minute))
		defer func() {
			if err := w.system.Root.StopFuture(timers).Wait(); err != nil {
				t.Error(err)
			}
		}()
		synctest.Wait() // its first scan, its first page's loads held
		if n := loads.entered.Load(); n != 3 {
			t.Errorf("%d sessions loading at once, want 3 (one page of the scan, of %d due)", n, due)
		}
		close(loads.release)
		synctest.Wait()
		for _, id := range ids {
			if s, err := w.store.Session(w.ctx, id); err != nil || s.EndReason != persistence.EndIdle {
				t.Errorf("session %s: %+v, %v; want it ended idle", id, s, err)
			}
		}
	})
}
