package logging

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// TestLimiter: the first event of a failure is let through at once, then one a LimitEvery,
// standing for the events held back; after Reset the next is let through at once.
func TestLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Limiter
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

// TestLimiterAllowed: the line's arguments say how many events it stands for beyond its own.
func TestLimiterAllowed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Limiter
		if args, ok := l.Allowed("k", 1); !ok || fmt.Sprint(args) != "[k 1]" {
			t.Errorf("first event: %v %v, want [k 1] let through", args, ok)
		}
		for range 3 {
			if _, ok := l.Allowed("k", 2); ok {
				t.Fatal("an event within LimitEvery was let through")
			}
		}
		time.Sleep(LimitEvery)
		if args, ok := l.Allowed("k", 3); !ok || fmt.Sprint(args) != "[k 3 repeats 3]" {
			t.Errorf("after LimitEvery: %v %v, want [k 3 repeats 3] let through", args, ok)
		}
	})
}

// TestLimiterFlush: the events held back are let through once a line is due without a new
// event, and the next event then waits LimitEvery from the flush.
func TestLimiterFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Limiter
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

// TestKeyedLimiter: each key's events are let through once a LimitEvery, with how many were
// held back, apart from the other keys'; a key not seen for LimitEvery is forgotten.
func TestKeyedLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l KeyedLimiter
		allowed := func(key string) string {
			args, ok := l.Allowed(key, "k", key)
			return fmt.Sprint(args, ok)
		}
		for i, tc := range []struct{ key, want string }{
			{"a", "[k a] true"},
			{"a", "[k a] false"},
			{"b", "[k b] true"}, // another key's first
			{"a", "[k a] false"},
		} {
			if got := allowed(tc.key); got != tc.want {
				t.Errorf("event %d (%s) = %s, want %s", i+1, tc.key, got, tc.want)
			}
		}
		time.Sleep(LimitEvery)
		if got, want := allowed("a"), "[k a repeats 2] true"; got != want {
			t.Errorf("a after LimitEvery = %s, want %s", got, want)
		}
		for i := range 200 { // enough new keys to prune the old ones
			allowed(fmt.Sprint("n", i))
		}
		time.Sleep(LimitEvery)
		for i := range 200 {
			allowed(fmt.Sprint("m", i))
		}
		l.mu.Lock()
		_, kept := l.keys["n0"]
		l.mu.Unlock()
		if kept {
			t.Error("a key not seen for LimitEvery is still kept")
		}
	})
}

// TestKeyedLimiterPruneKeepsHeldRepeats: a key whose window ended with events held back is not
// forgotten by a prune before its next event can report them (repeats), as it is when other
// keys come meanwhile; one not seen for two windows is. Before, a prune forgot any key past its
// window, and the next line of a command resent through an outage while new commands came
// stood for itself alone: the resends held back in its last window were never reported.
func TestKeyedLimiterPruneKeepsHeldRepeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l KeyedLimiter
		allowed := func(key string) string {
			args, ok := l.Allowed(key, "k", key)
			return fmt.Sprint(args, ok)
		}
		allowed("a")
		time.Sleep(LimitEvery / 2)
		allowed("a") // held back
		time.Sleep(LimitEvery / 2)
		for i := range 200 { // enough new keys to prune the old ones
			allowed(fmt.Sprint("n", i))
		}
		time.Sleep(LimitEvery / 4)
		if got, want := allowed("a"), "[k a repeats 1] true"; got != want {
			t.Errorf("a after a prune = %s, want %s (its held-back event reported)", got, want)
		}
		allowed("a") // held back again
		time.Sleep(2 * LimitEvery)
		for i := range 400 {
			allowed(fmt.Sprint("m", i))
		}
		l.mu.Lock()
		_, kept := l.keys["a"]
		l.mu.Unlock()
		if kept {
			t.Error("a key not seen for two LimitEvery is still kept, with events held back")
		}
	})
}
