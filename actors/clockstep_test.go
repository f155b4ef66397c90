package actors

import (
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// TestResetNoticeAfterTheClockWasSetBack: a session's idle reset ends it, and the host's clock
// is then set back (NTP corrects a clock that ran ahead) to before the session's last activity.
// The next message's notice says how long the session was inactive by the reset's own due time,
// not a negative time. Before, it said "inactive for -15m".
func TestResetNoticeAfterTheClockWasSetBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clock atomic.Int64
		t0 := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
		clock.Store(t0.UnixNano())
		policy := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Minute, Notify: true}
		w := newManagerWorld(t, gatedAgent("", nil), func(d *Deps) {
			d.Now = func() time.Time { return time.Unix(0, clock.Load()).UTC() }
			d.Config.ResetFor = func(string, string) ResetPolicy { return policy }
			d.Config.ResetPolicies = []ResetPolicy{policy}
		})
		m0 := w.deliver(t, "m0", "hello")
		w.answersTo(t, "m0")
		clock.Store(t0.Add(40 * time.Minute).UnixNano())
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
		synctest.Wait()
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.EndReason != persistence.EndIdle {
			t.Fatalf("session %s: %+v, %v; want it ended by the idle reset", m0.SessionId, s, err)
		}

		clock.Store(t0.Add(-15 * time.Minute).UnixNano()) // set back by an hour (less the 5 min since)
		m1 := w.deliver(t, "m1", "back")
		n := resetNotices(w.answersTo(t, "m1"))
		if m1.SessionId == m0.SessionId || len(n) != 1 {
			t.Fatalf("m1 in %s (the reset one %s), notices %q; want a new session and one notice", m1.SessionId, m0.SessionId, n)
		}
		if !strings.Contains(n[0], "(inactive for 30m)") {
			t.Errorf("notice %q; want it to say the session was inactive for 30m (its idle limit)", n[0])
		}
	})
}
