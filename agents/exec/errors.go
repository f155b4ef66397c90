package exec

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/agentgate/agentgate/agents"
)

// ErrTimeout is wrapped by the error Run returns when the command did not finish within
// Config.Timeout.
var ErrTimeout = errors.New("exec agent: timed out")

// errRunaway stops a command that wrote more than MaxOutput bytes to stdout.
var errRunaway = errors.New("exec agent: the command wrote more than agentgate reads")

// errStderrRunaway stops a command that wrote more than MaxStderrRead bytes to stderr.
var errStderrRunaway = errors.New("exec agent: the command wrote more to stderr than agentgate reads")

// ExitError reports that the command ran but ended unsuccessfully. Run wraps it; find it with
// errors.As.
type ExitError struct {
	// Code is the exit status, or 128 plus the signal number (as a shell reports it) when the
	// process was killed by a signal.
	Code int
	// Stderr is the end (at most MaxStderrLogged bytes, after a note of how many came before
	// it) of what the command wrote to stderr, most often why it failed, with the daemon's
	// secrets (Config.Withhold), key-like strings and the passwords of URLs replaced by
	// [redacted], since the error is logged. (More of it, MaxStderr bytes, is logged at Debug,
	// as is the tail of stdout, which may be the reply: no message bodies above it.)
	Stderr string
}

// Is makes an ExitError match agents.ErrStopSignal when its code says the command ended by a
// stop signal: killed by it, or a shell that exited 128 plus its number after it.
func (e *ExitError) Is(target error) bool {
	if target != agents.ErrStopSignal {
		return false
	}
	switch syscall.Signal(e.Code - 128) {
	case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGKILL:
		return true
	}
	return false
}

// Error returns the exit status followed by the captured stderr, if any.
func (e *ExitError) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if msg == "" {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return fmt.Sprintf("exit status %d: %s", e.Code, msg)
}
