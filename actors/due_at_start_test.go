package actors

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
)

// TestPendingMessagesOfASessionDueAtStartRunBeforeItsReset: agentgate stops with a message's
// turn running and one queued behind it (the drain deadline passed, or a kill -9), and starts
// again after the session's reset (idle or daily) fell due. The messages run in the session
// they were sent to, and the session then ends at its due time, as a live daemon does with a
// reset that falls due while the session works. A message that arrives meanwhile joins them,
// as on a live daemon, and the next one begins the successor, with the notice. Before, the
// start ended the session at once and answered both with "could not be answered before the
// session was reset …, so it was not run", though the last run had taken them.
func TestPendingMessagesOfASessionDueAtStartRunBeforeItsReset(t *testing.T) {
	idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Minute, Notify: true}
	for _, tc := range []struct {
		name    string
		policy  ResetPolicy
		restart time.Time // when agentgate starts again
		reason  string
		due     time.Time // when the session ends
	}{
		{"daily", ResetPolicy{Mode: ResetDaily, AtHour: 4, Notify: true, Location: time.UTC}, after4, persistence.EndDaily, at4},
		{"idle", idle, before4.Add(2 * time.Hour), persistence.EndIdle, before4.Add(30 * time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var clock atomic.Int64
				clock.Store(before4.UnixNano())
				setup := resetsBy(&clock, tc.policy)
				path := filepath.Join(t.TempDir(), "agentgate.db")
				w := newManagerWorldAt(t, path, gatedAgent("m0", make(chan struct{})), setup)
				m0 := w.deliver(t, "m0", "slow")
				if m1 := w.deliver(t, "m1", "queued"); m1.SessionId != m0.SessionId {
					t.Fatalf("m1 in %s, m0 in %s", m1.SessionId, m0.SessionId)
				}
				synctest.Wait()
				w.stop() // m0's turn is cut short: m0 and m1 are pending in the store
				synctest.Wait()

				clock.Store(tc.restart.UnixNano())
				release := make(chan struct{})
				w2 := newManagerWorldAt(t, path, gatedAgent("m0", release), setup)
				synctest.Wait() // recovered: m0's turn runs again
				if s, err := w2.store.Session(w2.ctx, m0.SessionId); err != nil || !s.EndedAt.IsZero() {
					t.Fatalf("session %s after the start: ended %v (%q), %v; want it open while its pending messages run", m0.SessionId, s.EndedAt, s.EndReason, err)
				}
				// A message that arrives while they run joins them, as on a live daemon.
				if m2 := w2.deliver(t, "m2", "meanwhile"); m2.SessionId != m0.SessionId {
					t.Errorf("m2 arrived while the session's pending messages ran and went to %s; want their session %s", m2.SessionId, m0.SessionId)
				}
				close(release)
				for _, id := range []string{"m0", "m1", "m2"} {
					if got := w2.answersTo(t, id); len(got) != 1 || got[0] != "re "+id {
						t.Errorf("%s was answered %q; want its reply", id, got)
					}
				}
				synctest.Wait()
				s, err := w2.store.Session(w2.ctx, m0.SessionId)
				if err != nil {
					t.Fatal(err)
				}
				if s.EndReason != tc.reason || !s.EndedAt.Equal(tc.due) {
					t.Errorf("once its messages ran, session %s ended %v (%q); want the %s reset at %v", m0.SessionId, s.EndedAt, s.EndReason, tc.reason, tc.due)
				}
				m3 := w2.deliver(t, "m3", "next")
				n := resetNotices(w2.answersTo(t, "m3"))
				if m3.SessionId == m0.SessionId || len(n) != 1 {
					t.Fatalf("m3 ran in %s (the reset one %s), with the notices %q; want a new session and one notice", m3.SessionId, m0.SessionId, n)
				}
				// The session's last activity is the answers, after its end: the idle time is
				// not told from them ("inactive for 0m").
				if tc.reason == persistence.EndIdle && !strings.Contains(n[0], "(inactive for too long)") {
					t.Errorf("m3's notice %q; want it to say the session was inactive for too long", n[0])
				}
			})
		})
	}
}

