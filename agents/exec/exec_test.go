package exec_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
)

// pollTimeout bounds every wait for an effect of a subprocess.
const pollTimeout = 15 * time.Second

// MustScript writes body as a /bin/sh script into a new temp dir. It returns the command that
// runs it with that dir as $1 (so scripts can leave marker files there) and the dir. Running
// it through /bin/sh avoids exec'ing a file this process just wrote (ETXTBSY).
func MustScript(t *testing.T, body string) (command []string, dir string) {
	t.Helper()
	dir = t.TempDir()
	path := filepath.Join(dir, "agent.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return []string{"/bin/sh", path, dir}, dir
}

// MustNewGone builds an exec agent for c whose command is a program that was there when the
// agent was made (New refuses one that is not) and is gone since: deleted or moved while the
// daemon runs, so every Start fails.
func MustNewGone(t *testing.T, c exec.Config) *exec.Agent {
	t.Helper()
	path := filepath.Join(t.TempDir(), "missing")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c.Command = []string{path}
	a := MustNew(t, c)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	return a
}

// MustNew builds an exec agent for c.
func MustNew(t *testing.T, c exec.Config) *exec.Agent {
	t.Helper()
	a, err := exec.New(c)
	if err != nil {
		t.Fatalf("New(%+v) error = %v, want nil", c, err)
	}
	return a
}

// waitFor polls cond until it holds or pollTimeout passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(pollTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", pollTimeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// MustReadPID waits for a script to write a pid file (scripts write it atomically with mv) and
// returns the pid.
func MustReadPID(t *testing.T, path string) int {
	t.Helper()
	var b []byte
	waitFor(t, path, func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil
	})
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pid file %s: %v", path, err)
	}
	return pid
}

// processGone reports whether pid has exited. An orphan that has exited may stay a zombie when
// the machine's init does not reap, so a zombie counts as gone.
func processGone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// waitGone waits until pid has exited.
func waitGone(t *testing.T, what string, pid int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s (pid %d) to be gone", what, pid), func() bool { return processGone(pid) })
}

func turn(n int) identity.Turn {
	t := identity.Turn{
		Platform:   "discord",
		ChatType:   identity.ChatGroup,
		ChatID:     fmt.Sprintf("chat-%d", n),
		UserID:     fmt.Sprintf("user-%d", n),
		UserName:   fmt.Sprintf("User %d", n),
		ScopeID:    "guild-1",
		SessionKey: fmt.Sprintf("agent:main:discord:group:chat-%d:user-%d", n, n),
		SessionID:  fmt.Sprintf("session-%d", n),
		MessageID:  fmt.Sprintf("message-%d", n),
		TurnID:     fmt.Sprintf("turn-%d", n),
	}
	if n%2 == 1 { // Odd turns carry the optional fields, even ones leave them empty.
		t.ThreadID = fmt.Sprintf("thread-%d", n)
		t.Profile = fmt.Sprintf("profile-%d", n)
	}
	return t
}

func request(id identity.Turn, texts ...string) *agents.Request {
	req := &agents.Request{Identity: id}
	for _, s := range texts {
		req.Messages = append(req.Messages, agents.Message{Role: "user", Text: s})
	}
	return req
}

type result struct {
	resp *agents.Response
	err  error
}

// runAsync runs a in a goroutine owned by the test; mustResult collects it.
func runAsync(ctx context.Context, a *exec.Agent, req *agents.Request) <-chan result {
	ch := make(chan result, 1)
	go func() {
		resp, err := a.Run(ctx, req)
		ch <- result{resp, err}
	}()
	return ch
}

func mustResult(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(2 * pollTimeout):
		t.Fatalf("Run did not return within %v", 2*pollTimeout)
		return result{}
	}
}

// envMap returns the AGENTGATE_* variables in env output (one NAME=value per line).
func envMap(out string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), "=")
		if ok && strings.HasPrefix(name, identity.EnvPrefix) {
			m[name] = value
		}
	}
	return m
}

func wantEnv(id identity.Turn) map[string]string {
	m := map[string]string{}
	for _, kv := range id.Env() {
		name, value, _ := strings.Cut(kv, "=")
		m[name] = value
	}
	return m
}

