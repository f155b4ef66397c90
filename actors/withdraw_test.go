package actors

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// withdraw routes a Withdraw of message id of the world's chat through the manager, as the
// platform's intake does, and returns the session's answer.
func (w *managerWorld) withdraw(t *testing.T, id string) *WithdrawResult {
	t.Helper()
	res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &Withdraw{Source: sourceToProto(w.src), MessageId: id}}, time.Hour).Result()
	if err != nil {
		t.Fatalf("withdraw %s: %v", id, err)
	}
	return res.(*WithdrawResult)
}

// holdsM1 answers "m1" once gate is closed, "m2" once the second gate is (when one is given),
// and others at once, counting its runs by message id.
func holdsM1(gate <-chan struct{}, more ...<-chan struct{}) (agents.Agent, func(id string) int) {
	var mu sync.Mutex
	runs := map[string]int{}
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		id := req.Identity.MessageID
		mu.Lock()
		runs[id]++
		mu.Unlock()
		var wait <-chan struct{}
		switch {
		case id == "m1":
			wait = gate
		case id == "m2" && len(more) > 0:
			wait = more[0]
		}
		if wait != nil {
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return &agents.Response{Text: "answer " + id}, nil
	})
	return agent, func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return runs[id]
	}
}

// refuseArchive refuses, as unavailable, the commits that archive rows, while refusing is set.
type refuseArchive struct {
	persistence.Store
	mu       sync.Mutex
	refusing bool
}

func (r *refuseArchive) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	r.mu.Lock()
	refusing := r.refusing
	r.mu.Unlock()
	archives := slices.ContainsFunc(groups, func(g []persistence.Op) bool {
		return slices.ContainsFunc(g, func(op persistence.Op) bool { _, ok := op.(*persistence.ArchiveMessages); return ok })
	})
	if !refusing || !archives {
		return r.Store.Commit(ctx, groups)
	}
	errs := make([]error, len(groups))
	for i := range errs {
		errs[i] = fmt.Errorf("%w: disk full (test)", persistence.ErrUnavailable)
	}
	return errs
}

// TestRefusedWithdrawalRunsNoTurnAgain: a withdrawal whose archive the store refuses leaves the
// message to run, in the queue, and cancels nothing. Before, the session started again from
// the store, which cancelled the turn running meanwhile and ran its message again (found by a
// review).
func TestRefusedWithdrawalRunsNoTurnAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		agent, ran := holdsM1(gate)
		store := &refuseArchive{refusing: true}
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store { store.Store = s; return store })
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Queued {
			t.Fatalf("m2: %+v, want queued", r)
		}
		if r := w.withdraw(t, "m2"); r.Withdrawn || r.Error == "" {
			t.Fatalf("withdrawal whose archive is refused = %+v, want not withdrawn, with the error", r)
		}
		close(gate)
		time.Sleep(time.Minute)
		synctest.Wait()
		for _, id := range []string{"m1", "m2"} {
			if n := ran(id); n != 1 {
				t.Errorf("the agent ran %s %d times, want once", id, n)
			}
			if st, _ := w.statusOf(t, id); st != persistence.StatusDone {
				t.Errorf("%s is %s in the store, want done", id, st)
			}
		}
	})
}

// TestWithdrawalWhileAResultIsHeldIsRefused: while the session holds a turn's result the store
// refused, a withdrawal is answered at once, not withdrawn, and the message runs once the
// result is stored. Before, its archive waited behind the result for the whole outage, and the
// Discord gateway's reader, which asks, with it (found by a review).
func TestWithdrawalWhileAResultIsHeldIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate, gate2 := make(chan struct{}), make(chan struct{})
		agent, ran := holdsM1(gate, gate2)
		disk := &fullDisk{left: 20, result: resultOf("m1")}
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store { disk.Store = s; return disk })
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		for _, id := range []string{"m2", "m3"} { // m2 runs on while m1's result is held; m3 waits
			if r := w.deliver(t, id, id); r.Disposition != platforms.Queued {
				t.Fatalf("%s: %+v, want queued", id, r)
			}
		}
		close(gate)
		synctest.Wait()
		if disk.refusedResults() == 0 {
			t.Fatal("the store took the turn's result: the test does not test")
		}
		f := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &Withdraw{Source: sourceToProto(w.src), MessageId: "m3"}}, time.Hour)
		res, err := f.Result() // (under the old code, it came once the store took the result)
		if err != nil {
			t.Fatal(err)
		}
		if r := res.(*WithdrawResult); r.Withdrawn || r.Error == "" {
			t.Errorf("withdrawal while a result is held = %+v, want refused at once", r)
		}
		close(gate2)
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		for _, id := range []string{"m1", "m2", "m3"} {
			if n := ran(id); n != 1 {
				t.Errorf("the agent ran %s %d times, want once", id, n)
			}
			if st, _ := w.statusOf(t, id); st != persistence.StatusDone {
				t.Errorf("%s is %s in the store, want done", id, st)
			}
		}
	})
}

// TestWithdrawalOfAnInterruptIsRefused: in interrupt mode m2 cuts m1's turn short and waits
// while m1's call ends; m2's sender deletes it. It is not withdrawn: m1, cut short, is answered
// with it, and taken back, it would leave m1 unanswered until the user writes again (found by
// a review).
func TestWithdrawalOfAnInterruptIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &slowToEnd{ending: 3 * time.Second}
		w := newManagerWorld(t, agent, func(d *Deps) { d.Config.QueueMode = ModeInterrupt })
		w.deliver(t, "m1", "first")
		synctest.Wait()
		if r := w.deliver(t, "m2", "second"); r.Disposition != platforms.Interrupted {
			t.Fatalf("m2: %+v, want interrupted", r)
		}
		if r := w.withdraw(t, "m2"); r.Withdrawn {
			t.Errorf("withdrawal of the message that cut m1 short = %+v, want it left to run", r)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		var answer *platforms.Outbound
		for len(w.sent) > 0 {
			if o := (<-w.sent).Out; o.TurnEnd {
				answer = o
			}
		}
		if answer == nil || !slices.Equal(answer.InReplyTo, []string{"m1", "m2"}) {
			t.Errorf("the answer: %+v, want it to answer m1 and m2", answer)
		}
	})
}
