package supervisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/persistence"
)

// TestCleanStopFileThatCannotBeRemovedIsNotRecordedAgain: a start that records an earlier
// run's clean stop but cannot remove its file says so once, with what to do, and neither it nor
// the next start says it recorded that stop: the next one only ends it again, which changes
// nothing. Before, every start logged "recorded the clean stop of an earlier run" anew, and a
// start whose own record the store refused logged it again at each retry (each second). The
// file is made immutable (chattr +i), which takes root and a file system that has the flag.
func TestCleanStopFileThatCannotBeRemovedIsNotRecordedAgain(t *testing.T) {
	dir := t.TempDir()
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, logs: &logSignal{},
		wrap: func(s persistence.Store) persistence.Store { return &endRunRefused{Store: s} }})
	r.stop(t)
	files, _ := filepath.Glob(filepath.Join(dir, cleanStopPrefix+"*"))
	if len(files) != 1 {
		t.Fatalf("clean-stop files after a stop the store refused = %v, want one", files)
	}
	if out, err := exec.Command("chattr", "+i", files[0]).CombinedOutput(); err != nil {
		t.Skipf("cannot make %s immutable (chattr +i: %v %s); the test needs root and a file system with the flag", files[0], err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", "-i", files[0]).Run() })
	if err := os.Remove(files[0]); err == nil {
		t.Fatalf("removed %s after chattr +i; want it immutable", files[0])
	}

	const warn = "cannot remove the file of an earlier run's clean stop, which the store has recorded; remove it"
	for _, start := range []string{"a start whose record the store refuses at first", "the start after it"} {
		st := &refusesRuns{}
		st.refusing.Store(start == "a start whose record the store refuses at first")
		recorded := make(chan struct{})
		log := &logSignal{want: "recorded the daemon's run in the store", ready: recorded}
		r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, logs: log,
			wrap: func(s persistence.Store) persistence.Store { st.Store = s; return st }})
		if st.refusing.Load() {
			st.refusing.Store(false)
			select {
			case <-recorded:
			case <-time.After(10 * time.Second):
				t.Errorf("%s: no record of the run 10s after the store took writes again; log:\n%s", start, log.String())
			}
		}
		r.stop(t)
		got := log.String()
		if strings.Contains(got, "recorded the clean stop of an earlier run") || strings.Count(got, warn) != 1 || strings.Contains(got, "did not stop cleanly") {
			t.Errorf("%s logged:\n%s\nwant %q once, no clean stop recorded and no unclean stop counted", start, grepLines(got, "clean"), warn)
		}
	}
}
