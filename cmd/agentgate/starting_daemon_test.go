package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/supervisor"
)

// TestSessionsResetAndRequeueRefuseAStartingDaemon: a daemon that is starting holds the data
// directory's lock (supervisor.LockDataDir) before it opens the store and takes the store's
// lock, and records its address only after that. sessions reset and sessions requeue take the
// data directory's lock first too, as sessions pardon does, so in that window they go the way
// of a running daemon: with no address recorded they refuse, say how to go through the daemon,
// and change nothing; with an address recorded whose daemon answers as its run, they go
// through it. Before, with the spool empty they took only the store's lock: the reset ended
// the session in the store under the starting daemon (whose opening of the store it could
// fail), and the requeue said that no daemon runs, to start one. Neither keeps a lock after it
// is done.
func TestSessionsResetAndRequeueRefuseAStartingDaemon(t *testing.T) {
	ctx := context.Background()
	dir := MustSeedSessions(t) // keyA's sa2 is open, with m4 pending
	path := filepath.Join(dir, "agentgate.db")
	st, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	storetest.MustCommit(t, st, &persistence.AppendMessage{Message: persistence.Message{
		SessionID: "sb1", Seq: 2, Role: persistence.RoleUser, Content: "boom", Platform: "discord", ChatID: "g1",
		MessageID: "q1", UserID: "bob", Status: persistence.StatusQuarantined, Active: true, CreatedAt: sessAt(32),
	}})
	st.Close()
	unchanged := func(t *testing.T, what string) {
		t.Helper()
		st, err := sqlite.OpenReadOnly(ctx, path)
		if err != nil {
			t.Fatalf("sqlite.OpenReadOnly: %v", err)
		}
		defer st.Close()
		s, err := st.Session(ctx, "sa2")
		if err != nil {
			t.Fatal(err)
		}
		if !s.EndedAt.IsZero() {
			t.Errorf("after %s, sa2 ended (%s), want it open", what, s.EndReason)
		}
		status := map[string]string{}
		for _, id := range []string{"sa2", "sb1"} {
			ms, err := st.Transcript(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				status[m.MessageID] = m.Status
			}
		}
		if status["m4"] != persistence.StatusPending || status["q1"] != persistence.StatusQuarantined {
			t.Errorf("after %s, m4 is %q and q1 %q; want m4 pending, q1 quarantined", what, status["m4"], status["q1"])
		}
	}
	// The store, which the starting daemon opens next, is not held by the refused command.
	storeFree := func(t *testing.T, what string) {
		t.Helper()
		st, err := sqlite.Open(ctx, path, sqlite.Options{})
		if err != nil {
			t.Errorf("the daemon's store, opened after %s: %v", what, err)
			return
		}
		st.Close()
	}
	// The command let go of the data directory: a daemon can take it.
	dirFree := func(t *testing.T, what string) {
		t.Helper()
		lock, err := supervisor.LockDataDir(dir, supervisor.HolderDaemon)
		if err != nil {
			t.Errorf("the data directory's lock after %s: %v", what, err)
			return
		}
		lock.Close()
	}

	// The daemon's start, between its two locks: the data directory's held, the store's not
	// yet, no address recorded; the spool is empty.
	lock, err := supervisor.LockDataDir(dir, supervisor.HolderDaemon)
	if err != nil {
		t.Fatal(err)
	}
	addr := closedAddr(t)
	out, _, err := runSessions(t, "reset", "--data-dir", dir, "--http-addr", addr, keyA)
	want := "the daemon is running on this data directory, but it records no address in " + dir +
		" (it starts, or it runs on another host); reset through it: curl -X POST http://" + addr + "/v1/sessions/" + keyA + "/reset"
	if err == nil || err.Error() != want || out != "" {
		t.Errorf("reset while a daemon starts = %v, stdout %q; want the error %q", err, out, want)
	}
	unchanged(t, "a reset while a daemon starts")
	storeFree(t, "the reset was refused")

	out, _, err = runSessions(t, "requeue", "--data-dir", dir, "--http-addr", addr, keyB, "q1")
	want = "the daemon is running on this data directory, but it records no address in " + dir +
		" (it starts, or it runs on another host); requeue through it: curl -X POST http://" + addr + "/v1/sessions/" + keyB + "/messages/q1/requeue"
	if err == nil || err.Error() != want || out != "" {
		t.Errorf("requeue while a daemon starts = %v, stdout %q; want the error %q", err, out, want)
	}
	unchanged(t, "a requeue while a daemon starts")
	storeFree(t, "the requeue was refused")

	// A daemon that holds the data directory and answers at the address it recorded is asked,
	// the store's lock aside (here free: its database may be elsewhere).
	s, resets := countingServer(t, testRun)
	MustRecordDaemon(t, dir, s, testRun)
	out, _ = MustRunSessions(t, "reset", "--data-dir", dir, keyA)
	if n := resets.Load(); n != 1 || !strings.Contains(out, "through the daemon at "+s.Listener.Addr().String()) {
		t.Errorf("reset with the data directory held by a daemon that answers: %d reset(s) asked, printed %q; want 1, through it", n, out)
	}
	unchanged(t, "a reset through the daemon")
	lock.Close()
	dirFree(t, "a reset through the daemon")

	// With the daemon stopped (its record gone), the requeue refuses as before and the reset
	// ends the session in the store; neither keeps the data directory.
	for _, f := range []string{supervisor.AddrFile, supervisor.RunFile} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := runSessions(t, "requeue", "--data-dir", dir, keyB, "q1"); err == nil || !strings.Contains(err.Error(), "no daemon runs on "+dir) {
		t.Errorf("requeue with the daemon stopped = %v, want a refusal that says no daemon runs", err)
	}
	dirFree(t, "the requeue with the daemon stopped")
	out, _ = MustRunSessions(t, "reset", "--data-dir", dir, keyA)
	if w := "ended session sa2 of " + keyA + " (reset_command)\n"; out != w {
		t.Errorf("reset with the daemon stopped printed %q, want %q", out, w)
	}
	dirFree(t, "the reset with the daemon stopped")
}

// TestAdminCommandsWaitForOneAnother: an admin command that finds the data directory held by
// another (its lock file records it: supervisor.LockDataDir) says so, with the command and its
// pid, and to run it again once that one is done; it changes nothing. Before, a pardon said to
// stop the daemon, a reset and a requeue looked for a daemon to go through, as if a daemon held
// the directory.
func TestAdminCommandsWaitForOneAnother(t *testing.T) {
	dir := MustSeedSessions(t) // keyA's sa2 is open, with m4 pending
	lock, err := supervisor.LockDataDir(dir, "sessions reset")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	held := " another admin command holds the data directory " + dir + " (agentgate sessions reset, pid " +
		strconv.Itoa(os.Getpid()) + "); run this one again once it is done"
	for _, args := range [][]string{
		{"pardon", "--all"},
		{"reset", keyA},
		{"requeue", keyA, "m4"},
	} {
		out, _, err := runSessions(t, append([]string{args[0], "--data-dir", dir}, args[1:]...)...)
		if want := "sessions " + args[0] + ":" + held; err == nil || err.Error() != want || out != "" {
			t.Errorf("%s while another command holds the data directory = %v, stdout %q; want the error %q", args, err, out, want)
		}
	}
	lock.Close()
	ctx := context.Background()
	st, err := sqlite.OpenReadOnly(ctx, filepath.Join(dir, "agentgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if s, err := st.Session(ctx, "sa2"); err != nil || !s.EndedAt.IsZero() {
		t.Errorf("sa2 after the refused commands: %+v, %v; want it open", s, err)
	}
}
