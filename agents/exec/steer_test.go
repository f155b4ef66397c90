package exec_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/exec"
)

// These tests run commands with steering (Config.Steer and a Request.Steer channel): steered
// messages reach stdin as lines after the input object, a command that stops reading never
// blocks Run, and without steering stdin still closes after the input object.

func TestCanSteer(t *testing.T) {
	t.Parallel()
	for _, steer := range []bool{false, true} {
		t.Run(fmt.Sprintf("steer %t", steer), func(t *testing.T) {
			t.Parallel()
			a := MustNew(t, exec.Config{Command: []string{"/bin/true"}, Steer: steer})
			if got := a.CanSteer(); got != steer {
				t.Errorf("CanSteer() = %t, want %t", got, steer)
			}
			if got := agents.CanSteer(a); got != steer {
				t.Errorf("agents.CanSteer(exec agent) = %t, want %t", got, steer)
			}
		})
	}
}

// steerDoc is one steer line on stdin.
type steerDoc struct {
	Steer agents.Message `json:"steer"`
}

// mustStdinLines splits a reply that echoed stdin into its lines and checks that the first
// is the input object for req.
func mustStdinLines(t *testing.T, reply string, req *agents.Request) []string {
	t.Helper()
	lines := strings.Split(reply, "\n")
	var got stdinDoc
	if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
		t.Fatalf("first stdin line %q is not the input object: %v", lines[0], err)
	}
	want := stdinDoc{Identity: req.Identity, Messages: req.Messages, History: []agents.Message{}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("first stdin line mismatch (-want +got):\n%s", diff)
	}
	return lines
}

// mustSend sends m on ch, failing the test if no one receives it in time.
func mustSend(t *testing.T, ch chan<- agents.Message, m agents.Message) {
	t.Helper()
	select {
	case ch <- m:
	case <-time.After(pollTimeout):
		t.Fatalf("steered message %q not received within %v", m.MessageID, pollTimeout)
	}
}

func TestRunSteer(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	steered := []agents.Message{
		{Role: "user", Text: "[Ann] wait, <b>&</b>\nuse the other file", MessageID: "m2", At: at},
		{Role: "user", Text: `and quote "this" \ too`, MessageID: "m3", At: at.Add(time.Second)},
	}
	tests := []struct {
		name string
		// script echoes the stdin lines it reads.
		script string
		// closeFirst queues the steered messages and closes the channel before Run; otherwise
		// they are sent while the command runs and the channel is closed after Run returns.
		closeFirst bool
	}{
		{
			name: "command reads until it has what it needs",
			script: `
n=0
while IFS= read -r line; do
	printf '%s\n' "$line"
	n=$((n+1))
	if [ "$n" -eq 3 ]; then exit 0; fi
done
echo "stdin closed after $n lines" >&2
exit 1`,
		},
		{name: "closed channel closes stdin", script: `exec cat`, closeFirst: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd, _ := MustScript(t, tc.script)
			a := MustNew(t, exec.Config{Command: cmd, Steer: true})
			req := request(turn(3), "first")
			var r result
			if tc.closeFirst {
				steer := make(chan agents.Message, len(steered))
				for _, m := range steered {
					steer <- m
				}
				close(steer)
				req.Steer = steer
				r = mustResult(t, runAsync(t.Context(), a, req))
			} else {
				steer := make(chan agents.Message)
				req.Steer = steer
				done := runAsync(t.Context(), a, req)
				for _, m := range steered {
					mustSend(t, steer, m)
				}
				r = mustResult(t, done)
				close(steer) // The caller closes the channel after the turn.
			}
			if r.err != nil {
				t.Fatalf("Run() error = %v, want nil", r.err)
			}
			lines := mustStdinLines(t, r.resp.Text, req)
			if got, want := len(lines), 1+len(steered); got != want {
				t.Fatalf("command read %d stdin lines %q, want %d", got, lines, want)
			}
			for i, m := range steered {
				line := lines[1+i]
				var got steerDoc
				if err := json.Unmarshal([]byte(line), &got); err != nil {
					t.Fatalf("stdin line %d %q is not a steer object: %v", 2+i, line, err)
				}
				if diff := cmp.Diff(steerDoc{Steer: m}, got); diff != "" {
					t.Errorf("stdin line %d mismatch (-want +got):\n%s", 2+i, diff)
				}
				want, err := exec.EncodeSteer(m)
				if err != nil {
					t.Fatal(err)
				}
				if line+"\n" != string(want) {
					t.Errorf("stdin line %d = %s, want EncodeSteer's %s", 2+i, line, want)
				}
			}
			if !strings.Contains(lines[1], `<b>&</b>`) {
				t.Errorf("stdin line 2 = %s, want HTML characters unescaped", lines[1])
			}
		})
	}
}

