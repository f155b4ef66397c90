package logging

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestCounter: the first event of a failure is let through at once, then one a LimitEvery,
// standing for the events held back; after Reset the next is let through at once.
func TestCounter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Counter
		type got struct {
			n  int
			ok bool
		}
		allow := func() got { n, ok := l.Allow(); return got{n, ok} }
		step := LimitEvery / 4
		var seen []got
		for range 9 { // 0, ¼, ½, ¾, 1, … 2 periods
			seen = append(seen, allow())
			time.Sleep(step)
		}
		want := []got{{1, true}, {}, {}, {}, {4, true}, {}, {}, {}, {4, true}}
		for i := range want {
			if seen[i] != want[i] {
				t.Fatalf("Allow at %v = %+v, want %+v (all: %+v)", time.Duration(i)*step, seen[i], want[i], seen)
			}
		}
		allow()
		l.Reset()
		if g := allow(); g != (got{1, true}) {
			t.Errorf("Allow after Reset = %+v, want {1 true}", g)
		}
	})
}

// TestCounterFlush: the events held back are let through once a line is due without a new
// event, and the next event then waits LimitEvery from the flush.
func TestCounterFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Counter
		if n, ok := l.Flush(); ok || n != 0 {
			t.Errorf("Flush with nothing held back = %d, %v, want 0, false", n, ok)
		}
		start := time.Now()
		l.Allow()
		l.Allow()
		l.Allow()
		if n, due := l.Held(); n != 2 || !due.Equal(start.Add(LimitEvery)) {
			t.Errorf("Held = %d, %v, want 2, %v", n, due, start.Add(LimitEvery))
		}
		time.Sleep(LimitEvery)
		if n, ok := l.Flush(); !ok || n != 2 {
			t.Errorf("Flush when due = %d, %v, want 2, true", n, ok)
		}
		if n, _ := l.Held(); n != 0 {
			t.Errorf("Held after Flush = %d, want 0", n)
		}
		if _, ok := l.Allow(); ok {
			t.Error("an event right after a Flush was let through, want it held back a LimitEvery")
		}
		time.Sleep(LimitEvery)
		if n, ok := l.Allow(); !ok || n != 2 {
			t.Errorf("Allow a LimitEvery after the Flush = %d, %v, want 2, true", n, ok)
		}
	})
}

// keyedLog is a logger at Debug into a buffer, and its lines without their time.
type keyedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
	log *slog.Logger
}

func (k *keyedLog) Write(p []byte) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.buf.Write(p)
}

func newKeyedLog() *keyedLog {
	k := &keyedLog{}
	k.log = slog.New(slog.NewTextHandler(k, &slog.HandlerOptions{Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
	return k
}

// lines are the lines logged since the last call, those at Debug left out unless debug, once
// the reports' timer is done.
func (k *keyedLog) lines(debug bool) []string {
	synctest.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(k.buf.String()), "\n") {
		if l != "" && (debug || !strings.HasPrefix(l, "level=DEBUG")) {
			out = append(out, l)
		}
	}
	k.buf.Reset()
	return out
}

// clock is the time of day as a held-back event's report says it.
func clock(t time.Time) string { return t.Format(TimeFormat) }

// TestKeyedLimiter: each key's events are let through once a LimitEvery, the others logged at
// Debug in full, apart from the other keys', and reported as the key's window passes, with when
// they were.
func TestKeyedLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l KeyedLimiter
		k := newKeyedLog()
		start := time.Now()
		logged := func(key string) bool { return l.Log(k.log, slog.LevelWarn, "m", key, "k", key) }
		for i, tc := range []struct {
			key  string
			want bool
		}{{"a", true}, {"a", false}, {"b", true}, {"a", false}} {
			if got := logged(tc.key); got != tc.want {
				t.Errorf("event %d (%s) logged = %v, want %v", i+1, tc.key, got, tc.want)
			}
		}
		if got, want := k.lines(true), []string{
			"level=WARN msg=m k=a", "level=DEBUG msg=m k=a", "level=WARN msg=m k=b", "level=DEBUG msg=m k=a",
		}; !slices.Equal(got, want) {
			t.Errorf("lines = %q, want %q", got, want)
		}
		time.Sleep(LimitEvery - time.Second)
		logged("a") // held back
		time.Sleep(time.Second)
		if got, want := k.lines(false), []string{
			"level=WARN msg=m k=a repeats=3 repeats_from=" + clock(start) + " repeats_to=" + clock(start.Add(LimitEvery-time.Second)),
		}; !slices.Equal(got, want) {
			t.Errorf("lines as a's window passed = %q, want %q", got, want)
		}
		if logged("a") {
			t.Error("a's event right after its report was let through, want it held back a LimitEvery")
		}
		time.Sleep(LimitEvery)
		k.lines(false) // its report
		time.Sleep(LimitEvery)
		if !logged("a") {
			t.Error("a's event a LimitEvery after its last line, nothing held back, was held back")
		}
		if got, want := k.lines(false), []string{"level=WARN msg=m k=a"}; !slices.Equal(got, want) {
			t.Errorf("lines = %q, want %q", got, want)
		}
	})
}