func TestNew(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		config  exec.Config
		wantErr bool
	}{
		{name: "command", config: exec.Config{Command: []string{"/bin/true"}}},
		{name: "all fields", config: exec.Config{Command: []string{"/bin/sh", "-c", "true"}, Timeout: time.Second, KillGrace: time.Second, History: 3, HistoryBytes: 4096, Dir: "/"}},
		{name: "no command", config: exec.Config{}, wantErr: true},
		{name: "empty program", config: exec.Config{Command: []string{""}}, wantErr: true},
		{name: "negative timeout", config: exec.Config{Command: []string{"/bin/true"}, Timeout: -time.Second}, wantErr: true},
		{name: "negative grace", config: exec.Config{Command: []string{"/bin/true"}, KillGrace: -time.Second}, wantErr: true},
		{name: "negative history", config: exec.Config{Command: []string{"/bin/true"}, History: -1}, wantErr: true},
		{name: "negative history bytes", config: exec.Config{Command: []string{"/bin/true"}, HistoryBytes: -1}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, err := exec.New(tc.config)
			if gotErr := err != nil; gotErr != tc.wantErr {
				t.Errorf("New(%+v) = %v, %v; want error %t", tc.config, a, err, tc.wantErr)
			}
		})
	}
}

// TestNewRefusesACommandItCannotRun: a command that is not there, or not executable, is an
// error when the agent is made (serve refuses to start), not a failure of every turn.
func TestNewRefusesACommandItCannotRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	plain := filepath.Join(dir, "agent.sh")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runnable := filepath.Join(dir, "run.sh")
	if err := os.WriteFile(runnable, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		config  exec.Config
		wantErr string // "" means success
	}{
		{name: "missing path", config: exec.Config{Command: []string{filepath.Join(dir, "nope")}}, wantErr: "does not exist"},
		{name: "not in PATH", config: exec.Config{Command: []string{"agentgate-no-such-agent"}}, wantErr: "is not found in PATH"},
		{name: "not executable", config: exec.Config{Command: []string{plain}}, wantErr: "is not executable"},
		{name: "a directory", config: exec.Config{Command: []string{dir}}, wantErr: "cannot be run"},
		{name: "relative to Dir", config: exec.Config{Command: []string{"./run.sh"}, Dir: dir}},
		{name: "missing relative to Dir", config: exec.Config{Command: []string{"./nope"}, Dir: dir}, wantErr: "does not exist"},
		{name: "missing relative to the working directory", config: exec.Config{Command: []string{"./agentgate-no-such-agent"}},
			wantErr: `"./agentgate-no-such-agent" does not exist (a relative path, taken from the working directory ` + wd + ")"},
		{name: "in PATH", config: exec.Config{Command: []string{"sh", "-c", "true"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := exec.New(tc.config)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("New(%q) = %v, want success", tc.config.Command, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("New(%q) = %v, want an error containing %q", tc.config.Command, err, tc.wantErr)
			}
		})
	}
}

func TestRunReply(t *testing.T) {
	t.Parallel()
	aaa := func(n int) string { return fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a", n) }
	tests := []struct {
		name   string
		script string
		want   string
	}{
		{name: "trailing newlines trimmed", script: `printf 'hello\n\n \t\n'`, want: "hello"},
		{name: "inner and leading space kept", script: `printf '  a\n\nb  \n'`, want: "  a\n\nb"},
		{name: "empty reply", script: `exit 0`, want: ""},
		{name: "only white space", script: `printf '\n\n'`, want: ""},
		{name: "stderr is not the reply", script: `echo noise >&2; echo reply`, want: "reply"},
		{name: "unread stdin", script: `echo ignored stdin`, want: "ignored stdin"},
		{name: "invalid UTF-8 replaced", script: `printf 'caf\351 \377\376ok\n'`, want: "caf\uFFFD \uFFFDok"},
		{name: "exactly the cap", script: aaa(exec.MaxReply), want: strings.Repeat("a", exec.MaxReply)},
		{name: "one byte over the cap", script: aaa(exec.MaxReply + 1), want: strings.Repeat("a", exec.MaxReply) + exec.TruncatedSuffix},
		{name: "far over the cap", script: aaa(3 * exec.MaxReply), want: strings.Repeat("a", exec.MaxReply) + exec.TruncatedSuffix},
		// MaxReply bytes of "a\377" pairs: each stray byte becomes a 3-byte U+FFFD, twice the cap.
		{name: "the cap holds after replacement", script: `f=$(mktemp); printf 'a\377' > "$f"; i=0
			while [ $i -lt 19 ]; do cat "$f" "$f" > "$f.2"; mv "$f.2" "$f"; i=$((i+1)); done; cat "$f"; rm -f "$f"`,
			want: strings.Repeat("a\uFFFD", exec.MaxReply/4) + exec.TruncatedSuffix},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd, _ := MustScript(t, tc.script)
			a := MustNew(t, exec.Config{Command: cmd})
			resp, err := a.Run(t.Context(), request(turn(1), "hi"))
			if err != nil {
				t.Fatalf("Run() error = %v, want nil", err)
			}
			if !utf8.ValidString(resp.Text) {
				t.Errorf("Run() = %q, not valid UTF-8", abbrev(resp.Text))
			}
			if resp.Text != tc.want {
				t.Errorf("Run() = %q (%d bytes), want %q (%d bytes)", abbrev(resp.Text), len(resp.Text), abbrev(tc.want), len(tc.want))
			}
		})
	}
}