// sender offers steered messages of one size on an unbuffered channel, as a session does,
// until stopped. Its goroutine is owned by the test that starts it.
type sender struct {
	ch       chan agents.Message
	received atomic.Int64
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
}

// startSender starts a sender of messages of size bytes; it is stopped at the end of the test.
func startSender(t *testing.T, size int) *sender {
	t.Helper()
	s := &sender{ch: make(chan agents.Message), stop: make(chan struct{}), done: make(chan struct{})}
	text := strings.Repeat("s", size)
	go func() {
		defer close(s.done)
		for i := 0; ; i++ {
			m := agents.Message{Role: "user", Text: text, MessageID: fmt.Sprintf("s%d", i)}
			select {
			case s.ch <- m:
				s.received.Add(1)
			case <-s.stop:
				return
			}
		}
	}()
	t.Cleanup(s.Stop)
	return s
}

// Stop ends the sender and waits for its goroutine.
func (s *sender) Stop() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

// TestRunSteerNotRead runs commands that stop reading stdin while steered messages keep coming
// on a channel that is never closed: Run must return as soon as the command is done, and
// nothing of Run may receive from the channel afterwards. The kill grace is an hour: a Run
// that waited for it (for stdin's forwarder, or for a process holding a pipe) meets
// mustResult's watchdog and fails, and none of it is timed.
func TestRunSteerNotRead(t *testing.T) {
	t.Parallel()
	const (
		grace = time.Hour
		// size makes one steer line larger than a pipe's buffer, so the forwarding write
		// blocks until the command is gone.
		size = 128 << 10
	)
	tests := []struct {
		name   string
		script string
		// cancel cancels the turn once a steered message was received, and wants
		// context.Canceled; otherwise Run must return the reply.
		cancel  bool
		want    string
		pidFile string // a process Run must leave gone
		// idle sends nothing: the forwarder waits on the channel, not on a write.
		idle bool
	}{
		{
			name:   "command exits while the channel is idle",
			script: `IFS= read -r line; echo got input`,
			want:   "got input",
			idle:   true,
		},
		{
			name:   "command exits after the input line",
			script: `IFS= read -r line; echo got input`,
			want:   "got input",
		},
		{
			name: "grandchild holds stdin without reading",
			script: `
exec 3<&0
sh -c 'echo $$ > "$1/child.tmp"; mv "$1/child.tmp" "$1/child.pid"; exec sleep 100' sh "$1" <&3 >/dev/null 2>&1 &
exec 3<&-
while [ ! -e "$1/child.pid" ]; do sleep 0.01; done
IFS= read -r line
echo got input`,
			want:    "got input",
			pidFile: "child.pid",
		},
		{
			name:    "cancel while stdin is full",
			script:  `IFS= read -r line; echo $$ > "$1/pid.tmp"; mv "$1/pid.tmp" "$1/pid"; exec sleep 100`,
			cancel:  true,
			pidFile: "pid",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd, dir := MustScript(t, tc.script)
			a := MustNew(t, exec.Config{Command: cmd, Steer: true, KillGrace: grace})
			s := startSender(t, size)
			if tc.idle {
				s.Stop()
			}
			req := request(turn(1), "hi")
			req.Steer = s.ch
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := runAsync(ctx, a, req)
			if tc.cancel {
				waitFor(t, "a steered message to be received", func() bool { return s.received.Load() > 0 })
				MustReadPID(t, filepath.Join(dir, tc.pidFile))
				cancel()
			}
			r := mustResult(t, done)
			switch {
			case tc.cancel && !errors.Is(r.err, context.Canceled):
				t.Errorf("Run() after cancel = %v, %v; want an error wrapping context.Canceled", r.resp, r.err)
			case !tc.cancel && r.err != nil:
				t.Errorf("Run() error = %v, want nil", r.err)
			case !tc.cancel && r.resp.Text != tc.want:
				t.Errorf("Run() = %q, want %q", r.resp.Text, tc.want)
			}
			// Run waits for its forwarding goroutine, so no one may take a message now.
			s.Stop()
			select {
			case s.ch <- agents.Message{Role: "user", Text: "late", MessageID: "late"}:
				t.Errorf("after Run returned, someone received a steered message; want Run's goroutines gone")
			case <-time.After(50 * time.Millisecond):
			}
			if tc.pidFile != "" {
				waitGone(t, tc.pidFile, MustReadPID(t, filepath.Join(dir, tc.pidFile)))
			}
		})
	}
}

