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
