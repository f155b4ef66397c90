package actors

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
)

// TestDailyResetHeldOverAWorkingTurnStillHappens: a turn running across the daily boundary
// holds the reset over until the session is idle; it must still happen then (the turn's own
// activity, and the queued message's, would move the due time to the next day).
func TestDailyResetHeldOverAWorkingTurnStillHappens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			if req.Identity.MessageID == "a" {
				<-gate
			}
			return &agents.Response{Text: "ok"}, nil
		})
		var clock atomic.Int64
		day := time.Date(2030, 1, 1, 3, 59, 0, 0, time.UTC)
		clock.Store(day.UnixNano())
		policy := ResetPolicy{Mode: ResetDaily, AtHour: 4, Notify: true, Location: time.UTC}
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Now = func() time.Time { return time.Unix(0, clock.Load()).UTC() }
			d.Config.ResetFor = func(string, string) ResetPolicy { return policy }
			d.Config.ResetPolicies = []ResetPolicy{policy}
		})
		send := func(id string) *DeliverResult { return w.deliver(t, id, id) }
		a := send("a") // 03:59, its turn runs past 04:00
		synctest.Wait()
		clock.Store(day.Add(2 * time.Minute).UnixNano()) // 04:01
		b := send("b")
		close(gate)
		synctest.Wait()
		clock.Store(day.Add(31 * time.Minute).UnixNano()) // 04:30, idle
		c := send("c")
		synctest.Wait()
		t.Logf("a %s, b %s (%s), c %s (%s)", a.SessionId, b.SessionId, b.Disposition, c.SessionId, c.Disposition)
		if c.SessionId == a.SessionId {
			t.Errorf("c at 04:30 ran in the session of 03:59: the 04:00 daily reset never happened")
		}
	})
}
