package actors

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// TestMessageRunningAtAnUncleanStopStaysInTheConversation: with sessions.recovery: notice, the
// start after an unclean stop answers the messages left pending with a notice. The one that was
// running then (the head, its unclean stop counted by Store.BeginRun) is failed but stays in the
// conversation, as a cancelled turn's message does: the next turn's agent reads it. The one
// queued behind it never ran, and is archived. Before, both were archived: the agent never saw
// the message it had been acting on, and the transcript said it never ran.
func TestMessageRunningAtAnUncleanStopStaysInTheConversation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		setup := func(d *Deps) { d.Config.Recovery = RecoveryNotice }
		a := newRequeueAgent()
		w := newManagerWorldAt(t, path, a, setup)
		w.deliver(t, "m0", "hold")
		w.deliver(t, "m1", "queued")
		synctest.Wait()
		w.stop() // m0's turn is cut short: m0 and m1 are pending in the store
		synctest.Wait()
		store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, run := range []string{"run-1", "run-2"} { // run-1 never ended: an unclean stop
			if _, err := store.BeginRun(t.Context(), run, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}

		b := newRequeueAgent()
		w2 := newManagerWorldAt(t, path, b, setup)
		synctest.Wait() // loaded, and m0 and m1 answered with notices
		if got := b.order(); len(got) > 0 {
			t.Fatalf("turns ran %v; want none: the messages are answered with notices", got)
		}
		for _, tc := range []struct {
			id               string
			attempts         int
			active, archived bool
		}{
			{"m0", 1, true, false},
			{"m1", 0, false, true},
		} {
			m, err := w2.store.FindInbound(w2.ctx, w2.src.Platform, w2.src.ChatID, tc.id)
			if err != nil {
				t.Fatal(err)
			}
			if m.Attempts != tc.attempts {
				t.Fatalf("%s has %d attempts, want %d: the test does not test", tc.id, m.Attempts, tc.attempts)
			}
			if m.Status != persistence.StatusFailed || m.Active != tc.active || m.Archived != tc.archived {
				t.Errorf("%s: %s, active %t, archived %t; want failed, active %t, archived %t",
					tc.id, m.Status, m.Active, m.Archived, tc.active, tc.archived)
			}
		}
		w2.deliver(t, "m2", "next")
		synctest.Wait()
		var seen []string
		for _, h := range b.history["m2"] {
			seen = append(seen, h.Text)
		}
		if !slices.ContainsFunc(seen, func(s string) bool { return strings.Contains(s, "hold") }) ||
			slices.ContainsFunc(seen, func(s string) bool { return strings.Contains(s, "queued") }) {
			t.Errorf("m2's turn got the history %q, want m0's text in it and not m1's", seen)
		}
	})
}
