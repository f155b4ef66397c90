package actors

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
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
