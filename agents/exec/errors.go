package exec

import (
	"errors"
	"fmt"
	"strings"
)

// ErrTimeout is wrapped by the error Run returns when the command did not finish within
// Config.Timeout.
var ErrTimeout = errors.New("exec agent: timed out")

// ExitError reports that the command ran but ended unsuccessfully. Run wraps it; find it with
// errors.As.
type ExitError struct {
	// Code is the exit status, or 128 plus the signal number (as a shell reports it) when the
	// process was killed by a signal.
	Code int
	// Stderr is the tail (at most MaxStderr bytes) of what the command wrote to stderr.
	Stderr string
}

// Error returns the exit status followed by the captured stderr, if any.
func (e *ExitError) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if msg == "" {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return fmt.Sprintf("exit status %d: %s", e.Code, msg)
}
