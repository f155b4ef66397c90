package actors

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// TestRequeueWhoseCommitAnswerIsLostRuns: the requeue's write commits but its answer is lost
// (a connection that broke after COMMIT; a cluster member keeps no spool that would replay it).
// The message is pending in the store at the end of the session: it runs now, in this
// activation, and the operator is told it was requeued. Before, the session dropped it from its
// queue and answered "the message stays quarantined; retry later", and the retry was refused
// as not quarantined (pending): the message sat in the store, in no queue, until the key's next
// activation.
func TestRequeueWhoseCommitAnswerIsLostRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		out := &storetest.Outage{}
		w := newManagerWorldWrites(t, a, nil, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		w.quarantine(t, a, "m1")
		a.poisoned.Store(false)
		for len(w.sent) > 0 {
			<-w.sent // the quarantine notice
		}

		out.Lost.Store(1)
		r := w.requeue(t, "m1")
		synctest.Wait()
		st, _ := w.statusOf(t, "m1")
		if r.ErrorCode != "" {
			t.Errorf("requeue of m1 whose write committed, its answer lost = %+v (m1 is %s in the store), want it taken", r, st)
		}
		if r.ErrorCode == "unavailable" {
			if again := w.requeue(t, "m1"); again.ErrorCode != "" {
				t.Errorf("the operator's retry, as told = %+v", again)
			}
		}
		w.awaitTurnEndsWithin(t, 1, time.Hour)
		synctest.Wait()
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusDone {
			t.Errorf("m1 after its requeue: %q, want done", st)
		}
	})
}

// awaitTurnEndsWithin is awaitTurnEnds that fails the test when the n turns have not ended
// within d of the bubble's clock.
func (w *managerWorld) awaitTurnEndsWithin(t *testing.T, n int, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for done := 0; done < n; {
		select {
		case m := <-w.sent:
			if m.Out.TurnEnd {
				done++
			}
		case <-deadline:
			t.Fatalf("%d of %d turns ended within %v", done, n, d)
		}
	}
}

// TestResumeWhileARequeueIsInFlight: /new and then /resume back to the session at once, while
// the write of an operator's requeue in it is still in flight. /resume numbers its rows after
// the session's writes in flight (inflightSeq), the requeue's new seq among them: its write is
// stored, the session resumed, and the requeued message, dropped by /new, is set aside with a
// notice. Before, /resume gave its command row the requeue's seq, its write was refused, and the
// user was told to send /resume again while the session started again from the store.
func TestResumeWhileARequeueIsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		w, g, _ := newGatedWorld(t, a, nil, nil)
		w.quarantine(t, a, "m1")
		a.poisoned.Store(false)
		m1, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, "m1")
		if err != nil {
			t.Fatal(err)
		}
		first := m1.SessionID

		g.armed.Store(true)
		rq := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &RequeueMessage{MessageId: "m1"}}, time.Hour)
		<-g.waiting // the requeue's write waits in the store
		n1 := w.request("n1", "/new")
		n2 := w.request("n2", "/resume "+first)
		synctest.Wait()
		close(g.open)

		for id, f := range map[string]*actor.Future{"/new": n1, "/resume": n2} {
			res, err := f.Result()
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			if r := res.(*DeliverResult); r.ErrorCode != "" || r.Disposition != platforms.Command {
				t.Errorf("%s = %+v, want it taken as a command", id, r)
			}
		}
		res, err := rq.Result()
		if err != nil {
			t.Fatal(err)
		}
		if r := res.(*RequeueResult); r.ErrorCode != ErrCodeSessionEnded {
			t.Errorf("requeue of m1, dropped by /new = %+v, want session_ended", r)
		}
		synctest.Wait()
		route, err := w.store.Route(w.ctx, w.key)
		if err != nil {
			t.Fatal(err)
		}
		if route.SessionID != first {
			t.Errorf("the key's session after /resume %s: %s, want %s", first, route.SessionID, first)
		}
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusFailed {
			t.Errorf("m1, requeued and dropped by /new: %q, want failed (set aside with a notice)", st)
		}
		if ran := a.order(); slices.Contains(ran, "m1") {
			t.Errorf("turns ran %v: m1, dropped by /new, must not run", ran)
		}
	})
}

