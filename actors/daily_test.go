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
		w := newManagerWorld(t, agent, resetsBy(&clock, policy))
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

// TestDailyResetWaitsForAQuietSession: with DailyMinIdle (sessions.reset.daily_min_idle), a
// session in use shortly before the daily hour is not cut off at it: a message 30 minutes
// later continues it, and then no reset comes until the next day's; one that stays quiet ends
// once it has been idle that long.
func TestDailyResetWaitsForAQuietSession(t *testing.T) {
	// world starts a chat whose send(id, h, m) delivers message id at h:m on one day and
	// returns the session that took it.
	world := func(t *testing.T) (send func(id string, h, m int) string) {
		agent := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "ok"}, nil
		})
		var clock atomic.Int64
		policy := ResetPolicy{Mode: ResetDaily, AtHour: 4, Notify: true, Location: time.UTC, DailyMinIdle: time.Hour}
		w := newManagerWorld(t, agent, resetsBy(&clock, policy))
		return func(id string, h, m int) string {
			clock.Store(time.Date(2030, 1, 1, h, m, 0, 0, time.UTC).UnixNano())
			r := w.deliver(t, id, id)
			synctest.Wait()
			return r.SessionId
		}
	}
	t.Run("in use", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			send := world(t)
			first := send("a", 3, 40)
			if got := send("b", 4, 30); got != first {
				t.Errorf("a message at 04:30 in a chat active at 03:40 started session %s, want %s continued", got, first)
			}
			if got := send("c", 23, 0); got != first {
				t.Errorf("a message at 23:00 started session %s, want %s: the day's reset was waived by the 04:30 message", got, first)
			}
		})
	})
	t.Run("quiet", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			send := world(t)
			first := send("a", 3, 40)
			if got := send("b", 4, 41); got == first {
				t.Errorf("a message at 04:41 in a chat quiet since 03:40 ran in its old session: the reset never came")
			}
		})
	})
}
