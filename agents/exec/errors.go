package exec

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

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
	// Signal is the signal that killed the process; zero when it exited. A shell that exits
	// 128 plus a number (its report of a child a signal killed) exited: Signal is zero, and
	// Code says the rest.
	Signal syscall.Signal
	// Stderr is the end (at most MaxStderrLogged bytes, after a note of how many came before
	// it) of what the command wrote to stderr, most often why it failed, without colour codes
	// (ansi.Strip), with the daemon's secrets (Config.Withhold), key-like strings and the
	// passwords of URLs replaced by [redacted], since the error is logged. (More of it, MaxStderr bytes, is logged at Debug,
	// as is the tail of stdout, which may be the reply: no message bodies above it.)
	Stderr string
}

// Is makes an ExitError match agents.ErrStopSignal when its code says the command ended by a
// stop signal: killed by it (Signal), or a shell that exited 128 plus its number after it.
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

// Error returns how the command ended, "exit status N" or "killed by signal N (SIGNAME)",
// followed by the captured stderr, if any. A signal's exit status (137 for SIGKILL, as a shell
// reports it) read as an exit of the command's own: an operator looked for the exit 137 in its
// code, not for who killed it (an out-of-memory kill, a kill -9).
func (e *ExitError) Error() string {
	how := fmt.Sprintf("exit status %d", e.Code)
	if e.Signal != 0 {
		how = fmt.Sprintf("killed by signal %d (%s)", int(e.Signal), signalName(e.Signal))
	}
	msg := strings.TrimSpace(e.Stderr)
	if msg == "" {
		return how
	}
	return how + ": " + msg
}

// signalName returns the name of sig ("SIGKILL"), or "an unknown signal".
func signalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return "an unknown signal"
}
