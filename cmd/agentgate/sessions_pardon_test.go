package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/supervisor"
)

// TestSessionsPardon: after two unclean stops, the messages then pending are suspects (strikes
// 2); sessions pardon clears their strikes, of one key or of all, and says how many messages of
// how many sessions it pardoned, leaving a quarantined message as it is. It refuses while a
// daemon holds the data directory, and changes nothing then.
func TestSessionsPardon(t *testing.T) {
	ctx := context.Background()
	dir := MustSeedSessions(t) // keyA's sa2 and keyB's sb1 each have a pending message
	path := filepath.Join(dir, "agentgate.db")
	daemon, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	defer daemon.Close()
	// Three starts, the first two of which never stopped: both count against each head, whose
	// turn started in r2 (marked, as a session marks a struck message once its turn has its
	// agent slot).
	for _, run := range []string{"r1", "r2", "r3"} {
		if run == "r3" {
			storetest.MustCommit(t, daemon, &persistence.MarkProbation{SessionID: "sa2", Seq: 3, Run: "r2"},
				&persistence.MarkProbation{SessionID: "sb1", Seq: 1, Run: "r2"})
		}
		if _, err := daemon.BeginRun(ctx, run, time.Now()); err != nil {
			t.Fatalf("BeginRun(%s): %v", run, err)
		}
	}
	storetest.MustCommit(t, daemon, &persistence.AppendMessage{Message: persistence.Message{
		SessionID: "sa2", Seq: 5, Role: persistence.RoleUser, Content: "poison", Platform: "http", ChatID: "alice",
		MessageID: "m6", UserID: "alice", Status: persistence.StatusQuarantined, Active: true, CreatedAt: sessAt(5)}},
		&persistence.SetAttempts{SessionID: "sa2", Seq: 5, Attempts: 3})
	attempts := func(t *testing.T, st persistence.Store) map[string]int {
		t.Helper()
		got := map[string]int{}
		for _, sid := range []string{"sa2", "sb1"} {
			ms, err := st.Transcript(ctx, sid)
			if err != nil {
				t.Fatalf("Transcript(%s): %v", sid, err)
			}
			for _, m := range ms {
				if m.Role == persistence.RoleUser && m.Status != persistence.StatusDone {
					got[m.MessageID] = m.Attempts
				}
			}
		}
		return got
	}
	want := map[string]int{"m4": 2, "d1": 2, "m6": 3}
	if got := attempts(t, daemon); !maps.Equal(got, want) {
		t.Fatalf("attempts after two unclean stops = %v, want %v", got, want)
	}

	_, _, err = runSessions(t, "pardon", "--all", "--data-dir", dir)
	if err == nil || !strings.Contains(err.Error(), "agentgate is running on this data directory: stop the daemon first") {
		t.Errorf("pardon while the daemon runs: error = %v, want it to say to stop the daemon first", err)
	}
	if got := attempts(t, daemon); !maps.Equal(got, want) {
		t.Errorf("attempts after a pardon refused = %v, want %v", got, want)
	}
	daemon.Close()

	out, _ := MustRunSessions(t, "pardon", "--data-dir", dir, keyB)
	if w := "pardoned 1 message(s) in 1 session(s) of " + keyB; !strings.Contains(out, w) {
		t.Errorf("pardon %s printed %q, want %q", keyB, out, w)
	}
	out, _ = MustRunSessions(t, "pardon", "--all", "--data-dir", dir)
	if w := "pardoned 1 message(s) in 1 session(s)\n"; !strings.Contains(out, w) {
		t.Errorf("pardon --all printed %q, want %q", out, w)
	}
	st, err := sqlite.OpenReadOnly(ctx, path)
	if err != nil {
		t.Fatalf("sqlite.OpenReadOnly: %v", err)
	}
	defer st.Close()
	want = map[string]int{"m4": 0, "d1": 0, "m6": 3}
	if got := attempts(t, st); !maps.Equal(got, want) {
		t.Errorf("attempts after the pardons = %v, want %v", got, want)
	}

	for _, args := range [][]string{{"pardon"}, {"pardon", "--all", keyA}} {
		if _, _, err := runSessions(t, append(args, "--data-dir", dir)...); !errors.Is(err, errUsage) {
			t.Errorf("sessions %s: error = %v, want a usage error", strings.Join(args, " "), err)
		}
	}
}

