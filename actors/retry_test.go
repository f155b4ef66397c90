package actors

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
)

// TestRetryInFlightIsDroppedByNew: /new right after /retry, while the retry's write is in
// flight: the retried message must not run after the boundary (in the ended session).
func TestRetryInFlightIsDroppedByNew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var calls []string
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			mu.Lock()
			calls = append(calls, req.Identity.SessionID+" "+req.Identity.MessageID)
			mu.Unlock()
			return &agents.Response{Text: "echo"}, nil
		})
		w := newManagerWorld(t, echo, nil)
		system, manager, key, store, ctx, deliver := w.system, w.manager, w.key, w.store, w.ctx, w.message
		if _, err := system.Root.RequestFuture(manager, &Routed{Key: key, Msg: deliver("m0", "hello")}, time.Hour).Result(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		fr := system.Root.RequestFuture(manager, &Routed{Key: key, Msg: deliver("r1", "/retry")}, time.Hour)
		fn := system.Root.RequestFuture(manager, &Routed{Key: key, Msg: deliver("n1", "/new")}, time.Hour)
		rr, _ := fr.Result()
		rn, _ := fn.Result()
		synctest.Wait()
		time.Sleep(time.Minute)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		t.Logf("retry: %+v\nnew: %+v\nagent calls: %v", rr, rn, calls)
		newSID := rn.(*DeliverResult).SessionId
		oldSID := rr.(*DeliverResult).SessionId
		msgs, _ := store.Transcript(ctx, oldSID)
		for _, m := range msgs {
			t.Logf("old session row seq=%d role=%s id=%s status=%s text=%q", m.Seq, m.Role, m.MessageID, m.Status, m.Content)
			if m.MessageID == "r1" && m.Status != persistence.StatusFailed {
				t.Errorf("retried message r1 status %s after /new, want failed (dropped by the boundary)", m.Status)
			}
		}
		for _, c := range calls[1:] {
			if c != newSID+" " && len(c) > 0 {
				t.Errorf("a turn ran after /new: %q (new session %s)", c, newSID)
			}
		}
	})
}
