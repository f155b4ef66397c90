package logging

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// LimitEvery is how often a Limiter lets an event through.
const LimitEvery = time.Minute

// Counter lets one event through per LimitEvery and counts the ones it holds back, for a
// caller that logs the count itself (Allow) in a field of its own: a failure that lasts (a
// failing checkpoint, a rate limit) would otherwise log its line at every tick. Its count of
// the events held back reaches the log only with the next event let through, or when its
// caller flushes them (Held, Flush): a caller with a line to log uses a Limiter instead, which
// reports them when its window passes. The zero value is ready; it is safe for concurrent use.
type Counter struct {
	mu   sync.Mutex
	last time.Time // when an event was last let through; zero: none since Reset
	n    int       // events since then
}

// Allow records one event and reports whether to log it, and how many events the line stands
// for: this one and those held back since the last one let through.
func (l *Counter) Allow() (n int, ok bool) {
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
func (l *Counter) Held() (n int, due time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n, l.last.Add(LimitEvery)
}

// Flush lets the events held back through without a new one, as Allow lets the next one
// through: it returns how many there were (ok false, and nothing changed, when none), and the
// next event waits LimitEvery from now. It does not check that a line is due (Held): a
// caller may flush early, at a stop.
func (l *Counter) Flush() (n int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == 0 {
		return 0, false
	}
	n, l.n, l.last = l.n, 0, time.Now()
	return n, true
}

// Reset forgets the events: what failed works again, and its next failure is logged at once.
func (l *Counter) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last, l.n = time.Time{}, 0
}

// Limiter logs one line of an event per LimitEvery, and the others at Debug: a failure that
// lasts (a full disk, an unreadable spool, a refused write) would otherwise log its line at
// every commit or every tick. It is a KeyedLimiter with one key, and reports as it does: the
// events held back are reported once the window of the last line has passed, at the line's
// level, with how many they were and between which times (repeats, repeats_from,
// repeats_to), by the next event if it comes first, otherwise by the limiter's timer, or by
// Flush, which its owner calls as it stops. Before, they were reported only with the next
// event let through, maybe hours later, whose line then counted the events of two outages as
// one, and never when none came (TestLimiterReportsWhenTheWindowPasses). The zero value is
// ready; it is safe for concurrent use.
type Limiter struct {
	k KeyedLimiter
}

// Log logs msg with args to log at level when the event is let through: the first, or one
// once LimitEvery has passed since the last line, with the events held back since (repeats,
// repeats_from, repeats_to) when they were not reported yet. Otherwise it logs it at Debug,
// in full, so that an operator who asks for Debug still sees each one, and holds it back for
// the report. It reports whether it logged at level.
func (l *Limiter) Log(log *slog.Logger, level slog.Level, msg string, args ...any) bool {
	return l.k.Log(log, level, msg, "", args...)
}

// LogQuiet is Log but for an event held back, which it counts for the report without logging
// it at Debug (KeyedLimiter.LogQuiet): for a line whose events come by the hundred in an
// outage, a request refused or a call retried each, which were not logged at all held back
// before the Limiter reported them, and would bury the Debug log.
func (l *Limiter) LogQuiet(log *slog.Logger, level slog.Level, msg string, args ...any) bool {
	return l.k.LogQuiet(log, level, msg, "", args...)
}

// Flush reports at once the events held back, due or not, and stops the limiter's timer. Its
// owner calls it as it stops (FlushAll).
func (l *Limiter) Flush() { l.k.Flush() }

// Reset reports the events held back (Flush) and forgets the last line: what failed works
// again, and its next failure is logged at once. It forgets in the lock section that takes the
// report's lines: before, it forgot in a second one, after the report was logged, and an event
// logged from another goroutine meanwhile was held back and then forgotten, in no line
// (TestLimiterResetLosesNoEventLoggedDuringItsReport).
func (l *Limiter) Reset() { l.k.flush(true) }

// FlushAll flushes each of ls (Limiter.Flush): the owner of limiters calls it as it stops.
func FlushAll(ls ...*Limiter) {
	for _, l := range ls {
		l.Flush()
	}
}

