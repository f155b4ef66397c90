package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// TestSessionsPardonReplaysTheSpoolFirst: the daemon dies (-9) for the third time while a
// suspect message runs on probation (2 strikes, marked in that run), and with writes waiting
// in the spool: another process held the database's write lock when a second chat's message
// came, and that message, its session and its answer went to the spool. The next start would
// count the third strike and quarantine the suspect. sessions pardon --all, with the daemon
// stopped, replays the spool into the database first (the second chat's session, message and
// answer are there, once; the spool is empty), then clears the strikes and forgets the run.
// The start after it finds nothing to replay, counts no unclean stop, and runs the message
// again: it is answered, not quarantined. Before, the pardon refused while the spool held
// writes and said to start the daemon once to replay them: that start quarantined it.
func TestSessionsPardonReplaysTheSpoolFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the daemon binary")
	}
	ctx := context.Background()
	dataDir := t.TempDir()
	dbPath, spoolDir := filepath.Join(dataDir, "agentgate.db"), filepath.Join(dataDir, "spool")
	cure := filepath.Join(t.TempDir(), "cured")
	agent := `AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'case "$AGENTGATE_MESSAGE_ID" in poison*) [ -e "$PARDON_CURE" ] || sleep 60;; esac; echo "answered $AGENTGATE_MESSAGE_ID"']`
	serve := func() *daemon {
		return MustServe(t, dataDir, "AGENTGATE_AGENT_BACKEND=exec", "AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT=100ms", "PARDON_CURE="+cure, agent)
	}
	const key, key2 = "agent:main:http:dm:c1", "agent:main:http:dm:c2"

	d := serve()
	if status, ack := post(t, d.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"poison","message_id":"poison-1"}`); status != http.StatusAccepted {
		t.Fatalf("POST = %d %v, want 202", status, ack)
	}
	for stop := range 3 {
		if stop > 0 {
			d = serve()
		}
		waitAgentRunning(t, d, key) // at the third start, on probation
		if stop == 2 {
			unlock := testutil.LockSQLite(t, dbPath)
			status, res := post(t, d.base+"/v1/messages?wait=30s", "", `{"chat_id":"c2","user_id":"u2","text":"hello","message_id":"m2"}`)
			if replies, _ := res["replies"].([]any); status != http.StatusOK || len(replies) != 1 || replies[0].(map[string]any)["text"] != "answered m2" {
				t.Fatalf("POST ?wait with the database locked = %d %v, want 200 with the answer to m2", status, res)
			}
			d.kill(t)
			unlock()
			break
		}
		d.kill(t)
	}
	if n, err := spool.Waiting(spoolDir); err != nil || n == 0 {
		t.Fatalf("after the daemon died spooling, the spool holds %d batch(es) (%v), want some", n, err)
	}
	message := func(st persistence.Store, key, id string) (m persistence.Message, answers int) {
		t.Helper()
		r, err := st.Route(ctx, key)
		if errors.Is(err, persistence.ErrNotFound) {
			return m, 0
		}
		if err != nil {
			t.Fatalf("Route(%s): %v", key, err)
		}
		ms, err := st.Transcript(ctx, r.SessionID)
		if err != nil {
			t.Fatalf("Transcript(%s): %v", r.SessionID, err)
		}
		n := 0
		for _, msg := range ms {
			switch {
			case msg.Role == persistence.RoleUser && msg.MessageID == id:
				m = msg
				n++
			case msg.Role != persistence.RoleUser && msg.Content == "answered "+id:
				answers++
			}
		}
		if n > 1 {
			t.Errorf("%s has %d messages %s, want it once", key, n, id)
		}
		return m, answers
	}
	st, err := sqlite.OpenReadOnly(ctx, dbPath)
	if err != nil {
		t.Fatalf("sqlite.OpenReadOnly: %v", err)
	}
	if m, _ := message(st, key, "poison-1"); m.Status != persistence.StatusPending || m.Attempts != 2 {
		t.Fatalf("before the pardon, poison-1 is %q with %d strike(s), want pending with 2", m.Status, m.Attempts)
	}
	if m, _ := message(st, key2, "m2"); m.MessageID != "" {
		t.Fatalf("before the pardon, the database has m2 (%+v), want it only in the spool", m)
	}
	st.Close()

	out, errOut := MustRunSessions(t, "pardon", "--all", "--data-dir", dataDir)
	if out != "pardoned 1 message(s) in 1 session(s)\n" {
		t.Errorf("pardon --all printed %q, want poison-1's session pardoned", out)
	}
	if w := " batch(es) of writes waiting in " + spoolDir + " into the database first, as the next start would have\n"; !strings.HasPrefix(errOut, "note: replayed ") ||
		!strings.Contains(errOut, w) {
		t.Errorf("pardon --all: stderr %q, want it to say it replayed the spool (%q)", errOut, w)
	}
	if n, err := spool.Waiting(spoolDir); err != nil || n != 0 {
		t.Errorf("after the pardon, the spool holds %d batch(es) (%v), want none", n, err)
	}
	if _, err := os.Stat(filepath.Join(spoolDir, "failed")); err == nil {
		t.Errorf("the pardon set spooled batches aside in %s", filepath.Join(spoolDir, "failed"))
	}
	st, err = sqlite.OpenReadOnly(ctx, dbPath)
	if err != nil {
		t.Fatalf("sqlite.OpenReadOnly: %v", err)
	}
	if m, _ := message(st, key, "poison-1"); m.Status != persistence.StatusPending || m.Attempts != 0 {
		t.Errorf("after the pardon, poison-1 is %q with %d strike(s), want pending with none", m.Status, m.Attempts)
	}
	if m, answers := message(st, key2, "m2"); m.Status != persistence.StatusDone || answers != 1 {
		t.Errorf("after the pardon, m2 is %q with %d answer(s), want the spooled message done, answered once", m.Status, answers)
	}
	st.Close()

	if err := os.WriteFile(cure, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d = serve()
	events := readSSE(t, d.base+"/v1/sessions/"+key+"/events", "", 1)
	if text, _ := events[0].data["text"].(string); events[0].event != "reply" || text != "answered poison-1" {
		t.Errorf("after the pardon, the start sent c1 %s %v, want the answer to poison-1", events[0].event, events[0].data)
	}
	for _, line := range []string{"writes left in the spool", "did not stop cleanly", "quarantined"} {
		if logged(d, line) {
			t.Errorf("the start after the pardon logged %q, want a start with nothing to replay and no unclean stop:\n%s", line, d.stderr.String())
		}
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
	st, err = sqlite.OpenReadOnly(ctx, dbPath)
	if err != nil {
		t.Fatalf("sqlite.OpenReadOnly: %v", err)
	}
	defer st.Close()
	if m, answers := message(st, key, "poison-1"); m.Status != persistence.StatusDone || answers != 1 {
		t.Errorf("after the start, poison-1 is %q with %d answer(s), want it done, answered once", m.Status, answers)
	}
	if m, answers := message(st, key2, "m2"); m.Status != persistence.StatusDone || answers != 1 {
		t.Errorf("after the start, m2 is %q with %d answer(s), want it done, answered once", m.Status, answers)
	}
}
