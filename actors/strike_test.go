package actors

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestWaitingForASlotIsNoStrikeAfterTheFirst: two chats, one agent slot (agent.max_concurrent
// 1), and the daemon dies twice while one chat's turn runs and the other waits for the slot.
// The first stop counts both heads (they carry no strike yet); from then on a struck head
// counts only when its turn had the slot in the run that died (its mark), so after the second
// stop one chat is a suspect (2) and the other, which waited, keeps its one strike and runs
// as any other message. Before, both were suspects: during a backlog two kill -9s put every
// waiting chat on probation.
func TestWaitingForASlotIsNoStrikeAfterTheFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		MustSeedHeads(t, path, map[string]int{"a": 0, "b": 0})
		beginRun(t, path, "run-1")
		started := make(chan string, 16)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			started <- req.Identity.MessageID
			<-ctx.Done() // it runs until the process dies
			return nil, ctx.Err()
		})
		oneSlot := func(run string) func(d *Deps) {
			return func(d *Deps) {
				d.Run = run
				d.AgentSlots = NewAgentSlots(1, d.Metrics.AgentCallsWaiting, d.Metrics.AgentSlotWait, d.Log)
			}
		}
		// live runs the daemon's run until one turn has the slot and the other waits, and then
		// "kills" it: the next start's BeginRun counts the stop while its turns still hang.
		live := func(t *testing.T, run, next string) (ran string, u *persistence.UncleanStop) {
			t.Helper()
			w := newManagerWorldAt(t, path, agent, oneSlot(run))
			synctest.Wait()
			got := drain(started)
			if len(got) != 1 {
				t.Fatalf("%s: turns started %v, want one (one slot)", run, got)
			}
			if n := testutil.ToFloat64(w.d.Metrics.AgentCallsWaiting); n != 1 {
				t.Fatalf("%s: %v agent calls wait for a slot, want 1", run, n)
			}
			u, err := w.store.BeginRun(t.Context(), next, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			w.stop()
			synctest.Wait()
			drain(started) // a call that took the freed slot as its context ended
			return got[0], u
		}
		other := map[string]string{"a": "b", "b": "a"}

		ran, u := live(t, "run-1", "run-2")
		if want := map[string]int{"a": 1, "b": 1}; !maps.Equal(countedOf(u), want) {
			t.Errorf("the first stop (%s running) counted %v, want %v: both heads carried no strike", ran, countedOf(u), want)
		}
		ran, u = live(t, "run-2", "run-3")
		if want := map[string]int{ran: 2}; !maps.Equal(countedOf(u), want) {
			t.Errorf("the second stop (%s running, %s waiting for the slot) counted %v, want %v", ran, other[ran], countedOf(u), want)
		}
		if got, want := headAttempts(t, path, "a", "b"), map[string]int{ran: 2, other[ran]: 1}; !maps.Equal(got, want) {
			t.Errorf("attempts after two unclean stops: %v, want %v", got, want)
		}
	})
}

// TestStruckTurnStartsItsAgentOnceItsMarkIsStored: the turn of a head struck once (attempts 1)
// takes its agent slot, and its agent starts only once the head's mark of this run is stored.
// A mark the store refuses runs nothing: the session starts again from the store and runs the
// message once the mark is taken. So a process that dies while the agent runs has always
// marked it: the next start counts it (2).
func TestStruckTurnStartsItsAgentOnceItsMarkIsStored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		MustSeedHeads(t, path, map[string]int{"a": 1})
		beginRun(t, path, "run-1")
		started := make(chan string, 16)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			started <- req.Identity.MessageID
			<-ctx.Done()
			return nil, ctx.Err()
		})
		marks := &refusesMarks{refuse: 1, until: make(chan struct{})}
		w := newManagerWorldWith(t, path, agent, func(d *Deps) {
			d.Run = "run-1"
			d.AgentSlots = NewAgentSlots(1, d.Metrics.AgentCallsWaiting, d.Metrics.AgentSlotWait, d.Log)
		}, func(s persistence.Store) persistence.Store {
			marks.Store = s
			return marks
		})
		synctest.Wait()
		if got := drain(started); len(got) > 0 || marks.seen() != 1 {
			t.Fatalf("after the store refused the mark: %d marks written, agent started for %v; want 1 and none", marks.seen(), got)
		}
		time.Sleep(time.Minute) // the key's pause after a refusal
		synctest.Wait()
		if got := drain(started); len(got) > 0 || marks.seen() != 2 {
			t.Fatalf("while the second mark waits in its commit: %d marks written, agent started for %v; want 2 and none", marks.seen(), got)
		}
		close(marks.until)
		synctest.Wait()
		if got := drain(started); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("once the mark is stored: agent started for %v, want a", got)
		}
		u, err := w.store.BeginRun(t.Context(), "run-2", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]int{"a": 2}; !maps.Equal(countedOf(u), want) {
			t.Errorf("the stop while a's agent ran counted %v, want %v", countedOf(u), want)
		}
	})
}

