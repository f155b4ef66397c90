//go:build !race

// Multi-member cluster tests run without -race (protoactor's cluster code is not race-clean);
// `make test` runs them in a second pass.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/jackc/pgx/v5"
)

// hangingAgent is an exec agent whose turns hang on the member started with BLOCK set to a
// directory (not an AGENTGATE_ variable, so the agent sees it): such a turn first leaves a file
// named by its message id there, then sleeps for seconds. Elsewhere it answers at once.
func hangingAgent(seconds int) string {
	return fmt.Sprintf(`AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'if [ -n "$BLOCK" ]; then touch "$BLOCK/$AGENTGATE_MESSAGE_ID"; sleep %d; fi; echo "ok $AGENTGATE_MESSAGE_ID"']`, seconds)
}

// chatOnTheBlockedMember sends new chats' first messages through via until one's turn runs on
// the member whose agent hangs (its file appears in blockDir; see hangingAgent), each chat
// until either that or its answer (its turn ran on a member that answers) is seen. It returns
// that chat and its message id.
func chatOnTheBlockedMember(t *testing.T, via *daemon, blockDir string) (chat, msgID string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatal("no session was placed on the member whose agent hangs within 60s")
		}
		chat, id := fmt.Sprint("c", i), fmt.Sprint("m", i)
		status, body := post(t, via.base+"/v1/messages", "",
			fmt.Sprintf(`{"chat_id":%q,"user_id":"u","text":"hi","message_id":%q}`, chat, id))
		key, _ := body["session_key"].(string)
		if status != http.StatusAccepted || key == "" {
			t.Fatalf("POST: %d %v", status, body)
		}
		blocked := false
		waitFor(t, 30*time.Second, func() bool {
			if _, err := os.Stat(filepath.Join(blockDir, id)); err == nil {
				blocked = true
				return true
			}
			_, transcript := get(t, via.base+"/v1/sessions/"+url.PathEscape(key)+"/transcript")
			return strings.Contains(transcript, `"text":"ok `+id+`"`)
		})
		if blocked {
			return chat, id
		}
	}
}

// TestClusterMemberKilled: two `agentgate serve` members of one cluster on one PostgreSQL
// database. A session whose key the second member owns has a turn running there when that
// member is killed with -9. Once the first member counts it gone (cluster.member_ttl), it
// takes the key over: the acknowledged message is answered exactly once, by it, the death
// counts against it, and the chat goes on there.
func TestClusterMemberKilled(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	env := []string{"AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN=" + dsn,
		"AGENTGATE_CLUSTER_ENABLED=true", "AGENTGATE_CLUSTER_BIND=127.0.0.1:0", "AGENTGATE_CLUSTER_MEMBER_TTL=2s",
		"AGENTGATE_AGENT_BACKEND=exec", hangingAgent(60)} // the victim's turns hang
	blockDir := t.TempDir()
	a := MustServe(t, t.TempDir(), env...)
	b := MustServe(t, t.TempDir(), append(env, "BLOCK="+blockDir)...)

	chat, msgID := chatOnTheBlockedMember(t, a, blockDir) // b's agent hangs
	b.kill(t)

	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	answers := func() int {
		var n int
		err := conn.QueryRow(context.Background(), `SELECT COUNT(*) FROM outbox o
			WHERE $1 = ANY(o.in_reply_to) AND o.text = $2`, msgID, "ok "+msgID).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 30*time.Second, func() bool { return answers() > 0 })
	status, body := post(t, a.base+"/v1/messages?wait=30s", "",
		fmt.Sprintf(`{"chat_id":%q,"user_id":"u","text":"again","message_id":"after"}`, chat))
	if status != http.StatusOK {
		t.Errorf("the chat after the takeover: %d %v, want 200 with the reply", status, body)
	}
	if n := answers(); n != 1 {
		t.Errorf("the message acknowledged before the kill was answered %d times, want once", n)
	}
	var pending int
	if err := conn.QueryRow(context.Background(), `SELECT COUNT(*) FROM messages
		WHERE role = 'user' AND status = 'pending'`).Scan(&pending); err != nil || pending != 0 {
		t.Errorf("%d messages still pending (%v), want none", pending, err)
	}
	// The death counts against the message it was running (once it expired: member_ttl), and
	// only against it: the message sent after the takeover counts nothing.
	var attempts []int
	rows, err := conn.Query(context.Background(), `SELECT attempts FROM messages WHERE message_id IN ($1, 'after') ORDER BY seq`, msgID)
	if err == nil {
		attempts, err = pgx.CollectRows(rows, pgx.RowTo[int])
	}
	if err != nil || fmt.Sprint(attempts) != "[1 0]" {
		t.Errorf("attempts of the killed member's message and the next: %v (%v), want [1 0]", attempts, err)
	}
	if err := a.stop(t, 30*time.Second); err != nil {
		t.Errorf("first member exit: %v", err)
	}
}