// KeyedLimiter is a Limiter for each key, and logs its lines itself (Log): the events of one key
// (a session paused again and again through an outage, a command its client resends by its
// message id) are logged once a LimitEvery, those of other keys apart. The zero value is ready;
// it is safe for concurrent use.
//
// A key's first event (the first since the key was last seen, KeyedForget ago or more) is logged
// at once: it says which keys a failure reached. The events that follow within LimitEvery of its
// last line are logged at Debug and held back, and reported once its window has passed, at the
// line's own level, with how many they were and between which times (repeats, repeats_from,
// repeats_to): by the key's next event if it comes first, otherwise by a report that one timer
// for the whole limiter logs (no goroutine per key, and no timer armed while nothing is held
// back), or by Flush, which its owner calls as it stops. Before, they waited for the key's next event, maybe hours later, whose line then
// counted the events of two outages as one; when none came (the outage ended) they were only at
// Debug.
//
// At most FoldAbove such reports a LimitEvery are lines of their own; beyond, those due are
// folded into one line a LimitEvery that counts the keys (keys) and their events held back
// (repeats), and names a few (examples): an outage of thousands of chats logs each key's first
// line, then one line a minute, not one for each key. A key not seen for KeyedForget with
// nothing held back is forgotten, so memory follows the keys of the last minutes, however many
// distinct keys come.
type KeyedLimiter struct {
	mu     sync.Mutex
	keys   map[string]*keyedEvents
	pruned int // len(keys) after the last prune

	timer   *time.Timer // the reports' timer; armed while a key holds events back
	timerAt time.Time   // when it fires; zero when not armed
	budget  time.Time   // when the current LimitEvery of reports began
	reports int         // report lines logged since budget
	// folding: the reports due did not fit in a LimitEvery's lines (FoldAbove), and are folded
	// into one line a LimitEvery: no key's event is let through but a first one, so that the
	// keys' next events do not take the lines of the next LimitEvery first.
	folding bool
	// turn is held (a value in it) by the timer's report and by Flush, from before they read
	// the events held back until their lines are logged (outside mu): a Flush at its owner's
	// stop waits for a report the timer began, whose line would otherwise come after the
	// owner's line that it stopped (TestLimiterFlushWaitsForTheTimersReport). Made with the
	// timer.
	turn chan struct{}
}

// FoldAbove is how many reports of held-back events a KeyedLimiter logs as lines of their own in
// a LimitEvery; beyond, it folds those due into one line a LimitEvery.
const FoldAbove = 3

// KeyedForget is how long a KeyedLimiter keeps a key not seen since, with nothing held back:
// its next event is then a first one, logged at once. Two windows, so that a key whose events
// come about once a LimitEvery (a session paused for a minute at each refusal of its writes)
// keeps its place in the reports, and so in the folded line.
const KeyedForget = 2 * LimitEvery

// keyedEvents is a KeyedLimiter's record of one key: when it was last seen, when its last line
// was logged (let through or reported), and the events held back since, with the times of the
// first and the last of them and what the last one would have logged.
type keyedEvents struct {
	seen, last  time.Time
	n           int
	first, prev time.Time // of the events held back
	log         *slog.Logger
	level       slog.Level
	msg         string
	args        []any
}

// Log logs msg with args to log at level for an event of key when it is let through: the key's
// first, or an event once LimitEvery has passed since the key's last line while this
// LimitEvery's reports are not spent (FoldAbove), with the events held back since (repeats,
// repeats_from, repeats_to) when there were any. Otherwise it logs it at Debug, in full, and
// holds it back for the key's report. It reports whether it logged at level.
func (l *KeyedLimiter) Log(log *slog.Logger, level slog.Level, msg, key string, args ...any) bool {
	return l.log(log, level, msg, key, true, args)
}

// LogQuiet is Log but for an event held back, which it counts for the key's report without
// logging it at Debug: for a line whose events come by the hundred in an outage (each request,
// each retry), where one line a LimitEvery with their count says all there is to say.
func (l *KeyedLimiter) LogQuiet(log *slog.Logger, level slog.Level, msg, key string, args ...any) bool {
	return l.log(log, level, msg, key, false, args)
}

