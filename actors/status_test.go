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

// TestStatusAfterAnIdleReset: /status as the chat's first word after an idle reset begins the
// session the chat now has, and says so: that it started now, and that the previous one was
// reset and when. Before, it named the new session beside the ended one's last activity, as if
// that session had been active an hour ago (a review).
func TestStatusAfterAnIdleReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, w := idleResetWorld(t)
		first := w.deliver(t, "m0", "hello")
		synctest.Wait()
		lastActivity := time.Now()
		time.Sleep(time.Hour) // idle past the policy (30 s)
		synctest.Wait()
		now := time.Now()
		status := w.deliver(t, "s1", "/status")
		if status.ErrorCode != "" || status.SessionId == first.SessionId {
			t.Fatalf("/status: %+v, want a session after %s", status, first.SessionId)
		}
		for {
			select {
			case got := <-w.sent:
				if !strings.HasPrefix(got.Out.Text, "Session ") {
					continue
				}
				text := got.Out.Text
				for _, want := range []string{
					"Session " + status.SessionId,
					"Started: " + now.UTC().Format(time.RFC3339) + ", by this command",
					"the previous session, " + first.SessionId + ", was reset automatically (idle) at " +
						lastActivity.Add(30*time.Second).UTC().Format(time.RFC3339),
				} {
					if !strings.Contains(text, want) {
						t.Errorf("/status after an idle reset = %q, want it to say %q", text, want)
					}
				}
				if strings.Contains(text, "Last activity: "+lastActivity.UTC().Format(time.RFC3339)) {
					t.Errorf("/status after an idle reset = %q: the ended session's last activity beside the new session", text)
				}
				return
			case <-time.After(time.Minute):
				t.Fatal("no /status answer")
			}
		}
	})
}

// TestStatusAfterTheResetOfASilentSession: /status after an idle reset of a session nothing was
// said in (one /status or /new began, and nobody wrote to) begins the chat's next session, which
// follows the silent one's predecessor, or none: no automatic reset is told of, and the answer
// says that the session started now, by this command. Before, it named the new session beside
// the silent session's last activity, as if the session had been active then (a review).
func TestStatusAfterTheResetOfASilentSession(t *testing.T) {
	for _, tt := range []struct {
		name  string
		begin func(t *testing.T, w *managerWorld) // begins the silent session
	}{
		{"begun by /status on a new chat", func(t *testing.T, w *managerWorld) {
			w.deliver(t, "s0", "/status")
			w.answersTo(t, "s0")
		}},
		{"begun by /new after a conversation", func(t *testing.T, w *managerWorld) { afterNew(t, w) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, w := idleResetWorld(t)
				tt.begin(t, w)
				silentActivity := time.Now()
				time.Sleep(time.Hour) // the silent session is idle past the policy (30 s)
				now := time.Now()
				s1 := w.deliver(t, "s1", "/status")
				got := w.answersTo(t, "s1")
				if len(got) != 1 || !strings.HasPrefix(got[0], "Session "+s1.SessionId+"\n") {
					t.Fatalf("/status after the silent session's reset was answered %q, want the status of %s alone", got, s1.SessionId)
				}
				if want := "Started: " + now.UTC().Format(time.RFC3339) + ", by this command\n"; !strings.Contains(got[0], want) {
					t.Errorf("/status after the silent session's reset = %q, want it to say %q", got[0], want)
				}
				if stale := "Last activity: " + silentActivity.UTC().Format(time.RFC3339); strings.Contains(got[0], stale) {
					t.Errorf("/status after the silent session's reset = %q: the ended session's last activity beside the new session", got[0])
				}
			})
		})
	}
}
