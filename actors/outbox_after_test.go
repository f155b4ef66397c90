package actors

import (
	"testing"
	"testing/synctest"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/platforms"
)

// TestAcknowledgedOutboxSeqPrecedesTheAnswer: the acknowledgment of a message, a command and
// a /retry says the key's outbox seq before it was taken (DeliverResult.OutboxAfter), and its
// whole answer comes after it: a reader that reads only from there (a cluster member's ?wait)
// misses none of it, and reads none of the answers before it.
func TestAcknowledgedOutboxSeqPrecedesTheAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newManagerWorld(t, echo.New(), nil)
		last := int64(0) // the key's outbox seq so far
		for _, tc := range []struct{ id, text, disp string }{
			{"m1", "hello", platforms.Started},
			{"m2", "again", platforms.Started},
			{"c1", "/status", platforms.Command},
			{"r1", "/retry", platforms.Command},
		} {
			r := w.deliver(t, tc.id, tc.text)
			if r.ErrorCode != "" || r.Disposition != tc.disp {
				t.Fatalf("%s: %+v, want %s", tc.id, r, tc.disp)
			}
			synctest.Wait()
			if r.OutboxAfter != last {
				t.Errorf("%s (%s) acknowledged at outbox seq %d, want %d: the key's last entry before it", tc.id, tc.text, r.OutboxAfter, last)
			}
			all, err := w.store.RepliesTo(w.ctx, w.key, tc.id, 0)
			if err != nil {
				t.Fatal(err)
			}
			after, err := w.store.RepliesTo(w.ctx, w.key, tc.id, r.OutboxAfter)
			if err != nil {
				t.Fatal(err)
			}
			if len(all) == 0 || len(after) != len(all) {
				t.Errorf("%s: its answer past outbox seq %d = %+v, want all of it: %+v", tc.id, r.OutboxAfter, after, all)
			}
			for len(w.sent) > 0 {
				if o := <-w.sent; o.Out.Seq > last {
					last = o.Out.Seq
				}
			}
		}
	})
}