// TestRunawayOutputIsStopped: a command that prints without end is stopped once it has
// written MaxOutput bytes, and its reply is the first MaxReply of them, cut as a long reply is.
// Before, the output was read and thrown away until the timeout, and the turn failed with "no
// reply" (found by an audit: 5 s of the daemon's CPU in an 8 s timeout).
func TestRunawayOutputIsStopped(t *testing.T) {
	cmd, _ := MustScript(t, `yes a`)
	a := MustNew(t, exec.Config{Command: cmd, Timeout: time.Minute})
	resp, err := a.Run(t.Context(), request(turn(1), "hi"))
	if err != nil {
		t.Fatalf("Run() error = %v, want the output's head", err)
	}
	if want := strings.Repeat("a\n", exec.MaxReply/2-1) + "a" + exec.TruncatedSuffix; resp.Text != want {
		t.Errorf("Run() = %q (%d bytes), want %q (%d bytes)", abbrev(resp.Text), len(resp.Text), abbrev(want), len(want))
	}
}

// TestRunawayStderrIsStopped: a command that prints to stderr without end is stopped once it
// has written MaxStderrRead bytes there, and its turn fails with the end of its stderr. Before,
// stderr was read and thrown away until the timeout (10 minutes by default), which took most
// of a core of the daemon for each such command, as stdout's did before MaxOutput.
func TestRunawayStderrIsStopped(t *testing.T) {
	cmd, _ := MustScript(t, `echo 'a reply that never comes'; yes 'still failing' >&2`)
	a := MustNew(t, exec.Config{Command: cmd, Timeout: time.Minute})
	resp, err := a.Run(t.Context(), request(turn(1), "hi"))
	if err == nil || errors.Is(err, exec.ErrTimeout) {
		t.Fatalf("Run() = %v, %v, want the command stopped for its stderr", resp, err)
	}
	for _, want := range []string{fmt.Sprintf("more than %d MiB on stderr", exec.MaxStderrRead>>20), "still failing\nstill failing"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run() error = %q, want it to hold %q", abbrev(err.Error()), want)
		}
	}
	if n := len(err.Error()); n > exec.MaxStderr+200 {
		t.Errorf("Run() error is %d bytes, want the end of stderr only (%d)", n, exec.MaxStderr)
	}
}

func abbrev(s string) string {
	if len(s) <= 80 {
		return s
	}
	return s[:40] + "..." + s[len(s)-40:]
}

func TestRunDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := MustNew(t, exec.Config{Command: []string{"/bin/sh", "-c", "pwd -P"}, Dir: dir})
	resp, err := a.Run(t.Context(), request(turn(1), "hi"))
	if err != nil {
		t.Fatalf("Run() error = %v, want nil", err)
	}
	want, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Text != want {
		t.Errorf("Run() in Dir %s = %q, want %q", dir, resp.Text, want)
	}
}

