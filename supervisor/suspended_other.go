//go:build !linux

package supervisor

import "time"

// suspended returns 0: outside Linux agentgate does not read how long the host was suspended
// (Linux: suspended_linux.go), and the monotonic clock alone judges.
func suspended() time.Duration { return 0 }
