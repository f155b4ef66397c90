package actors

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
)

// TestStatusAfterAnOperatorReset: /status in the session an operator's reset (the admin API,
// agentgate sessions reset) began reports that session's activity, its start, not the last
// message of the session the reset ended.
func TestStatusAfterAnOperatorReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newManagerWorld(t, echo.New(), nil)
		if r := w.deliver(t, "m1", "hello"); r.ErrorCode != "" {
			t.Fatalf("m1: %+v", r)
		}
		w.awaitTurnEnds(1)
		time.Sleep(time.Hour)
		resetAt := time.Now()
		res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &ResetSession{}}, time.Minute).Result()
		if r, ok := res.(*ResetResult); err != nil || !ok || r.Error != "" {
			t.Fatalf("reset: %v, %v", res, err)
		}
		time.Sleep(time.Minute)
		if r := w.deliver(t, "s1", "/status"); r.ErrorCode != "" {
			t.Fatalf("/status: %+v", r)
		}
		want := "Last activity: " + resetAt.UTC().Format(time.RFC3339)
		for {
			select {
			case got := <-w.sent:
				if !strings.HasPrefix(got.Out.Text, "Session ") {
					continue
				}
				if !strings.Contains(got.Out.Text, want) {
					t.Errorf("/status after a reset = %q, want it to say %q", got.Out.Text, want)
				}
				return
			case <-time.After(time.Minute):
				t.Fatal("no /status answer")
			}
		}
	})
}