// TestSessionsPardonReplaysTheSpool: while the spool holds writes the database does not have
// yet, sessions pardon replays them into the database first, as the next start would, and
// then pardons: what it pardons is what the start would find. The spooled writes here are what
// a session writes as it quarantines a suspect at its 3rd strike while the database refuses
// writes, a title, and a batch that does not decode, which is set aside as the daemon sets it
// aside. The quarantined message is left as it is (sessions requeue runs it again), and the
// pardon says what it replayed. Before, the pardon refused while the spool held writes, and
// said to start the daemon once to replay them: a start that counts the last run's unclean
// stop, and can quarantine a message at its 3rd strike. With the data directory's lock held
// (a daemon on it), or the database refusing writes, it refuses and pardons nothing; the
// batches it could not replay stay in the spool (the pardon holds the data directory's lock
// from the start, and replays under it). The offline sessions requeue, which refuses
// anyway, says that the start replays them first.
func TestSessionsPardonReplaysTheSpool(t *testing.T) {
	dir := MustSeedSessions(t) // keyA's sa2 has m4 pending at seq 3
	path := filepath.Join(dir, "agentgate.db")
	setStrikes(t, path, 3)
	spoolDir, corrupt := mustSpoolWithACorruptBatch(t, dir,
		[]persistence.Op{&persistence.SetMessageStatus{SessionID: "sa2", Seqs: []int64{3}, Status: persistence.StatusQuarantined}},
		[]persistence.Op{&persistence.SetTitle{SessionID: "sa2", Title: "spooled"}},
	)
	m4 := func(t *testing.T) (status string, attempts int, title string) {
		t.Helper()
		m, sess := m4Of(t, path)
		return m.Status, m.Attempts, sess.Title
	}
	unchanged := func(t *testing.T, what string) {
		t.Helper()
		if status, attempts, title := m4(t); status != persistence.StatusPending || attempts != 3 || title == "spooled" {
			t.Errorf("after %s, m4 is %s with %d strike(s) and sa2's title %q; want it pending with its 3 kept, and no spooled write applied",
				what, status, attempts, title)
		}
		if n, err := spool.Waiting(spoolDir); err != nil || n != 3 {
			t.Errorf("after %s, the spool holds %d batch(es) (%v), want its 3 kept", what, n, err)
		}
	}

	_, _, err := runSessions(t, "requeue", "--data-dir", dir, keyA, "m4")
	if w := "; at its start it first replays the 3 batch(es) of writes waiting in " + spoolDir; err == nil || !strings.Contains(err.Error(), w) {
		t.Errorf("requeue with no daemon and writes in the spool = %v, want it to say %q", err, w)
	}

	// A daemon holding the data directory (its database elsewhere): the spool is its.
	lock, err := supervisor.LockDataDir(dir, supervisor.HolderDaemon)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runSessions(t, "pardon", "--data-dir", dir, keyA)
	if w := "sessions pardon: agentgate is running on this data directory: stop the daemon first"; err == nil || !strings.HasPrefix(err.Error(), w) || out != "" {
		t.Errorf("pardon with the data directory locked = %v, stdout %q; want the error %q…", err, out, w)
	}
	unchanged(t, "the pardon refused for the data directory's lock")
	lock.Close()

	// The database refusing writes (another process holds its write lock): nothing replayed,
	// nothing pardoned.
	refusedForTheDatabasesLock(t, path, "pardon", "--data-dir", dir, keyA)
	unchanged(t, "the pardon refused for the database's lock")

	out, errOut := MustRunSessions(t, "pardon", "--data-dir", dir, keyA)
	if w := "pardoned 0 message(s) in 0 session(s) of " + keyA + "\n"; out != w {
		t.Errorf("pardon with writes in the spool printed %q, want %q (m4's quarantine was among them)", out, w)
	}
	for _, w := range []string{
		"corrupt spool batch quarantined", "batch=" + corrupt,
		"note: replayed 2 batch(es) of writes waiting in " + spoolDir + " into the database first, as the next start would have, " +
			"1 set aside in " + filepath.Join(spoolDir, "failed") + " (the lines above say why)\n",
	} {
		if !strings.Contains(errOut, w) {
			t.Errorf("pardon with writes in the spool: stderr %q, want %q", errOut, w)
		}
	}
	if status, attempts, title := m4(t); status != persistence.StatusQuarantined || attempts != 3 || title != "spooled" {
		t.Errorf("after the pardon, m4 is %s with %d strike(s) and sa2's title %q; want the spooled quarantine and title applied, its strikes as they were",
			status, attempts, title)
	}
	if n, err := spool.Waiting(spoolDir); err != nil || n != 0 {
		t.Errorf("after the pardon, the spool holds %d batch(es) (%v), want none", n, err)
	}
	if _, err := os.Stat(filepath.Join(spoolDir, "failed", corrupt)); err != nil {
		t.Errorf("the batch that does not decode is not set aside: %v", err)
	}
	if _, _, err := runSessions(t, "requeue", "--data-dir", dir, keyA, "m4"); err == nil || strings.Contains(err.Error(), "replays") {
		t.Errorf("requeue with no daemon and an empty spool = %v, want the refusal without a word of the spool", err)
	}
	// Nothing left to replay: the pardon says nothing of the spool.
	if out, errOut := MustRunSessions(t, "pardon", "--all", "--data-dir", dir); out != "pardoned 0 message(s) in 0 session(s)\n" || strings.Contains(errOut, "spool") {
		t.Errorf("pardon --all with an empty spool printed %q, stderr %q; want nothing pardoned, no word of the spool", out, errOut)
	}
}