// TestRunNoSteer checks that without steering stdin closes after the input object, so a
// command reading to EOF ends, and that the steer channel is not read.
func TestRunNoSteer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		steer   bool
		channel bool
	}{
		{name: "steer off with a channel", steer: false, channel: true},
		{name: "steer on without a channel", steer: true, channel: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd, _ := MustScript(t, `exec cat`)
			a := MustNew(t, exec.Config{Command: cmd, Steer: tc.steer})
			req := request(turn(2), "hi")
			steer := make(chan agents.Message, 1)
			steer <- agents.Message{Role: "user", Text: "not for this command", MessageID: "m2"}
			if tc.channel {
				req.Steer = steer // Never closed: stdin must close without it.
			}
			r := mustResult(t, runAsync(t.Context(), a, req))
			if r.err != nil {
				t.Fatalf("Run() error = %v, want nil", r.err)
			}
			if lines := mustStdinLines(t, r.resp.Text, req); len(lines) != 1 {
				t.Errorf("command read %d stdin lines %q, want only the input object", len(lines), lines)
			}
			if got := len(steer); got != 1 {
				t.Errorf("after Run, steer channel holds %d messages, want 1 (not read)", got)
			}
		})
	}
}

// TestRunSteerUnseen: a steered message the command never read (it answered and exited
// without reading further lines, or had exited already while what it started still held its
// pipes) is counted in Response.Unseen, so that the session runs it as the next turn; before,
// the agent took it and it counted as answered by a reply that never saw it.
func TestRunSteerUnseen(t *testing.T) {
	t.Parallel()
	// Each script writes "ready" once it has read what it reads, and exits when "go" exists.
	const awaitGo = `touch "$1/ready"; while [ ! -e "$1/go" ]; do sleep 0.01; done`
	tests := []struct {
		name   string
		script string
		// steerBefore is sent before the command is ready, steerAfter once it is; afterExit
		// is sent after the command itself has exited (what it started holds its pipes).
		steerBefore, steerAfter, afterExit int
		want                               int
	}{
		{
			name:        "each steered line read",
			script:      `IFS= read -r line; IFS= read -r line; ` + awaitGo + `; echo answer`,
			steerBefore: 1,
			want:        0,
		},
		{
			name:        "answered without reading the later lines",
			script:      `IFS= read -r line; IFS= read -r line; ` + awaitGo + `; echo answer`,
			steerBefore: 1,
			steerAfter:  2,
			want:        2,
		},
		{
			name:       "sent after the command exited",
			script:     `IFS= read -r line; sleep 100 & ` + awaitGo + `; echo $$ > "$1/pid.tmp"; mv "$1/pid.tmp" "$1/pid"; echo answer`,
			steerAfter: 1,
			afterExit:  1,
			want:       2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd, dir := MustScript(t, tc.script)
			a := MustNew(t, exec.Config{Command: cmd, Steer: true, KillGrace: 3 * time.Second})
			steer := make(chan agents.Message)
			defer close(steer)
			req := request(turn(1), "hi")
			req.Steer = steer
			done := runAsync(t.Context(), a, req)
			n := 0
			send := func(count int) {
				for range count {
					n++
					steer <- agents.Message{Role: "user", Text: fmt.Sprintf("steer %d", n), MessageID: fmt.Sprintf("m%d", n)}
				}
			}
			send(tc.steerBefore)
			waitFor(t, "the command to be ready", func() bool { _, err := os.Stat(filepath.Join(dir, "ready")); return err == nil })
			send(tc.steerAfter)
			if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.afterExit > 0 {
				waitGone(t, "the command", MustReadPID(t, filepath.Join(dir, "pid")))
				send(tc.afterExit)
			}
			r := mustResult(t, done)
			if r.err != nil || r.resp.Text != "answer" {
				t.Fatalf("Run() = %+v, %v; want the answer", r.resp, r.err)
			}
			if r.resp.Unseen != tc.want {
				t.Errorf("Run() Unseen = %d, want %d", r.resp.Unseen, tc.want)
			}
		})
	}
}

