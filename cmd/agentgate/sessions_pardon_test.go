package main

import (
	"context"
	"errors"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
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

// TestSessionsPardonWaitsForTheSpool: while the spool holds writes the database does not have
// yet, sessions pardon (of a KEY or --all) refuses, changes nothing, and says to start the
// daemon once, which replays them, before the pardon; and the offline sessions requeue, which
// refuses anyway, says that the start replays them first. The spooled write here is what a
// session writes as it quarantines a suspect at its 3rd strike while the database refuses
// writes: before, the pardon cleared the message's strikes and counted it pardoned, and the next
// start's replay quarantined it all the same (its sender had been told so already).
func TestSessionsPardonWaitsForTheSpool(t *testing.T) {
	ctx := context.Background()
	dir := MustSeedSessions(t) // keyA's sa2 has m4 pending at seq 3
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	storetest.MustCommit(t, st, &persistence.SetAttempts{SessionID: "sa2", Seq: 3, Attempts: 3})
	st.Close()
	spoolDir := filepath.Join(dir, "spool")
	sp, err := spool.Open(spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	name, err := sp.Append([][]persistence.Op{{&persistence.SetMessageStatus{SessionID: "sa2", Seqs: []int64{3}, Status: persistence.StatusQuarantined}}})
	if err != nil {
		t.Fatal(err)
	}
	strikes := func(t *testing.T) int {
		t.Helper()
		st, err := sqlite.Open(ctx, filepath.Join(dir, "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatalf("sqlite.Open: %v", err)
		}
		defer st.Close()
		ms, err := st.Transcript(ctx, "sa2")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.Seq == 3 {
				return m.Attempts
			}
		}
		t.Fatal("sa2 has no message at seq 3")
		return 0
	}
	want := "sessions pardon: " + spoolDir + " holds 1 batch(es) of writes the database does not have yet, which the next start " +
		"replays before any session loads and which may undo the pardon (a message quarantined, or answered, since its strikes " +
		"were counted): start the daemon once (agentgate serve), which replays them, stop it, then pardon (nothing was changed)"
	for _, args := range [][]string{{keyA}, {"--all"}} {
		out, _, err := runSessions(t, append([]string{"pardon", "--data-dir", dir}, args...)...)
		if err == nil || err.Error() != want || out != "" {
			t.Errorf("pardon %s with a write in the spool = %v, stdout %q; want the error %q", args[0], err, out, want)
		}
		if got := strikes(t); got != 3 {
			t.Errorf("after the refused pardon %s, m4 has %d strike(s), want its 3 kept", args[0], got)
		}
	}
	_, _, err = runSessions(t, "requeue", "--data-dir", dir, keyA, "m4")
	if w := "; at its start it first replays the 1 batch(es) of writes waiting in " + spoolDir; err == nil || !strings.Contains(err.Error(), w) {
		t.Errorf("requeue with no daemon and a write in the spool = %v, want it to say %q", err, w)
	}

	// Once the start has replayed the spool (here: its batch removed), the pardon goes ahead.
	if err := sp.Remove(name); err != nil {
		t.Fatal(err)
	}
	if out, _ := MustRunSessions(t, "pardon", "--data-dir", dir, keyA); !strings.Contains(out, "pardoned 1 message(s) in 1 session(s)") {
		t.Errorf("pardon with an empty spool printed %q, want one message pardoned", out)
	}
	if got := strikes(t); got != 0 {
		t.Errorf("after the pardon, m4 has %d strike(s), want 0", got)
	}
	if _, _, err := runSessions(t, "requeue", "--data-dir", dir, keyA, "m4"); err == nil || strings.Contains(err.Error(), "replays") {
		t.Errorf("requeue with no daemon and an empty spool = %v, want the refusal without a word of the spool", err)
	}
}