// TestFreshAndSuspectTurnsWriteNoMarkAtTheirSlot: a head with no strike writes no mark (the
// hot path pays nothing), and a suspect only its probation mark, before its turn: neither
// waits for a mark once it has its slot.
func TestFreshAndSuspectTurnsWriteNoMarkAtTheirSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		MustSeedHeads(t, path, map[string]int{"n": 0, "p": ProbationAfter})
		started := make(chan string, 16)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			started <- req.Identity.MessageID
			<-ctx.Done()
			return nil, ctx.Err()
		})
		marks := &refusesMarks{until: make(chan struct{})}
		close(marks.until)
		newManagerWorldWith(t, path, agent, func(d *Deps) { d.Run = "run-1" }, func(s persistence.Store) persistence.Store {
			marks.Store = s
			return marks
		})
		synctest.Wait()
		if got := drain(started); len(got) != 2 {
			t.Errorf("agent started for %v, want n and p", got)
		}
		if n := marks.seen(); n != 1 {
			t.Errorf("%d marks written, want 1 (p's probation mark)", n)
		}
	})
}

// refusesMarks is a store whose commits that hold a MarkProbation are counted; the first
// refuse of them are refused (unavailable), and the others wait until until is closed.
type refusesMarks struct {
	persistence.Store
	until chan struct{}

	mu     sync.Mutex
	refuse int
	marks  int
}

func (s *refusesMarks) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	isMark := func(op persistence.Op) bool { _, ok := op.(*persistence.MarkProbation); return ok }
	if !slices.ContainsFunc(groups, func(g []persistence.Op) bool { return slices.ContainsFunc(g, isMark) }) {
		return s.Store.Commit(ctx, groups)
	}
	s.mu.Lock()
	s.marks++
	refused := s.refuse > 0
	if refused {
		s.refuse--
	}
	s.mu.Unlock()
	if refused {
		errs := make([]error, len(groups))
		for i := range errs {
			errs[i] = fmt.Errorf("%w: disk full (test)", persistence.ErrUnavailable)
		}
		return errs
	}
	<-s.until
	return s.Store.Commit(ctx, groups)
}

// seen is how many commits held a mark.
func (s *refusesMarks) seen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.marks
}

// beginRun records run in the store at path, as the daemon does at its start.
func beginRun(t *testing.T, path, run string) {
	t.Helper()
	store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.BeginRun(t.Context(), run, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// countedOf maps the message ids an unclean stop counted against to their attempts.
func countedOf(u *persistence.UncleanStop) map[string]int {
	got := map[string]int{}
	if u != nil {
		for _, c := range u.Counted {
			got[c.MessageID] = c.Attempts
		}
	}
	return got
}

// headAttempts returns the attempts of each message MustSeedHeads stored among ids.
func headAttempts(t *testing.T, path string, ids ...string) map[string]int {
	t.Helper()
	store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	got := map[string]int{}
	for _, id := range ids {
		msgs, err := store.Transcript(t.Context(), "s-"+id)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if m.Role == persistence.RoleUser {
				got[m.MessageID] = m.Attempts
			}
		}
	}
	return got
}