// TestOverdueResetOutlivesACrash: a start finds a session's daily reset due with messages
// pending, and the reset waits for them (above); one of them then crashes the session until it
// is quarantined. The reset is still done once the rest ran, at its due time. Before, the
// restarted session loaded its activity from the store, moved past the due time by the
// answer, saw no reset due, and went on until the next day's (found by a review).
func TestOverdueResetOutlivesACrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clock atomic.Int64
		clock.Store(before4.UnixNano())
		policy := ResetPolicy{Mode: ResetDaily, AtHour: 4, Notify: true, Location: time.UTC}
		setup := resetsBy(&clock, policy)
		path := filepath.Join(t.TempDir(), "agentgate.db")
		a := newRequeueAgent()
		a.holdAll.Store(true)
		w := newManagerWorldAt(t, path, a, setup)
		m0 := w.deliver(t, "m0", "slow")
		w.deliver(t, "m1", "boom")
		synctest.Wait()
		w.stop() // m0's turn is cut short: m0 and m1 are pending in the store
		synctest.Wait()

		clock.Store(after4.UnixNano())
		b := newRequeueAgent()
		b.poisoned.Store(true) // m1 crashes the session each time it runs
		w2 := newManagerWorldAt(t, path, b, setup)
		synctest.Wait()
		if got := w2.answersTo(t, "m0"); len(got) != 1 || got[0] != "answered m0" {
			t.Fatalf("m0 was answered %q; want its reply", got)
		}
		s, err := w2.store.Session(w2.ctx, m0.SessionId)
		if err != nil {
			t.Fatal(err)
		}
		if s.EndReason != persistence.EndDaily || !s.EndedAt.Equal(at4) {
			t.Errorf("once m1 was quarantined, session %s ended %v (%q); want the daily reset at %v", m0.SessionId, s.EndedAt, s.EndReason, at4)
		}
	})
}

// TestDueResetOutlivesAStopDuringItsBacklog: a start finds a session's reset due with messages
// the last run left pending, and the reset waits for them (above); agentgate stops again before
// they have all run, after the first one was answered. At the next start the session's last
// activity is that answer, after the due time, so its activity no longer says the reset is due;
// the session's row does (persistence.MarkResetDue). The rest of the backlog runs in the
// session, which then ends at its due time, and the next message begins its successor with the
// notice. Before, the reset was held in memory only: the stop lost it, and the session went on
// until its next reset (a daily one a day late), with the next message in it.
func TestDueResetOutlivesAStopDuringItsBacklog(t *testing.T) {
	idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Minute, Notify: true}
	for _, tc := range []struct {
		name    string
		policy  ResetPolicy
		restart time.Time // when agentgate starts again, the reset due
		again   time.Time // when it starts once more, the first message answered at restart
		reason  string
		due     time.Time // when the session ends
	}{
		{"daily", ResetPolicy{Mode: ResetDaily, AtHour: 4, Notify: true, Location: time.UTC}, after4, after4.Add(30 * time.Minute), persistence.EndDaily, at4},
		{"idle", idle, before4.Add(2 * time.Hour), before4.Add(2*time.Hour + 10*time.Minute), persistence.EndIdle, before4.Add(30 * time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var clock atomic.Int64
				clock.Store(before4.UnixNano())
				setup := resetsBy(&clock, tc.policy)
				path := filepath.Join(t.TempDir(), "agentgate.db")
				w := newManagerWorldAt(t, path, gatedAgent("m0", make(chan struct{})), setup)
				m0 := w.deliver(t, "m0", "slow")
				w.deliver(t, "m1", "queued")
				synctest.Wait()
				w.stop() // m0's turn is cut short: m0 and m1 are pending in the store
				synctest.Wait()

				clock.Store(tc.restart.UnixNano())
				w2 := newManagerWorldAt(t, path, gatedAgent("m1", make(chan struct{})), setup)
				if got := w2.answersTo(t, "m0"); len(got) != 1 || got[0] != "re m0" {
					t.Fatalf("m0 was answered %q; want its reply", got)
				}
				synctest.Wait() // m1's turn runs
				w2.stop()       // and is cut short: m1 is pending, the session's activity m0's answer
				synctest.Wait()

				clock.Store(tc.again.UnixNano())
				w3 := newManagerWorldAt(t, path, gatedAgent("", nil), setup)
				if got := w3.answersTo(t, "m1"); len(got) != 1 || got[0] != "re m1" {
					t.Errorf("m1 was answered %q; want its reply", got)
				}
				synctest.Wait()
				s, err := w3.store.Session(w3.ctx, m0.SessionId)
				if err != nil {
					t.Fatal(err)
				}
				if s.EndReason != tc.reason || !s.EndedAt.Equal(tc.due) {
					t.Errorf("once its backlog ran, session %s ended %v (%q); want the %s reset at %v", m0.SessionId, s.EndedAt, s.EndReason, tc.reason, tc.due)
				}
				if s.ResetDueReason != "" {
					t.Errorf("session %s still holds its due reset (%q at %v) after it ended", m0.SessionId, s.ResetDueReason, s.ResetDueAt)
				}
				if got := saidIn(t, w3, m0.SessionId); !slices.Equal(got, []string{"slow", "queued", "re m0", "re m1"}) {
					t.Errorf("session %s holds %q; want both messages answered in it", m0.SessionId, got)
				}
				m2 := w3.deliver(t, "m2", "next")
				n := resetNotices(w3.answersTo(t, "m2"))
				if m2.SessionId == m0.SessionId || len(n) != 1 {
					t.Fatalf("m2 ran in %s (the reset one %s), with the notices %q; want a new session and one notice", m2.SessionId, m0.SessionId, n)
				}
				synctest.Wait()
				if got := saidIn(t, w3, m2.SessionId); !slices.Equal(got, []string{"next", "re m2"}) {
					t.Errorf("session %s holds %q; want m2 and its reply", m2.SessionId, got)
				}
			})
		})
	}
}