// log is Log, and LogQuiet when debug is false.
func (l *KeyedLimiter) log(log *slog.Logger, level slog.Level, msg, key string, debug bool, args []any) bool {
	l.mu.Lock()
	now := time.Now()
	if l.keys == nil {
		l.keys = map[string]*keyedEvents{}
	}
	if len(l.keys) >= 2*max(l.pruned, 64) { // amortised: a prune at most every doubling
		l.prune(now)
	}
	e := l.keys[key]
	through := e == nil
	if e == nil {
		e = &keyedEvents{}
		l.keys[key] = e
	} else if now.Sub(e.last) >= LimitEvery && !l.folding {
		if now.Sub(l.budget) >= LimitEvery {
			l.budget, l.reports = now, 0
		}
		if through = l.reports < FoldAbove; through {
			l.reports++
		} else {
			l.folding = true // the lines of this LimitEvery are spent: those due are folded
		}
	}
	e.seen = now
	if !through {
		if e.n == 0 {
			e.first = now
		}
		e.n++
		e.prev, e.log, e.level, e.msg, e.args = now, log, level, msg, args
		l.arm(now, e.last.Add(LimitEvery))
		l.mu.Unlock()
		if debug && log.Enabled(context.Background(), slog.LevelDebug) {
			log.Debug(msg, args...)
		}
		return false
	}
	if e.n > 0 {
		args = append(args[:len(args):len(args)], heldArgs(e.n, e.first, e.prev)...)
	}
	l.reported(e, now)
	l.mu.Unlock()
	log.Log(context.Background(), level, msg, args...)
	return true
}

// heldArgs are the arguments that report n events held back between first and last.
func heldArgs(n int, first, last time.Time) []any {
	return []any{"repeats", n, "repeats_from", first.Format(TimeFormat), "repeats_to", last.Format(TimeFormat)}
}

// prune forgets the keys not seen for KeyedForget with nothing held back. Those holding events
// back are kept until their report.
func (l *KeyedLimiter) prune(now time.Time) {
	for k, e := range l.keys {
		if e.n == 0 && now.Sub(e.seen) >= KeyedForget {
			delete(l.keys, k)
		}
	}
	l.pruned = len(l.keys)
}

// arm sets the reports' timer for at, the end of a window with events held back, or, once this
// LimitEvery's reports are spent, for the next LimitEvery. It keeps a timer that fires sooner.
func (l *KeyedLimiter) arm(now, at time.Time) {
	if next := l.budget.Add(LimitEvery); (l.folding || l.reports >= FoldAbove) && at.Before(next) {
		at = next
	}
	if !l.timerAt.IsZero() && !l.timerAt.After(at) {
		return
	}
	l.timerAt = at
	if l.timer == nil {
		l.turn = make(chan struct{}, 1)
		l.timer = time.AfterFunc(at.Sub(now), l.report)
	} else {
		l.timer.Reset(at.Sub(now))
	}
}

// heldLine is a line a report logs.
type heldLine struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	args  []any
}

// report logs the reports due, run by the reports' timer: each key whose window has passed with
// events held back gets a line at its level with the last of them and their count and times,
// as a line of its own while FoldAbove a LimitEvery allow, folded with the others due into one
// line otherwise (fold). The key's next event then waits LimitEvery from the report, as after a
// line let through.
func (l *KeyedLimiter) report() {
	l.mu.Lock()
	turn := l.turn
	l.mu.Unlock()
	turn <- struct{}{}
	defer func() { <-turn }()
	l.mu.Lock()
	now := time.Now()
	l.timerAt = time.Time{}
	if now.Sub(l.budget) >= LimitEvery {
		l.budget, l.reports = now, 0
	}
	var due []string
	for k, e := range l.keys {
		if e.n > 0 && now.Sub(e.last) >= LimitEvery {
			due = append(due, k)
		}
	}
	slices.Sort(due)
	var lines []heldLine
	switch {
	case len(due) == 0:
		l.folding = false
	case l.reports+len(due) <= FoldAbove:
		l.folding = false
		lines = l.own(due, now)
		l.reports += len(due)
	case l.reports > 0:
		// They do not all fit in what is left of this LimitEvery's lines: they wait for the
		// next LimitEvery, folded then.
		l.folding = true
	default:
		lines = l.fold(due, now)
		l.folding = true
	}
	l.prune(now)
	var at time.Time
	for _, e := range l.keys {
		if due := e.last.Add(LimitEvery); e.n > 0 && (at.IsZero() || due.Before(at)) {
			at = due
		}
	}
	if !at.IsZero() {
		l.arm(now, at)
	}
	l.mu.Unlock()
	logHeld(lines)
}

