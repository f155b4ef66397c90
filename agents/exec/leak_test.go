package exec_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/internal/testutil"
)

// TestManyTurnsLeaveNothingBehind runs each way a command can end badly many times, as real
// subprocesses, and checks that the daemon is left with what it had before: no file
// descriptor, goroutine, child process or zombie grows with the number of turns, and no process
// a command started outlives its turn. A daemon runs for months; one fd or one zombie per bad
// turn ends it.
func TestManyTurnsLeaveNothingBehind(t *testing.T) {
	if testing.Short() {
		t.Skip("starts over a thousand subprocesses")
	}
	const (
		turns = 200
		// parallel turns at once: enough to mix them, few enough for a 2-core machine.
		parallel = 8
		grace    = 50 * time.Millisecond
	)
	// big is more than a pipe holds (64 KiB on Linux), so a command that does not read stdin
	// leaves the write to it blocked until it exits or its stdin is closed.
	big := strings.Repeat("x", 200<<10)
	testutil.MarkProcesses(t) // the commands' own children are reparented, not ours
	for _, tc := range []struct {
		name   string
		script string
		text   string
		// timeout is Config.Timeout; cancel cancels the turn's ctx after that long instead.
		timeout, cancel time.Duration
		steer           bool
		missing         bool // the command is not there: every Start fails
	}{
		{name: "cannot start", text: "hi", steer: true, missing: true},
		{name: "answers", script: `cat >/dev/null; echo ok`, text: "hi"},
		{name: "exits before reading stdin", script: `echo early`, text: big},
		{name: "fails before reading stdin", script: `echo oops >&2; exit 3`, text: big},
		{name: "closes stdout early", script: `exec >&- 2>&-; cat >/dev/null; sleep 0.01`, text: big},
		{name: "leaves a child holding stdout", script: `sleep 100 & echo done`, text: "hi"},
		{name: "leaves a child holding stdin", script: `sleep 100 <&0 & echo done`, text: big},
		{name: "times out", script: `exec sleep 100`, text: "hi", timeout: 20 * time.Millisecond},
		{name: "times out with a child that ignores SIGTERM", script: `trap '' TERM; sleep 100 & wait`,
			text: "hi", timeout: 20 * time.Millisecond},
		{name: "is cancelled", script: `trap 'exit 1' TERM; cat >/dev/null; sleep 100 & wait`, text: big, cancel: 20 * time.Millisecond},
		{name: "steers and exits without reading", script: `echo early`, text: big, steer: true},
		{name: "steers and exits while nothing is steered", script: `IFS= read -r line; echo ok`, text: "hi", steer: true},
		{name: "steers and is cancelled", script: `IFS= read -r line; exec sleep 100`, text: "hi", steer: true, cancel: 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, _ := MustScript(t, tc.script)
			c := exec.Config{Command: cmd, Timeout: tc.timeout, KillGrace: grace, Steer: tc.steer}
			var a *exec.Agent
			if tc.missing {
				a = MustNewGone(t, c)
			} else {
				a = MustNew(t, c)
			}
			// A first turn loads what the first use of os/exec keeps for good.
			runTurns(t, a, tc.text, tc.cancel, tc.steer, tc.missing, 1, 1)
			base := testutil.TakeResources()
			runTurns(t, a, tc.text, tc.cancel, tc.steer, tc.missing, turns, parallel)
			// The poller's own fds and a goroutine of the runtime may come and go.
			testutil.MustSettle(t, tc.name, base, testutil.Slack{Goroutines: 2, FDs: 2}, 10*time.Second)
		})
	}
}

// runTurns runs n turns of a, at most parallel at once, each with a request of text. A turn is
// cancelled after cancel when that is not zero; with steer, a channel that is never closed
// offers a steered message to every other turn. A turn that does not answer must fail when it
// is cancelled, or when fails says so.
func runTurns(t *testing.T, a *exec.Agent, text string, cancel time.Duration, steer, fails bool, n, parallel int) {
	t.Helper()
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			// The turn's ctx outlives it unless the turn is cancelled: what Run leaves waiting
			// on it would hide.
			ctx := t.Context()
			if cancel > 0 {
				var stop context.CancelFunc
				ctx, stop = context.WithTimeout(ctx, cancel)
				defer stop()
			}
			req := request(turn(i), text)
			if steer {
				ch := make(chan agents.Message, 1)
				if i%2 == 0 {
					ch <- agents.Message{Role: "user", Text: text, MessageID: "steered"}
				}
				req.Steer = ch // never closed
			}
			if _, err := a.Run(ctx, req); err == nil && (cancel > 0 || fails) {
				t.Errorf("turn %d: Run() = nil error, want one", i)
			}
		})
	}
	wg.Wait()
}