// TestRequeueWhileWritesWaitInTheSpoolRunsOnce: the database refuses writes (they wait in the
// spool) but answers reads. A requeue reads the message's status from the database, which does
// not show the writes in the spool: a message requeued and run meanwhile still reads as
// quarantined there. A second requeue of it is refused, and the message runs once. Before, the
// second requeue was taken (202), the message ran a second time, and the replay made that
// requeue a no-op in the store.
func TestRequeueWhileWritesWaitInTheSpoolRunsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		close(a.hold)
		out := &storetest.Outage{}
		dir := t.TempDir()
		sp, err := spool.Open(filepath.Join(dir, "spool"))
		if err != nil {
			t.Fatal(err)
		}
		var deps *Deps
		w := newManagerWorldWith(t, filepath.Join(dir, "agentgate.db"), a, func(d *Deps) { deps = d },
			out.Wrap,
			func(o *persistence.ActorOptions) {
				o.Spool, o.Spooling, o.ReplayEvery = sp, &deps.Spooling, time.Second
			})
		w.quarantine(t, a, "m1")
		a.poisoned.Store(false)
		for len(w.sent) > 0 {
			<-w.sent // the quarantine notice
		}

		out.Down.Store(true) // writes go to the spool; reads still answer
		first := w.requeue(t, "m1")
		if first.ErrorCode == "" {
			w.awaitTurnEndsWithin(t, 1, time.Hour)
			if again := w.requeue(t, "m1"); again.ErrorCode == "" {
				t.Errorf("second requeue of m1, run already (its writes in the spool) = %+v, want refused", again)
			}
		}
		synctest.Wait()
		out.Down.Store(false)
		time.Sleep(time.Minute) // the spool replays
		synctest.Wait()
		if first.ErrorCode != "" {
			if r := w.requeue(t, "m1"); r.ErrorCode != "" {
				t.Fatalf("requeue of m1 once the spool has drained = %+v", r)
			}
			w.awaitTurnEndsWithin(t, 1, time.Hour)
			synctest.Wait()
		}
		if n := len(slices.DeleteFunc(a.order(), func(id string) bool { return id != "m1" })); n != 1 {
			t.Errorf("m1 ran %d times after its requeue, want once", n)
		}
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusDone {
			t.Errorf("m1: %q, want done", st)
		}
	})
}

// TestRedeliveryWhileARequeueIsInFlightIsAnswered: the quarantined message's id delivered again
// (a client's retry) while an operator's requeue of it waits for its write is answered
// duplicate once that write is answered: the message is stored either way. Before, it waited
// with the requeue's write and was never answered.
func TestRedeliveryWhileARequeueIsInFlightIsAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		w, g, _ := newGatedWorld(t, a, nil, nil)
		w.quarantine(t, a, "m1")
		a.poisoned.Store(false)
		close(a.hold)
		g.armed.Store(true)
		rq := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &RequeueMessage{MessageId: "m1"}}, time.Hour)
		<-g.waiting // the requeue's write waits in the store
		again := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: w.message("m1", "boom")}, time.Minute)
		synctest.Wait()
		g.armed.Store(false)
		close(g.open)
		if res, err := rq.Result(); err != nil || res.(*RequeueResult).ErrorCode != "" {
			t.Fatalf("requeue: %v, %v", res, err)
		}
		res, err := again.Result()
		if err != nil {
			t.Fatalf("m1 delivered again while its requeue was in flight: %v, want an answer", err)
		}
		if r := res.(*DeliverResult); r.Disposition != platforms.Duplicate || r.ErrorCode != "" {
			t.Errorf("m1 delivered again while its requeue was in flight: %+v, want duplicate", r)
		}
		w.awaitTurnEnds(1)
		synctest.Wait()
		if n := len(slices.DeleteFunc(a.order(), func(id string) bool { return id != "m1" })); n != 1 {
			t.Errorf("m1 ran %d times after its requeue, want once", n)
		}
	})
}

// TestRedeliveredRetryWhileItsWriteIsInFlightIsAnswered: a /retry delivered again (a client's
// retry, a platform's re-delivery) while its write is in flight is answered duplicate once that
// write is answered, and the message runs again once. Before, it was never answered.
func TestRedeliveredRetryWhileItsWriteIsInFlightIsAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		close(a.hold)
		w, g, _ := newGatedWorld(t, a, nil, nil)
		w.deliver(t, "m1", "one")
		w.awaitTurnEnds(1)
		synctest.Wait()
		g.armed.Store(true)
		retry := w.request("r1", "/retry")
		<-g.waiting // the /retry's write waits in the store
		again := w.request("r1", "/retry")
		synctest.Wait()
		g.armed.Store(false)
		close(g.open)
		if res, err := retry.Result(); err != nil || res.(*DeliverResult).Disposition != platforms.Command {
			t.Fatalf("/retry: %v, %v", res, err)
		}
		res, err := again.Result()
		if err != nil {
			t.Fatalf("/retry delivered again while its write was in flight: %v, want an answer", err)
		}
		if r := res.(*DeliverResult); r.Disposition != platforms.Duplicate || r.ErrorCode != "" {
			t.Errorf("/retry delivered again while its write was in flight: %+v, want duplicate", r)
		}
		w.awaitTurnEnds(1)
		synctest.Wait()
		if got := a.order(); len(got) != 2 {
			t.Errorf("turns ran %v, want m1 and its one retry", got)
		}
	})
}