// TestSessionsPardonRefusesAStartingDaemon: a daemon that is starting holds the data
// directory's lock before it opens the store (supervisor.LockDataDir, then the store's lock);
// sessions pardon takes the data directory's lock first too, so it refuses then and changes
// nothing, also with an empty spool. Before, with the spool empty it took only the store's
// lock: it pardoned under the starting daemon, whose opening of the store it could fail. A
// pardon refused for a --data-dir with no database creates nothing there.
func TestSessionsPardonRefusesAStartingDaemon(t *testing.T) {
	ctx := context.Background()
	dir := MustSeedSessions(t) // keyA's sa2 has m4 pending at seq 3
	path := filepath.Join(dir, "agentgate.db")
	setStrikes(t, path, 2)
	strikes := func(t *testing.T) int {
		t.Helper()
		m, _ := m4Of(t, path)
		return m.Attempts
	}

	// The daemon's start, between its two locks: the data directory's held, the store's not yet.
	lock, err := supervisor.LockDataDir(dir, supervisor.HolderDaemon)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runSessions(t, "pardon", "--all", "--data-dir", dir)
	if w := "sessions pardon: agentgate is running on this data directory: stop the daemon first"; err == nil || !strings.HasPrefix(err.Error(), w) || out != "" {
		t.Errorf("pardon while a daemon starts = %v, stdout %q; want the error %q…", err, out, w)
	}
	if n := strikes(t); n != 2 {
		t.Errorf("m4 has %d strike(s) after a pardon refused, want its 2 kept", n)
	}
	// The store, which the starting daemon opens next, is not held by the refused pardon.
	st, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Errorf("the daemon's store, opened after the pardon was refused: %v", err)
	} else {
		st.Close()
	}
	lock.Close()

	out, _ = MustRunSessions(t, "pardon", "--all", "--data-dir", dir)
	if w := "pardoned 1 message(s) in 1 session(s)\n"; out != w {
		t.Errorf("pardon with the daemon stopped printed %q, want %q", out, w)
	}
	if n := strikes(t); n != 0 {
		t.Errorf("m4 has %d strike(s) after the pardon, want 0", n)
	}
	// The pardon let go of the data directory: a daemon can take it.
	if lock, err := supervisor.LockDataDir(dir, supervisor.HolderDaemon); err != nil {
		t.Errorf("the data directory's lock after the pardon: %v", err)
	} else {
		lock.Close()
	}

	empty := filepath.Join(t.TempDir(), "none")
	if _, _, err := runSessions(t, "pardon", "--all", "--data-dir", empty); err == nil || !strings.Contains(err.Error(), "no database at") {
		t.Errorf("pardon of a data directory with no database = %v, want it to say there is none", err)
	}
	if _, err := os.Stat(empty); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a pardon refused for a data directory with no database made it (%v), want nothing made", err)
	}
}

