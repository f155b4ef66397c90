package exec_test

import (
	"errors"
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

// TestStderrColourCodesAreTakenOut: a failed command's stderr in colour (a logger's ANSI
// codes, and what is left of them when a wrapper printed them without the ESC) reaches the
// turn's error and its log lines without the codes, as the openai agent's endpoint text does
// (ansi.Strip, one function for both); a withheld value that holds text that reads as a code is
// still redacted whole, and a code between "Bearer" and its token does not hide the token.
// Before, the codes stayed: the error read "␛[1;31mERROR␛[0m" on a coloured log line and
// "\x1b[1;31mERROR\x1b[0m" on another.
func TestStderrColourCodesAreTakenOut(t *testing.T) {
	t.Setenv("EXECTEST_COLOUR_SECRET", "pa[1mss[0mword42")
	// (The command has no such variable: it prints the value as a command may have it from
	// elsewhere.)
	script := `printf '\033[1;31mERROR\033[0m worker \033[33mgpu-0\033[0m died\n' >&2
printf '[33mWARN[0m printed without the ESC, retry in [5m0s]\n' >&2
printf 'login with %s\n' 'pa[1mss[0mword42' >&2
printf 'Authorization: Bearer \033[2mabcdef0123456789abcdef\033[0m\n' >&2
exit 3`
	var logs testutil.Buffer
	cmd, _ := MustScript(t, script)
	a := MustNew(t, exec.Config{Command: cmd, Withhold: []string{"EXECTEST_COLOUR_SECRET"},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	_, err := a.Run(t.Context(), request(turn(1), "hi"))
	ee, ok := errors.AsType[*exec.ExitError](err)
	const want = "ERROR worker gpu-0 died\nWARN printed without the ESC, retry in [5m0s]\nlogin with [redacted]\nAuthorization: Bearer [redacted]\n"
	if !ok || ee.Stderr != want {
		t.Fatalf("Run() error = %v, want an ExitError whose stderr is %q", err, want)
	}
	debug := ""
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, `msg="exec agent stderr"`) {
			debug = line
		}
	}
	if !strings.Contains(debug, `ERROR worker gpu-0 died\nWARN printed without the ESC, retry in [5m0s]\nlogin with [redacted]`) {
		t.Errorf("the Debug line of stderr does not show it without its codes:\n%s", debug)
	}
	for _, s := range []string{"[1;31m", "[33m", "[0m", `\x1b`, "pa[1m", "word42", "abcdef0123"} {
		if strings.Contains(err.Error(), s) || strings.Contains(logs.String(), s) {
			t.Errorf("the error or the logs hold %q:\n%v\n%s", s, err, logs.String())
		}
	}
}

// TestStderrKeyAfterAnEscapeSequenceIsRedacted: a key redact knows by its prefix (sk-, ghp_)
// that a command wrote right after an escape sequence whose last character is no letter (a
// hyperlink's "␛]8;;…␛\", a "␛[2~") and a word before it is redacted, as it was before the
// codes were taken out; a key a code cuts in two ("sk-…␛[0m…") is redacted whole. Before,
// taking the sequence out joined the key to the word ("linksk-…"), and the rules, which want
// a key's prefix to start a word, showed it whole.
func TestStderrKeyAfterAnEscapeSequenceIsRedacted(t *testing.T) {
	script := `printf 'see link\033]8;;https://x.example\033\\sk-proj0123456789abcdef\033]8;;\033\\ now\n' >&2
printf 'x\033[31m\033[2~ghp_abcdefghijklmnopqrstuvwxyz0123\n' >&2
printf 'cut sk-abcdefgh\033[0mijklmnopqrst end\n' >&2
exit 3`
	cmd, _ := MustScript(t, script)
	a := MustNew(t, exec.Config{Command: cmd})
	_, err := a.Run(t.Context(), request(turn(1), "hi"))
	ee, ok := errors.AsType[*exec.ExitError](err)
	const want = "see link[redacted] now\nx[redacted]\ncut [redacted] end\n"
	if !ok || ee.Stderr != want {
		t.Fatalf("Run() error = %v, want an ExitError whose stderr is %q", err, want)
	}
}
