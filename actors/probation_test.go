package actors

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestProbationRunsSuspectsOneAtATime: the messages the daemon's unclean stops were counted
// against ProbationAfter times (suspects) run one at a time, while the others run as usual. The
// session whose suspect crashes it gives the token back as it restarts, so the other suspect
// runs next; the crashed one runs again once that is done.
func TestProbationRunsSuspectsOneAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		// One chat per message: p1 and p2 are suspects, n3 is not.
		MustSeedHeads(t, path, map[string]int{"p1": ProbationAfter, "p2": ProbationAfter, "n3": ProbationAfter - 1})
		release := map[string]chan struct{}{"p1": make(chan struct{}), "p2": make(chan struct{}), "n3": make(chan struct{})}
		var suspects atomic.Int32
		var overlap, crashing atomic.Bool
		crash := make(chan struct{})
		started := make(chan string, 16)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			id := req.Identity.MessageID
			if strings.HasPrefix(id, "p") {
				if suspects.Add(1) > 1 {
					overlap.Store(true)
				}
				defer suspects.Add(-1)
			}
			started <- id
			if strings.HasPrefix(id, "p") && crashing.CompareAndSwap(false, true) {
				select {
				case <-crash:
					panic("the first suspect to run crashes its session")
				case <-ctx.Done(): // the test failed before
					return nil, ctx.Err()
				}
			}
			select {
			case <-release[id]:
				return &agents.Response{Text: "answered " + id}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		w := newManagerWorldAt(t, path, agent, func(d *Deps) { d.Run = "run-1" })
		synctest.Wait()

		got := drain(started)
		if len(got) != 2 || !slices.Contains(got, "n3") {
			t.Fatalf("turns started at first: %v, want n3 and one suspect", got)
		}
		crashedID := got[slices.IndexFunc(got, func(id string) bool { return id != "n3" })]
		other := map[string]string{"p1": "p2", "p2": "p1"}[crashedID]
		if n := testutil.ToFloat64(w.d.Metrics.ProbationWaiting); n != 1 {
			t.Errorf("agentgate_probation_waiting = %v while %s runs, want 1 (%s)", n, crashedID, other)
		}
		close(crash)
		synctest.Wait()
		if got := drain(started); !slices.Equal(got, []string{other}) {
			t.Fatalf("turns started after %s crashed its session: %v, want %s (and %s not again yet)", crashedID, got, other, crashedID)
		}
		close(release[other])
		synctest.Wait()
		if got := drain(started); !slices.Equal(got, []string{crashedID}) {
			t.Errorf("turns started after %s was answered: %v, want %s again", other, got, crashedID)
		}
		close(release[crashedID])
		close(release["n3"])
		synctest.Wait()
		if overlap.Load() {
			t.Errorf("two suspects ran at once")
		}
		want := map[string]string{"p1": persistence.StatusDone, "p2": persistence.StatusDone, "n3": persistence.StatusDone}
		if got := headStatuses(t, w.store, "p1", "p2", "n3"); !maps.Equal(got, want) {
			t.Errorf("message statuses %v, want %v", got, want)
		}
		if n := testutil.ToFloat64(w.d.Metrics.ProbationWaiting); n != 0 {
			t.Errorf("agentgate_probation_waiting = %v at the end, want 0", n)
		}
	})
}

// TestProbationMarksTheRunningSuspect: a suspect's turn starts only once its run is marked, so
// when the daemon dies meanwhile, the next start (Store.BeginRun) counts that suspect alone: not
// the one waiting for the token. A message that is no suspect counts as ever.
func TestProbationMarksTheRunningSuspect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		MustSeedHeads(t, path, map[string]int{"p1": ProbationAfter, "p2": ProbationAfter, "n3": 0})
		func() { // the run that is about to die, recorded as the daemon does at start
			store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			if _, err := store.BeginRun(t.Context(), "run-1", time.Now()); err != nil {
				t.Fatal(err)
			}
		}()
		started := make(chan string, 16)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			started <- req.Identity.MessageID
			<-ctx.Done() // it runs until the process dies
			return nil, ctx.Err()
		})
		w := newManagerWorldAt(t, path, agent, func(d *Deps) { d.Run = "run-1" })
		synctest.Wait()
		got := drain(started)
		running := slices.DeleteFunc(slices.Clone(got), func(id string) bool { return id == "n3" })
		if len(running) != 1 || len(got) != 2 {
			t.Fatalf("turns started: %v, want n3 and one suspect", got)
		}
		// The process dies here: the next start counts its unclean stop.
		u, err := w.store.BeginRun(t.Context(), "run-2", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		key := func(id string) string {
			return identity.Key(identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: id, UserID: "u1"}, identity.KeyOptions{})
		}
		want := []persistence.CountedMessage{{Key: key("n3"), SessionID: "s-n3", MessageID: "n3", Attempts: 1},
			{Key: key(running[0]), SessionID: "s-" + running[0], MessageID: running[0], Attempts: ProbationAfter + 1}}
		slices.SortFunc(want, func(a, b persistence.CountedMessage) int { return strings.Compare(a.SessionID, b.SessionID) })
		if u == nil || !slices.Equal(u.Counted, want) {
			t.Errorf("BeginRun after the death counted %+v, want %+v (the waiting suspect not)", u, want)
		}
	})
}