// TestRunSteerUnencodable: a steered message that cannot be written as JSON (a time outside
// years 0-9999, which only a caller's clock makes) ends the turn's messages: stdin closes before
// it, it counts unseen (Response.Unseen counts the last messages the agent took), and those
// after it are not taken, so that it and they run next, each as a turn of its own. Before, it
// was skipped and the next one written: the command saw that one, yet Unseen counted it (the
// last taken) unseen and the skipped one seen, to run again and never run.
func TestRunSteerUnencodable(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	steered := []agents.Message{
		{Role: "user", Text: "first steer", MessageID: "m2", At: at},
		{Role: "user", Text: "from year 10000", MessageID: "m3", At: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Role: "user", Text: "after it", MessageID: "m4", At: at},
	}
	if _, err := exec.EncodeSteer(steered[1]); err == nil {
		t.Fatalf("EncodeSteer(%v) = nil error, want one", steered[1].At)
	}
	cmd, _ := MustScript(t, `exec cat`)
	a := MustNew(t, exec.Config{Command: cmd, Steer: true})
	steer := make(chan agents.Message, len(steered))
	for _, m := range steered {
		steer <- m
	}
	close(steer)
	req := request(turn(3), "first")
	req.Steer = steer
	r := mustResult(t, runAsync(t.Context(), a, req))
	if r.err != nil {
		t.Fatalf("Run() error = %v, want nil", r.err)
	}
	lines := mustStdinLines(t, r.resp.Text, req)
	want, err := exec.EncodeSteer(steered[0])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{strings.TrimSuffix(string(want), "\n")}, lines[1:]); diff != "" {
		t.Errorf("steer lines the command read mismatch (-want +got):\n%s", diff)
	}
	if r.resp.Unseen != 1 {
		t.Errorf("Run() Unseen = %d, want 1 (m3)", r.resp.Unseen)
	}
	if got := len(steer); got != 1 {
		t.Errorf("after Run, steer channel holds %d messages, want 1 (m4, not taken)", got)
	}
}

// TestRunSteerUnseenWhenStopped checks that the steered messages a command left wholly unread
// are counted unseen also when Run stopped it: at its timeout, or for its output. Run closes
// stdin then, and measured nothing afterwards, so they counted as seen and failed with the turn
// (a soak: a message steered into a hung turn was told the agent took too long, though it
// never saw it) instead of running as the next turn.
func TestRunSteerUnseenWhenStopped(t *testing.T) {
	t.Parallel()
	const ready = `IFS= read -r line; touch "$1/ready"; `
	tests := []struct {
		name    string
		script  string
		timeout time.Duration
		wantErr error // nil: the reply is the output's head
	}{
		{name: "timed out", script: ready + `exec sleep 100`, timeout: 2 * time.Second, wantErr: exec.ErrTimeout},
		{name: "wrote more than agentgate reads", script: ready + `while [ ! -e "$1/go" ]; do sleep 0.01; done; exec yes`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd, dir := MustScript(t, tc.script)
			a := MustNew(t, exec.Config{Command: cmd, Steer: true, Timeout: tc.timeout, KillGrace: 3 * time.Second})
			steer := make(chan agents.Message)
			defer close(steer)
			req := request(turn(1), "hi")
			req.Steer = steer
			done := runAsync(t.Context(), a, req)
			waitFor(t, "the command to be ready", func() bool { _, err := os.Stat(filepath.Join(dir, "ready")); return err == nil })
			for i := range 2 {
				steer <- agents.Message{Role: "user", Text: fmt.Sprintf("steer %d", i), MessageID: fmt.Sprintf("m%d", i)}
			}
			if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			r := mustResult(t, done)
			if !errors.Is(r.err, tc.wantErr) || tc.wantErr == nil && r.err != nil {
				t.Fatalf("Run() error = %v, want %v", r.err, tc.wantErr)
			}
			unseen := 0
			if r.resp != nil {
				unseen = r.resp.Unseen
			}
			if unseen != 2 {
				t.Errorf("Run() Unseen = %d, want 2: the command read none of the steered lines", unseen)
			}
		})
	}
}
