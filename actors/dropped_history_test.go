package actors

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/platforms"
)

// TestDroppedMessagesStayOutOfReloadedHistory: a message a command drops unrun (queued behind
// the turn /stop cancels, or behind the one /new ends) is not part of the conversation: the
// live session never gives it to its agent, and neither does one loaded again from the store,
// after a restart (here a passivation, which reads the same rows) or a /resume of the session
// it was sent in. The cancelled turn's message stays, as docs/HTTP-API.md says (the transcript). Before, the dropped
// message was stored failed, as the cancelled one, and every reload put it back in the
// history (found by an exec agent's walkthrough on a real daemon).
func TestDroppedMessagesStayOutOfReloadedHistory(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reload func(t *testing.T, w *managerWorld, sid string)
	}{
		{"stop, then a reload", func(t *testing.T, w *managerWorld, _ string) {
			mustCommand(t, w, "stop", "/stop")
			w.deliver(t, "q3", "Q3")
			synctest.Wait()
			time.Sleep(3 * time.Minute) // the session passivates
			synctest.Wait()
		}},
		{"new, then resume", func(t *testing.T, w *managerWorld, sid string) {
			mustCommand(t, w, "new", "/new")
			mustCommand(t, w, "resume", "/resume "+sid)
			w.deliver(t, "q3", "Q3")
			synctest.Wait()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := newHistoryAgent("")
				w := newManagerWorld(t, a.agent, func(d *Deps) { d.Config.PassivateAfter = time.Minute })
				r := w.deliver(t, "q1", "Q1") // runs until release, which never comes
				synctest.Wait()
				if q := w.deliver(t, "q2", "Q2"); q.Disposition != platforms.Queued {
					t.Fatalf("q2 = %+v, want queued behind Q1", q)
				}
				synctest.Wait()
				tc.reload(t, w, r.SessionId)
				w.deliver(t, "q4", "Q4")
				synctest.Wait()
				if got, want := a.history(), []string{"Q1", "Q3", "A3"}; !slices.Equal(got, want) {
					t.Errorf("Q4's turn got the history %q, want %q (Q2 was dropped unrun)", got, want)
				}
			})
		})
	}
}

// mustCommand delivers a chat command of the world's chat and fails the test unless it was
// taken as one.
func mustCommand(t *testing.T, w *managerWorld, id, text string) {
	t.Helper()
	if r := w.deliver(t, id, text); r.Disposition != platforms.Command {
		t.Fatalf("%s = %+v, want it taken as a command", text, r)
	}
	synctest.Wait()
}
