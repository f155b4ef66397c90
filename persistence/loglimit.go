package persistence

import (
	"context"
	"log/slog"
	"time"
)

// repeatEvery is how often a line that a lasting failure repeats is logged again: a full
// disk or an unreadable spool would otherwise log it at every commit, or at every replay tick
// (each second). The lines held back meanwhile are counted in the next one (repeats).
const repeatEvery = time.Minute

// repeatLimiter holds back a line already logged within repeatEvery, per message. The
// persistence actor owns it; it is not safe for concurrent use.
type repeatLimiter struct {
	last map[string]time.Time
	held map[string]int
}

// log logs msg at level unless it was logged within repeatEvery, adding how many times it was
// held back since it was last logged.
func (l *repeatLimiter) log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	now := time.Now()
	if l.last == nil {
		l.last, l.held = map[string]time.Time{}, map[string]int{}
	}
	if t, ok := l.last[msg]; ok && now.Sub(t) < repeatEvery {
		l.held[msg]++
		return
	}
	if n := l.held[msg]; n > 0 {
		args = append(args, "repeats", n)
	}
	l.last[msg], l.held[msg] = now, 0
	log.Log(context.Background(), level, msg, args...)
}

// ok says that what msg reports has stopped failing: its next failure is logged at once.
func (l *repeatLimiter) ok(msg string) {
	delete(l.last, msg)
	delete(l.held, msg)
}