// stdinDoc is what a command reads on stdin.
type stdinDoc struct {
	Identity identity.Turn    `json:"identity"`
	Messages []agents.Message `json:"messages"`
	History  []agents.Message `json:"history"`
}

func TestRunStdin(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	var history []agents.Message
	for i := range 5 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		history = append(history, agents.Message{Role: role, Text: fmt.Sprintf("old %d", i), MessageID: fmt.Sprintf("h%d", i), At: at.Add(time.Duration(i) * time.Minute)})
	}
	messages := []agents.Message{
		{Role: "user", Text: "[Ann] first <b>&</b>\nline two", MessageID: "m1", At: at.Add(time.Hour)},
		{Role: "user", Text: "second", MessageID: "m2", At: at.Add(time.Hour + time.Second)},
	}
	tests := []struct {
		name        string
		history     int
		wantHistory []agents.Message
	}{
		{name: "no history", history: 0, wantHistory: []agents.Message{}},
		{name: "last two", history: 2, wantHistory: history[3:]},
		{name: "more than there is", history: 10, wantHistory: history},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd, _ := MustScript(t, `exec cat`)
			a := MustNew(t, exec.Config{Command: cmd, History: tc.history})
			req := &agents.Request{Identity: turn(7), Messages: messages, History: history}
			resp, err := a.Run(t.Context(), req)
			if err != nil {
				t.Fatalf("Run() error = %v, want nil", err)
			}
			var got stdinDoc
			if err := json.Unmarshal([]byte(resp.Text), &got); err != nil {
				t.Fatalf("stdin %q is not one JSON object: %v", resp.Text, err)
			}
			want := stdinDoc{Identity: turn(7), Messages: messages, History: tc.wantHistory}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("stdin mismatch (-want +got):\n%s", diff)
			}
			if !strings.Contains(resp.Text, `"history":[`) {
				t.Errorf("stdin = %s, want history as a JSON array", resp.Text)
			}
		})
	}
}

// TestRunEnv sets leaked AGENTGATE_* values in this process's environment, so it cannot run in
// parallel with other tests.
func TestRunEnv(t *testing.T) {
	t.Setenv("AGENTGATE_SESSION_KEY", "leaked")
	t.Setenv("AGENTGATE_FOO", "x")
	t.Setenv("EXECTEST_KEEP", "kept")
	cmd, _ := MustScript(t, `exec env`)
	a := MustNew(t, exec.Config{Command: cmd})
	for _, n := range []int{1, 2} { // Odd turns have every field, even ones have absent fields.
		t.Run(fmt.Sprintf("turn %d", n), func(t *testing.T) {
			id := turn(n)
			resp, err := a.Run(t.Context(), request(id, "hi"))
			if err != nil {
				t.Fatalf("Run() error = %v, want nil", err)
			}
			if diff := cmp.Diff(wantEnv(id), envMap(resp.Text)); diff != "" {
				t.Errorf("child AGENTGATE_* environment mismatch (-want +got):\n%s", diff)
			}
			if !strings.Contains("\n"+resp.Text+"\n", "\nEXECTEST_KEEP=kept\n") {
				t.Errorf("child environment = %q, want it to keep EXECTEST_KEEP=kept from the parent", resp.Text)
			}
		})
	}
	if got := os.Getenv("AGENTGATE_SESSION_KEY"); got != "leaked" {
		t.Errorf("after Run, parent AGENTGATE_SESSION_KEY = %q, want %q (Run must not touch the parent's environment)", got, "leaked")
	}
}

