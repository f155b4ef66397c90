package discord

import (
	"testing"
	"time"
)

// SetGapRetry makes the platforms of the test read an unread gap again d after the backfill
// that left it (instead of a minute), until the test ends.
func SetGapRetry(t testing.TB, d time.Duration) {
	old := gapRetryFirst.Swap(int64(d))
	t.Cleanup(func() { gapRetryFirst.Store(old) })
}

// SetBlockWait makes the platforms of the test wait d after the first 429 of a block that
// names no Retry-After (instead of 10 seconds), until the test ends.
func SetBlockWait(t testing.TB, d time.Duration) {
	old := blockWaitFirst.Swap(int64(d))
	t.Cleanup(func() { blockWaitFirst.Store(old) })
}

// SetRetryAfter makes the platforms of the test wait on after(d) instead of time.After(d) before
// they try a connection the gateway refused again, until the test ends.
func SetRetryAfter(t testing.TB, after func(d time.Duration) <-chan time.Time) {
	old := refusalWait.Swap(&after)
	t.Cleanup(func() { refusalWait.Store(old) })
}

// SetMaxReplayHeld makes the platforms of the test hold at most n messages of a resume's
// replay (instead of 1000), until the test ends.
func SetMaxReplayHeld(t testing.TB, n int) {
	old := maxReplayHeld
	maxReplayHeld = n
	t.Cleanup(func() { maxReplayHeld = old })
}