// refusedForTheDatabasesLock runs `sessions args…` while another process holds the SQLite
// database's write lock: the open refuses after the 5 s a commit waits for it, saying so and
// that nothing was changed, and prints nothing. It runs in a bubble, under its context, so that
// the 5 s are the bubble's (see runSessionsIn).
func refusedForTheDatabasesLock(t *testing.T, path string, args ...string) {
	t.Helper()
	testutil.BubbleTest(t, lockedBubbleWithin, lockedBubbleHang, func(t *testing.T) {
		unlock := testutil.LockSQLite(t, path)
		defer unlock()
		out, _, err := runSessionsIn(t.Context(), args...)
		if w := "the database is locked by another process (SQLITE_BUSY): "; err == nil || !strings.Contains(err.Error(), w) ||
			!strings.HasSuffix(err.Error(), "and run the command again (nothing was changed): take the write lock: database is locked (5) (SQLITE_BUSY)") || out != "" {
			t.Errorf("sessions %s with the database locked = %v, stdout %q; want the error …%q…(nothing was changed)…",
				strings.Join(args, " "), err, out, w)
		}
	})
}

// m4Of reads sa2's m4 (seq 3, MustSeedSessions) and sa2 itself from the database at path.
func m4Of(t *testing.T, path string) (persistence.Message, *persistence.Session) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.OpenReadOnly(ctx, path)
	if err != nil {
		t.Fatalf("sqlite.OpenReadOnly: %v", err)
	}
	defer st.Close()
	ms, err := st.Transcript(ctx, "sa2")
	if err != nil {
		t.Fatal(err)
	}
	sess, err := st.Session(ctx, "sa2")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Seq == 3 {
			return m, sess
		}
	}
	t.Fatal("sa2 has no message at seq 3")
	return persistence.Message{}, nil
}

// setStrikes sets the attempts of sa2's pending m4 (seq 3, MustSeedSessions) in the database at
// path to n, the unclean stops counted against it.
func setStrikes(t *testing.T, path string, n int) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	defer st.Close()
	storetest.MustCommit(t, st, &persistence.SetAttempts{SessionID: "sa2", Seq: 3, Attempts: n})
}

// mustSpoolWithACorruptBatch writes batches into the spool of the data directory dir, one
// each, as a daemon spools its writes while the database refuses them, and then a batch that
// does not decode under the next name the spool would give. It returns the spool's directory
// and that batch's name.
func mustSpoolWithACorruptBatch(t *testing.T, dir string, batches ...[]persistence.Op) (spoolDir, corrupt string) {
	t.Helper()
	spoolDir = filepath.Join(dir, "spool")
	sp, err := spool.Open(spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, batch := range batches {
		if _, err := sp.Append([][]persistence.Op{batch}); err != nil {
			t.Fatal(err)
		}
	}
	corrupt = fmt.Sprintf("%020d.json", len(batches)+1)
	if err := os.WriteFile(filepath.Join(spoolDir, corrupt), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	return spoolDir, corrupt
}

// TestSessionsPardonOfAnUnknownKey: a KEY no session has (a typo, a key of another data
// directory) is an error that names it, as sessions show and reset say, and nothing is
// pardoned. Before, the command printed "pardoned 0 message(s) in 0 session(s) of KEY" and
// exited 0, which read as "nothing was struck" (found running every command by hand).
func TestSessionsPardonOfAnUnknownKey(t *testing.T) {
	dir := MustSeedSessions(t) // keyA's sa2 has m4 pending at seq 3
	path := filepath.Join(dir, "agentgate.db")
	setStrikes(t, path, 2)
	for _, c := range []struct{ name, arg, shown string }{
		{"plain", "agent:main:http:dm:alicia", "agent:main:http:dm:alicia"},
		{"quoted", `"agent:main:http:dm:a b"`, `'"agent:main:http:dm:a b"'`},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, _, err := runSessions(t, "pardon", "--data-dir", dir, c.arg)
			want := "sessions pardon: the key " + c.shown + " has no session, so nothing was pardoned; agentgate sessions list prints the keys that have one"
			if err == nil || err.Error() != want || out != "" {
				t.Errorf("pardon of an unknown key = %v, stdout %q; want the error %q", err, out, want)
			}
			if m, _ := m4Of(t, path); m.Attempts != 2 {
				t.Errorf("m4 has %d strike(s) after a pardon of another key, want its 2 kept", m.Attempts)
			}
		})
	}
}
