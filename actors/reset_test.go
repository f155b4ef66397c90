package actors

import (
	"testing"
	"time"
)

func TestResetPolicyDue(t *testing.T) {
	utc := time.UTC
	day := func(d, h, m int) time.Time { return time.Date(2026, 11, d, h, m, 0, 0, utc) }
	idle := ResetPolicy{Mode: ResetIdle, Idle: 60 * time.Minute, Location: utc}
	daily := ResetPolicy{Mode: ResetDaily, AtHour: 4, Location: utc}
	both := ResetPolicy{Mode: ResetBoth, Idle: 24 * time.Hour, AtHour: 4, Location: utc}
	deferred := ResetPolicy{Mode: ResetDaily, AtHour: 4, Location: utc, DailyMinIdle: time.Hour}
	tests := []struct {
		name       string
		p          ResetPolicy
		last, now  time.Time
		wantDue    bool
		wantAt     time.Time
		wantReason string
	}{
		{"none never", ResetPolicy{Mode: ResetNone}, day(1, 0, 0), day(30, 0, 0), false, time.Time{}, ""},
		{"idle not yet", idle, day(10, 12, 0), day(10, 12, 59), false, time.Time{}, ""},
		{"idle due at its time", idle, day(10, 12, 0), day(10, 13, 0), true, day(10, 13, 0), "idle"},
		{"idle long overdue keeps the due time", idle, day(10, 12, 0), day(20, 0, 0), true, day(10, 13, 0), "idle"},
		{"daily before the hour", daily, day(10, 3, 0), day(10, 3, 59), false, time.Time{}, ""},
		{"daily at the hour", daily, day(10, 3, 0), day(10, 4, 0), true, day(10, 4, 0), "daily"},
		{"daily after the hour waits a day", daily, day(10, 5, 0), day(11, 3, 59), false, time.Time{}, ""},
		{"daily next day", daily, day(10, 5, 0), day(11, 4, 0), true, day(11, 4, 0), "daily"},
		{"both: daily first", both, day(10, 3, 0), day(10, 4, 30), true, day(10, 4, 0), "daily"},
		{"both: idle first", ResetPolicy{Mode: ResetBoth, Idle: time.Hour, AtHour: 4, Location: utc}, day(10, 5, 0), day(10, 6, 0), true, day(10, 6, 0), "idle"},
		{"invalid activity counts as old", idle, time.Time{}, day(10, 0, 0), true, time.Time{}, "idle"},
		{"daily_min_idle: quiet long enough, at the hour", deferred, day(10, 2, 30), day(10, 4, 0), true, day(10, 4, 0), "daily"},
		{"daily_min_idle: active just before, not at the hour", deferred, day(10, 3, 40), day(10, 4, 0), false, time.Time{}, ""},
		{"daily_min_idle: once idle that long", deferred, day(10, 3, 40), day(10, 4, 40), true, day(10, 4, 40), "daily"},
		{"daily_min_idle: long overdue keeps the deferred time", deferred, day(10, 3, 40), day(12, 9, 0), true, day(10, 4, 40), "daily"},
		{"daily_min_idle: active after the hour waits a day", deferred, day(10, 4, 30), day(11, 3, 59), false, time.Time{}, ""},
		{"daily_min_idle: both, idle first", ResetPolicy{Mode: ResetBoth, Idle: 30 * time.Minute, AtHour: 4, Location: utc, DailyMinIdle: time.Hour},
			day(10, 3, 40), day(10, 4, 10), true, day(10, 4, 10), "idle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at, reason, due := tt.p.Overdue(tt.last, tt.now)
			if due != tt.wantDue || !at.Equal(tt.wantAt) || reason != tt.wantReason {
				t.Errorf("Overdue(%v, %v) = %v %q %v, want %v %q %v", tt.last, tt.now, at, reason, due, tt.wantAt, tt.wantReason, tt.wantDue)
			}
			if cut, ok := tt.p.LatestCutoff(tt.now); ok && due && !tt.last.Before(cut) {
				t.Errorf("LatestCutoff(%v) = %v does not cover a due session last active %v", tt.now, cut, tt.last)
			}
		})
	}
}

func TestResetPolicyDailyInTimeZone(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skipf("no tzdata: %v", err)
	}
	edt := time.FixedZone("EDT", -4*3600)
	for _, tt := range []struct {
		name   string
		atHour int
		last   time.Time
		want   time.Time
	}{
		{"an ordinary day", 4, time.Date(2026, 11, 10, 3, 0, 0, 0, ny), time.Date(2026, 11, 10, 4, 0, 0, 0, ny)},
		{"after a 23-hour day", 4, time.Date(2026, 3, 7, 12, 0, 0, 0, ny), time.Date(2026, 3, 8, 4, 0, 0, 0, ny)},
		// 2026-03-08 02:00 does not exist in New York: the clocks move from 02:00 EST to 03:00
		// EDT, and the reset comes then (time.Date alone gives 01:00 EST, an hour early).
		{"the hour the clocks skip", 2, time.Date(2026, 3, 7, 12, 0, 0, 0, ny), time.Date(2026, 3, 8, 3, 0, 0, 0, edt)},
		{"the day after", 2, time.Date(2026, 3, 8, 3, 0, 0, 0, ny), time.Date(2026, 3, 9, 2, 0, 0, 0, ny)},
		// 2026-11-01 01:00 happens twice: the first is the boundary.
		{"the hour that repeats", 1, time.Date(2026, 10, 31, 12, 0, 0, 0, ny), time.Date(2026, 11, 1, 1, 0, 0, 0, edt)},
	} {
		p := ResetPolicy{Mode: ResetDaily, AtHour: tt.atHour, Location: ny}
		if at, _, ok := p.Due(tt.last); !ok || !at.Equal(tt.want) {
			t.Errorf("%s: Due(%v) = %v, want %v", tt.name, tt.last, at, tt.want)
		}
	}
}

// The reset scan lists the sessions last active before LatestCutoff, so the cutoff must cover
// every session Overdue finds due, on the days a clock change makes 23 or 25 hours long too.
func TestResetPolicyCutoffCoversDueSessionsAcrossClockChanges(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skipf("no tzdata: %v", err)
	}
	for _, p := range []ResetPolicy{
		{Mode: ResetDaily, AtHour: 4, Location: ny},
		{Mode: ResetDaily, AtHour: 0, Location: ny},
		{Mode: ResetDaily, AtHour: 2, Location: ny}, // 02:00 does not exist on 2026-03-08
		{Mode: ResetBoth, Idle: 48 * time.Hour, AtHour: 4, Location: ny},
	} {
		// Around the spring-forward (2026-03-08) and fall-back (2026-11-01) changes, every
		// half hour of activity against every half hour of the next two days.
		for _, start := range []time.Time{time.Date(2026, 3, 6, 0, 0, 0, 0, ny), time.Date(2026, 10, 30, 0, 0, 0, 0, ny)} {
			for last := start; last.Before(start.Add(72 * time.Hour)); last = last.Add(30 * time.Minute) {
				for now := last; now.Before(last.Add(48 * time.Hour)); now = now.Add(30 * time.Minute) {
					at, _, due := p.Overdue(last, now)
					if !due {
						continue
					}
					if cut, _ := p.LatestCutoff(now); !last.Before(cut) {
						t.Fatalf("%+v: LatestCutoff(%v) = %v leaves out a session last active %v, due since %v",
							p, now, cut, last, at)
					}
				}
			}
		}
	}
}