// TestProbationWithoutARunRunsAll: without a run (cluster mode, which counts deaths at claim
// time) suspects run as any message does, at once.
func TestProbationWithoutARunRunsAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		MustSeedHeads(t, path, map[string]int{"p1": ProbationAfter, "p2": ProbationAfter})
		started := make(chan string, 16)
		hold := make(chan struct{})
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			started <- req.Identity.MessageID
			select {
			case <-hold:
			case <-ctx.Done():
			}
			return &agents.Response{Text: "ok"}, nil
		})
		newManagerWorldAt(t, path, agent, nil)
		synctest.Wait()
		if got := drain(started); len(got) != 2 {
			t.Errorf("turns started: %v, want both suspects at once", got)
		}
		close(hold)
		synctest.Wait()
	})
}

// TestProbationGrantsInOrderAndWatchesHolders: the token goes to the sessions in request order;
// a holder that stops without giving it back (Terminated) passes it on, and a request withdrawn
// before its turn is skipped.
func TestProbationGrantsInOrderAndWatchesHolders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		system, quiet := quietSystem(t)
		d := &Deps{Log: quiet, Metrics: metrics.New("fake")}
		probation := system.Root.Spawn(NewProbation(d))
		granted := make(chan string, 8)
		holder := func() *actor.PID {
			return system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
				if m, ok := c.Message().(*probationGranted); ok {
					granted <- m.id
				}
			}))
		}
		a, b, c, e := holder(), holder(), holder(), holder()
		for _, r := range []struct {
			id  string
			pid *actor.PID
		}{{"a", a}, {"b", b}, {"c", c}, {"e", e}} {
			system.Root.Send(probation, &askProbation{id: r.id, session: r.pid})
		}
		synctest.Wait()
		if got := drain(granted); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("granted %v, want a alone", got)
		}
		if n := testutil.ToFloat64(d.Metrics.ProbationWaiting); n != 3 {
			t.Errorf("agentgate_probation_waiting = %v, want 3", n)
		}
		system.Root.Send(probation, &endProbation{id: "c"}) // withdrawn while it waits
		_ = system.Root.StopFuture(a).Wait()                // gone without a word
		synctest.Wait()
		if got := drain(granted); !slices.Equal(got, []string{"b"}) {
			t.Fatalf("granted %v after a stopped, want b", got)
		}
		system.Root.Send(probation, &endProbation{id: "b"})
		synctest.Wait()
		if got := drain(granted); !slices.Equal(got, []string{"e"}) {
			t.Errorf("granted %v after b ended, want e (c withdrew)", got)
		}
		for _, pid := range []*actor.PID{b, c, e, probation} {
			_ = system.Root.StopFuture(pid).Wait()
		}
	})
}

// MustSeedHeads stores one session per message id (its chat is the id), each routed and with
// that message pending at the head, its attempts as given.
func MustSeedHeads(t *testing.T, path string, attempts map[string]int) {
	t.Helper()
	store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	now := time.Now()
	var ops []persistence.Op
	for _, id := range slices.Sorted(maps.Keys(attempts)) {
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: id, UserID: "u1"}
		key, sid := identity.Key(src, identity.KeyOptions{}), "s-"+id
		ops = append(ops,
			&persistence.CreateSession{Session: persistence.Session{ID: sid, Key: key, Platform: "fake", ChatType: identity.ChatDM,
				ChatID: id, UserID: "u1", StartedAt: now, LastActivityAt: now}},
			&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: sid, Generation: 1, UpdatedAt: now}},
			&persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: 1, Role: persistence.RoleUser,
				Content: "text of " + id, Platform: "fake", ChatID: id, MessageID: id, UserID: "u1",
				Status: persistence.StatusPending, Active: true, CreatedAt: now}},
			&persistence.SetAttempts{SessionID: sid, Seq: 1, Attempts: attempts[id]})
	}
	if errs := store.Commit(t.Context(), [][]persistence.Op{ops}); errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// headStatuses returns the status of each message MustSeedHeads stored among ids.
func headStatuses(t *testing.T, store persistence.Store, ids ...string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, id := range ids {
		msgs, err := store.Transcript(t.Context(), "s-"+id)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if m.Role == persistence.RoleUser {
				got[m.MessageID] = m.Status
			}
		}
	}
	return got
}
