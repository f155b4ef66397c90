package main

import (
	"database/sql"
	"io"
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

// TestSecondSignalAsTheStartReturns: a second stop signal that the start's signal reader takes
// in the instant after Start returned, before serve's own reader begins, exits as one during
// the drain does: Daemon.Abort first (the exec agents' commands killed, the clean stop
// recorded), then exit status 2. Before, that reader exited 2 at once: the commands ran on, and
// the next start counted an unclean stop, a strike against each session's running message.
// serve runs in the test's process, its exit replaced, and the signals are sent in that
// instant (testHookStartReturned): a SIGTERM and a SIGINT, two signals the kernel does not
// merge into one.
func TestSecondSignalAsTheStartReturns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a daemon")
	}
	dataDir := t.TempDir()
	// The run the database names when the process would exit: "" once the clean stop is in.
	exited := make(chan string, 1)
	exitProcess = func(code int) {
		if code != 2 {
			t.Errorf("exit status %d at a second signal, want 2", code)
		}
		exited <- runRecorded(t, dataDir)
	}
	var atExit string
	testHookStartReturned = func() {
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
			if err := syscall.Kill(os.Getpid(), sig); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case atExit = <-exited:
		case <-time.After(30 * time.Second):
			t.Error("no exit within 30 s of two stop signals as the start returned")
		}
	}
	t.Cleanup(func() { exitProcess, testHookStartReturned = os.Exit, nil })
	var stderr testutil.Buffer
	err := serve(t.Context(), []string{"--data-dir", dataDir, "--http-addr", "127.0.0.1:0"}, io.Discard, &stderr)
	if err != nil {
		t.Errorf("serve: %v", err)
	}
	if atExit != "" {
		t.Errorf("the database still names run %s as running when a second signal exits: the next start counts an unclean stop\n%s", atExit, stderr.String())
	}
	if got := stderr.String(); !strings.Contains(got, "second signal; exiting now") {
		t.Errorf("serve's log says nothing of the second signal:\n%s", got)
	}
}

// runRecorded is the daemon run the SQLite database in dataDir names as running (daemon_run):
// "" when the last run recorded its clean stop.
func runRecorded(t *testing.T, dataDir string) string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dataDir, "agentgate.db")+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var run string
	if err := db.QueryRow(`SELECT run FROM daemon_run WHERE one = 1`).Scan(&run); err != nil {
		t.Errorf("read the daemon's run: %v", err)
	}
	return run
}
