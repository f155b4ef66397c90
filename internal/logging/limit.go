package logging

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// LimitEvery is how often a Limiter lets an event through.
const LimitEvery = time.Minute

// Limiter lets one event through per LimitEvery and counts the ones it holds back: a failure
// that lasts (a full disk, an unreadable spool, a failing checkpoint) would otherwise log its
// line at every commit or every tick. The zero value is ready; it is safe for concurrent use.
type Limiter struct {
	mu   sync.Mutex
	last time.Time // when an event was last let through; zero: none since Reset
	n    int       // events since then
}

// Allow records one event and reports whether to log it, and how many events the line stands
// for: this one and those held back since the last one let through.
func (l *Limiter) Allow() (n int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < LimitEvery {
		return 0, false
	}
	n, l.n, l.last = l.n, 0, now
	return n, true
}

// Held reports how many events were held back since the last one let through, and when the
// next line is due: a caller whose events may stop coming arms a timer for then and calls
// Flush, so that their count is logged when due, not only with the next event (which may come
// much later, or never).
func (l *Limiter) Held() (n int, due time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n, l.last.Add(LimitEvery)
}

// Flush lets the events held back through without a new one, as Allow lets the next one
// through: it returns how many there were (ok false, and nothing changed, when none), and the
// next event waits LimitEvery from now. It does not check that a line is due (Held): a
// caller may flush early, at a stop.
func (l *Limiter) Flush() (n int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == 0 {
		return 0, false
	}
	n, l.n, l.last = l.n, 0, time.Now()
	return n, true
}

// Allowed records one event and, when it is let through (Allow), returns args with
// "repeats", the events held back since the last line, when there were any: the arguments of
// the line to log.
func (l *Limiter) Allowed(args ...any) ([]any, bool) {
	n, ok := l.Allow()
	if ok && n > 1 {
		args = append(args, "repeats", n-1)
	}
	return args, ok
}

// Log logs msg with args to log at level when the event is let through (Allowed, with its
// "repeats"), and at Debug when it is held back, so that an operator who asks for Debug still
// sees each one in full.
func (l *Limiter) Log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	if all, ok := l.Allowed(args...); ok {
		log.Log(context.Background(), level, msg, all...)
	} else if log.Enabled(context.Background(), slog.LevelDebug) {
		log.Debug(msg, args...)
	}
}

// Reset forgets the events: what failed works again, and its next failure is logged at once.
func (l *Limiter) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last, l.n = time.Time{}, 0
}

// KeyedLimiter is a Limiter for each key: the events of one key (a command its client resends
// through an outage, by its message id) are let through once a LimitEvery, those of other keys
// apart. The zero value is ready; it is safe for concurrent use.
//
// A key with no event let through for LimitEvery is forgotten, when the keys are next pruned,
// unless it holds events back: those are reported (repeats) by its next event let through, and
// it is kept for that up to a second LimitEvery (TestKeyedLimiterPruneKeepsHeldRepeats). The
// events a key holds back when its events stop (the outage ends, and the command is stored) are
// reported only by the Debug line its caller logs for each: no next event reports them, and the
// limiter has no timer to report them when due. Keeping the key until its next event would not
// help: most keys (a command's message id) never have one, and would stay for good; a later one
// would count them on a line of another outage.
type KeyedLimiter struct {
	mu     sync.Mutex
	keys   map[string]*keyedEvents
	pruned int // len(keys) after the last prune
}

// keyedEvents is a KeyedLimiter's record of one key: as Limiter's last and n.
type keyedEvents struct {
	last time.Time
	n    int
}

// Allowed is Limiter.Allowed for key's events.
func (l *KeyedLimiter) Allowed(key string, args ...any) ([]any, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.keys == nil {
		l.keys = map[string]*keyedEvents{}
	}
	if len(l.keys) >= 2*max(l.pruned, 64) { // amortised: a prune at most every doubling
		for k, e := range l.keys {
			if age := now.Sub(e.last); age >= LimitEvery && (e.n == 0 || age >= 2*LimitEvery) {
				delete(l.keys, k)
			}
		}
		l.pruned = len(l.keys)
	}
	e := l.keys[key]
	if e == nil {
		e = &keyedEvents{}
		l.keys[key] = e
	}
	e.n++
	if !e.last.IsZero() && now.Sub(e.last) < LimitEvery {
		return args, false
	}
	n := e.n
	e.n, e.last = 0, now
	if n > 1 {
		args = append(args, "repeats", n-1)
	}
	return args, true
}
