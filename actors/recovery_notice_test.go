package actors

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
)

// TestRecoveryNoticeSaysTheHeadMayHaveBeenPartlyRun: agentgate stops with m0's turn running
// (its agent started) and m1, m2 queued behind it, and starts again with sessions.recovery:
// notice. m0's notice says it may have been partly run, and m1's and m2's that they were not
// run. Before, m0's said "it was not run" too: its sender sent it again, and an agent with
// side effects did the work twice.
func TestRecoveryNoticeSaysTheHeadMayHaveBeenPartlyRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		a := newRequeueAgent()
		w := newManagerWorldAt(t, path, a, nil)
		w.deliver(t, "m0", "hold")
		w.deliver(t, "m1", "queued")
		w.deliver(t, "m2", "queued too")
		synctest.Wait()
		if got := a.order(); len(got) != 1 || got[0] != "m0" {
			t.Fatalf("turns ran %v before the stop; want m0's only", got)
		}
		w.stop() // m0's turn is cut short: m0, m1 and m2 are pending in the store
		synctest.Wait()

		b := newRequeueAgent()
		var logs testutil.Buffer
		w2 := newManagerWorldAt(t, path, b, func(d *Deps) {
			d.Config.Recovery = RecoveryNotice
			d.Log = slog.New(slog.NewTextHandler(&logs, nil))
		})
		synctest.Wait()
		// One line names the session and how many it answered so (before, none did).
		if got := logs.String(); !strings.Contains(got, `msg="`+noticedLine+`"`) || !strings.Contains(got, "messages=3") {
			t.Errorf("no INF line names the messages answered with a notice:\n%s", got)
		}
		for id, want := range map[string]string{"m0": MayHaveRunNotice, "m1": NotRunNotice, "m2": NotRunNotice} {
			if got := w2.answerText(t, id); got != want {
				t.Errorf("%s was answered %q; want %q", id, got, want)
			}
		}
		if got := b.order(); len(got) > 0 {
			t.Errorf("turns ran %v after the start; want none", got)
		}
	})
}

// answerText is the text of the outbox's answer to the world's message id.
func (w *managerWorld) answerText(t *testing.T, id string) string {
	t.Helper()
	out, err := w.store.OutboxAfter(w.ctx, w.key, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range out {
		for _, r := range e.InReplyTo {
			if r == id {
				return e.Text
			}
		}
	}
	return ""
}

// TestRecoveryNoticeWithDebounceCoversTheMergedTurn: with debounce, the turn cut short ran the
// head with the messages its sender sent within the window; after the start every one of them
// is told it may have been partly run, and a message sent after the window, which waited for
// a turn of its own, that it was not run. Before, only the head was: recovered messages have
// no arrival time, and the turn's group was the head alone (found by a review).
func TestRecoveryNoticeWithDebounceCoversTheMergedTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		a := newRequeueAgent()
		a.holdAll.Store(true)
		debounce := func(d *Deps) { d.Config.Debounce = 2 * time.Second }
		w := newManagerWorldAt(t, path, a, debounce)
		w.deliver(t, "m0", "first")
		w.deliver(t, "m1", "and this")
		time.Sleep(3 * time.Second) // the window passes: m0 and m1 run in one turn
		synctest.Wait()
		w.deliver(t, "m2", "later")
		synctest.Wait()
		if got := a.order(); len(got) != 1 {
			t.Fatalf("turns ran %v before the stop; want one", got)
		}
		w.stop()
		synctest.Wait()

		b := newRequeueAgent()
		w2 := newManagerWorldAt(t, path, b, func(d *Deps) { debounce(d); d.Config.Recovery = RecoveryNotice })
		synctest.Wait()
		for id, want := range map[string]string{"m0": MayHaveRunNotice, "m1": MayHaveRunNotice, "m2": NotRunNotice} {
			if got := w2.answerText(t, id); got != want {
				t.Errorf("%s was answered %q; want %q", id, got, want)
			}
		}
		if got := b.order(); len(got) > 0 {
			t.Errorf("turns ran %v after the start; want none", got)
		}
	})
}