// saidIn is the user messages and replies of session sid, in order.
func saidIn(t *testing.T, w *managerWorld, sid string) []string {
	t.Helper()
	tr, err := w.store.Transcript(w.ctx, sid)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range tr {
		if m.Role == persistence.RoleUser || m.Role == persistence.RoleAssistant {
			got = append(got, m.Content)
		}
	}
	return got
}

// TestResetDueWhileTheSessionWorksOutlivesAStop: a turn runs across the daily hour with a message
// queued behind it, and the timer's nudge finds the reset due meanwhile: the session's row
// records it at once. The turn is answered (the session's activity is now after the hour), and
// agentgate stops while the queued message's turn runs. At the next start that message runs in
// the session, which then ends at the hour. Before, the stop lost the reset, held in memory
// only, and the session went on until the next day's.
func TestResetDueWhileTheSessionWorksOutlivesAStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clock atomic.Int64
		clock.Store(before4.UnixNano())
		daily := dailyClock(&clock)
		path := filepath.Join(t.TempDir(), "agentgate.db")
		release0 := make(chan struct{})
		w := newManagerWorldAt(t, path, heldUntil(release0), daily)
		m0 := w.dueWhileM0Runs(t, &clock, nil)
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.ResetDueReason != persistence.EndDaily || !s.ResetDueAt.Equal(at4) || !s.EndedAt.IsZero() {
			t.Errorf("session %s while it works past its reset: %+v, %v; want it open, its daily reset due at %v stored", m0.SessionId, s, err, at4)
		}
		close(release0)
		w.answersTo(t, "m0")
		synctest.Wait() // m1's turn runs
		w.stop()
		synctest.Wait()

		w2 := restartPastTheHour(t, &clock, path, daily, m0.SessionId)
		m2 := w2.deliver(t, "m2", "next")
		if n := resetNotices(w2.answersTo(t, "m2")); m2.SessionId == m0.SessionId || len(n) != 1 {
			t.Errorf("m2 ran in %s (the reset one %s), with the notices %q; want a new session and one notice", m2.SessionId, m0.SessionId, n)
		}
	})
}

// TestRefusedResetDueMarkIsWrittenAgain: a turn runs across the daily hour with a message queued
// behind it, and the store refuses the write of the reset that falls due meanwhile (the
// database and the spool both failing). The session writes it again once the store takes
// writes, so a stop while the queued message's turn runs keeps the reset: the next start runs
// that message in the session, which then ends at the hour. Before, a refused mark was not
// tried again, and the stop lost the reset: the answer had moved the session's activity past
// the hour, and the session went on until the next day's.
func TestRefusedResetDueMarkIsWrittenAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clock atomic.Int64
		clock.Store(before4.UnixNano())
		daily := dailyClock(&clock)
		path := filepath.Join(t.TempDir(), "agentgate.db")
		release0 := make(chan struct{})
		var refusing atomic.Bool
		w := newManagerWorldWith(t, path, heldUntil(release0), daily, func(s persistence.Store) persistence.Store {
			return &refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
				_, ok := op.(*persistence.MarkResetDue)
				return ok && refusing.Load()
			}}
		})
		m0 := w.dueWhileM0Runs(t, &clock, &refusing)
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.ResetDueReason != "" {
			t.Fatalf("session %s with its mark refused: %+v, %v; want no mark stored yet", m0.SessionId, s, err)
		}
		close(release0)
		w.answersTo(t, "m0")
		time.Sleep(5 * time.Second) // m1's turn runs; the mark is refused again meanwhile
		refusing.Store(false)
		time.Sleep(maxHeldRetry) // the next try
		synctest.Wait()
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.ResetDueReason != persistence.EndDaily || !s.ResetDueAt.Equal(at4) || !s.EndedAt.IsZero() {
			t.Errorf("session %s once the store takes writes: %+v, %v; want it open, its daily reset due at %v stored", m0.SessionId, s, err, at4)
		}
		w.stop()
		synctest.Wait()

		restartPastTheHour(t, &clock, path, daily, m0.SessionId)
	})
}

