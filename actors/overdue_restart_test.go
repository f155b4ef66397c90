package actors

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
)

// TestOverdueResetWhoseMarkWasRefusedOutlivesARestartFromTheStore: a turn runs across the daily
// hour with a message queued behind it, the timer's nudge comes meanwhile, and the store refuses
// the reset's mark (persistence.MarkResetDue) as unavailable. The turn's reply is stored, after
// the hour; while the queued message's turn runs, the store refuses a write, and the session
// starts again from the store. The next activation runs the queued message again and then ends
// the session at the hour. The refused write is a /status's, or one of a reset that began a new
// session in memory (a chat's /new, an operator's reset; the store holds the old session, where
// the reset did not happen; its sender is told to send it again). Before, for these two, the
// overdue reset was filed only for the session current in memory (fileOverdue), the new one the
// refused write began: the next activation found the old session's activity (m0's reply) past
// the hour, and the session went on until the next day's reset.
func TestOverdueResetWhoseMarkWasRefusedOutlivesARestartFromTheStore(t *testing.T) {
	for _, refused := range []string{"/status", "/new", "operator"} {
		t.Run(refused, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release1 := make(chan struct{})
				w, m0 := restartFromStoreWithItsMarkRefused(t, filepath.Join(t.TempDir(), "agentgate.db"), release1, refused)
				close(release1)
				time.Sleep(time.Minute) // the session starts again from the store, and runs m1 again
				synctest.Wait()
				if got := w.answersTo(t, "m1"); len(got) == 0 || got[len(got)-1] != "re m1" {
					t.Errorf("m1 was answered %q; want its reply", got)
				}
				w.checkEndedAt4(t, m0.SessionId, "once m1 ran again after the restart from the store")
			})
		})
	}
}

// TestOverdueResetOutlivesACrashBeforeACommandThatEndedItIsAnswered: as in
// TestOverdueResetWhoseMarkWasRefusedOutlivesARestartFromTheStore, the reset falls due while m0's
// turn runs, with m1 queued behind it, and the store refuses its mark; m0 is answered after the
// hour and m1's turn runs. Then a chat's /new, or an operator's reset, ends the session in memory
// and begins another; before the store answers its write, the session crashes (a store bug under
// a /resume) and restarts; then the store refuses the write. The restarted session loads the old
// session, runs m1 again and ends the session at the hour. Before, the crash filed only the
// reset of the session current in memory, the new one, which had none: the restarted session
// found the old session's activity (m0's reply) past the hour, and the session went on until the
// next day's reset. When the store takes the write instead, the old session stays ended by the
// command, and the reset filed at the crash ends nothing: it names a session no longer current.
// A /status sent a minute later, just before the /new, whose write the store takes, leaves the
// old session current and touches it: the reset filed at the crash is the /new's, with that
// activity. Before, it was the /status's, the first unanswered write's, taken with the activity
// the /status moved on; the restarted session found the session active since, dropped the
// reset, and the session went on until the next day's reset.
func TestOverdueResetOutlivesACrashBeforeACommandThatEndedItIsAnswered(t *testing.T) {
	for _, tc := range []struct {
		name, ended string
		stored      bool   // the store takes the command's write
		first       string // a command whose write the store takes, sent before, a minute later
	}{
		{"/new", "/new", false, ""},
		{"operator", "operator", false, ""},
		{"/new stored", "/new", true, ""},
		{"/status then /new", "/new", false, "/status"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				byCommand := func(op persistence.Op) bool { // the end the command writes
					e, ok := op.(*persistence.EndSession)
					return ok && e.Reason != persistence.EndDaily
				}
				w, release0, release1, answer, clock, refusing := crashingWorld(t,
					func(op persistence.Op) bool { return !tc.stored && byCommand(op) },
					func(op persistence.Op) bool {
						a, ok := op.(*persistence.AppendMessage)
						return byCommand(op) || ok && tc.first != "" && a.Message.Content == tc.first
					})
				m0 := w.dueWhileM0Runs(t, clock, refusing)
				close(release0)
				w.answersTo(t, "m0") // its reply is stored after the hour; m1's turn runs
				synctest.Wait()
				if tc.first != "" {
					clock.Store(after4.Add(time.Minute).UnixNano())
					w.request("c0", tc.first) // its write waits for the store's answer
					synctest.Wait()
				}
				if tc.ended == "operator" {
					w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &ResetSession{}}, time.Hour)
				} else {
					w.request("c1", "/new")
				}
				synctest.Wait()                    // its write waits for the store's answer
				w.request("k1", "/resume earlier") // never answered: the session crashes on it
				synctest.Wait()
				close(answer) // the store answers the command's write; the session has restarted
				synctest.Wait()
				refusing.Store(false)
				close(release1)
				time.Sleep(time.Minute)
				synctest.Wait()
				if tc.stored {
					s, err := w.store.Session(w.ctx, m0.SessionId)
					if err != nil || s.EndReason != persistence.EndNewCommand {
						t.Errorf("session %s: %+v, %v; want it ended by /new", m0.SessionId, s, err)
					}
					route, err := w.store.Route(w.ctx, w.key)
					if err != nil {
						t.Fatal(err)
					}
					if cur, err := w.store.Session(w.ctx, route.SessionID); err != nil || route.SessionID == m0.SessionId || !cur.EndedAt.IsZero() {
						t.Errorf("the key's session %s: %+v, %v; want the one /new began, open", route.SessionID, cur, err)
					}
					return
				}
				if tc.first != "" {
					if in, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, "c0"); err != nil || in.SessionID != m0.SessionId {
						t.Errorf("%s: %+v, %v; want it stored in session %s", tc.first, in, err, m0.SessionId)
					}
				}
				if got := w.answersTo(t, "m1"); len(got) == 0 || got[len(got)-1] != "re m1" {
					t.Errorf("m1 was answered %q; want its reply", got)
				}
				w.checkEndedAt4(t, m0.SessionId, "once m1 ran again after the crash")
			})
		})
	}
}