// TestClusterStalledMemberLeavesAlone: the older of two members is paused (SIGSTOP) for longer
// than member_ttl while its agent runs a turn. The younger one counts it gone, blocks it and
// takes its chat over. Back, the paused member finds its renewals a ttl apart and leaves, its
// stop waiting for the turn it was running; the younger one stays, and the chat is answered
// once. Before, the paused member renewed its registration as a member that stays before it
// noticed the pause, and then as leaving for the whole of its stop: the younger one's renewal
// found an older live member it had blocked, took itself for the losing side of a split and
// left too. A soak met it with three members: a 10 s pause of one stopped all three.
func TestClusterStalledMemberLeavesAlone(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	env := []string{"AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN=" + dsn,
		"AGENTGATE_CLUSTER_ENABLED=true", "AGENTGATE_CLUSTER_BIND=127.0.0.1:0", "AGENTGATE_CLUSTER_MEMBER_TTL=2s",
		"AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT=8s", "AGENTGATE_AGENT_BACKEND=exec", hangingAgent(30)} // the older member's turns hang
	blockDir := t.TempDir()
	older := MustServe(t, t.TempDir(), append(env, "BLOCK="+blockDir)...)
	younger := MustServe(t, t.TempDir(), env...)

	_, msgID := chatOnTheBlockedMember(t, younger, blockDir) // the older member's agent hangs

	if err := older.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // past member_ttl: the younger member drops the older one
	if err := older.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-older.done:
		if older.err == nil || !strings.Contains(older.stderr.String(), "past member_ttl") {
			t.Errorf("the paused member exited with %v, want an error that names the pause:\n%s",
				older.err, grep(older.stderr.String(), "cannot go on"))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the member paused past member_ttl still runs 30s after it was resumed")
	}
	select {
	case <-younger.done:
		t.Fatalf("the member that was not paused exited (%v):\n%s", younger.err, grep(younger.stderr.String(), "cannot go on"))
	case <-time.After(3 * time.Second): // a few of its renewals
	}
	if strings.Contains(younger.stderr.String(), "cluster split") {
		t.Errorf("the member that was not paused took the pause for a split:\n%s", grep(younger.stderr.String(), "cluster split"))
	}
	status, body := post(t, younger.base+"/v1/messages?wait=30s", "",
		`{"chat_id":"after","user_id":"u","text":"again","message_id":"after"}`)
	if status != http.StatusOK {
		t.Errorf("a message after the pause: %d %v, want 200 with the reply", status, body)
	}

	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	answers := func() int {
		var n int
		err := conn.QueryRow(context.Background(), `SELECT COUNT(*) FROM outbox o
			WHERE $1 = ANY(o.in_reply_to) AND o.kind = 'reply'`, msgID).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 30*time.Second, func() bool { return answers() > 0 })
	if n := answers(); n != 1 {
		t.Errorf("the message the paused member was running was answered %d times, want once", n)
	}
	if err := younger.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit of the member that was not paused: %v", err)
	}
}

