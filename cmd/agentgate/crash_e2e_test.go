package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPoisonMessageStopsTheCrashLoop: a message whose turn takes the whole daemon down (here
// the test kills it with -9 while the agent hangs on it, as the OOM killer would) runs again at
// every start. The store counts each unclean stop against it, and the start after the third
// quarantines it: its sender gets the notice, and the chat's next message is answered. A clean
// stop (SIGTERM, the drain cut short) in between does not count.
func TestPoisonMessageStopsTheCrashLoop(t *testing.T) {
	dataDir := t.TempDir()
	d := poisonCrashLoop(t, "agentgate restarted 3 times", func() *daemon {
		return MustServe(t, dataDir, "AGENTGATE_AGENT_BACKEND=exec", "AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT=100ms", poisonAgent)
	})
	// The start after the third unclean stop names the session and the message it counted.
	if !logged(d, "the last run did not stop cleanly; one unclean stop is counted", "agent:main:http:dm:c1 poison-1=3/3") {
		t.Errorf("no unclean-stop warning naming the session and its message's strikes:\n%s", d.stderr.String())
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
}

// poisonAgent is an exec agent whose turns of messages with an id that starts with poison
// hang, as one that takes its daemon down would run until it does.
const poisonAgent = `AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'case "$AGENTGATE_MESSAGE_ID" in poison*) sleep 60;; esac; echo "answered $AGENTGATE_MESSAGE_ID"']`

// poisonCrashLoop sends a poison message to the daemons serve starts one after the other (with
// poisonAgent), kills three of them with -9 while its turn runs and stops one in between with
// SIGTERM, and checks that the next one quarantines it, tells its sender (a notice that says
// why: told, "restarted 3 times" for a daemon) and counts it, and answers the chat's next
// message. It returns that daemon, running.
func poisonCrashLoop(t *testing.T, told string, serve func() *daemon) *daemon {
	t.Helper()
	const key = "agent:main:http:dm:c1"

	d := serve()
	status, ack := post(t, d.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"poison","message_id":"poison-1"}`)
	if status != http.StatusAccepted || ack["session_key"] != key {
		t.Fatalf("POST = %d %v, want 202 for %s", status, ack, key)
	}
	waitAgentRunning(t, d, key)
	d.kill(t) // unclean stop 1

	d = serve()
	waitAgentRunning(t, d, key) // recovered and run again
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v, want 0\n%s", err, d.stderr.String())
	}

	for range 2 {
		d = serve()
		waitAgentRunning(t, d, key) // not quarantined yet: the clean stop did not count
		d.kill(t)                   // unclean stops 2 and 3
	}

	d = serve()
	events := readSSE(t, d.base+"/v1/sessions/"+key+"/events", "", 1)
	if text, _ := events[0].data["text"].(string); events[0].event != "notice" ||
		!strings.Contains(text, "quarantined") || !strings.Contains(text, told) {
		t.Errorf("after the third unclean stop the chat got %s %v, want a quarantine notice that says %q", events[0].event, events[0].data, told)
	}
	status, res := post(t, d.base+"/v1/messages?wait=30s", "", `{"chat_id":"c1","user_id":"u1","text":"hello","message_id":"m2"}`)
	replies, _ := res["replies"].([]any)
	if status != http.StatusOK || len(replies) != 1 || replies[0].(map[string]any)["text"] != "answered m2" {
		t.Fatalf("POST ?wait after the quarantine = %d %v, want 200 with the answer to m2", status, res)
	}
	if _, body := get(t, d.base+"/metrics"); !strings.Contains(body, `agentgate_messages_quarantined_total{cause="unclean_restart"} 1`) {
		t.Errorf("/metrics does not count the quarantine:\n%s", grep(body, "agentgate_messages_quarantined_total"))
	}
	return d
}

// TestPoisonSparesTheChatsInFlight: a slow, innocent message of another chat is in flight at
// every unclean stop of the poison message's crash loop (its turn runs again at each start and
// is still running when the process dies). Both reach 2 strikes; from then on they run on
// probation, one at a time, and a stop counts only against the one that ran: the poison message
// is quarantined after 3 stops, the innocent one is answered. Without probation both reach 3.
func TestPoisonSparesTheChatsInFlight(t *testing.T) {
	dataDir, marks := t.TempDir(), t.TempDir()
	// Poison hangs, as one that takes its daemon down runs until it does; slow hangs until the
	// test creates $MARKS/release (at most 60 s: a killed daemon leaves it behind).
	env := []string{"AGENTGATE_AGENT_BACKEND=exec", "MARKS=" + marks, "AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT=100ms",
		`AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'case "$AGENTGATE_MESSAGE_ID" in poison*) sleep 60;; slow*) i=0; while [ ! -e "$MARKS/release" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done;; esac; echo "answered $AGENTGATE_MESSAGE_ID"']`}
	const poisonKey, slowKey = "agent:main:http:dm:c1", "agent:main:http:dm:c2"
	running := func(d *daemon, key string) bool {
		t.Helper()
		_, body := get(t, d.base+"/v1/sessions/"+key)
		return strings.Contains(body, `"running_turn_id":"t_`)
	}
	release := func() {
		t.Helper()
		if err := os.WriteFile(filepath.Join(marks, "release"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	d := MustServe(t, dataDir, env...)
	for _, m := range []string{`{"chat_id":"c1","user_id":"u1","text":"poison","message_id":"poison-1"}`,
		`{"chat_id":"c2","user_id":"u2","text":"slow","message_id":"slow-1"}`} {
		if status, ack := post(t, d.base+"/v1/messages", "", m); status != http.StatusAccepted {
			t.Fatalf("POST %s = %d %v, want 202", m, status, ack)
		}
	}
	for stop := 1; stop <= 2; stop++ {
		if stop > 1 {
			d = MustServe(t, dataDir, env...)
		}
		// Both agents' commands run (from the second start on, once their marks are stored).
		waitFor(t, 30*time.Second, func() bool { return running(d, poisonKey) && running(d, slowKey) && agentsRunning(d) == 2 })
		d.kill(t) // unclean stops 1 and 2: both in flight, both count
	}

	// Both have 2 strikes: they run one at a time. When the slow one runs first (the poison
	// message's session says it waits), it is answered, and the poison message runs next.
	d = MustServe(t, dataDir, env...)
	probation := func(key, want string) bool {
		_, body := get(t, d.base+"/v1/sessions/"+key)
		return strings.Contains(body, `"probation":"`+want+`"`)
	}
	waitFor(t, 30*time.Second, func() bool {
		return running(d, poisonKey) || running(d, slowKey) && probation(poisonKey, "waiting")
	})
	// The session API says which one runs on probation and which one waits.
	runner, waiter := poisonKey, slowKey
	if !running(d, poisonKey) {
		runner, waiter = slowKey, poisonKey
	}
	waitFor(t, 30*time.Second, func() bool { return probation(waiter, "waiting") })
	if !logged(d, "waits to run alone") { // (once for both: the line is limited to one a minute)
		t.Errorf("the log does not say a suspect waits to run alone:\n%s", d.stderr.String())
	}
	if !probation(runner, "running") {
		_, body := get(t, d.base+"/v1/sessions/"+runner)
		t.Errorf("GET %s = %s, want the live state to say it runs on probation", runner, body)
	}
	if !running(d, poisonKey) {
		t.Log("the slow message runs first on probation; it is answered, then the poison message runs")
		release()
		waitFor(t, 30*time.Second, func() bool { return running(d, poisonKey) })
	}
	if running(d, slowKey) {
		t.Errorf("the slow message runs along with the poison message after 2 unclean stops, want one at a time")
	}
	waitFor(t, 30*time.Second, func() bool { return agentsRunning(d) == 1 }) // its command runs
	if !logged(d, "running a suspect message on probation", "message_id=poison-1", "strikes=2/3") {
		t.Errorf("the log does not say the poison message runs on probation:\n%s", d.stderr.String())
	}
	d.kill(t) // unclean stop 3: counted against the poison message alone
	release()

	d = MustServe(t, dataDir, env...)
	events := readSSE(t, d.base+"/v1/sessions/"+poisonKey+"/events", "", 1)
	if text, _ := events[0].data["text"].(string); events[0].event != "notice" || !strings.Contains(text, "restarted 3 times") {
		t.Errorf("the poison message's chat got %s %v, want a quarantine notice that says agentgate restarted 3 times", events[0].event, events[0].data)
	}
	events = readSSE(t, d.base+"/v1/sessions/"+slowKey+"/events", "", 1)
	if text, _ := events[0].data["text"].(string); events[0].event != "reply" || text != "answered slow-1" {
		t.Errorf("the slow message's chat got %s %v, want the answer to slow-1", events[0].event, events[0].data)
	}
	if _, body := get(t, d.base+"/metrics"); !strings.Contains(body, `agentgate_messages_quarantined_total{cause="unclean_restart"} 1`) {
		t.Errorf("/metrics does not count one quarantine:\n%s", grep(body, "agentgate_messages_quarantined_total"))
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
}

// TestWaitingForAnAgentSlotIsNoSuspect: two chats, one agent slot (agent.max_concurrent 1),
// and two kill -9s while one chat's agent runs and the other chat's turn waits for the slot.
// The first stop counts both messages; the second only the one whose agent had started (its
// mark), so the start after it has one suspect, on probation, and the chat that only waited is
// no suspect and waits for no probation. Before, both were suspects: during a backlog two
// unclean stops put every chat that waited for a slot on probation.
func TestWaitingForAnAgentSlotIsNoSuspect(t *testing.T) {
	dataDir := t.TempDir()
	env := []string{"AGENTGATE_AGENT_BACKEND=exec", "AGENTGATE_AGENT_MAX_CONCURRENT=1", "AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT=100ms",
		`AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'sleep 60']`}
	keys := []string{"agent:main:http:dm:c1", "agent:main:http:dm:c2"}
	state := func(d *daemon, key string) string {
		t.Helper()
		_, body := get(t, d.base+"/v1/sessions/"+key)
		return body
	}
	// One agent runs and the other chat's turn waits for the slot.
	oneRunsOneWaits := func(d *daemon) {
		t.Helper()
		waitFor(t, 30*time.Second, func() bool {
			return agentsRunning(d) == 1 && strings.Contains(state(d, keys[0]), `"running_turn_id":"t_`) &&
				strings.Contains(state(d, keys[1]), `"running_turn_id":"t_`)
		})
	}

	d := MustServe(t, dataDir, env...)
	for i, key := range keys {
		m := fmt.Sprintf(`{"chat_id":"c%d","user_id":"u%d","text":"hello","message_id":"m%d"}`, i+1, i+1, i+1)
		if status, ack := post(t, d.base+"/v1/messages", "", m); status != http.StatusAccepted || ack["session_key"] != key {
			t.Fatalf("POST %s = %d %v, want 202 for %s", m, status, ack, key)
		}
	}
	oneRunsOneWaits(d)
	d.kill(t) // unclean stop 1: both messages count (1)
	d = MustServe(t, dataDir, env...)
	oneRunsOneWaits(d)
	d.kill(t) // unclean stop 2: only the message whose agent ran counts (2)

	d = MustServe(t, dataDir, env...)
	waitFor(t, 30*time.Second, func() bool { return logged(d, "did not stop cleanly") })
	if line := grep(d.stderr.String(), "did not stop cleanly"); strings.Count(line, "=2/3") != 1 || strings.Count(line, "/3") != 1 {
		t.Errorf("the start after the second unclean stop logged %q, want one message counted, to 2", line)
	}
	var running, other string
	waitFor(t, 30*time.Second, func() bool {
		for i, key := range keys {
			if strings.Contains(state(d, key), `"probation":"running"`) {
				running, other = key, keys[1-i]
				return true
			}
		}
		return false
	})
	if body := state(d, other); strings.Contains(body, `"probation"`) {
		t.Errorf("GET %s = %s, want no probation: its message only waited for an agent slot during the second stop", other, body)
	}
	if _, body := get(t, d.base+"/metrics"); !strings.Contains(body, "agentgate_probation_waiting 0") {
		t.Errorf("with %s on probation, /metrics says %s, want none waiting", running, grep(body, "agentgate_probation_waiting"))
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
}

// waitAgentRunning waits until key's session on d runs a turn and its agent's command runs: a
// struck message's turn starts its agent only once its mark is stored, and a stop before that
// does not count against it.
func waitAgentRunning(t *testing.T, d *daemon, key string) {
	t.Helper()
	waitFor(t, 30*time.Second, func() bool {
		_, body := get(t, d.base+"/v1/sessions/"+key)
		return strings.Contains(body, `"running_turn_id":"t_`) && agentsRunning(d) > 0
	})
}

// agentsRunning counts the live child processes of d: the exec agent's commands that run.
func agentsRunning(d *daemon) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	ppid := strconv.Itoa(d.cmd.Process.Pid)
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) state ppid ...": the fields after the parenthesised command name.
		i := strings.LastIndexByte(string(stat), ')')
		if f := strings.Fields(string(stat[i+1:])); len(f) > 1 && f[0] != "Z" && f[1] == ppid {
			n++
		}
	}
	return n
}

// logged reports whether a line of d's log holds every one of parts.
func logged(d *daemon, parts ...string) bool {
	for line := range strings.Lines(d.stderr.String()) {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return true
		}
	}
	return false
}

// TestAgentSignalledWithTheDaemonRunsAgain: a service manager that stops agentgate signals its
// whole process tree at once (systemd's default KillMode=control-group), the running agent's
// command included. That turn did not fail, the stop cut it short: no failure notice, the
// message stays pending, and the next start runs it and answers it once.
func TestAgentSignalledWithTheDaemonRunsAgain(t *testing.T) {
	dataDir, marks := t.TempDir(), t.TempDir()
	env := []string{"AGENTGATE_AGENT_BACKEND=exec", "MARKS=" + marks,
		// The first run records its process group and hangs; the next answers.
		`AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'if [ ! -e "$MARKS/pgid" ]; then echo $$ > "$MARKS/pgid.tmp"; mv "$MARKS/pgid.tmp" "$MARKS/pgid"; sleep 60; fi; echo "answered $AGENTGATE_MESSAGE_ID"']`}
	d := MustServe(t, dataDir, env...)
	if status, ack := post(t, d.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"hi","message_id":"m1"}`); status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ack)
	}
	var pgid int
	waitFor(t, 30*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(marks, "pgid"))
		if err != nil {
			return false
		}
		pgid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	// As KillMode=control-group does: SIGTERM to every process at once.
	if err := errors.Join(d.cmd.Process.Signal(syscall.SIGTERM), syscall.Kill(-pgid, syscall.SIGTERM)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
		if d.err != nil {
			t.Fatalf("exit after SIGTERM: %v, want 0\n%s", d.err, d.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon did not stop")
	}
	if !strings.Contains(d.stderr.String(), "KillMode=mixed") {
		t.Errorf("the log does not say why the turn ran again:\n%s", d.stderr.String())
	}

	d = MustServe(t, dataDir, env...)
	events := readSSE(t, d.base+"/v1/sessions/agent:main:http:dm:c1/events", "", 1)
	if text, _ := events[0].data["text"].(string); events[0].event != "reply" || text != "answered m1" {
		t.Errorf("the chat's first event after the restart: %s %v, want the reply to m1 (no failure notice)", events[0].event, events[0].data)
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
}