// TestOverdueResetOutlivesACrashBeforeItsOwnWriteIsAnswered: the reset falls due while m0's turn
// runs, with m1 queued behind it, and the store refuses its mark. Once m1's turn is done the
// session ends at the hour in memory; before the store answers that write, the session crashes
// (a store bug under a /resume) and restarts; then the store refuses the write (m1's reply, in
// the same batch or the one before, is stored). The restarted session loads the session, still
// open, and ends it at the hour. Before, the crash filed nothing: the reset was no longer the
// session's (expire had taken it), and the restarted session found the session's activity (m1's
// reply) past the hour, and the session went on until the next day's reset. When the store takes
// the write instead, the session stays ended.
func TestOverdueResetOutlivesACrashBeforeItsOwnWriteIsAnswered(t *testing.T) {
	for _, stored := range []bool{false, true} {
		t.Run(fmt.Sprintf("stored=%v", stored), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				daily := func(op persistence.Op) bool { // the reset's own write
					e, ok := op.(*persistence.EndSession)
					return ok && e.Reason == persistence.EndDaily
				}
				w, release0, release1, answer, clock, refusing := crashingWorld(t,
					func(op persistence.Op) bool { return !stored && daily(op) }, daily)
				m0 := w.dueWhileM0Runs(t, clock, refusing)
				close(release0)
				w.answersTo(t, "m0")
				close(release1)
				synctest.Wait()                    // m1's reply is written after the hour; the reset's write waits
				w.request("k1", "/resume earlier") // never answered: the session crashes on it
				synctest.Wait()
				close(answer) // the store answers the reset's write; the session has restarted
				synctest.Wait()
				refusing.Store(false)
				time.Sleep(time.Minute)
				synctest.Wait()
				if got := w.answersTo(t, "m1"); len(got) == 0 || got[len(got)-1] != "re m1" {
					t.Errorf("m1 was answered %q; want its reply", got)
				}
				w.checkEndedAt4(t, m0.SessionId, "after the crash")
			})
		})
	}
}

// crashingWorld is the world of the tests of a crash before a write is answered: m0's turn held
// until release0 is closed, m1's until release1; a clock at before4; a store that, while refusing
// is set, refuses every reset mark and the writes refuseEnd picks, and holds the writes held picks
// until answer is closed; a /resume crashes the session.
func crashingWorld(t *testing.T, refuseEnd, held func(persistence.Op) bool) (w *managerWorld,
	release0, release1, answer chan struct{}, clock *atomic.Int64, refusing *atomic.Bool) {
	t.Helper()
	release0, release1, answer = make(chan struct{}), make(chan struct{}), make(chan struct{})
	clock, refusing = new(atomic.Int64), new(atomic.Bool)
	clock.Store(before4.UnixNano())
	w = newManagerWorldWith(t, filepath.Join(t.TempDir(), "agentgate.db"), twoGates(release0, release1), func(d *Deps) {
		dailyClock(clock)(d)
		d.Store = sessionsOfKeyPanics{d.Store} // a /resume crashes the session
	}, func(s persistence.Store) persistence.Store {
		refused := &refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
			_, mark := op.(*persistence.MarkResetDue)
			return refusing.Load() && (mark || refuseEnd(op))
		}}
		return &waitsFor{Store: refused, pick: held, until: answer}
	})
	return w, release0, release1, answer, clock, refusing
}

