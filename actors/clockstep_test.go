package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
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
// talks (NTP correcting a clock that ran ahead). The session's last activity, an hour after now
// by the clock, is not kept: the next message's time is, so the idle reset comes 30 min after
// it by the clock, not an hour late, and once; the messages of the hour stay in its transcript
// in the order they came. Before, the activity of the message before the step stayed, and the
// reset came an hour late.
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
		m1At := t0.Add(-time.Hour + 10*time.Minute) // set back an hour, 10 min on
		clock.Store(m1At.UnixNano())
		if m1 := w.deliver(t, "m1", "after the step"); m1.SessionId != m0.SessionId {
			t.Fatalf("m1 in %s, want the session of m0 %s", m1.SessionId, m0.SessionId)
		}
		w.answersTo(t, "m1")
		nudge(m1At.Add(20 * time.Minute))
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || !s.EndedAt.IsZero() {
			t.Fatalf("20 min after m1: session %+v, %v; want it open", s, err)
		}
		nudge(m1At.Add(31 * time.Minute))
		s, err := w.store.Session(w.ctx, m0.SessionId)
		if err != nil || s.EndReason != persistence.EndIdle || !s.EndedAt.Equal(m1At.Add(30*time.Minute)) {
			t.Fatalf("31 min after m1 by the clock: session %+v, %v; want it ended idle at %v (30 min after m1)", s, err, m1At.Add(30*time.Minute))
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

// TestTimesAfterNowWhenTheClockWasSetBackADay: the host's clock ran a day ahead and is set
// right, with a chat's session active a minute before (it stays in memory) and a session that
// ended then in the store, both "a day in the future" by the clock. The first scan sets both
// times to now, with one warning; the session resets 30 min after that scan (its idle limit),
// and the ended one is pruned a day after it (the retention). Before, the stores kept the
// times a day ahead: the reset came a day late, and the pruning too.
func TestTimesAfterNowWhenTheClockWasSetBackADay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var clock atomic.Int64
		t0 := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
		clock.Store(t0.UnixNano())
		policy := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Minute, Notify: true}
		var logs testutil.Buffer
		w := newManagerWorld(t, gatedAgent("", nil), func(d *Deps) {
			resetsBy(&clock, policy)(d)
			d.Log = slog.New(slog.NewTextHandler(&logs, nil))
			d.Config.Prune = PrunePolicy{Enabled: true, After: 24 * time.Hour, Every: 24 * time.Hour}
		})
		m0 := w.deliver(t, "m0", "before the step")
		w.answersTo(t, "m0")
		mustCommit(t, w.store,
			&persistence.CreateSession{Session: persistence.Session{ID: "ended", Key: "k-ended", Platform: "fake", StartedAt: t0.Add(-time.Hour), LastActivityAt: t0.Add(-40 * time.Minute)}},
			&persistence.EndSession{SessionID: "ended", Reason: persistence.EndIdle, At: t0.Add(-10 * time.Minute)})

		step := t0.Add(-24*time.Hour + time.Minute) // set back a day, a minute after m0
		clock.Store(step.UnixNano())
		timers := w.system.Root.Spawn(NewTimers(w.d, NewLocalRouter(w.system.Root, w.manager), time.Minute))
		defer func() {
			if err := w.system.Root.StopFuture(timers).Wait(); err != nil {
				t.Error(err)
			}
		}()
		synctest.Wait() // its first scan and prune pass
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || !s.LastActivityAt.Equal(step) || !s.EndedAt.IsZero() {
			t.Fatalf("after the first scan: session %+v, %v; want it open, active at the scan (%v)", s, err, step)
		}
		if s, err := w.store.Session(w.ctx, "ended"); err != nil || !s.EndedAt.Equal(step) || !s.LastActivityAt.Equal(step.Add(-30*time.Minute)) {
			t.Fatalf("after the first scan: the ended session %+v, %v; want it ended at the scan (%v), active 30 min before", s, err, step)
		}
		if n := strings.Count(logs.String(), `level=WARN msg="the clock is behind times the store holds; they are set to now" actor=timers sessions=2`); n != 1 {
			t.Errorf("%d warnings of times after now with sessions=2, want 1:\n%s", n, logs.String())
		}

		scan := func(at time.Time) {
			clock.Store(at.UnixNano())
			w.system.Root.Send(timers, &CheckResets{})
			synctest.Wait()
		}
		scan(step.Add(29 * time.Minute))
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || !s.EndedAt.IsZero() {
			t.Fatalf("29 min after the step: session %+v, %v; want it open", s, err)
		}
		scan(step.Add(31 * time.Minute))
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.EndReason != persistence.EndIdle || !s.EndedAt.Equal(step.Add(30*time.Minute)) {
			t.Fatalf("31 min after the step: session %+v, %v; want it ended idle at %v", s, err, step.Add(30*time.Minute))
		}

		clock.Store(step.Add(24*time.Hour + time.Minute).UnixNano()) // past the retention of the ended one
		w.system.Root.Send(timers, &Prune{})
		synctest.Wait()
		if _, err := w.store.Session(w.ctx, "ended"); !errors.Is(err, persistence.ErrNotFound) {
			t.Errorf("the ended session a day after the step: %v, want it pruned (%v)", err, persistence.ErrNotFound)
		}
		if strings.Count(logs.String(), "the clock is behind times the store holds") != 1 {
			t.Errorf("warnings of times after now, want 1:\n%s", logs.String())
		}

		// A member whose clock runs ahead writes such times at every message: one warning
		// while every scan finds more.
		now := step.Add(24*time.Hour + 2*time.Minute)
		for i := range 3 {
			id := fmt.Sprint("ahead-", i)
			mustCommit(t, w.store,
				&persistence.CreateSession{Session: persistence.Session{ID: id, Key: "k-" + id, Platform: "fake", StartedAt: now, LastActivityAt: now.Add(5 * time.Minute)}})
			scan(now)
		}
		if n := strings.Count(logs.String(), "level=WARN msg=\"the clock is behind times the store holds"); n != 2 {
			t.Errorf("%d warnings of times after now, want 2 (the step's, and one for the scans that each found more):\n%s", n, logs.String())
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
		store := mustOpenSQLite(t, ctx)
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

		stopPruning(t, system, timers, persist, store)
	})
}
