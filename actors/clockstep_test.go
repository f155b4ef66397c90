package actors

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/asynkron/protoactor-go/actor"
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
		w := newManagerWorld(t, gatedAgent("", nil), resetsBy(&clock, policy))
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

// TestSessionActiveWhenTheClockWasSetBack: the host's clock is set back an hour while a chat
// talks (NTP correcting a clock that ran ahead). The session's last activity does not move back,
// so its idle reset comes up to an hour late, never early and never twice, as docs/RUNBOOK.md
// ("The clock") says; the messages of the hour stay in its transcript in the order they came.
func TestSessionActiveWhenTheClockWasSetBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clock atomic.Int64
		t0 := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
		clock.Store(t0.UnixNano())
		policy := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Minute, Notify: true}
		w := newManagerWorld(t, gatedAgent("", nil), resetsBy(&clock, policy))
		nudge := func(at time.Time) {
			clock.Store(at.UnixNano())
			w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
			synctest.Wait()
		}
		m0 := w.deliver(t, "m0", "before the step")
		w.answersTo(t, "m0")
		clock.Store(t0.Add(-time.Hour + 10*time.Minute).UnixNano()) // set back an hour, 10 min on
		if m1 := w.deliver(t, "m1", "after the step"); m1.SessionId != m0.SessionId {
			t.Fatalf("m1 in %s, want the session of m0 %s", m1.SessionId, m0.SessionId)
		}
		w.answersTo(t, "m1")
		nudge(t0.Add(-10 * time.Minute)) // 40 min after m1 by the clock
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || !s.EndedAt.IsZero() {
			t.Fatalf("40 min after m1: session %+v, %v; want it open (its last activity is m0's, 10 min ago by the clock)", s, err)
		}
		nudge(t0.Add(31 * time.Minute))
		s, err := w.store.Session(w.ctx, m0.SessionId)
		if err != nil || s.EndReason != persistence.EndIdle || !s.EndedAt.Equal(t0.Add(30*time.Minute)) {
			t.Fatalf("30 min after m0 by the clock: session %+v, %v; want it ended idle at %v", s, err, t0.Add(30*time.Minute))
		}
		ms, err := w.store.Transcript(w.ctx, m0.SessionId)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range ms {
			if m.Role == persistence.RoleUser {
				ids = append(ids, m.MessageID)
			}
		}
		if strings.Join(ids, " ") != "m0 m1" {
			t.Errorf("the transcript's messages %q, want m0 m1", ids)
		}
		nudge(t0.Add(2 * time.Hour)) // nothing more to end
		m2 := w.deliver(t, "m2", "later")
		if n := resetNotices(w.answersTo(t, "m2")); m2.SessionId == m0.SessionId || len(n) != 1 {
			t.Errorf("m2 in %s (the ended one %s), notices %q; want a new session and one notice", m2.SessionId, m0.SessionId, n)
		}
	})
}

// TestPruneAfterTheClockJumpedAhead: pruning keeps sessions for 30 days; the host's clock then
// jumps a year ahead (an operator's date -s with a wrong year, a bad NTP server). The passes
// that follow delete only what the real time since the last one allows, with one warning, and
// the sessions that ended within the retention stay; with the clock set right again, pruning
// goes on as before. Before, the pass after the jump deleted every ended session, and setting
// the clock right brought none back.
func TestPruneAfterTheClockJumpedAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
		const retention = 30 * 24 * time.Hour
		ended := func(id string, at time.Time) {
			mustCommit(t, store,
				&persistence.CreateSession{Session: persistence.Session{ID: id, Key: "k-" + id, Platform: "fake", StartedAt: at, LastActivityAt: at}},
				&persistence.EndSession{SessionID: id, Reason: persistence.EndNewCommand, At: at})
		}
		ended("old", t0.Add(-retention-24*time.Hour))
		ended("edge", t0.Add(-retention+4*time.Hour+30*time.Minute)) // past the retention 4.5 h on
		ended("today", t0.Add(-time.Hour))

		// The wall clock: real time (the bubble's) from t0, and whatever it was stepped by.
		start := time.Now()
		var step atomic.Int64
		now := func() time.Time { return t0.Add(time.Since(start) + time.Duration(step.Load())) }
		system, _ := quietSystem(t)
		defer system.Shutdown()
		var logs testutil.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		persist := system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, store, persistence.ActorOptions{MaxBatch: 64, Log: log})))
		d := &Deps{Ctx: ctx, Persist: persist, Store: store, Log: log, Metrics: metrics.New("fake"),
			Now: now, realElapsed: func() time.Duration { return time.Since(start) },
			Config: SessionConfig{Prune: PrunePolicy{Enabled: true, After: retention, Every: time.Hour}}}
		timers := system.Root.Spawn(NewTimers(d, nil, time.Minute)) // prunes at start
		synctest.Wait()
		kept := func(when string, want ...string) {
			t.Helper()
			var got []string
			for _, id := range []string{"old", "edge", "today"} {
				if _, err := store.Session(ctx, id); err == nil {
					got = append(got, id)
				}
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("%s: sessions kept %q, want %q", when, got, want)
			}
		}
		kept("after the first pass", "edge", "today")

		step.Store(int64(365 * 24 * time.Hour)) // a year ahead
		time.Sleep(time.Hour)                   // the next pass
		synctest.Wait()
		kept("after a pass with the clock a year ahead", "edge", "today")
		time.Sleep(time.Hour) // and the one after: warned once
		synctest.Wait()
		kept("after two passes with the clock a year ahead", "edge", "today")
		if n := strings.Count(logs.String(), `msg="the clock moved ahead faster than time passed`); n != 1 {
			t.Errorf("%d warnings of the clock moving ahead, want 1:\n%s", n, logs.String())
		}

		step.Store(0) // set right
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		kept("with the clock set right, 4 h on", "edge", "today")
		time.Sleep(time.Hour)
		synctest.Wait()
		kept("with the clock set right, 5 h on", "today")

		if err := system.Root.StopFuture(timers).Wait(); err != nil {
			t.Fatal(err)
		}
		if err := system.Root.StopFuture(persist).Wait(); err != nil {
			t.Fatal(err)
		}
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	})
}