// restartPastTheHour starts agentgate again on path 30 minutes past the daily hour, after a stop
// cut the turn of m1 (queued in session sid) short, and checks that m1 runs and is answered,
// and that sid then ends at the hour.
func restartPastTheHour(t *testing.T, clock *atomic.Int64, path string, daily func(*Deps), sid string) *managerWorld {
	t.Helper()
	clock.Store(after4.Add(30 * time.Minute).UnixNano())
	w := newManagerWorldAt(t, path, gatedAgent("", nil), daily)
	if got := w.answersTo(t, "m1"); len(got) != 1 || got[0] != "re m1" {
		t.Errorf("m1 was answered %q; want its reply", got)
	}
	synctest.Wait()
	w.checkEndedAt4(t, sid, "once m1 ran after the restart")
	return w
}

// heldUntil is an agent that answers "re ID" once release is closed, except for m1, which runs
// until its context ends (a stop).
func heldUntil(release chan struct{}) agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		gate := release
		if req.Identity.MessageID == "m1" {
			gate = nil // m1 runs until the stop
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &agents.Response{Text: "re " + req.Identity.MessageID}, nil
	})
}

// TestResetDueMarkIsWrittenOnceTheStoreTakesTheSessionsNextWrite: the daily reset falls due while
// m0's turn runs (m1 queued behind it), and the store refuses its mark for 4 s (tries at 0, 1
// and 3 s; the next at 7 s). The store takes writes again, and m0's answer is stored: the mark
// is written at once, not at the end of its pause. The daemon then stops with m1's turn still
// running (a drain's deadline), and the next start, past the hour, runs m1 and ends the session
// at the hour. Before, the mark waited out its pause, and a stop in it lost the reset: m0's
// answer had moved the session's activity past the due time, and the next start let the session
// go on until the next day's reset.
func TestResetDueMarkIsWrittenOnceTheStoreTakesTheSessionsNextWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clock atomic.Int64
		clock.Store(before4.UnixNano())
		daily := dailyClock(&clock)
		path := filepath.Join(t.TempDir(), "agentgate.db")
		release0 := make(chan struct{})
		var refusing atomic.Bool
		var marks atomic.Int32
		w := newManagerWorldWith(t, path, heldUntil(release0), daily, func(s persistence.Store) persistence.Store {
			return &refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
				_, ok := op.(*persistence.MarkResetDue)
				if ok {
					marks.Add(1)
				}
				return ok && refusing.Load()
			}}
		})
		m0 := w.dueWhileM0Runs(t, &clock, &refusing)
		time.Sleep(4 * time.Second) // tries at 0, 1 and 3 s; the next at 7 s
		synctest.Wait()
		if n := marks.Load(); n != 3 {
			t.Fatalf("the mark was tried %d times in 4 s, want 3 (1 s doubling)", n)
		}
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.ResetDueReason != "" {
			t.Fatalf("session %s with its mark refused: %+v, %v; want no mark stored yet", m0.SessionId, s, err)
		}

		refusing.Store(false)
		close(release0)
		w.answersTo(t, "m0")
		synctest.Wait() // no time passes
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.ResetDueReason != persistence.EndDaily || !s.ResetDueAt.Equal(at4) {
			t.Errorf("session %s once m0's answer was stored: %+v, %v; want its daily reset due at %v stored", m0.SessionId, s, err, at4)
		}
		w.stop() // m1 still runs: as a stop past the drain's deadline
		synctest.Wait()

		restartPastTheHour(t, &clock, path, daily, m0.SessionId)
	})
}