// restartFromStoreWithItsMarkRefused starts a world on the database at path whose session runs
// m0 (held until it is released) across the daily hour with m1 (held until release1 is closed)
// queued behind it; the timer's nudge comes after the hour, and the store refuses the reset's
// mark as unavailable; m0 is answered after the hour, and, while m1's turn runs, the store
// refuses the write of refused, so the session starts again from the store: a chat's command
// ("/status", or "/new", which began a new session in memory) or, for "operator", an operator's
// reset (which did too). It returns once the store takes writes again, with m0's answer.
func restartFromStoreWithItsMarkRefused(t *testing.T, path string, release1 chan struct{}, refused string) (*managerWorld, *DeliverResult) {
	t.Helper()
	release0 := make(chan struct{})
	var clock atomic.Int64
	clock.Store(before4.UnixNano())
	var refusing atomic.Bool
	w := newManagerWorldWith(t, path, twoGates(release0, release1), dailyClock(&clock), func(s persistence.Store) persistence.Store {
		return &refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
			switch o := op.(type) {
			case *persistence.MarkResetDue:
				return refusing.Load()
			case *persistence.AppendMessage:
				return refusing.Load() && o.Message.Content == refused
			case *persistence.EndSession:
				return refusing.Load() && refused == "operator" && o.Reason == persistence.EndResetCommand
			}
			return false
		}}
	})
	m0 := w.dueWhileM0Runs(t, &clock, &refusing)
	close(release0)
	w.answersTo(t, "m0") // its reply is stored after the hour; m1's turn runs
	synctest.Wait()
	if refused == "operator" {
		res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &ResetSession{}}, time.Minute).Result()
		if r, ok := res.(*ResetResult); err != nil || !ok || r.ErrorCode != ErrCodeUnavailable {
			t.Fatalf("operator's reset: %+v, %v; want it refused as unavailable", res, err)
		}
	} else if r := w.deliver(t, "c1", refused); r.ErrorCode != "unavailable" {
		t.Fatalf("%s: %+v; want it refused as unavailable", refused, r)
	}
	synctest.Wait()
	refusing.Store(false)
	return w, m0
}

// twoGates is an agent that answers "re ID" to m0 once release0 is closed, to m1 once release1
// is, and to any other message at once.
func twoGates(release0, release1 chan struct{}) agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		var gate chan struct{}
		switch req.Identity.MessageID {
		case "m0":
			gate = release0
		case "m1":
			gate = release1
		}
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return &agents.Response{Text: "re " + req.Identity.MessageID}, nil
	})
}

// TestOverdueResetFiledAtARestartFromTheStoreIsMarkedOnceTheStoreTakesWrites: as in
// TestOverdueResetWhoseMarkWasRefusedOutlivesARestartFromTheStore, the store refuses the reset's
// mark and then a /status, and the session starts again from the store, which takes writes
// again by then. The next activation, running the queued message again, writes the mark on the
// session's row; agentgate stops before that turn is done, and at its next start the session
// runs the message and ends at the hour. Before, the reset filed for the next activation
// (fileOverdue) was a copy of the one in memory, which took the refused mark for one stored
// (it waited to be written again, by a timer of the activation that had stopped): the next
// activation never wrote it, and the stop lost the reset; the session went on until the next
// day's.
func TestOverdueResetFiledAtARestartFromTheStoreIsMarkedOnceTheStoreTakesWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		w, m0 := restartFromStoreWithItsMarkRefused(t, path, make(chan struct{}), "/status")
		time.Sleep(time.Minute) // the session starts again from the store, and runs m1 again
		synctest.Wait()
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.ResetDueReason != persistence.EndDaily {
			t.Errorf("session %s as m1 runs again: %+v, %v; want its due reset marked", m0.SessionId, s, err)
		}
		w.stop() // m1's turn is cut short: it is pending in the store
		synctest.Wait()

		var clock atomic.Int64 // the next start, as the hour passed
		clock.Store(after4.UnixNano())
		w2 := newManagerWorldAt(t, path, gatedAgent("", nil), dailyClock(&clock))
		if got := w2.answersTo(t, "m1"); len(got) == 0 || got[len(got)-1] != "re m1" {
			t.Errorf("m1 was answered %q; want its reply", got)
		}
		synctest.Wait()
		w2.checkEndedAt4(t, m0.SessionId, "once m1 ran at the next start")
	})
}