// TestKeyedLimiterReportsWhenTheWindowPasses: the events a key held back are reported at the
// line's level when its window passes, without a next event of any key, with the times they
// came between; the key's event an hour later stands for itself alone. Before, they were
// reported by the key's next event, whenever it came: an hour later, its line counted the events
// of an earlier outage with its own, and nothing said when they were; at Info, an operator whose
// events stopped never learned of them.
func TestKeyedLimiterReportsWhenTheWindowPasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l KeyedLimiter
		k := newKeyedLog()
		l.Log(k.log, slog.LevelWarn, "m", "a", "k", "a", "n", 0)
		time.Sleep(10 * time.Second)
		from := time.Now()
		l.Log(k.log, slog.LevelWarn, "m", "a", "k", "a", "n", 1)
		time.Sleep(10 * time.Second)
		to := time.Now()
		l.Log(k.log, slog.LevelWarn, "m", "a", "k", "a", "n", 2)
		k.lines(true)
		time.Sleep(LimitEvery - 20*time.Second - time.Millisecond)
		synctest.Wait()
		if got := k.lines(true); len(got) != 0 {
			t.Errorf("lines before the window passed: %q, want none", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got, want := k.lines(true), []string{
			"level=WARN msg=m k=a n=2 repeats=2 repeats_from=" + clock(from) + " repeats_to=" + clock(to),
		}; !slices.Equal(got, want) {
			t.Errorf("lines when the window passed = %q, want %q", got, want)
		}
		time.Sleep(time.Hour)
		if !l.Log(k.log, slog.LevelWarn, "m", "a", "k", "a", "n", 3) {
			t.Error("a's event an hour later was held back")
		}
		if got, want := k.lines(true), []string{"level=WARN msg=m k=a n=3"}; !slices.Equal(got, want) {
			t.Errorf("lines of a's event an hour later = %q, want %q (no repeats)", got, want)
		}
	})
}

// TestLimiterReportsWhenTheWindowPasses: a Limiter (one key) logs its first event at once and
// those within LimitEvery of it at Debug, and reports them when the window passes, without a
// next event, at the line's level with their count and times; its event an hour later stands
// for itself alone. Before, they waited for its next event let through, an hour later, whose
// line counted them as its own repeats, and nothing said when they were.
func TestLimiterReportsWhenTheWindowPasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Limiter
		k := newKeyedLog()
		if !l.Log(k.log, slog.LevelWarn, "m", "n", 0) {
			t.Error("the first event was held back")
		}
		time.Sleep(10 * time.Second)
		from := time.Now()
		l.Log(k.log, slog.LevelWarn, "m", "n", 1)
		time.Sleep(10 * time.Second)
		to := time.Now()
		if l.Log(k.log, slog.LevelWarn, "m", "n", 2) {
			t.Error("an event within LimitEvery of the first was let through")
		}
		if got, want := k.lines(true), []string{"level=WARN msg=m n=0", "level=DEBUG msg=m n=1", "level=DEBUG msg=m n=2"}; !slices.Equal(got, want) {
			t.Errorf("lines = %q, want %q", got, want)
		}
		time.Sleep(LimitEvery - 20*time.Second - time.Millisecond)
		if got := k.lines(true); len(got) != 0 {
			t.Errorf("lines before the window passed: %q, want none", got)
		}
		time.Sleep(time.Millisecond)
		if got, want := k.lines(true), []string{
			"level=WARN msg=m n=2 repeats=2 repeats_from=" + clock(from) + " repeats_to=" + clock(to),
		}; !slices.Equal(got, want) {
			t.Errorf("lines when the window passed = %q, want %q", got, want)
		}
		time.Sleep(time.Hour)
		if !l.Log(k.log, slog.LevelWarn, "m", "n", 3) {
			t.Error("the event an hour later was held back")
		}
		if got, want := k.lines(true), []string{"level=WARN msg=m n=3"}; !slices.Equal(got, want) {
			t.Errorf("lines of the event an hour later = %q, want %q (no repeats)", got, want)
		}
	})
}

