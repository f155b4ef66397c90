package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	agentexec "github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
)

// TestStopLeavesNoAgentProcess: a daemon that stops while exec turns run cancels them, and once
// Stop has returned nothing those turns started is left: not the commands, not what they
// started and kept out of SIGTERM's way, not a goroutine of theirs. Before, Stop returned as
// soon as it had cancelled the turns; the process then exited, and whatever a command had
// started that ignored SIGTERM ran on for ever, reparented to init (the command itself dies
// with the daemon by Pdeathsig; its children do not).
func TestStopLeavesNoAgentProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out an exec agent's kill grace")
	}
	const (
		turns = 4
		grace = 2 * time.Second
	)
	testutil.MarkProcesses(t)
	base := testutil.TakeResources()
	path := filepath.Join(t.TempDir(), "agent.sh")
	// The command starts a child that ignores SIGTERM and waits for it.
	if err := os.WriteFile(path, []byte("#!/bin/sh\nsh -c 'trap \"\" TERM; exec sleep 100' &\nwait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	agent, err := agentexec.New(agentexec.Config{Command: []string{"/bin/sh", path}, KillGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	r := MustStartDaemon(t, agent, daemonOpts{drain: 50 * time.Millisecond})
	for i := range turns {
		r.inject(t, identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: fmt.Sprint("c", i), UserID: "u"}, fmt.Sprint("m", i), "hi")
	}
	waitUntil(t, func() bool { return testutil.TakeResources().Marked >= 2*turns }) // each command and its child
	start := time.Now()
	r.stop(t)
	// What Stop waited for is gone at once; only the runtime's own goroutines may still be
	// ending. Well within the grace period: what was left to the grace timer is not.
	got := testutil.MustSettle(t, "after Stop", base, testutil.Slack{Goroutines: 2, FDs: 2}, grace/4)
	t.Logf("Stop took %v; then %v", time.Since(start), got)
}