// TestClusterPoisonMessageStopsTheCrashLoop is TestPoisonMessageStopsTheCrashLoop for a
// cluster: a one-member cluster under a process supervisor. The member is killed with -9 while
// its agent runs a message (as the OOM killer would) and started again at once on its address,
// long before its registration expires (member_ttl is a minute). The new process registers the
// address, which makes the killed one gone, and the claim that takes the key over counts the
// death against the message. A clean stop in between does not count; the start after the third
// death quarantines the message, and the chat goes on.
func TestClusterPoisonMessageStopsTheCrashLoop(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dataDir := t.TempDir()
	d := poisonCrashLoop(t, "agentgate went down 3 times", func() *daemon { // its member's deaths, not restarts of one daemon
		return MustServe(t, dataDir, "AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN="+dsn,
			"AGENTGATE_CLUSTER_ENABLED=true", fmt.Sprint("AGENTGATE_CLUSTER_BIND=127.0.0.1:", port),
			"AGENTGATE_CLUSTER_MEMBER_TTL=1m", "AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT=100ms", "AGENTGATE_AGENT_BACKEND=exec", poisonAgent)
	})
	if !strings.Contains(d.stderr.String(), "strikes=3/3") {
		t.Errorf("the member's log does not say it counted the third death:\n%s", grep(d.stderr.String(), "took the session over"))
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
}

// TestClusterSessionsResetThroughAMember: `agentgate sessions reset` on a host that runs no
// member finds the members in the store and asks one to reset the session; the reset reaches
// the member that runs it, which cancels the running turn (before, the reset only fenced the
// session in the store: its agent ran on to its end).
func TestClusterSessionsResetThroughAMember(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	mark := filepath.Join(t.TempDir(), "mark")
	env := []string{"AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN=" + dsn,
		"AGENTGATE_CLUSTER_ENABLED=true", "AGENTGATE_CLUSTER_BIND=127.0.0.1:0", "AGENTGATE_CLUSTER_MEMBER_TTL=2s",
		"AGENTGATE_AGENT_BACKEND=exec", "MARK=" + mark,
		// BLOCK makes the second member's turns note their start there (as hangingAgent's do)
		// and run until they are cancelled.
		`AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'if [ -n "$BLOCK" ]; then touch "$BLOCK/$AGENTGATE_MESSAGE_ID"; trap "echo cancelled > \"$MARK\"; exit 143" TERM; sleep 60 & wait; fi; echo "ok $AGENTGATE_MESSAGE_ID"']`}
	blockDir := t.TempDir()
	a := MustServe(t, t.TempDir(), env...)
	b := MustServe(t, t.TempDir(), append(env, "BLOCK="+blockDir)...)

	// Before, a chat whose POST ?wait=2s came back 202 was taken for one on b; a turn on a that
	// took longer than 2 s (a loaded machine) was taken for one too, and the reset below then
	// met no running turn.
	chat, _ := chatOnTheBlockedMember(t, a, blockDir)
	key := "agent:main:http:dm:" + chat
	status, raw := get(t, a.base+"/v1/sessions/"+key)
	var running struct {
		SessionID string `json:"session_id"`
	}
	if err := json.Unmarshal([]byte(raw), &running); status != http.StatusOK || err != nil || running.SessionID == "" {
		t.Fatalf("the key's session before the reset: %d %s (%v)", status, raw, err)
	}
	first := running.SessionID

	t.Setenv("AGENTGATE_STORE_DRIVER", "postgres")
	t.Setenv("AGENTGATE_STORE_DSN", dsn)
	t.Setenv("AGENTGATE_CLUSTER_ENABLED", "true")
	out, errOut := MustRunSessions(t, "reset", "--data-dir", t.TempDir(), key)
	if want := "ended session " + first + " of " + key + " (reset_command) through the member at 127.0.0.1:"; !strings.HasPrefix(out, want) || errOut != "" {
		t.Errorf("reset said %q (stderr %q), want it to begin %q", out, errOut, want)
	}
	waitFor(t, 30*time.Second, func() bool {
		b, _ := os.ReadFile(mark)
		return strings.TrimSpace(string(b)) == "cancelled"
	})
	status, raw = get(t, a.base+"/v1/sessions/"+key)
	var info struct {
		SessionID     string `json:"session_id"`
		PrevSessionID string `json:"prev_session_id"`
	}
	if err := json.Unmarshal([]byte(raw), &info); status != http.StatusOK || err != nil ||
		info.PrevSessionID != first || info.SessionID == first {
		t.Errorf("the key's session after the reset: %d %s (%v), want a new session after %s", status, raw, err, first)
	}
	for _, m := range []*daemon{a, b} {
		if err := m.stop(t, 30*time.Second); err != nil {
			t.Errorf("member exit: %v", err)
		}
	}
}

// TestClusterRequeueThroughAMember: in a cluster a requeue reaches the member that owns the
// key, as a reset does: quarantined messages of ten chats (seeded in the shared database), each
// requeued through the first member's HTTP API, run on the member the cluster places their key
// on, some on the second, each as its own sender's; `agentgate sessions requeue` asks a live
// member.
func TestClusterRequeueThroughAMember(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	const chats = 10
	key := func(i int) string { return fmt.Sprintf("agent:main:http:dm:c%d", i) }
	func() {
		st, err := postgres.Open(t.Context(), dsn, postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		now := time.Now().UTC()
		var ops []persistence.Op
		for i := range chats {
			sid, chat, user := fmt.Sprint("s", i), fmt.Sprint("c", i), fmt.Sprint("u", i)
			ops = append(ops,
				&persistence.CreateSession{Session: persistence.Session{ID: sid, Key: key(i), Platform: "http", ChatType: "dm",
					ChatID: chat, UserID: user, StartedAt: now, LastActivityAt: now}},
				&persistence.PutRoute{Route: persistence.Route{Key: key(i), SessionID: sid, Generation: 1, UpdatedAt: now}},
				&persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: 1, Role: persistence.RoleUser,
					Content: "again", Platform: "http", ChatID: chat, MessageID: fmt.Sprint("q", i), UserID: user,
					Status: persistence.StatusQuarantined, Active: true, CreatedAt: now}})
		}
		if errs := st.Commit(t.Context(), [][]persistence.Op{ops}); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}()
	env := []string{"AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN=" + dsn,
		"AGENTGATE_CLUSTER_ENABLED=true", "AGENTGATE_CLUSTER_BIND=127.0.0.1:0", "AGENTGATE_CLUSTER_MEMBER_TTL=2s",
		"AGENTGATE_AGENT_BACKEND=exec", `AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'echo "$MEMBER ran $AGENTGATE_MESSAGE_ID for $AGENTGATE_USER_ID"']`}
	a := MustServe(t, t.TempDir(), append(env, "MEMBER=a")...)
	b := MustServe(t, t.TempDir(), append(env, "MEMBER=b")...)
	waitFor(t, 30*time.Second, func() bool {
		_, body := get(t, a.base+"/metrics")
		return strings.Contains(body, "agentgate_cluster_members 2")
	})

	ranOn := map[string]int{}
	for i := range chats - 1 {
		status, res := post(t, a.base+"/v1/sessions/"+key(i)+fmt.Sprintf("/messages/q%d/requeue?wait=30s", i), "", "")
		replies, _ := res["replies"].([]any)
		if status != http.StatusOK || len(replies) != 1 {
			t.Fatalf("requeue q%d through a = %d %v, want 200 with its reply", i, status, res)
		}
		text, _ := replies[0].(map[string]any)["text"].(string)
		member, rest, _ := strings.Cut(text, " ")
		if want := fmt.Sprintf("ran q%d for u%d", i, i); rest != want {
			t.Errorf("requeued q%d answered %q, want %q (its own sender)", i, text, want)
		}
		ranOn[member]++
	}
	if ranOn["b"] == 0 {
		t.Errorf("requeues ran on %v: none on the second member (the request did not reach the key's owner?)", ranOn)
	}

	t.Setenv("AGENTGATE_STORE_DRIVER", "postgres")
	t.Setenv("AGENTGATE_STORE_DSN", dsn)
	t.Setenv("AGENTGATE_CLUSTER_ENABLED", "true")
	last := chats - 1
	out, errOut := MustRunSessions(t, "requeue", "--data-dir", t.TempDir(), key(last), fmt.Sprint("q", last))
	if want := fmt.Sprintf("requeued message q%d of %s through the member at 127.0.0.1:", last, key(last)); !strings.HasPrefix(out, want) || errOut != "" {
		t.Errorf("sessions requeue said %q (stderr %q), want it to begin %q", out, errOut, want)
	}
	events := readSSE(t, a.base+"/v1/sessions/"+key(last)+"/events", "", 1)
	if text, _ := events[0].data["text"].(string); !strings.HasSuffix(text, fmt.Sprintf("ran q%d for u%d", last, last)) {
		t.Errorf("the requeued q%d answered %q", last, text)
	}
	for _, m := range []*daemon{a, b} {
		if err := m.stop(t, 30*time.Second); err != nil {
			t.Errorf("member exit: %v", err)
		}
	}
}