// TestLimiterLogQuiet: LogQuiet logs an event let through as Log does, but an event held back
// is not logged at Debug: it is only counted, and reported when the window passes, so that a
// line whose events come by the hundred in an outage (each request refused, each retry) does
// not bury the Debug log, as the limiters' Allowed, which it replaces, never logged them.
func TestLimiterLogQuiet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Limiter
		k := newKeyedLog()
		if !l.LogQuiet(k.log, slog.LevelWarn, "m", "n", 0) {
			t.Error("the first event was held back")
		}
		from := time.Now()
		for i := 1; i <= 3; i++ {
			if l.LogQuiet(k.log, slog.LevelWarn, "m", "n", i) {
				t.Errorf("event %d within LimitEvery of the first was let through", i)
			}
		}
		if got, want := k.lines(true), []string{"level=WARN msg=m n=0"}; !slices.Equal(got, want) {
			t.Errorf("lines = %q, want %q (the events held back not at Debug)", got, want)
		}
		time.Sleep(LimitEvery)
		if got, want := k.lines(true), []string{
			"level=WARN msg=m n=3 repeats=3 repeats_from=" + clock(from) + " repeats_to=" + clock(from),
		}; !slices.Equal(got, want) {
			t.Errorf("lines when the window passed = %q, want %q", got, want)
		}
	})
}

// TestLimiterFlushAndReset: Flush (its owner's stop) reports the events held back at once, and
// stops the timer, which reports nothing more; Reset (what failed works again) reports them too,
// and the next event is logged at once.
func TestLimiterFlushAndReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Limiter
		k := newKeyedLog()
		l.Flush() // nothing held back: nothing logged
		l.Log(k.log, slog.LevelWarn, "m", "n", 0)
		at := time.Now()
		l.Log(k.log, slog.LevelWarn, "m", "n", 1)
		k.lines(true)
		l.Flush()
		if got, want := k.lines(false), []string{
			"level=WARN msg=m n=1 repeats=1 repeats_from=" + clock(at) + " repeats_to=" + clock(at),
		}; !slices.Equal(got, want) {
			t.Errorf("lines of the Flush = %q, want %q", got, want)
		}
		time.Sleep(2 * LimitEvery)
		if got := k.lines(true); len(got) != 0 {
			t.Errorf("lines after the Flush: %q, want none", got)
		}
		l.Log(k.log, slog.LevelWarn, "m", "n", 2)
		at = time.Now()
		l.Log(k.log, slog.LevelWarn, "m", "n", 3)
		l.Reset()
		l.Log(k.log, slog.LevelWarn, "m", "n", 4)
		if got, want := k.lines(false), []string{
			"level=WARN msg=m n=2",
			"level=WARN msg=m n=3 repeats=1 repeats_from=" + clock(at) + " repeats_to=" + clock(at),
			"level=WARN msg=m n=4",
		}; !slices.Equal(got, want) {
			t.Errorf("lines around a Reset = %q, want %q", got, want)
		}
	})
}

// TestLimiterFlushWaitsForTheTimersReport: a Flush at its owner's stop while the timer's report
// is being logged (its handler slow: a full pipe, a disk) returns once that report is logged,
// so that the owner's line that it stopped, logged next, comes after it. Before, the report,
// logged outside the limiter's lock, could come after the owner's stopped line.
func TestLimiterFlushWaitsForTheTimersReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Limiter
		var mu sync.Mutex
		var lines []string
		record := func(line string) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, line)
		}
		slow := make(chan struct{})
		log := slog.New(handlerFunc(func(r slog.Record) {
			if r.Level == slog.LevelWarn && r.NumAttrs() > 1 { // the report (n, repeats, …)
				<-slow
			}
			record(r.Message)
		}))
		l.LogQuiet(log, slog.LevelWarn, "m", "n", 0)
		l.LogQuiet(log, slog.LevelWarn, "m", "n", 1) // held back
		time.Sleep(LimitEvery)
		synctest.Wait() // the timer's report is in the handler
		stopped := make(chan struct{})
		go func() {
			l.Flush()
			record("stopped")
			close(stopped)
		}()
		synctest.Wait()
		close(slow)
		<-stopped
		synctest.Wait()
		if want := []string{"m", "m", "stopped"}; !slices.Equal(lines, want) {
			t.Errorf("lines = %q, want %q (the report before the owner's stopped line)", lines, want)
		}
	})
}

