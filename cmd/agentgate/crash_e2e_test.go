package main

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
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
	d := poisonCrashLoop(t, func() *daemon {
		return MustServe(t, dataDir, "AGENTGATE_AGENT_BACKEND=exec", "AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT=100ms", poisonAgent)
	})
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
}

// poisonAgent is an exec agent whose turns of messages with an id that starts with poison
// hang, as one that takes its daemon down would run until it does.
const poisonAgent = `AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'case "$AGENTGATE_MESSAGE_ID" in poison*) sleep 60;; esac; echo "answered $AGENTGATE_MESSAGE_ID"']`

// poisonCrashLoop sends a poison message to the daemons serve starts one after the other (with
// poisonAgent), kills three of them with -9 while its turn runs and stops one in between with
// SIGTERM, and checks that the next one quarantines it, tells its sender and counts it, and
// answers the chat's next message. It returns that daemon, running.
func poisonCrashLoop(t *testing.T, serve func() *daemon) *daemon {
	t.Helper()
	const key = "agent:main:http:dm:c1"
	running := func(d *daemon) {
		t.Helper()
		waitFor(t, 30*time.Second, func() bool {
			_, body := get(t, d.base+"/v1/sessions/"+key)
			return strings.Contains(body, `"running_turn_id":"t_`)
		})
	}
	kill := func(d *daemon) {
		t.Helper()
		if err := d.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-d.done
	}

	d := serve()
	status, ack := post(t, d.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"poison","message_id":"poison-1"}`)
	if status != http.StatusAccepted || ack["session_key"] != key {
		t.Fatalf("POST = %d %v, want 202 for %s", status, ack, key)
	}
	running(d)
	kill(d) // unclean stop 1

	d = serve()
	running(d) // recovered and run again
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v, want 0\n%s", err, d.stderr.String())
	}

	for range 2 {
		d = serve()
		running(d) // not quarantined yet: the clean stop did not count
		kill(d)    // unclean stops 2 and 3
	}

	d = serve()
	events := readSSE(t, d.base+"/v1/sessions/"+key+"/events", "", 1)
	if text, _ := events[0].data["text"].(string); events[0].event != "notice" ||
		!strings.Contains(text, "quarantined") || !strings.Contains(text, "restarted 3 times") {
		t.Errorf("after the third unclean stop the chat got %s %v, want a quarantine notice that says agentgate restarted 3 times", events[0].event, events[0].data)
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
