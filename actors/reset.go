package actors

import (
	"fmt"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// Reset modes.
const (
	ResetNone  = "none"
	ResetIdle  = "idle"
	ResetDaily = "daily"
	ResetBoth  = "both"
)

// ResetPolicy says when a session ends on its own (DESIGN §3). It is pure: every method takes
// the times it needs.
type ResetPolicy struct {
	Mode   string
	Idle   time.Duration
	AtHour int
	Notify bool
	// Location is the time zone of AtHour; nil means time.Local.
	Location *time.Location
	// DailyMinIdle defers the daily reset of a session active less than this long before the
	// hour until it has been idle this long (config sessions.reset.daily_min_idle).
	DailyMinIdle time.Duration
}

// Due returns when a session whose last durable activity was last becomes due for a reset, and
// the end reason. ok is false when the policy never resets. A zero last (missing or invalid
// timestamp) counts as old, never as now: such a session is due at once.
func (p ResetPolicy) Due(last time.Time) (at time.Time, reason string, ok bool) {
	idle, daily := p.Mode == ResetIdle || p.Mode == ResetBoth, p.Mode == ResetDaily || p.Mode == ResetBoth
	if !idle && !daily {
		return time.Time{}, "", false
	}
	if last.IsZero() {
		if idle {
			return time.Time{}, persistence.EndIdle, true
		}
		return time.Time{}, persistence.EndDaily, true
	}
	if idle {
		at, reason, ok = last.Add(p.Idle), persistence.EndIdle, true
	}
	if daily {
		b := p.nextBoundary(last)
		if b.Sub(last) < p.DailyMinIdle {
			b = last.Add(p.DailyMinIdle) // still in use at the hour: not cut off mid-conversation
		}
		if !ok || b.Before(at) {
			at, reason, ok = b, persistence.EndDaily, true
		}
	}
	return at, reason, ok
}

// Overdue reports whether a session last active at last must be reset at now, with the time it
// became due and the reason.
func (p ResetPolicy) Overdue(last, now time.Time) (at time.Time, reason string, overdue bool) {
	at, reason, ok := p.Due(last)
	if !ok || now.Before(at) {
		return time.Time{}, "", false
	}
	return at, reason, true
}

// nextBoundary is the first daily reset hour strictly after t.
func (p ResetPolicy) nextBoundary(t time.Time) time.Time {
	b := p.boundary(t, 0)
	if !b.After(t) {
		b = p.boundary(t, 1)
	}
	return b
}

// lastBoundary is the last daily reset hour at or before t. It counts in calendar days, not
// 24 hours: a day with a clock change is 23 or 25 hours long.
func (p ResetPolicy) lastBoundary(t time.Time) time.Time {
	b := p.boundary(t, 0)
	if b.After(t) {
		b = p.boundary(t, -1)
	}
	return b
}

// boundary is the reset hour of the day days after t's, in the policy's time zone. On a day
// whose clocks skip that hour (moving forward at 02:00 with AtHour 2), it is the moment they
// skip it, as cron has it: time.Date would give a time an hour early or late.
func (p ResetPolicy) boundary(t time.Time, days int) time.Time {
	loc := p.Location
	if loc == nil {
		loc = time.Local
	}
	lt := t.In(loc)
	b := time.Date(lt.Year(), lt.Month(), lt.Day()+days, p.AtHour, 0, 0, 0, loc)
	wall := func(t time.Time) time.Time { // t's wall clock, compared as if in UTC
		return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), 0, 0, time.UTC)
	}
	want := time.Date(lt.Year(), lt.Month(), lt.Day()+days, p.AtHour, 0, 0, 0, time.UTC)
	switch start, end := b.ZoneBounds(); {
	case wall(b).Before(want) && !end.IsZero():
		return end // b is in the zone before the skip, which ends when the clocks move
	case wall(b).After(want) && !start.IsZero():
		return start
	}
	return b
}

// LatestCutoff returns a time such that every session this policy could find due at now was
// last active before it (for the timer's scan). ok is false when the policy never resets.
func (p ResetPolicy) LatestCutoff(now time.Time) (cutoff time.Time, ok bool) {
	if p.Mode != ResetIdle && p.Mode != ResetDaily && p.Mode != ResetBoth {
		return time.Time{}, false
	}
	if p.Mode == ResetIdle || p.Mode == ResetBoth {
		cutoff, ok = now.Add(-p.Idle), true
	}
	if p.Mode == ResetDaily || p.Mode == ResetBoth {
		// A session is due once a boundary lies after its last activity and not after now: the
		// last boundary at or before now is the cutoff.
		if b := p.lastBoundary(now); !ok || b.After(cutoff) {
			cutoff, ok = b, true
		}
	}
	return cutoff.Add(time.Nanosecond), ok
}

// describeReset is the user-facing reason of an automatic reset.
func describeReset(reason string, p ResetPolicy, last time.Time, now time.Time) string {
	switch reason {
	case persistence.EndIdle:
		if last.IsZero() {
			return "inactive for too long"
		}
		return "inactive for " + humanDuration(now.Sub(last))
	case persistence.EndDaily:
		return fmt.Sprintf("daily reset at %02d:00", p.AtHour)
	}
	return reason
}

// humanDuration writes d for people: "45m", "2h0m", "3d4h".
func humanDuration(d time.Duration) string {
	d = d.Round(time.Minute)
	switch {
	case d >= 24*time.Hour:
		return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
	case d >= time.Hour:
		return fmt.Sprintf("%dh%dm", d/time.Hour, d%time.Hour/time.Minute)
	}
	return fmt.Sprintf("%dm", d/time.Minute)
}
