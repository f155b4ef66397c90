package testutil

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// BubbleTest runs f in a synctest bubble (synctest.Test) under a watchdog of real time. A
// bubble's clock moves only while every goroutine in it is durably blocked, and a wait that
// synctest does not count so (a sync.Mutex, a syscall) behind a goroutine that sleeps on the
// bubble's clock holds it still for good: synctest.Test then hangs until go test's -timeout
// (10 minutes by default) instead of failing. If the bubble has not ended after within of real
// time, the watchdog writes the test's name, hang (what most likely holds it, for the reader)
// and every goroutine's stack to stderr, and panics, which fails the test binary there.
//
// within bounds a hang, not the test's speed: pick it many times what the test takes on a
// loaded machine (a bubble's test takes no real time for the waits it shows), so that it
// cannot end a test that runs.
func BubbleTest(t *testing.T, within time.Duration, hang string, f func(*testing.T)) {
	t.Helper()
	var ended atomic.Bool
	name := t.Name()
	watchdog := time.AfterFunc(within, func() { // the machine's clock: made outside the bubble
		if ended.Load() {
			return
		}
		msg := fmt.Sprintf("%s: its synctest bubble has not ended after %v of real time: %s", name, within, hang)
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "%s\n\n%s\n", msg, buf)
		panic(msg)
	})
	defer watchdog.Stop()
	defer ended.Store(true)
	synctest.Test(t, f)
}
