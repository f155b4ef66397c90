package exec_test

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/internal/testutil"
)

// TestHeldOpenOutputIsLoggedWhateverTheExitStatus: a command that exits while a process it
// started holds its stdout open costs the turn kill_grace, and the operator hears of that wait,
// whether the command succeeded or failed; one that leaves nothing holding its output is no
// such wait. Before, only a success logged it: a failure's turn waited the grace and logged
// only its exit status (found by a walkthrough on a real daemon).
func TestHeldOpenOutputIsLoggedWhateverTheExitStatus(t *testing.T) {
	t.Parallel()
	const holder = `sh -c 'echo $$ > "$1/child.tmp"; mv "$1/child.tmp" "$1/child.pid"; exec sleep 100' sh "$1" &
while [ ! -e "$1/child.pid" ]; do sleep 0.01; done
echo done
`
	for _, tc := range []struct {
		name, script string
		held, fails  bool
	}{
		{"exit 0", holder + "exit 0", true, false},
		{"exit 1", holder + "exit 1", true, true},
		{"exit 1, output closed", "echo done; exit 1", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs testutil.Buffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			cmd, dir := MustScript(t, tc.script)
			const grace = 200 * time.Millisecond
			a := MustNew(t, exec.Config{Command: cmd, KillGrace: grace, Logger: log})
			_, err := a.Run(t.Context(), request(turn(1), "hi"))
			if (err != nil) != tc.fails {
				t.Fatalf("Run() error = %v, want a failure: %t", err, tc.fails)
			}
			line := ""
			for l := range strings.Lines(logs.String()) {
				if strings.Contains(l, `msg="exec agent closed output held open after exit"`) {
					line = l
				}
			}
			switch {
			case tc.held && !strings.Contains(line, "grace=200ms"):
				t.Errorf("logs = %q, want a WRN line of the output held open, with grace=200ms", logs.String())
			case !tc.held && line != "":
				t.Errorf("logged %q of a command that left nothing holding its output", line)
			}
			if tc.held {
				waitGone(t, "leftover background process", MustReadPID(t, filepath.Join(dir, "child.pid")))
			}
		})
	}
}