// lostRequeue is a store whose commit of a requeue, while armed, applies but answers as a
// connection lost after COMMIT, and leaves the sessions unable to read the store (blind) until
// the test says otherwise: the session cannot tell whether the requeue applied.
type lostRequeue struct {
	persistence.Store
	armed atomic.Bool
	blind *blindReads
}

func (l *lostRequeue) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	errs := l.Store.Commit(ctx, groups)
	for i, g := range groups {
		if errs[i] == nil && slices.ContainsFunc(g, func(op persistence.Op) bool { _, ok := op.(*persistence.RequeueMessage); return ok }) &&
			l.armed.CompareAndSwap(true, false) {
			l.blind.on.Store(true)
			errs[i] = fmt.Errorf("%w: connection lost after COMMIT (test)", persistence.ErrUnavailable)
		}
	}
	return errs
}

// TestUnsureRequeueRunsAtTheKeysRecovery: a requeue whose write committed although its answer
// was lost, when the store cannot be read just then either (the session cannot tell it
// applied), is answered unavailable, saying to look at the message's status; the message,
// pending in the store, runs at the key's next recovery (in a cluster, every member_ttl), once.
// Before, it sat pending in the store, in no queue, until the key's next activation, and a
// retried requeue was refused as pending (found by a review).
func TestUnsureRequeueRunsAtTheKeysRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		close(a.hold)
		blind := &blindReads{}
		lost := &lostRequeue{blind: blind}
		w := newManagerWorldWrites(t, a, func(d *Deps) { d.Fencing = true; blind.wrap(d) }, func(s persistence.Store) persistence.Store {
			lost.Store = s
			return lost
		})
		w.quarantine(t, a, "m1")
		a.poisoned.Store(false)
		for len(w.sent) > 0 {
			<-w.sent // the quarantine notice
		}
		lost.armed.Store(true)
		if r := w.requeue(t, "m1"); r.ErrorCode != "unavailable" || !strings.Contains(r.Error, "look at the message's status") {
			t.Fatalf("requeue whose answer is lost, the store unreadable = %+v, want unavailable, saying to look", r)
		}
		blind.on.Store(false)
		synctest.Wait()
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusPending {
			t.Fatalf("m1 after the requeue that applied: %s, want pending", st)
		}
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
		w.awaitTurnEndsWithin(t, 1, time.Hour)
		synctest.Wait()
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
		synctest.Wait()
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusDone {
			t.Errorf("m1 after the key's recovery: %s, want done", st)
		}
		if n := len(slices.DeleteFunc(a.order(), func(id string) bool { return id != "m1" })); n != 1 {
			t.Errorf("m1 ran %d times after its requeue, want once", n)
		}
	})
}

// TestRepeatedCommandWhileItsWriteIsInFlightGetsItsOutcome: a command delivered again (a
// client's retry) while its write is in flight gets that write's outcome: here the store
// refuses it, and both are told to send it again. Before, the repeat was answered duplicate at
// once: its sender, told the command was taken, never sent it again, and it never happened.
func TestRepeatedCommandWhileItsWriteIsInFlightGetsItsOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, g, refuse := newGatedWorld(t, echo.New(), nil, func(op persistence.Op) bool {
			m, ok := op.(*persistence.AppendMessage)
			return ok && m.Message.MessageID == "k1"
		})
		w.deliver(t, "m0", "hello")
		w.awaitTurnEnds(1)
		synctest.Wait()
		g.armed.Store(true)
		refuse.Store(true)
		first := w.request("k1", "/title first")
		<-g.waiting // the command's write waits in the store
		g.armed.Store(false)
		again := w.request("k1", "/title first")
		synctest.Wait()
		close(g.open)
		for name, f := range map[string]*actor.Future{"the command": first, "its repeat": again} {
			res, err := f.Result()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if r := res.(*DeliverResult); r.ErrorCode != "unavailable" {
				t.Errorf("%s, whose write was refused, answered %+v; want unavailable (send it again)", name, r)
			}
		}
		refuse.Store(false)
		time.Sleep(2 * refusedPause) // the session starts again from the store after a pause
		synctest.Wait()
		if r := w.deliver(t, "k1", "/title first"); r.Disposition != platforms.Command || r.ErrorCode != "" {
			t.Errorf("the command sent again: %+v, want it taken", r)
		}
		if r := w.deliver(t, "k1", "/title first"); r.Disposition != platforms.Duplicate {
			t.Errorf("the command sent once more after it was stored: %+v, want duplicate", r)
		}
	})
}
