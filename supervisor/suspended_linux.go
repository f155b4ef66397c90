package supervisor

import (
	"time"

	"golang.org/x/sys/unix"
)

// suspended returns how long the host has spent suspended since it booted: CLOCK_BOOTTIME,
// which counts a suspend, less CLOCK_MONOTONIC (Go's monotonic clock), which does not. The two
// are read one after the other, so the difference is late by the time between the reads (more
// when the thread is descheduled there): of up to three tries it returns the one read closest
// together. It returns 0 when the clocks cannot be read: the monotonic clock alone then judges.
func suspended() time.Duration {
	best, window := time.Duration(0), time.Duration(-1)
	for range 3 {
		var m1, boot, m2 unix.Timespec
		if unix.ClockGettime(unix.CLOCK_MONOTONIC, &m1) != nil || unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot) != nil ||
			unix.ClockGettime(unix.CLOCK_MONOTONIC, &m2) != nil {
			return 0
		}
		if w := time.Duration(m2.Nano() - m1.Nano()); window < 0 || w < window {
			best, window = time.Duration(boot.Nano()-m1.Nano()), w
		}
		if window < time.Millisecond {
			break
		}
	}
	return best
}
