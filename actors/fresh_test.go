package actors

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/platforms"
)

// TestOperatorResetOfAFreshSessionKeepsIt: an operator's reset (the admin API, agentgate
// sessions reset) of a session nothing was said in yet, the one the last reset began, is
// answered with that session, which stays open: the key keeps one new session, in the same
// activation and in the next. Before, every reset ended the empty session and began another,
// and resetting a key twice left a chain of empty sessions.
func TestOperatorResetOfAFreshSessionKeepsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newManagerWorld(t, echo.New(), nil)
		m1 := w.deliver(t, "m1", "hello")
		w.awaitTurnEnds(1)
		first := w.reset(t, &ResetSession{})
		if first.PreviousSessionId != m1.SessionId {
			t.Fatalf("reset = %+v, want the end of %s", first, m1.SessionId)
		}
		for _, when := range []string{"at once", "in the next activation"} {
			if when != "at once" {
				time.Sleep(2 * time.Hour) // the session passivates: the reset activates it from the store
				synctest.Wait()
			}
			if got := w.reset(t, &ResetSession{}); got.SessionId != first.SessionId || got.PreviousSessionId != m1.SessionId {
				t.Errorf("a second reset %s = %+v, want session %s kept (following %s)", when, got, first.SessionId, m1.SessionId)
			}
		}
		if n := w.sessionCount(t); n != 2 {
			t.Errorf("the key has %d sessions after resetting it three times, want 2", n)
		}
		if s, err := w.store.Session(w.ctx, first.SessionId); err != nil || !s.EndedAt.IsZero() {
			t.Errorf("the fresh session after the second reset: %+v, %v; want it open", s, err)
		}
	})
}

// TestNewInAFreshSessionKeepsIt: /new (or /reset) in a session nothing was said in yet tells
// the user so and keeps it: typing /new twice starts one session, not two; after a message it
// starts a new one again. With history_limit 0 (no transcript buffer in memory) the session's
// stored messages still count. Before, each /new ended the empty session and began another.
func TestNewInAFreshSessionKeepsIt(t *testing.T) {
	for _, tt := range []struct {
		name         string
		historyLimit int
	}{
		{"with a transcript buffer", 50},
		{"history_limit 0", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newManagerWorld(t, echo.New(), func(d *Deps) { d.Config.HistoryLimit = tt.historyLimit })
				command := func(id, text string) (*DeliverResult, string) {
					t.Helper()
					r := w.deliver(t, id, text)
					if r.ErrorCode != "" || r.Disposition != platforms.Command {
						t.Fatalf("%s: %+v, want a command answered", text, r)
					}
					return r, w.noticeFor(t, id)
				}
				m1 := w.deliver(t, "m1", "hello")
				w.awaitTurnEnds(1)
				n1, answer := command("n1", "/new")
				if n1.SessionId == m1.SessionId || !strings.HasPrefix(answer, "✨ Started a new session ("+n1.SessionId+").") {
					t.Fatalf("/new after a message: %s, answered %q; want a new session", n1.SessionId, answer)
				}
				n2, answer := command("n2", "/new")
				want := "✨ This session (" + n1.SessionId + ") is new already"
				if n2.SessionId != n1.SessionId || !strings.HasPrefix(answer, want) {
					t.Errorf("a second /new: session %s, answered %q; want %s kept, answered %q…", n2.SessionId, answer, n1.SessionId, want)
				}
				time.Sleep(2 * time.Hour) // the session passivates: the next command loads it from the store
				synctest.Wait()
				if n3, answer := command("n3", "/reset"); n3.SessionId != n1.SessionId || !strings.HasPrefix(answer, want) {
					t.Errorf("/reset in the next activation: session %s, answered %q; want %s kept, answered %q…", n3.SessionId, answer, n1.SessionId, want)
				}
				if n := w.sessionCount(t); n != 2 {
					t.Errorf("the key has %d sessions after /new, /new, /reset, want 2", n)
				}
				if m2 := w.deliver(t, "m2", "hi"); m2.SessionId != n1.SessionId {
					t.Errorf("m2 went to session %s, want the fresh %s", m2.SessionId, n1.SessionId)
				}
				w.awaitTurnEnds(1)
				if n4, answer := command("n4", "/new"); n4.SessionId == n1.SessionId || !strings.HasPrefix(answer, "✨ Started a new session") {
					t.Errorf("/new after m2: session %s, answered %q; want a new session after %s", n4.SessionId, answer, n1.SessionId)
				}
				if s, err := w.store.Session(w.ctx, n1.SessionId); err != nil || s.EndedAt.IsZero() {
					t.Errorf("the session m2 was said in, after /new: %+v, %v; want it ended", s, err)
				}
			})
		})
	}
}

// TestStatusOnANewChat: /status as a new chat's first message names the session the command
// began, the one its answer's session_id names and the chat's next message goes to, and shows
// the reset policy, as /help says it does. Before, it said "Session (none yet)" and had no
// reset policy line.
func TestStatusOnANewChat(t *testing.T) {
	start := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name   string
		policy ResetPolicy
		want   string
	}{
		{"no reset policy", ResetPolicy{Mode: ResetNone}, "Reset policy: none (only /new or /reset end this session)"},
		{"idle", ResetPolicy{Mode: ResetIdle, Idle: time.Hour, Location: time.UTC}, "Reset policy: idle; next reset 2030-01-01T13:00:00Z"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newManagerWorld(t, echo.New(), func(d *Deps) {
					d.Now = func() time.Time { return start }
					d.Config.ResetFor = func(string, string) ResetPolicy { return tt.policy }
				})
				r := w.deliver(t, "s1", "/status")
				if r.ErrorCode != "" || r.SessionId == "" {
					t.Fatalf("/status: %+v", r)
				}
				got := w.noticeFor(t, "s1")
				if !strings.HasPrefix(got, "Session "+r.SessionId+"\n") || !strings.HasSuffix(got, "\n"+tt.want) {
					t.Errorf("/status on a new chat answered %q (session_id %s), want it to name that session and end %q", got, r.SessionId, tt.want)
				}
				if m1 := w.deliver(t, "m1", "hello"); m1.SessionId != r.SessionId {
					t.Errorf("the next message went to session %s, not %s, which /status named", m1.SessionId, r.SessionId)
				}
			})
		})
	}
}