// TestClusterSignalDuringAStopTheMemberBeganDrains: a one-member cluster is paused (SIGSTOP)
// past member_ttl while its agent runs a turn; resumed, it finds its membership lost and stops
// on its own, its drain waiting for the turn. The service manager's SIGTERM that comes then is
// the first stop signal: the drain goes on, and only a second one exits at once. Before, that
// SIGTERM was taken for the second ("second signal; exiting now", exit 2) and cut the drain.
func TestClusterSignalDuringAStopTheMemberBeganDrains(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	blockDir := t.TempDir()
	m := MustServe(t, t.TempDir(), "AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN="+dsn,
		"AGENTGATE_CLUSTER_ENABLED=true", "AGENTGATE_CLUSTER_BIND=127.0.0.1:0", "AGENTGATE_CLUSTER_MEMBER_TTL=2s",
		"AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT=30s", "AGENTGATE_AGENT_BACKEND=exec", hangingAgent(60), "BLOCK="+blockDir)
	chatOnTheBlockedMember(t, m, blockDir)

	if err := m.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second) // past member_ttl
	if err := m.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool { return strings.Contains(m.stderr.String(), "INF stopping reason=") })
	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.done:
		t.Fatalf("the member stopping on its own exited at the first SIGTERM (%v), its turn still running:\n%s",
			m.err, grep(m.stderr.String(), "signal"))
	case <-time.After(3 * time.Second):
	}
	if s := m.stderr.String(); !strings.Contains(s, "signal received while the daemon stops on its own; the drain goes on") {
		t.Errorf("no line says the drain goes on after the first SIGTERM:\n%s", grep(s, "signal"))
	}
	if err := m.stop(t, 10*time.Second); err == nil { // the second signal
		t.Error("the member exited 0 at the second signal with a turn running; want a non-zero exit")
	}
	if s := m.stderr.String(); !strings.Contains(s, "second signal; exiting now") {
		t.Errorf("the second SIGTERM did not say it exits now:\n%s", grep(s, "signal"))
	}
}