// TestRunConcurrentIdentity runs many turns of different sessions at once: each child must see
// exactly its own identity in its environment and on stdin (DESIGN G1). It sets leaked
// AGENTGATE_* values in this process's environment, so it cannot run in parallel.
func TestRunConcurrentIdentity(t *testing.T) {
	t.Setenv("AGENTGATE_SESSION_KEY", "leaked")
	t.Setenv("AGENTGATE_USER_ID", "leaked")
	const n = 50
	cmd, _ := MustScript(t, "env\necho ---stdin---\nexec cat")
	a := MustNew(t, exec.Config{Command: cmd, Timeout: 2 * pollTimeout})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := turn(i)
			resp, err := a.Run(t.Context(), request(id, fmt.Sprintf("message %d", i)))
			if err != nil {
				t.Errorf("turn %d: Run() error = %v, want nil", i, err)
				return
			}
			env, stdin, ok := strings.Cut(resp.Text, "---stdin---\n")
			if !ok {
				t.Errorf("turn %d: output %q has no stdin marker", i, resp.Text)
				return
			}
			if diff := cmp.Diff(wantEnv(id), envMap(env)); diff != "" {
				t.Errorf("turn %d: child AGENTGATE_* environment mismatch (-want +got):\n%s", i, diff)
			}
			var got stdinDoc
			if err := json.Unmarshal([]byte(stdin), &got); err != nil {
				t.Errorf("turn %d: stdin %q: %v", i, stdin, err)
				return
			}
			if got.Identity != id {
				t.Errorf("turn %d: stdin identity = %+v, want %+v", i, got.Identity, id)
			}
			if len(got.Messages) != 1 || got.Messages[0].Text != fmt.Sprintf("message %d", i) {
				t.Errorf("turn %d: stdin messages = %+v, want [message %d]", i, got.Messages, i)
			}
		})
	}
	wg.Wait()
}

func TestRunExitError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		script     string
		wantCode   int
		wantSignal syscall.Signal
		wantMsg    string // what the error says of how the command ended
		wantStderr func(string) bool
		describe   string
	}{
		{
			name:       "exit status and stderr",
			script:     "echo partial reply\necho 'oops: bad input' >&2\nexit 3",
			wantCode:   3,
			wantMsg:    "exit status 3: oops: bad input",
			wantStderr: func(s string) bool { return s == "oops: bad input\n" },
			describe:   `"oops: bad input\n"`,
		},
		{
			// It said "exit status 137", which reads as the command's own exit.
			name:       "killed by a signal",
			script:     "kill -KILL $$",
			wantCode:   128 + int(syscall.SIGKILL),
			wantSignal: syscall.SIGKILL,
			wantMsg:    "killed by signal 9 (SIGKILL)",
			wantStderr: func(s string) bool { return s == "" },
			describe:   "empty",
		},
		{
			name:       "killed by a signal, after stderr",
			script:     "echo 'segfault ahead' >&2; kill -SEGV $$",
			wantCode:   128 + int(syscall.SIGSEGV),
			wantSignal: syscall.SIGSEGV,
			wantMsg:    "killed by signal 11 (SIGSEGV): segfault ahead",
			wantStderr: func(s string) bool { return s == "segfault ahead\n" },
			describe:   `"segfault ahead\n"`,
		},
		{
			// A shell's report of a child it ran that a signal killed: an exit, as it says.
			name:       "a shell that exits 128 plus a signal's number",
			script:     "exit 137",
			wantCode:   137,
			wantMsg:    "exit status 137",
			wantStderr: func(s string) bool { return s == "" },
			describe:   "empty",
		},
		{
			name:     "stderr keeps the last bytes",
			script:   "head -c 10000 /dev/zero | tr '\\0' x >&2\necho END >&2\nexit 1",
			wantCode: 1,
			wantMsg:  "exit status 1: [first ",
			wantStderr: func(s string) bool {
				note := fmt.Sprintf("[first %d bytes cut] ", 10004-exec.MaxStderrLogged)
				return s == note+strings.Repeat("x", exec.MaxStderrLogged-4)+"END\n"
			},
			describe: fmt.Sprintf("its last %d bytes, ending in END, after a note of the rest", exec.MaxStderrLogged),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd, _ := MustScript(t, tc.script)
			a := MustNew(t, exec.Config{Command: cmd})
			resp, err := a.Run(t.Context(), request(turn(1), "hi"))
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("Run() = %v, %v; want an error wrapping *ExitError", resp, err)
			}
			if ee.Code != tc.wantCode || ee.Signal != tc.wantSignal {
				t.Errorf("ExitError.Code, Signal = %d, %v; want %d, %v", ee.Code, ee.Signal, tc.wantCode, tc.wantSignal)
			}
			if !tc.wantStderr(ee.Stderr) {
				t.Errorf("ExitError.Stderr = %q, want %s", abbrev(ee.Stderr), tc.describe)
			}
			if want := "exec agent: run /bin/sh: " + tc.wantMsg; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Run() error = %q, want it to begin %q", abbrev(err.Error()), want)
			}
			if errors.Is(err, exec.ErrTimeout) || errors.Is(err, context.Canceled) {
				t.Errorf("Run() error = %v, want neither a timeout nor a cancel", err)
			}
		})
	}
}

