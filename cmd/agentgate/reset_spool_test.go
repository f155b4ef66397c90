package main

import (
	"context"
	"fmt"
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
	"github.com/agentgate/agentgate/supervisor"
)

// TestSessionsResetReplaysTheSpool: while the spool holds writes the database does not have
// yet, sessions reset with the daemon stopped replays them into the database first, as the
// next start would, and then resets: it settles what the start would find. The spooled writes
// here are what the daemon writes while the database refuses writes: the answer to keyA's
// pending m4 (the answer, m4 done, its reply at outbox seq 3), then a new message m6, pending;
// and a batch that does not decode, set aside as the daemon sets it aside. The reset then
// fails m6, not m4 (answered), and its notice to m6's sender takes outbox seq 4, after the
// reply. Before, the reset refused while the spool held writes and said to start the daemon,
// which replays them, and reset through it. With the data directory's lock held (a daemon on
// it), or the database refusing writes, it refuses and resets nothing; the batches it could
// not replay stay in the spool. The daemon's start after it finds the spool empty, and the
// database holds each spooled write once.
func TestSessionsResetReplaysTheSpool(t *testing.T) {
	ctx := context.Background()
	dir := MustSeedSessions(t) // keyA's sa2: m4 pending at seq 3, m5 at 4; outbox up to seq 2
	path := filepath.Join(dir, "agentgate.db")
	spoolDir, corrupt := mustSpoolWithACorruptBatch(t, dir,
		[]persistence.Op{
			&persistence.AppendMessage{Message: persistence.Message{
				SessionID: "sa2", Seq: 5, Role: persistence.RoleAssistant, Content: "spooled answer", Platform: "http", ChatID: "alice",
				Status: persistence.StatusDone, Active: true, CreatedAt: sessAt(50),
			}},
			&persistence.SetMessageStatus{SessionID: "sa2", Seqs: []int64{3}, Status: persistence.StatusDone},
			&persistence.AddOutbox{Entry: persistence.OutboxEntry{
				SessionKey: keyA, Seq: 3, SessionID: "sa2", Kind: "reply", Text: "spooled answer", InReplyTo: []string{"m4"},
				Platform: "http", ChatType: "dm", ChatID: "alice", UserID: "alice", State: persistence.DeliveryPending, CreatedAt: sessAt(50),
			}},
		},
		[]persistence.Op{
			&persistence.AppendMessage{Message: persistence.Message{
				SessionID: "sa2", Seq: 6, Role: persistence.RoleUser, Content: "one more", Platform: "http", ChatID: "alice",
				MessageID: "m6", UserID: "alice", Status: persistence.StatusPending, Active: true, CreatedAt: sessAt(50),
			}},
		},
	)
	type state struct {
		ended    bool
		messages map[string]string // message id (the answer: "answer") → status, "archived" added when not active
		answers  int
		outbox   []string // after seq 2: "seq kind in-reply-to state"
	}
	read := func(t *testing.T) state {
		t.Helper()
		st, err := sqlite.OpenReadOnly(ctx, path)
		if err != nil {
			t.Fatalf("sqlite.OpenReadOnly: %v", err)
		}
		defer st.Close()
		sess, err := st.Session(ctx, "sa2")
		if err != nil {
			t.Fatal(err)
		}
		ms, err := st.Transcript(ctx, "sa2")
		if err != nil {
			t.Fatal(err)
		}
		s := state{ended: !sess.EndedAt.IsZero(), messages: map[string]string{}}
		for _, m := range ms {
			switch {
			case m.Content == "spooled answer":
				s.answers++
			case m.MessageID == "m4" || m.MessageID == "m6":
				s.messages[m.MessageID] = m.Status
				if !m.Active {
					s.messages[m.MessageID] += " archived"
				}
			}
		}
		out, err := st.OutboxAfter(ctx, keyA, 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range out {
			s.outbox = append(s.outbox, fmt.Sprintf("%d %s %v %s", e.Seq, e.Kind, e.InReplyTo, e.State))
		}
		return s
	}
	unchanged := func(t *testing.T, what string) {
		t.Helper()
		if s := read(t); s.ended || s.messages["m4"] != persistence.StatusPending || s.messages["m6"] != "" || s.answers != 0 || len(s.outbox) != 0 {
			t.Errorf("after %s, sa2 is %+v; want it open, m4 pending, and no spooled write applied", what, s)
		}
		if n, err := spool.Waiting(spoolDir); err != nil || n != 3 {
			t.Errorf("after %s, the spool holds %d batch(es) (%v), want its 3 kept", what, n, err)
		}
	}

	// A daemon holding the data directory (its database elsewhere, or it is starting): the spool
	// is its. The reset takes the data directory's lock first, as a daemon does, and goes the
	// way of a running daemon's: it records no address, so the reset says to go through it.
	lock, err := supervisor.LockDataDir(dir, supervisor.HolderDaemon)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runSessions(t, "reset", "--data-dir", dir, keyA)
	w := "the daemon is running on this data directory, but it records no address in " + dir + " (it starts, or it runs on another host); reset through it: "
	if err == nil || !strings.HasPrefix(err.Error(), w) || out != "" {
		t.Errorf("reset with the data directory locked = %v, stdout %q; want the error %q…", err, out, w)
	}
	unchanged(t, "the reset refused for the data directory's lock")
	lock.Close()

	// The database refusing writes (another process holds its write lock): nothing replayed,
	// nothing reset.
	refusedForTheDatabasesLock(t, path, "reset", "--data-dir", dir, keyA)
	unchanged(t, "the reset refused for the database's lock")

	out, errOut, err := runSessions(t, "reset", "--data-dir", dir, keyA)
	if w := "ended session sa2 of " + keyA + " (reset_command)\n"; err != nil || out != w {
		t.Errorf("reset with writes in the spool = %v, printed %q; want %q", err, out, w)
	}
	for _, w := range []string{
		"corrupt spool batch quarantined", "batch=" + corrupt,
		"note: replayed 2 batch(es) of writes waiting in " + spoolDir + " into the database first, as the next start would have, " +
			"1 set aside in " + filepath.Join(spoolDir, "failed") + " (the lines above say why)\n",
		"note: the ended session's 1 pending message(s) are marked failed and will not be answered",
	} {
		if !strings.Contains(errOut, w) {
			t.Errorf("reset with writes in the spool: stderr %q, want %q", errOut, w)
		}
	}
	want := func(t *testing.T, what string, notice string) {
		t.Helper()
		s := read(t)
		if !s.ended || s.messages["m4"] != persistence.StatusDone || s.messages["m6"] != persistence.StatusFailed+" archived" || s.answers != 1 {
			t.Errorf("%s, sa2 is %+v; want it ended, m4 done and answered once, m6 failed and archived", what, s)
		}
		if w := []string{"3 reply [m4] " + notice, "4 notice [m6] " + notice}; fmt.Sprint(s.outbox) != fmt.Sprint(w) {
			t.Errorf("%s, keyA's outbox after seq 2 = %q, want %q (the spooled reply, then the reset's notice)", what, s.outbox, w)
		}
	}
	want(t, "after the reset", persistence.DeliveryPending)
	if n, err := spool.Waiting(spoolDir); err != nil || n != 0 {
		t.Errorf("after the reset, the spool holds %d batch(es) (%v), want none", n, err)
	}
	if _, err := os.Stat(filepath.Join(spoolDir, "failed", corrupt)); err != nil {
		t.Errorf("the batch that does not decode is not set aside: %v", err)
	}

	// The start finds nothing to replay, and sends the reply and the notice once each.
	d := MustServe(t, dir)
	waitFor(t, 30*time.Second, func() bool {
		s := read(t)
		return len(s.outbox) == 2 && !strings.Contains(fmt.Sprint(s.outbox), persistence.DeliveryPending)
	})
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
	if logged(d, "spool") {
		t.Errorf("the start after the reset logged of the spool, want nothing left to replay:\n%s", d.stderr.String())
	}
	want(t, "after the start", persistence.DeliveryDelivered)
}

// TestSessionsResetReplaysTheSpoolFirst: the daemon dies (-9) with writes waiting in the spool:
// another process held the database's write lock when a chat's message m2 came, and when its
// next message slow-3 came, whose agent still ran; both messages, m2's answer and its reply
// went to the spool. sessions reset of the chat, with the daemon stopped, replays the spool
// into the database first (m2 and its answer are there, once; the spool is empty), then ends
// the session and settles slow-3, which the database had not held: failed, with a notice to
// its sender. The start after it finds nothing to replay, sends the notice, and does not run
// slow-3; the chat's next message begins a new session. Before, the reset refused while the
// spool held writes and said to start the daemon and reset through it.
func TestSessionsResetReplaysTheSpoolFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the daemon binary")
	}
	ctx := context.Background()
	dataDir := t.TempDir()
	dbPath, spoolDir := filepath.Join(dataDir, "agentgate.db"), filepath.Join(dataDir, "spool")
	agent := `AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'case "$AGENTGATE_MESSAGE_ID" in slow*) sleep 60;; esac; echo "answered $AGENTGATE_MESSAGE_ID"']`
	serve := func() *daemon {
		return MustServe(t, dataDir, "AGENTGATE_AGENT_BACKEND=exec", "AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT=100ms", agent)
	}
	const key = "agent:main:http:dm:c1"
	ask := func(d *daemon, id string) (sessionID string) {
		t.Helper()
		status, res := post(t, d.base+"/v1/messages?wait=30s", "", `{"chat_id":"c1","user_id":"u1","text":"hello","message_id":"`+id+`"}`)
		if replies, _ := res["replies"].([]any); status != http.StatusOK || len(replies) != 1 || replies[0].(map[string]any)["text"] != "answered "+id {
			t.Fatalf("POST %s ?wait = %d %v, want 200 with its answer", id, status, res)
		}
		sessionID, _ = res["session_id"].(string)
		return sessionID
	}

	d := serve()
	first := ask(d, "m1")
	unlock := testutil.LockSQLite(t, dbPath)
	ask(d, "m2")
	if status, ack := post(t, d.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"slowly","message_id":"slow-3"}`); status != http.StatusAccepted {
		t.Fatalf("POST slow-3 = %d %v, want 202", status, ack)
	}
	waitFor(t, 30*time.Second, func() bool { return agentsRunning(d) > 0 })
	d.kill(t)
	unlock()
	if n, err := spool.Waiting(spoolDir); err != nil || n == 0 {
		t.Fatalf("after the daemon died spooling, the spool holds %d batch(es) (%v), want some", n, err)
	}

	type message struct {
		status  string
		answers int
	}
	read := func(t *testing.T) (ended bool, ms map[string]message, notices []string) {
		t.Helper()
		st, err := sqlite.OpenReadOnly(ctx, dbPath)
		if err != nil {
			t.Fatalf("sqlite.OpenReadOnly: %v", err)
		}
		defer st.Close()
		sess, err := st.Session(ctx, first)
		if err != nil {
			t.Fatalf("Session(%s): %v", first, err)
		}
		tr, err := st.Transcript(ctx, first)
		if err != nil {
			t.Fatalf("Transcript(%s): %v", first, err)
		}
		ms = map[string]message{}
		for _, m := range tr {
			if m.Role == persistence.RoleUser {
				if _, twice := ms[m.MessageID]; twice {
					t.Errorf("%s holds message %s twice", first, m.MessageID)
				}
				ms[m.MessageID] = message{status: m.Status, answers: ms[m.MessageID].answers}
			} else if id, ok := strings.CutPrefix(m.Content, "answered "); ok {
				ms[id] = message{status: ms[id].status, answers: ms[id].answers + 1}
			}
		}
		out, err := st.OutboxAfter(ctx, key, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range out {
			if e.Kind == "notice" && fmt.Sprint(e.InReplyTo) == "[slow-3]" {
				notices = append(notices, e.State)
			}
		}
		return !sess.EndedAt.IsZero(), ms, notices
	}
	if ended, ms, _ := read(t); ended || ms["m2"] != (message{}) || ms["slow-3"] != (message{}) {
		t.Fatalf("before the reset, %s is ended=%v with %v; want it open, without m2 and slow-3 (only in the spool)", first, ended, ms)
	}

	out, errOut := MustRunSessions(t, "reset", "--data-dir", dataDir, key)
	if w := "ended session " + first + " of " + key + " (reset_command)\n"; out != w {
		t.Errorf("reset printed %q, want %q", out, w)
	}
	for _, w := range []string{
		"note: replayed ",
		" batch(es) of writes waiting in " + spoolDir + " into the database first, as the next start would have\n",
		"note: the ended session's 1 pending message(s) are marked failed",
	} {
		if !strings.Contains(errOut, w) {
			t.Errorf("reset: stderr %q, want %q", errOut, w)
		}
	}
	if n, err := spool.Waiting(spoolDir); err != nil || n != 0 {
		t.Errorf("after the reset, the spool holds %d batch(es) (%v), want none", n, err)
	}
	if _, err := os.Stat(filepath.Join(spoolDir, "failed")); err == nil {
		t.Errorf("the reset set spooled batches aside in %s", filepath.Join(spoolDir, "failed"))
	}
	check := func(what, noticeState string) {
		t.Helper()
		ended, ms, notices := read(t)
		if !ended || ms["m1"] != (message{persistence.StatusDone, 1}) || ms["m2"] != (message{persistence.StatusDone, 1}) ||
			ms["slow-3"] != (message{persistence.StatusFailed, 0}) {
			t.Errorf("%s, %s is ended=%v with %v; want it ended, m1 and m2 done and answered once, slow-3 failed and unanswered", what, first, ended, ms)
		}
		if fmt.Sprint(notices) != "["+noticeState+"]" {
			t.Errorf("%s, the notices to slow-3's sender are %v, want one %s", what, notices, noticeState)
		}
	}
	check("after the reset", persistence.DeliveryPending)

	d = serve()
	waitFor(t, 30*time.Second, func() bool {
		_, _, notices := read(t)
		return fmt.Sprint(notices) == "["+persistence.DeliveryDelivered+"]"
	})
	if next := ask(d, "m4"); next == first || next == "" {
		t.Errorf("after the reset, m4 went to session %q, want a new one after %s", next, first)
	}
	if agentsRunning(d) > 0 || logged(d, "writes left in the spool") {
		t.Errorf("the start after the reset runs an agent or replayed the spool, want slow-3 not run and nothing to replay:\n%s", d.stderr.String())
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
	check("after the start", persistence.DeliveryDelivered)
}