// TestLimiterResetLosesNoEventLoggedDuringItsReport: an event logged from another goroutine
// while a Reset's report is being logged (its handler slow) is let through at once, as the
// first after a Reset. Before, Reset forgot the limiter's last line only after the report was
// logged, in a second lock section: the event, which came between, was held back as one within
// the window of the report, and then forgotten, in no line at all.
func TestLimiterResetLosesNoEventLoggedDuringItsReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Limiter
		var mu sync.Mutex
		var lines []string
		slow := make(chan struct{})
		log := slog.New(handlerFunc(func(r slog.Record) {
			if r.Level != slog.LevelWarn {
				return
			}
			line := r.Message
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "n" || a.Key == "repeats" {
					line += " " + a.String()
				}
				return true
			})
			if strings.Contains(line, "repeats=") { // the Reset's report
				<-slow
			}
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, line)
		}))
		l.Log(log, slog.LevelWarn, "m", "n", 0)
		l.Log(log, slog.LevelWarn, "m", "n", 1) // held back
		reset := make(chan struct{})
		go func() {
			l.Reset()
			close(reset)
		}()
		synctest.Wait() // the Reset's report is in the handler
		l.Log(log, slog.LevelWarn, "m", "n", 2)
		close(slow)
		<-reset
		l.Flush()
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"m n=0", "m n=2", "m n=1 repeats=1"}; !slices.Equal(lines, want) {
			t.Errorf("lines = %q, want %q (the event logged during the Reset's report let through)", lines, want)
		}
	})
}

// handlerFunc is a slog.Handler that hands each record to itself.
type handlerFunc func(slog.Record)

func (h handlerFunc) Enabled(context.Context, slog.Level) bool      { return true }
func (h handlerFunc) Handle(_ context.Context, r slog.Record) error { h(r); return nil }
func (h handlerFunc) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h handlerFunc) WithGroup(string) slog.Handler                 { return h }

// TestKeyedLimiterFoldsManyKeys: the reports of many keys are folded into one line a
// LimitEvery, which counts the keys and their events held back and names a few, after at most
// FoldAbove lines of their own; the first line of each key is logged at once, and every event
// held back (at Debug) is counted in a line's repeats. Before, every key had a line of its own
// each LimitEvery: an outage of thousands of chats, thousands of lines a minute.
func TestKeyedLimiterFoldsManyKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l KeyedLimiter
		k := newKeyedLog()
		const keys = 1000
		event := func(i int) { l.Log(k.log, slog.LevelWarn, "m", fmt.Sprintf("k%03d", i), "session", i) }
		for i := range keys { // spread over half a minute
			event(i)
			event(i) // held back
			time.Sleep(LimitEvery / 2 / keys)
		}
		var lines []string
		held, repeats := 0, 0
		count := func() {
			for _, line := range k.lines(true) {
				if strings.HasPrefix(line, "level=DEBUG") {
					held++
					continue
				}
				lines = append(lines, line)
				if i := strings.Index(line, "repeats="); i >= 0 {
					var n int
					fmt.Sscan(line[i+len("repeats="):], &n)
					repeats += n
				}
			}
		}
		count()
		if len(lines) != keys {
			t.Fatalf("%d lines for %d keys' first events, want one each", len(lines), keys)
		}
		lines = nil
		// Each key has an event every 10 s for 5 minutes.
		for range 30 {
			for i := range keys {
				event(i)
			}
			time.Sleep(10 * time.Second)
		}
		count()
		if len(lines) > FoldAbove+6 {
			t.Errorf("%d lines in 5 minutes of %d keys, want at most %d (FoldAbove, then one a minute):\n%s",
				len(lines), keys, FoldAbove+6, strings.Join(lines, "\n"))
		}
		folded := 0
		for _, line := range lines {
			if strings.Contains(line, "keys=") {
				folded++
				if !strings.Contains(line, `examples="[k`) {
					t.Errorf("folded line %q names no examples", line)
				}
			}
		}
		if folded < 4 {
			t.Errorf("%d folded lines in 5 minutes, want one a minute:\n%s", folded, strings.Join(lines, "\n"))
		}
		time.Sleep(2 * LimitEvery)
		count()
		if repeats != held {
			t.Errorf("the lines count %d events held back, want %d (those logged at Debug)", repeats, held)
		}
	})
}