// TestRunStartError: a command that was there when the agent was made (New checks) and is
// gone by the turn fails the turn, and is no exit of the command; Ready says so.
func TestRunStartError(t *testing.T) {
	t.Parallel()
	a := MustNewGone(t, exec.Config{})
	resp, err := a.Run(t.Context(), request(turn(1), "hi"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Run(missing command) = %v, %v; want an error wrapping fs.ErrNotExist", resp, err)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Errorf("Run(missing command) error = %v, want no *ExitError", err)
	}
	if err := a.Ready(); err == nil || !strings.Contains(err.Error(), "does not exist; every turn fails (since ") {
		t.Errorf("Ready() with the command gone = %v, want it does not exist; every turn fails (since …)", err)
	}
}

func TestRunBadRequest(t *testing.T) {
	t.Parallel()
	cmd, dir := MustScript(t, `touch "$1/ran"`)
	a := MustNew(t, exec.Config{Command: cmd})
	bad := turn(1)
	bad.UserName = "nul\x00name"
	tests := []struct {
		name string
		req  *agents.Request
	}{
		{name: "nil request", req: nil},
		{name: "NUL in identity", req: request(bad, "hi")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if resp, err := a.Run(t.Context(), tc.req); err == nil {
				t.Errorf("Run() = %v, nil; want an error", resp)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Errorf("command ran for a bad request, want it not started")
	}
}

func TestRunCancelledBeforeStart(t *testing.T) {
	t.Parallel()
	cmd, dir := MustScript(t, `touch "$1/ran"`)
	a := MustNew(t, exec.Config{Command: cmd})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	resp, err := a.Run(ctx, request(turn(1), "hi"))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run(cancelled ctx) = %v, %v; want an error wrapping context.Canceled", resp, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Errorf("command ran with a cancelled ctx, want it not started")
	}
}

// TestTimeoutLogsStderr: a command that times out has its stderr logged: what it was stuck on
// is what an operator needs to see.
func TestTimeoutLogsStderr(t *testing.T) {
	t.Parallel()
	var logs testutil.Buffer
	cmd, _ := MustScript(t, "echo 'waiting for the lock on /var/x' >&2\nexec sleep 60")
	// A timeout the shell's echo comes well before, on a loaded machine too (200 ms is short
	// there for a shell to start): the test is about the log, not the timeout.
	a := MustNew(t, exec.Config{Command: cmd, Timeout: 2 * time.Second, KillGrace: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if _, err := a.Run(t.Context(), request(turn(1), "hi")); !errors.Is(err, exec.ErrTimeout) {
		t.Fatalf("Run() error = %v, want ErrTimeout", err)
	}
	if !strings.Contains(logs.String(), "waiting for the lock on /var/x") {
		t.Errorf("log after a timeout lacks the command's stderr:\n%s", logs.String())
	}
	// It names the turn, as the turn's failure does: the two lines are found together.
	if !strings.Contains(logs.String(), "turn="+turn(1).TurnID) {
		t.Errorf("log after a timeout does not name turn %s:\n%s", turn(1).TurnID, logs.String())
	}
}

// TestFailureShowsStdout: a command that exits non-zero, or outlives its timeout, has the end
// of what it printed on stdout in the log at Debug (it may be the reply, a message body, which
// no line above Debug holds), bounded, with the daemon's own secrets and key-like strings
// redacted, and its stderr in the error. Before, stdout was not logged at all: a command that
// reports its trouble on stdout (most scripts do) failed without a trace of why.
func TestFailureShowsStdout(t *testing.T) {
	t.Setenv("EXECTEST_BOT_TOKEN", "MTA5.the-daemons-bot-token.xyz")
	const secrets = `echo "token MTA5.the-daemons-bot-token.xyz"; echo "Authorization: Bearer abc.def-123"; echo "Bearer MTA5.the-daemons-bot-token.xyz"; echo "key sk-proj-0123456789abcdef"; ` +
		`echo "proxy-authorization: basic dXNlcjpodW50ZXIy"; echo "dial postgres://agent:hunter2-pw@db/agentgate: refused"`
	long := "head -c 10000 /dev/zero | tr '\\0' x; echo; "
	tests := []struct {
		name    string
		script  string
		timeout time.Duration
		want    []string // in the log
		notWant []string // nowhere in the log
		stdout  string   // printed on stdout only: in no line above Debug
	}{
		{
			name:   "non-zero exit",
			script: "echo 'step 1 ok'\necho 'step 2: cannot reach api.example.com'\necho 'oops' >&2\nexit 3",
			want:   []string{"exit status 3: oops", "step 2: cannot reach api.example.com"},
			stdout: "step 2: cannot reach",
		},
		{
			name:    "timeout",
			script:  "echo 'waiting for the model server'\necho 'stuck' >&2\nexec sleep 60",
			timeout: 2 * time.Second,
			want:    []string{"waiting for the model server", "stuck"},
			stdout:  "waiting for the model server",
		},
		{
			name:   "secrets redacted",
			script: secrets + "\n" + secrets + " >&2\nexit 1",
			want:   []string{"[redacted]", "postgres://agent:[redacted]@db/agentgate"},
			// "[redacted]]": a withheld value after Bearer, taken for a token once more.
			notWant: []string{"the-daemons-bot-token", "abc.def-123", "0123456789abcdef", "dXNlcjpodW50ZXIy", "hunter2-pw", "[redacted]]"},
		},
		{
			name:    "the end of a long stdout",
			script:  long + "echo 'the last line'\nexit 1",
			want:    []string{"the last line"},
			notWant: []string{strings.Repeat("x", exec.MaxStdoutLogged)},
			stdout:  "the last line",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs testutil.Buffer
			cmd, _ := MustScript(t, tc.script)
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			a := MustNew(t, exec.Config{Command: cmd, Timeout: tc.timeout, KillGrace: 100 * time.Millisecond,
				Withhold: []string{"EXECTEST_BOT_TOKEN"}, Logger: log})
			_, err := a.Run(t.Context(), request(turn(1), "hi"))
			if err == nil {
				t.Fatal("Run() error = nil, want the command's failure")
			}
			// The caller logs the error as the turn's failure ("turn failed").
			log.Warn("turn failed", "err", err)
			got := logs.String()
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("log after the failure lacks %q:\n%s", w, got)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(got, w) {
					t.Errorf("log after the failure holds %q:\n%s", abbrev(w), abbrev(got))
				}
			}
			for line := range strings.Lines(got) {
				if tc.stdout != "" && strings.Contains(line, tc.stdout) && !strings.Contains(line, "level=DEBUG") {
					t.Errorf("stdout in a line above Debug: %s", abbrev(line))
				}
			}
		})
	}
}

// TestSuccessfulStderrAtDebugDropsACutSecret: the stderr a command that succeeded leaves at
// Debug is redacted as a failure's is, the cut end of a withheld value at its start included
// (before, only whole values were: a review's finding).
func TestSuccessfulStderrAtDebugDropsACutSecret(t *testing.T) {
	const secret = "MTA5.the-daemons-bot-token.xyz"
	t.Setenv("EXECTEST_BOT_TOKEN", secret)
	// The tail of stderr begins 12 bytes into the secret: its end, 18 bytes, then filler.
	filler := exec.MaxStderr - (len(secret) - 12)
	script := fmt.Sprintf("printf '%%s' %s >&2; head -c %d /dev/zero | tr '\\0' y >&2; echo ok", secret, filler)
	var logs testutil.Buffer
	cmd, _ := MustScript(t, script)
	a := MustNew(t, exec.Config{Command: cmd, Withhold: []string{"EXECTEST_BOT_TOKEN"},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if _, err := a.Run(t.Context(), request(turn(1), "hi")); err != nil {
		t.Fatal(err)
	}
	got := logs.String()
	if !strings.Contains(got, "exec agent stderr") {
		t.Fatalf("no stderr line at Debug:\n%s", abbrev(got))
	}
	if end := secret[12:]; strings.Contains(got, end) {
		t.Errorf("the Debug log holds the cut end of a withheld value, %q:\n%s", end, abbrev(got))
	}
}
