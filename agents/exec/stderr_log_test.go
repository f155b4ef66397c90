package exec_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/internal/testutil"
)

// TestFailedCommandsStderrIsBoundedInItsLogLine: the WRN line of a turn whose command failed
// holds the end of its stderr, the last lines (at most MaxStderrLogged bytes, from a line's
// start), after a note of how many bytes came before them; all that is kept (MaxStderr) is at
// Debug. Before, the line held the last 4 KiB in one attribute, for each failed turn.
func TestFailedCommandsStderrIsBoundedInItsLogLine(t *testing.T) {
	var script strings.Builder
	written := 0
	for i := range 200 {
		line := fmt.Sprintf("noise line %03d of a verbose client\n", i)
		script.WriteString("echo '" + strings.TrimSuffix(line, "\n") + "' >&2\n")
		written += len(line)
	}
	const last = "Traceback (most recent call last):\nValueError: the model name is unknown\n"
	script.WriteString("printf 'Traceback (most recent call last):\\nValueError: the model name is unknown\\n' >&2\nexit 1")
	written += len(last)

	var logs testutil.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cmd, _ := MustScript(t, script.String())
	a := MustNew(t, exec.Config{Command: cmd, Logger: log})
	_, err := a.Run(t.Context(), request(turn(1), "hi"))
	if err == nil {
		t.Fatal("Run() error = nil, want the command's failure")
	}
	log.Warn("turn failed", "err", err) // as the session logs it

	var warn, debug string
	for line := range strings.Lines(logs.String()) {
		switch {
		case strings.Contains(line, `msg="turn failed"`):
			warn = line
		case strings.Contains(line, `msg="exec agent stderr"`):
			debug = line
		}
	}
	_, shown, ok := strings.Cut(err.Error(), "exit status 1: ")
	if !ok {
		t.Fatalf("Run() error = %q, want the exit status and stderr", err)
	}
	note, shown, ok := strings.Cut(shown, "] ")
	if want := fmt.Sprintf("[first %d bytes cut", written-len(shown)-1); !ok || note != want { // (TrimSpace took the last newline)
		t.Errorf("Run() error's stderr begins %q, want the note %q]", note, want)
	}
	if !strings.HasPrefix(shown, "noise line ") || !strings.HasSuffix(shown, strings.TrimSpace(last)) {
		t.Errorf("Run() error shows %q, want the last lines whole, down to the ValueError", shown)
	}
	if len(shown) > exec.MaxStderrLogged {
		t.Errorf("Run() error shows %d bytes of stderr, want at most %d", len(shown), exec.MaxStderrLogged)
	}
	if n := len(warn); n > exec.MaxStderrLogged+300 {
		t.Errorf("the turn's WRN line is %d bytes, want the end of stderr only:\n%s", n, warn)
	}
	// At Debug, all that was kept: its first line 4 KiB from the end.
	if !strings.Contains(debug, "noise line 093 of") || !strings.Contains(debug, "ValueError") {
		t.Errorf("the Debug line lacks the kept stderr's start or end:\n%s", debug)
	}
}

// TestStderrEndDropsTheEndOfAWithheldValueOfSeveralLines: the end of stderr a failed command's
// error shows begins at a line's start, so its first word is shown whole; when that line is the
// rest of a withheld value of several lines (a PEM key in a variable), it is dropped all the
// same.
func TestStderrEndDropsTheEndOfAWithheldValueOfSeveralLines(t *testing.T) {
	const secret = "first-half-of-the-key\nsecond-half-of-the-key"
	t.Setenv("EXECTEST_PEM", secret)
	// The last MaxStderrLogged bytes begin 5 bytes before the value's newline: the end shown
	// begins at the line after it, the value's second half. (The command has no such variable:
	// it prints the value as a command may have it from elsewhere.)
	rest := exec.MaxStderrLogged - 5 - len("second-half-of-the-key\n") - 1
	script := fmt.Sprintf("printf 'noise\\n%%s\\n' '%s' >&2; head -c %d /dev/zero | tr '\\0' y >&2; echo >&2; exit 1", secret, rest)
	var logs testutil.Buffer
	cmd, _ := MustScript(t, script)
	a := MustNew(t, exec.Config{Command: cmd, Withhold: []string{"EXECTEST_PEM"},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	_, err := a.Run(t.Context(), request(turn(1), "hi"))
	if err == nil || !strings.Contains(err.Error(), "[first ") {
		t.Fatalf("Run() error = %v, want the end of stderr after a note", err)
	}
	for _, where := range []string{err.Error(), logs.String()} {
		if strings.Contains(where, "second-half") || strings.Contains(where, "of-the-key") {
			t.Errorf("the withheld value's second half is shown: %q", where)
		}
	}
}