// TestKeyedLimiterForgetsKeys: memory follows the keys of the last windows, however many
// distinct keys come: a key whose window passed with nothing held back is forgotten, one holding
// events back once they are reported. So with LogQuiet, as the manager's line of a member it
// cannot reach (a key for each member, SessionManager.unreachableHolders) uses it: its limiters
// of a member each, which it dropped itself, did not pile up (TestUnreachableLimitersAreDropped).
func TestKeyedLimiterForgetsKeys(t *testing.T) {
	for _, quiet := range []bool{false, true} {
		t.Run(fmt.Sprint("quiet=", quiet), func(t *testing.T) { testKeyedLimiterForgetsKeys(t, quiet) })
	}
}

func testKeyedLimiterForgetsKeys(t *testing.T, quiet bool) {
	synctest.Test(t, func(t *testing.T) {
		var l KeyedLimiter
		log := slog.New(slog.DiscardHandler)
		logged := l.Log
		if quiet {
			logged = l.LogQuiet
		}
		most := 0
		for i := range 60000 { // 100 new keys a second for 10 minutes, every fifth holding an event back
			key := fmt.Sprint("n", i)
			logged(log, slog.LevelWarn, "m", key)
			if i%5 == 0 {
				logged(log, slog.LevelWarn, "m", key)
			}
			if i%100 == 99 {
				time.Sleep(time.Second)
			}
			l.mu.Lock()
			most = max(most, len(l.keys))
			l.mu.Unlock()
		}
		// Those seen within KeyedForget, twice that between two prunes (amortised), and a window
		// for the reports.
		if limit := 100 * int((2*KeyedForget+LimitEvery)/time.Second); most > limit {
			t.Errorf("%d keys kept at most, want at most %d (those of the last minutes)", most, limit)
		}
	})
}

// TestKeyedLimiterFlush: Flush reports every key's events held back at once, due or not, in
// lines of their own up to FoldAbove keys and one folded line beyond, and the timer then reports
// nothing more. Before, only the timer reported them, up to LimitEvery after an owner's stop.
func TestKeyedLimiterFlush(t *testing.T) {
	for _, keys := range []int{2, FoldAbove + 2} {
		t.Run(fmt.Sprint(keys, " keys"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var l KeyedLimiter
				k := newKeyedLog()
				for i := range keys {
					key := fmt.Sprint("k", i)
					l.Log(k.log, slog.LevelWarn, "m", key, "k", key)
					l.Log(k.log, slog.LevelWarn, "m", key, "k", key) // held back
				}
				k.lines(true)
				time.Sleep(10 * time.Second)
				l.Flush()
				var want []string
				if keys <= FoldAbove {
					for i := range keys {
						want = append(want, fmt.Sprintf("level=WARN msg=m k=k%d repeats=1 repeats_from=%s repeats_to=%[2]s", i, clock(time.Now().Add(-10*time.Second))))
					}
				} else {
					// (The arguments of the last event held back: all came at once, the first key's.)
					want = []string{fmt.Sprintf(`level=WARN msg=m k=k0 keys=%d examples="[k0 k1 k2]" repeats=%[1]d repeats_from=%s repeats_to=%[2]s`,
						keys, clock(time.Now().Add(-10*time.Second)))}
				}
				if got := k.lines(false); !slices.Equal(got, want) {
					t.Errorf("lines at the Flush = %q, want %q", got, want)
				}
				time.Sleep(2 * LimitEvery)
				if got := k.lines(true); len(got) != 0 {
					t.Errorf("lines after the Flush: %q, want none", got)
				}
			})
		})
	}
}
