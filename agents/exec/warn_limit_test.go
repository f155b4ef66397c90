package exec_test

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/internal/testutil"
)

// TestPerTurnWarningsAreLimited: the WRN lines an agent's command earns each turn it does the
// same thing (it leaves a process holding its output, ignores SIGTERM, answers at length) are
// logged for the first turn, then at most once a minute (logging.Limiter, with repeats); the
// turns in between are at Debug, in full. Before, each turn logged its own: a soak's agent that
// always left a background process wrote a WRN a turn (106, 65 and 77 of them in 10 minutes).
func TestPerTurnWarningsAreLimited(t *testing.T) {
	t.Parallel()
	const turns = 3
	for _, tc := range []struct {
		name, msg, script string
		cancel            bool          // each turn is cancelled once the command has written its pid
		timeout           time.Duration // agent.exec.timeout, when set
	}{
		{"output held open", "exec agent closed output held open after exit",
			`sh -c 'exec sleep 100' & echo $! > "$1/child.tmp"; mv "$1/child.tmp" "$1/child.pid"; echo done`, false, 0},
		{"killed after the grace", "exec agent killed process group after grace period",
			`trap '' TERM; echo $$ > "$1/pid.tmp"; mv "$1/pid.tmp" "$1/pid"; while :; do sleep 0.1; done`, true, 0},
		{"reply cut off", "exec agent reply cut off: it is longer than agentgate takes",
			`head -c 1100000 /dev/zero | tr '\0' x`, false, 0},
		{"stderr before a timeout", "exec agent stderr before its timeout",
			`echo stuck >&2; exec sleep 100`, false, 300 * time.Millisecond},
		{"runaway output", "exec agent wrote more than agentgate reads; it was stopped, and the first part of its output is the reply",
			`exec yes`, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs testutil.Buffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			cmd, dir := MustScript(t, tc.script)
			a := MustNew(t, exec.Config{Command: cmd, KillGrace: 200 * time.Millisecond, Timeout: tc.timeout, Logger: log})
			for i := range turns {
				ctx, cancel := context.WithCancel(t.Context())
				done := runAsync(ctx, a, request(turn(i+1), "hi"))
				if tc.cancel {
					pid := MustReadPID(t, filepath.Join(dir, "pid"))
					cancel()
					waitGone(t, "the command that ignores SIGTERM", pid)
				}
				mustResult(t, done)
				cancel()
				if strings.Contains(tc.script, "child.pid") {
					waitGone(t, "the process that held the output", MustReadPID(t, filepath.Join(dir, "child.pid")))
				}
				for _, name := range []string{"pid", "child.pid"} { // for the next turn's
					if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
						t.Fatal(err)
					}
				}
			}
			// The grace's line comes from its timer, which may log after Run returned.
			count := func(level string) int {
				n := 0
				for l := range strings.Lines(logs.String()) {
					if strings.Contains(l, "level="+level+" ") && strings.Contains(l, `msg="`+tc.msg+`"`) {
						n++
					}
				}
				return n
			}
			waitFor(t, "a line for each turn", func() bool { return count("WARN")+count("DEBUG") == turns })
			if n := count("WARN"); n != 1 {
				t.Errorf("%d WRN lines %q for %d turns, want 1 (the others at Debug):\n%s", n, tc.msg, turns, logs.String())
			}
		})
	}
}
