package exec_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/internal/testutil"
)

// These tests stop commands: by timeout, by cancel with SIGTERM handled, ignored, or ignored
// by a grandchild holding stdout, and by a command leaving a process behind when it exits.
// Each checks what the command saw and that no process of it survives. None asserts how long
// Run took: Run is awaited under mustResult's watchdog (2*pollTimeout, 30 s), which fails a
// Run that does not return; where Run must not wait out the kill grace, the grace is an hour,
// so such a wait meets the watchdog.
//
// The one bound of real time left is TestRunCancelKill's: the SIGKILL of a command that
// ignores SIGTERM comes after the grace, a real timer for a real process. It is a lower bound
// taken from before the cancel that arms the timer, and Go's timers run on the monotonic clock
// and never fire early, so a loaded machine can only make Run later, never fail it.

func TestRunTimeout(t *testing.T) {
	t.Parallel()
	cmd, dir := MustScript(t, `echo $$ > "$1/pid.tmp"; mv "$1/pid.tmp" "$1/pid"; exec sleep 100`)
	// The timeout leaves sh a second to start and write its pid on a loaded machine.
	a := MustNew(t, exec.Config{Command: cmd, Timeout: time.Second, KillGrace: 200 * time.Millisecond})
	r := mustResult(t, runAsync(t.Context(), a, request(turn(1), "hi")))
	resp, err := r.resp, r.err
	if !errors.Is(err, exec.ErrTimeout) {
		t.Errorf("Run(slow command) = %v, %v; want an error wrapping ErrTimeout", resp, err)
	} else if msg := err.Error(); !strings.HasPrefix(msg, "exec agent: timed out: run ") || strings.Count(msg, "exec agent") != 1 ||
		!strings.HasSuffix(msg, "no reply within 1s (agent.exec.timeout)") {
		// It said "exec agent: run …: no reply within 1s: exec agent: timed out", naming no setting.
		t.Errorf("Run(slow command) error = %q, want it to say once that it timed out, and the setting", msg)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run(slow command) error = %v, want no context error (the caller's ctx is alive)", err)
	}
	// The user is told it timed out, not to try again (which would most likely time out too).
	const notice = "it took longer than its time limit (1s) and was stopped"
	if ref, ok := errors.AsType[*agents.Refusal](err); !ok || ref.Notice != notice || ref.Declined {
		t.Errorf("Run(slow command) error = %#v, want an agents.Refusal with the notice %q, not declined", err, notice)
	}
	waitGone(t, "timed out command", MustReadPID(t, filepath.Join(dir, "pid")))
}

// TestRunCancelTerm cancels a command that handles SIGTERM: it must get the signal and Run
// must return as soon as it exits, without waiting for the grace period (an hour here, which
// mustResult's watchdog would meet) or sending SIGKILL.
func TestRunCancelTerm(t *testing.T) {
	t.Parallel()
	cmd, dir := MustScript(t, `
trap 'echo term > "$1/term.tmp"; mv "$1/term.tmp" "$1/term"; exit 0' TERM
sleep 100 &
echo $! > "$1/child.tmp"; mv "$1/child.tmp" "$1/child.pid"
echo $$ > "$1/pid.tmp"; mv "$1/pid.tmp" "$1/pid"
wait`)
	logs := &testutil.Buffer{}
	a := MustNew(t, exec.Config{Command: cmd, KillGrace: time.Hour, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := runAsync(ctx, a, request(turn(1), "hi"))
	pid := MustReadPID(t, filepath.Join(dir, "pid"))
	child := MustReadPID(t, filepath.Join(dir, "child.pid"))

	cancel()
	r := mustResult(t, done)
	if !errors.Is(r.err, context.Canceled) {
		t.Errorf("Run() after cancel = %v, %v; want an error wrapping context.Canceled", r.resp, r.err)
	}
	if strings.Contains(logs.String(), "killed process group after grace period") {
		t.Errorf("the command that exited at its SIGTERM was killed after the grace period: %s", logs)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "term")); err != nil || string(b) != "term\n" {
		t.Errorf("TERM trap marker = %q, %v; want %q (SIGTERM delivered)", b, err, "term\n")
	}
	waitGone(t, "command", pid)
	waitGone(t, "background child", child)
}

// TestRunCancelKill cancels a command that does not end at SIGTERM: it records the SIGTERM it
// gets and runs on, and its child ignores it; the whole group must get SIGKILL once the grace
// period has passed, and not before.
func TestRunCancelKill(t *testing.T) {
	t.Parallel()
	// The child ignores SIGTERM (an ignored signal stays so across fork and exec); the shell
	// then records each SIGTERM it gets, and waits on.
	cmd, dir := MustScript(t, `
trap '' TERM
sleep 100 &
echo $! > "$1/child.tmp"; mv "$1/child.tmp" "$1/child.pid"
trap 'echo TERM >> "$1/signals"' TERM
echo $$ > "$1/pid.tmp"; mv "$1/pid.tmp" "$1/pid"
while :; do wait; done`)
	const grace = 200 * time.Millisecond
	a := MustNew(t, exec.Config{Command: cmd, KillGrace: grace})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := runAsync(ctx, a, request(turn(1), "hi"))
	pid := MustReadPID(t, filepath.Join(dir, "pid"))
	child := MustReadPID(t, filepath.Join(dir, "child.pid"))

	start := time.Now()
	cancel()
	r := mustResult(t, done)
	elapsed := time.Since(start)
	if !errors.Is(r.err, context.Canceled) {
		t.Errorf("Run() after cancel = %v, %v; want an error wrapping context.Canceled", r.resp, r.err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "signals")); err != nil || string(b) != "TERM\n" {
		t.Errorf("signals the command recorded = %q, %v; want one SIGTERM (then SIGKILL, which it cannot record)", b, err)
	}
	// A lower bound, which cannot flake: see the file's comment.
	if elapsed < grace {
		t.Errorf("Run() returned %v after cancel, want the SIGKILL after the %v grace period, not before", elapsed, grace)
	}
	waitGone(t, "command ignoring SIGTERM", pid)
	waitGone(t, "child ignoring SIGTERM", child)
}

// TestRunCancelGrandchild cancels a command whose grandchild ignores SIGTERM and holds stdout
// open after the command itself has died: Run must still return after the grace period, and
// the grandchild must be killed.
func TestRunCancelGrandchild(t *testing.T) {
	t.Parallel()
	cmd, dir := MustScript(t, `
sh -c 'trap "" TERM; echo $$ > "$1/child.tmp"; mv "$1/child.tmp" "$1/child.pid"; exec sleep 100' sh "$1" &
echo $$ > "$1/pid.tmp"; mv "$1/pid.tmp" "$1/pid"
wait`)
	const grace = 200 * time.Millisecond
	a := MustNew(t, exec.Config{Command: cmd, KillGrace: grace})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := runAsync(ctx, a, request(turn(1), "hi"))
	pid := MustReadPID(t, filepath.Join(dir, "pid"))
	child := MustReadPID(t, filepath.Join(dir, "child.pid"))

	cancel()
	r := mustResult(t, done)
	if !errors.Is(r.err, context.Canceled) {
		t.Errorf("Run() after cancel = %v, %v; want an error wrapping context.Canceled", r.resp, r.err)
	}
	waitGone(t, "command", pid)
	waitGone(t, "grandchild holding stdout", child)
}

// TestRunLeftoverAfterExit runs a command that exits successfully but leaves a background
// process holding stdout: Run returns the reply after the grace period and kills the leftover.
func TestRunLeftoverAfterExit(t *testing.T) {
	t.Parallel()
	cmd, dir := MustScript(t, `
sh -c 'echo $$ > "$1/child.tmp"; mv "$1/child.tmp" "$1/child.pid"; exec sleep 100' sh "$1" &
while [ ! -e "$1/child.pid" ]; do sleep 0.01; done
echo done`)
	logs := &testutil.Buffer{}
	a := MustNew(t, exec.Config{Command: cmd, KillGrace: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	r := mustResult(t, runAsync(t.Context(), a, request(turn(1), "hi")))
	if r.err != nil {
		t.Fatalf("Run() error = %v, want nil", r.err)
	}
	if r.resp.Text != "done" {
		t.Errorf("Run() = %q, want %q", r.resp.Text, "done")
	}
	if !strings.Contains(logs.String(), "exec agent closed output held open after exit") {
		t.Errorf("Run() logged %q, want it to say it closed the output a leftover held open", logs)
	}
	waitGone(t, "leftover background process", MustReadPID(t, filepath.Join(dir, "child.pid")))
}

// TestRunStopSignal: a command ended by a stop signal agentgate did not send (as a service
// manager stopping the whole process tree does) fails with an error that matches
// agents.ErrStopSignal; one that fails on its own, or is killed by another signal, does not.
func TestRunStopSignal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		script string
		kill   syscall.Signal // sent to the command's group from outside; 0 for none
		want   bool
	}{
		{"SIGTERM", "ready; sleep 100", syscall.SIGTERM, true},
		{"SIGKILL", "ready; sleep 100", syscall.SIGKILL, true},
		// A loop of short sleeps: a SIGINT that reaches the forked sleep before it resets the
		// shell's trap is lost to it, and the trap runs only once the sleep has ended.
		{"SIGINT to a shell that exits 130", "trap 'exit 130' INT; ready; while :; do sleep 0.1; done", syscall.SIGINT, true},
		// What README asks of a command that handles SIGTERM itself, and what it warns of.
		// The trap is set before the command says it is ready: a signal sent before would
		// end the shell by SIGTERM whatever the trap says.
		{"SIGTERM to a command that exits 143", "trap 'exit 143' TERM; ready; while :; do sleep 0.1; done", syscall.SIGTERM, true},
		{"SIGTERM to a command that exits 1", "trap 'exit 1' TERM; ready; while :; do sleep 0.1; done", syscall.SIGTERM, false},
		{"a failure of its own", "exit 1", 0, false},
		{"SIGSEGV", "kill -SEGV $$", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// ready writes the pid file that the signal waits for.
			cmd, dir := MustScript(t, `dir=$1; ready() { echo $$ > "$dir/pid.tmp"; mv "$dir/pid.tmp" "$dir/pid"; }; `+tc.script)
			a := MustNew(t, exec.Config{Command: cmd})
			done := runAsync(t.Context(), a, request(turn(1), "hi"))
			if tc.kill != 0 {
				pid := MustReadPID(t, filepath.Join(dir, "pid"))
				if err := syscall.Kill(-pid, tc.kill); err != nil {
					t.Fatal(err)
				}
			}
			r := mustResult(t, done)
			if r.err == nil {
				t.Fatalf("Run() = %v, nil error; want a failure", r.resp)
			}
			if got := errors.Is(r.err, agents.ErrStopSignal); got != tc.want {
				t.Errorf("errors.Is(%v, agents.ErrStopSignal) = %v, want %v", r.err, got, tc.want)
			}
		})
	}
}

// TestKillAllKillsWhatTheCommandsStarted: a daemon that exits at once (a second stop signal)
// kills its commands' process groups first; otherwise what a command started (here a sleep)
// runs on beside the next start's run of the same message. The Run fails, and a later Run is
// not affected.
func TestKillAllKillsWhatTheCommandsStarted(t *testing.T) {
	t.Parallel()
	cmd, dir := MustScript(t, `sleep 100 & echo $! > "$1/child.tmp"; mv "$1/child.tmp" "$1/child"; wait`)
	a := MustNew(t, exec.Config{Command: cmd, KillGrace: time.Second})
	if n := a.KillAll(); n != 0 {
		t.Errorf("KillAll() with nothing running = %d, want 0", n)
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.Run(t.Context(), request(turn(1), "hi"))
		done <- err
	}()
	child := MustReadPID(t, filepath.Join(dir, "child"))
	if n := a.KillAll(); n != 1 {
		t.Errorf("KillAll() with one command running = %d, want 1", n)
	}
	waitGone(t, "the command's child", child)
	if err := <-done; err == nil {
		t.Error("Run of a killed command = nil error, want its failure")
	}
	if n := a.KillAll(); n != 0 {
		t.Errorf("KillAll() after the Run returned = %d, want 0", n)
	}
}