// Flush reports at once the events every key holds back, due or not, as their windows' passing
// would (lines of their own up to FoldAbove keys, one folded line beyond), and stops the
// reports' timer. Its owner calls it as it stops: the timer reports up to LimitEvery later, and
// a daemon that stops exits meanwhile, its last minute's events held back at Debug alone. A
// report the timer has begun is logged before Flush returns, so that the owner's line that it
// stopped comes after every report.
func (l *KeyedLimiter) Flush() { l.flush(false) }

// flush is Flush, and forgets every key too when forget is set (Limiter.Reset), before the
// limiter's lock is let go: a key's next event is then let through at once.
func (l *KeyedLimiter) flush(forget bool) {
	l.mu.Lock()
	if turn := l.turn; turn != nil { // a report of the timer's logs its lines first
		l.mu.Unlock()
		turn <- struct{}{}
		defer func() { <-turn }()
		l.mu.Lock()
	}
	now := time.Now()
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timerAt, l.folding = time.Time{}, false
	var due []string
	for k, e := range l.keys {
		if e.n > 0 {
			due = append(due, k)
		}
	}
	slices.Sort(due)
	var lines []heldLine
	if len(due) <= FoldAbove {
		lines = l.own(due, now)
	} else {
		lines = l.fold(due, now)
	}
	if forget {
		clear(l.keys)
	}
	l.mu.Unlock()
	logHeld(lines)
}

// logHeld logs the report lines (outside the limiter's lock).
func logHeld(lines []heldLine) {
	for _, ln := range lines {
		ln.log.Log(context.Background(), ln.level, ln.msg, ln.args...)
	}
}

// own reports the events held back by each key of due in a line of its own: the arguments of
// the last of them, with their count and times.
func (l *KeyedLimiter) own(due []string, now time.Time) []heldLine {
	var lines []heldLine
	for _, k := range due {
		e := l.keys[k]
		lines = append(lines, heldLine{e.log, e.level, e.msg, append(e.args[:len(e.args):len(e.args)], heldArgs(e.n, e.first, e.prev)...)})
		l.reported(e, now)
	}
	return lines
}

// reported starts e's window anew at now, its events held back reported.
func (l *KeyedLimiter) reported(e *keyedEvents, now time.Time) {
	e.n, e.last, e.args, e.log = 0, now, nil, nil
}

// fold reports the events held back by the keys due in one line for each message (a limiter
// logs one message, as a rule): the arguments of the last event held back, with the count of the
// keys (keys), the first FoldAbove of them (examples), and their events held back in all, from
// the first to the last (repeats, repeats_from, repeats_to).
func (l *KeyedLimiter) fold(due []string, now time.Time) []heldLine {
	type sum struct {
		last        *keyedEvents
		keys, n     int
		first, prev time.Time
		examples    []string
	}
	var order []string
	sums := map[string]*sum{}
	for _, k := range due {
		e := l.keys[k]
		s := sums[e.msg]
		if s == nil {
			s = &sum{last: e, first: e.first, prev: e.prev}
			sums[e.msg] = s
			order = append(order, e.msg)
		}
		s.keys++
		s.n += e.n
		if e.prev.After(s.prev) {
			s.last, s.prev = e, e.prev
		}
		if e.first.Before(s.first) {
			s.first = e.first
		}
		if len(s.examples) < FoldAbove {
			s.examples = append(s.examples, k)
		}
	}
	var lines []heldLine
	for _, msg := range order {
		s := sums[msg]
		args := append(s.last.args[:len(s.last.args):len(s.last.args)], "keys", s.keys, "examples", s.examples)
		lines = append(lines, heldLine{s.last.log, s.last.level, msg, append(args, heldArgs(s.n, s.first, s.prev)...)})
	}
	for _, k := range due {
		l.reported(l.keys[k], now)
	}
	return lines
}
