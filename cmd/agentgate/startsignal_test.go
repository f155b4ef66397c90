package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
)

// TestSIGTERMDuringTheStartsReplay: a SIGTERM while the start replays a spool the last run
// left stops the daemon at once: it exits 0 with what the replay did not take still in the
// spool, for the next start. Before, no signal was read until the start returned, and the start
// waited for as long as the replay took batches out of the spool: the daemon exited only once
// all of them were in the database (under systemd, a long replay ran into TimeoutStopSec and
// SIGKILL).
func TestSIGTERMDuringTheStartsReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary")
	}
	dataDir := t.TempDir()
	sp, err := spool.Open(filepath.Join(dataDir, "spool"))
	if err != nil {
		t.Fatal(err)
	}
	// A transaction each (max_batch 1): far longer to replay than a SIGTERM takes, also on a disk
	// whose fsync is fast (here 400 took 0.25 s to replay; the signal follows the replay's first
	// log line within a poll of 10 ms).
	const batches = 2000
	for range batches {
		op := &persistence.SetMessageStatus{SessionID: "s1", Seqs: []int64{1}, Status: persistence.StatusDone}
		if _, err := sp.Append([][]persistence.Op{{op}}); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(MustBuild(t), "serve", "--data-dir", dataDir, "--http-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "AGENTGATE_PERSISTENCE_MAX_BATCH=1")
	var stderr testutil.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("daemon stderr:\n%s", stderr.String())
		}
	}()
	waitFor(t, 60*time.Second, func() bool {
		return strings.Contains(stderr.String(), "writes left in the spool by the last run; replaying them")
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Errorf("exit after SIGTERM during the start's replay: %v, want 0", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the daemon did not exit within 20 s of a SIGTERM during the start's replay")
	}
	n, err := spool.Waiting(filepath.Join(dataDir, "spool"))
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Errorf("the spool is empty after a SIGTERM during the start's replay of %d batches: the replay went on to its end", batches)
	}
	if got := stderr.String(); !strings.Contains(got, "stopped with writes waiting in the spool") || strings.Contains(got, "agentgate started") {
		t.Errorf("the daemon's log says nothing of the writes left in the spool, or that it started:\n%s", got)
	}
}
