package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// raceEnabled is set by race_test.go when the test binary is built with -race, so the daemon
// under test is built the same way.
var raceEnabled bool

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// MustBuild builds the agentgate binary once per test run.
func MustBuild(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the daemon binary")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "agentgate-e2e-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "agentgate")
		args := []string{"build", "-o", binPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// daemon is a running agentgate process.
type daemon struct {
	cmd    *exec.Cmd
	base   string
	stderr *testutil.Buffer
	done   chan struct{} // closed when the process has exited
	err    error         // its exit error, set before done closes
}

// MustServe starts `agentgate serve` on a loopback port with dataDir and waits for its ready
// line.
func MustServe(t *testing.T, dataDir string, env ...string) *daemon {
	t.Helper()
	return MustServeCmd(t, exec.Command(MustBuild(t), "serve", "--data-dir", dataDir, "--http-addr", "127.0.0.1:0"), env...)
}

// MustServeCmd starts cmd, an `agentgate serve` command line, with env added to the
// environment, and waits for its ready line.
func MustServeCmd(t *testing.T, cmd *exec.Cmd, env ...string) *daemon {
	t.Helper()
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, stderr: &testutil.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-d.done
		if t.Failed() {
			t.Logf("daemon stderr:\n%s", d.stderr.String())
		}
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				ready <- addr
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case addr := <-ready:
		d.base = "http://" + addr
	case <-d.done:
		t.Fatalf("daemon exited before ready: %v\n%s", d.err, d.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("no ready line within 60s\n%s", d.stderr.String())
	}
	return d
}

// kill stops the daemon with SIGKILL (an unclean stop) and waits for it to exit.
func (d *daemon) kill(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
}

// stop sends SIGTERM and returns the exit error, failing if the daemon outlives deadline.
func (d *daemon) stop(t *testing.T, deadline time.Duration) error {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
		return d.err
	case <-time.After(deadline):
		t.Fatalf("daemon still running %v after SIGTERM", deadline)
		return nil
	}
}

func post(t *testing.T, url, contentType, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("POST %s: status %d, body %q is not JSON: %v", url, resp.StatusCode, raw, err)
	}
	return resp.StatusCode, out
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// TestDaemonEndToEnd runs the real binary: ready line, messages with ?wait and SSE, health,
// metrics, SIGTERM → exit 0, and the rows it left in SQLite.
func TestDaemonEndToEnd(t *testing.T) {
	dataDir := t.TempDir()
	d := MustServe(t, dataDir)

	status, ack := post(t, d.base+"/v1/messages", "application/json", `{"chat_id":"c1","user_id":"u1","text":"first","message_id":"m1"}`)
	if status != http.StatusAccepted || ack["disposition"] == "" || ack["session_key"] != "agent:main:http:dm:c1" {
		t.Fatalf("POST = %d %v, want 202 with a disposition for agent:main:http:dm:c1", status, ack)
	}
	key := ack["session_key"].(string)

	status, res := post(t, d.base+"/v1/messages?wait=30s", "", `{"chat_id":"c1","user_id":"u1","text":"second","message_id":"m2"}`)
	if status != http.StatusOK {
		t.Fatalf("POST ?wait = %d %v, want 200", status, res)
	}
	replies, _ := res["replies"].([]any)
	if len(replies) != 1 || replies[0].(map[string]any)["text"] != "second" {
		t.Fatalf("?wait replies = %v, want one echo of %q", res["replies"], "second")
	}

	status, dup := post(t, d.base+"/v1/messages?wait=30s", "", `{"chat_id":"c1","user_id":"u1","text":"second","message_id":"m2"}`)
	if status != http.StatusOK || dup["disposition"] != "duplicate" {
		t.Fatalf("repeated message_id = %d %v, want 200 duplicate", status, dup)
	}

	// SSE from the start: both replies, in order, with increasing ids.
	events := readSSE(t, d.base+"/v1/sessions/"+key+"/events", "", 2)
	if events[0].data["text"] != "first" || events[1].data["text"] != "second" {
		t.Errorf("SSE events = %+v, want replies first, second", events)
	}
	// Resume after the first event.
	resumed := readSSE(t, d.base+"/v1/sessions/"+key+"/events", events[0].id, 1)
	if resumed[0].id != events[1].id {
		t.Errorf("resumed SSE starts at id %s, want %s", resumed[0].id, events[1].id)
	}

	for _, path := range []string{"/healthz", "/readyz"} {
		if status, body := get(t, d.base+path); status != http.StatusOK {
			t.Errorf("GET %s = %d %s, want 200", path, status, body)
		}
	}
	if _, body := get(t, d.base+"/metrics"); !strings.Contains(body, `agentgate_turns_total{outcome="ok"} 2`) {
		t.Errorf("/metrics does not count 2 ok turns:\n%s", grep(body, "agentgate_turns_total"))
	}
	if status, body := get(t, d.base+"/v1/sessions/"+key+"/transcript"); status != http.StatusOK || !strings.Contains(body, `"role":"assistant"`) {
		t.Errorf("transcript = %d %s", status, body)
	}

	if err := d.stop(t, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v, want 0\n%s", err, d.stderr.String())
	}

	store, err := sqlite.OpenReadOnly(t.Context(), filepath.Join(dataDir, "agentgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	msgs, err := store.Transcript(t.Context(), ack["session_id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	var users, done int
	for _, m := range msgs {
		if m.Role == persistence.RoleUser {
			users++
			if m.Status == persistence.StatusDone {
				done++
			}
		}
	}
	if users != 2 || done != 2 {
		t.Errorf("database has %d user messages (%d done), want 2 and 2: %+v", users, done, msgs)
	}
	out, err := store.OutboxAfter(t.Context(), key, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range out {
		if e.State != persistence.DeliveryDelivered {
			t.Errorf("outbox %d state %q, want delivered", e.Seq, e.State)
		}
	}
}

// TestDaemonBadInput sends malformed input to the real daemon: each case gets its status and a
// JSON error body, and the daemon keeps serving.
func TestDaemonBadInput(t *testing.T) {
	d := MustServe(t, t.TempDir())
	big := strings.Repeat("x", 64*1024+1)
	tests := []struct {
		name, contentType, body string
		status                  int
		code                    string
	}{
		{"invalid json", "application/json", `{"chat_id":`, 400, "invalid_json"},
		{"unknown field", "", `{"chat_id":"c","user_id":"u","text":"t","admin":true}`, 400, "unknown_field"},
		{"missing text", "", `{"chat_id":"c","user_id":"u"}`, 400, "missing_field"},
		{"missing chat", "", `{"user_id":"u","text":"t"}`, 400, "missing_field"},
		{"text too large", "", `{"chat_id":"c","user_id":"u","text":"` + big + `"}`, 413, "text_too_large"},
		{"invalid utf8", "", "{\"chat_id\":\"c\",\"user_id\":\"u\",\"text\":\"\xff\xfe\"}", 400, "invalid_utf8"},
		{"unknown chat type", "", `{"chat_id":"c","user_id":"u","text":"t","chat_type":"room"}`, 400, "invalid_chat_type"},
		{"wrong content type", "text/plain", `{"chat_id":"c","user_id":"u","text":"t"}`, 415, ""},
		{"not an object", "", `[1,2]`, 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := post(t, d.base+"/v1/messages", tt.contentType, tt.body)
			errBody, _ := body["error"].(map[string]any)
			if status != tt.status || errBody == nil || errBody["message"] == "" {
				t.Fatalf("status %d body %v, want %d with an error body", status, body, tt.status)
			}
			if tt.code != "" && errBody["code"] != tt.code {
				t.Errorf("error code %v, want %s", errBody["code"], tt.code)
			}
			status, res := post(t, d.base+"/v1/messages?wait=30s", "", `{"chat_id":"ok","user_id":"u","text":"still here"}`)
			if status != http.StatusOK {
				t.Fatalf("good request after %s = %d %v, want 200", tt.name, status, res)
			}
		})
	}
}

type sseEvent struct {
	id, event string
	data      map[string]any
}

// readSSE reads n events from url, resuming after lastID when it is not empty.
func readSSE(t *testing.T, url, lastID string, n int) []sseEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d", url, resp.StatusCode)
	}
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(resp.Body)
	for len(out) < n && sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.id != "" {
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			cur.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			cur.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.data); err != nil {
				t.Fatalf("SSE data %q: %v", line, err)
			}
		}
	}
	if len(out) < n {
		t.Fatalf("SSE gave %d events, want %d: %v", len(out), n, sc.Err())
	}
	return out
}

func grep(body, substr string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestDaemonSecondSignalAndRecovery: a turn outlives the first SIGTERM (the daemon drains); a
// second signal exits at once, and kills what the turn's command started (it would run on
// beside the next start's run of the message). The unanswered message is durable, and the next
// start answers it without any new traffic.
func TestDaemonSecondSignalAndRecovery(t *testing.T) {
	dataDir, marks := t.TempDir(), t.TempDir()
	d := MustServe(t, dataDir, "AGENTGATE_AGENT_BACKEND=exec", "MARKS="+marks,
		`AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'sleep 60 & echo $! > "$MARKS/child.tmp"; mv "$MARKS/child.tmp" "$MARKS/child"; wait']`)
	status, ack := post(t, d.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"survive me","message_id":"m1"}`)
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ack)
	}
	waitFor(t, 10*time.Second, func() bool {
		_, body := get(t, d.base+"/v1/sessions/"+ack["session_key"].(string))
		return strings.Contains(body, `"running_turn_id":"t_`)
	})
	var child int // the process the turn's command started
	waitFor(t, 10*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(marks, "child"))
		if err != nil {
			return false
		}
		child, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return strings.Contains(d.stderr.String(), "draining") })
	err := d.stop(t, 10*time.Second) // the second signal
	if err == nil {
		t.Fatalf("daemon exited 0 after a second signal with a turn running; want a non-zero exit")
	}
	waitFor(t, 10*time.Second, func() bool { return exited(child) })

	d2 := MustServe(t, dataDir) // echo agent
	events := readSSE(t, d2.base+"/v1/sessions/"+ack["session_key"].(string)+"/events", "", 1)
	if events[0].data["text"] != "survive me" {
		t.Errorf("after restart the session said %v, want the echo of the unanswered message", events[0].data)
	}
	// An operator's second signal is no crash: the message it cut short gets no strike.
	if strings.Contains(d2.stderr.String(), "did not stop cleanly") {
		t.Errorf("the start after a second signal counted an unclean stop:\n%s", grep(d2.stderr.String(), "did not stop cleanly"))
	}
	if err := d2.stop(t, 30*time.Second); err != nil {
		t.Errorf("second daemon exit: %v", err)
	}
}

// TestHangupIgnoredUnderNohup: a daemon started with SIGHUP ignored (`nohup`, or a shell
// that traps HUP to nothing) keeps ignoring it, as README says: the hangup of the terminal it
// was started from does not stop it. It answers after the hangup, and the SIGTERM after that
// is what stops it.
func TestHangupIgnoredUnderNohup(t *testing.T) {
	t.Parallel()
	d := MustServeCmd(t, exec.Command("/bin/sh", "-c", `trap '' HUP; exec "$0" "$@"`,
		MustBuild(t), "serve", "--data-dir", t.TempDir(), "--http-addr", "127.0.0.1:0"))
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	status, res := post(t, d.base+"/v1/messages?wait=30s", "", `{"chat_id":"c1","user_id":"u1","text":"still here","message_id":"m1"}`)
	if replies, _ := res["replies"].([]any); status != http.StatusOK || len(replies) != 1 || replies[0].(map[string]any)["text"] != "still here" {
		t.Errorf("POST ?wait after a hangup = %d %v, want 200 with the echo", status, res)
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
	if strings.Contains(d.stderr.String(), "hangup received") {
		t.Errorf("a daemon started with SIGHUP ignored acted on a hangup:\n%s", grep(d.stderr.String(), "hangup"))
	}
}

// TestHangupStopsAsSIGTERMDoes: SIGHUP (a terminal that drops, or a `kill -HUP` meant as a
// reload) drains as SIGTERM does: the running turn finishes, the log says what the hangup did
// and that nothing was reloaded, the process exits 0, and the next start counts no unclean
// stop. A second hangup during the drain (a dropped terminal sends two) does not cut it short.
// Before, SIGHUP killed the daemon at once, with no log line, and the next start counted an
// unclean stop against the running message.
func TestHangupStopsAsSIGTERMDoes(t *testing.T) {
	dataDir, marks := t.TempDir(), t.TempDir()
	d := MustServe(t, dataDir, "AGENTGATE_AGENT_BACKEND=exec", "MARKS="+marks,
		`AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'touch "$MARKS/running"; while [ ! -e "$MARKS/release" ]; do sleep 0.05; done; echo "answered $AGENTGATE_MESSAGE_ID"']`)
	status, ack := post(t, d.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"hi","message_id":"m1"}`)
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ack)
	}
	waitFor(t, 10*time.Second, func() bool { _, err := os.Stat(filepath.Join(marks, "running")); return err == nil })
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool {
		select {
		case <-d.done:
			t.Fatalf("SIGHUP ended the daemon at once (%v), want a drain\n%s", d.err, d.stderr.String())
		default:
		}
		return strings.Contains(d.stderr.String(), "draining")
	})
	const said = "INF hangup received (SIGHUP); stopping as for SIGTERM: agentgate does not reload its configuration (restart it to apply a change) signal=hangup"
	if !strings.Contains(d.stderr.String(), said) {
		t.Errorf("the log of a hangup:\n%s\nwant a line with %q", d.stderr.String(), said)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return strings.Contains(d.stderr.String(), "hangup received (SIGHUP) during the drain") })
	select {
	case <-d.done:
		t.Fatalf("a second hangup during the drain ended the daemon (%v), want the drain to go on", d.err)
	default:
	}
	if err := os.WriteFile(filepath.Join(marks, "release"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("daemon still running 30s after its turn was released")
	}
	if d.err != nil {
		t.Fatalf("exit after SIGHUP: %v, want 0\n%s", d.err, d.stderr.String())
	}
	if strings.Contains(d.stderr.String(), "second signal; exiting now") {
		t.Errorf("a second hangup counted as a second signal:\n%s", d.stderr.String())
	}

	d2 := MustServe(t, dataDir)
	if strings.Contains(d2.stderr.String(), "did not stop cleanly") {
		t.Errorf("the start after a hangup counted an unclean stop:\n%s", grep(d2.stderr.String(), "did not stop cleanly"))
	}
	if err := d2.stop(t, 30*time.Second); err != nil {
		t.Errorf("second daemon exit: %v", err)
	}
}

// exited reports whether pid has exited: an orphan whose exit no init reaps stays a zombie.
func exited(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", within)
		}
		time.Sleep(10 * time.Millisecond) // a poll interval under a deadline
	}
}

// TestDaemonServesDiscord runs the binary with Discord switched on through the environment, as
// an operator would, against a fake Discord on loopback: a DM is answered, and SIGTERM drains.
func TestDaemonServesDiscord(t *testing.T) {
	srv := discordtest.New(t)
	const dm = "300000000000000001"
	srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	d := MustServe(t, t.TempDir(),
		"AGENTGATE_PLATFORMS_DISCORD_ENABLED=true",
		"AGENTGATE_PLATFORMS_DISCORD_API_URL="+srv.APIURL(),
		"DISCORD_TOKEN="+srv.Token())
	srv.WaitReady(t)
	m := srv.Post(discordtest.UserMessage{ChannelID: dm, Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: "hello from discord"})
	got := srv.WaitSent(t, dm, 1)
	if got[0].Content != "hello from discord" || got[0].MessageReference == nil || got[0].MessageReference.MessageID != m.ID {
		t.Errorf("reply = %q answering %v, want the echo answering %s", got[0].Content, got[0].MessageReference, m.ID)
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// TestDaemonRefusesADataDirInUse: a second `agentgate serve` on the data directory a running
// daemon holds exits non-zero with a message that says so (it once panicked), and the first one
// keeps answering.
func TestDaemonRefusesADataDirInUse(t *testing.T) {
	dataDir := t.TempDir()
	d := MustServe(t, dataDir)
	out, err := exec.Command(MustBuild(t), "serve", "--data-dir", dataDir, "--http-addr", "127.0.0.1:0").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("second serve: %v, want a non-zero exit\n%s", err, out)
	}
	if !strings.Contains(string(out), "data directory in use by another process") || strings.Contains(string(out), "panic") {
		t.Errorf("second serve said:\n%s\nwant the data directory in use, and no panic", out)
	}
	// It names where the daemon that holds it answers (found by a new user's walkthrough)...
	addr := strings.TrimPrefix(d.base, "http://")
	if !strings.Contains(string(out), "(the daemon there answers at "+addr+")") {
		t.Errorf("second serve said:\n%s\nwant the running daemon's address, %s", out, addr)
	}
	// ...once the process there answers as the run the directory records: an address a dead
	// daemon left (its run is another) is not named.
	if err := os.WriteFile(filepath.Join(dataDir, "http.run"), []byte("r_dead\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ = exec.Command(MustBuild(t), "serve", "--data-dir", dataDir, "--http-addr", "127.0.0.1:0").CombinedOutput()
	if !strings.Contains(string(out), "data directory in use by another process") || strings.Contains(string(out), "answers at") {
		t.Errorf("serve beside a record of another run said:\n%s\nwant the data directory in use, and no address", out)
	}
	if status, ack := post(t, d.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"still here"}`); status != http.StatusAccepted {
		t.Errorf("first daemon after the refused start: %d %v", status, ack)
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("first daemon exit: %v", err)
	}
}

// TestStartErrorIsOneLine: a start that fails ends with one line, also when a library's error
// spans several: pgx lists each address it tried, one a line (found by an audit).
func TestStartErrorIsOneLine(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().(*net.TCPAddr).Port // nothing listens there once closed
	l.Close()
	cmd := exec.Command(MustBuild(t), "serve", "--data-dir", t.TempDir(), "--http-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "AGENTGATE_STORE_DRIVER=postgres",
		fmt.Sprintf("AGENTGATE_STORE_DSN=host=127.0.0.1 port=%d user=a password=x dbname=x connect_timeout=5", closed))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	var exit *exec.ExitError
	if err := cmd.Run(); !errors.As(err, &exit) {
		t.Fatalf("serve on a database nobody serves: %v, want a non-zero exit\n%s", err, stderr.String())
	}
	var last string
	for line := range strings.Lines(stderr.String()) {
		if strings.HasPrefix(line, "\t") || strings.HasPrefix(line, " ") {
			t.Errorf("stderr has a continued line %q:\n%s", line, stderr.String())
		}
		last = line
	}
	if !strings.HasPrefix(last, "agentgate: start: open store: ") || !strings.Contains(last, "connection refused") {
		t.Errorf("the last line of stderr = %q, want the start's error, whole", last)
	}
}

// TestDaemonStartsWithItsDatabaseNamedAgentgate: a SQLite database named "agentgate" in the
// data directory (store.dsn: <data_dir>/agentgate) has its lock file where the data
// directory's own lock would be if it were named "agentgate.lock". Before, the daemon took
// both locks on that one file and refused to start, saying the data directory was in use.
func TestDaemonStartsWithItsDatabaseNamedAgentgate(t *testing.T) {
	dataDir := t.TempDir()
	d := MustServe(t, dataDir, "AGENTGATE_STORE_DSN="+filepath.Join(dataDir, "agentgate"))
	if status, ack := post(t, d.base+"/v1/messages", "", `{"chat_id":"c1","user_id":"u1","text":"hello"}`); status != http.StatusAccepted {
		t.Errorf("POST /v1/messages: %d %v", status, ack)
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("daemon exit: %v", err)
	}
}

// TestHangupWithItsLogReaderGone: `agentgate serve 2>&1 | tee log` in an SSH session that
// drops: the hangup ends tee, the log's reader, and then reaches the daemon, which still
// drains and stops cleanly; its log lines fail with EPIPE. Before, Go killed it with SIGPIPE
// at its first line after the reader was gone: no drain, and the next start counted an unclean
// stop (found by a review).
func TestHangupWithItsLogReaderGone(t *testing.T) {
	dataDir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(MustBuild(t), "serve", "--data-dir", dataDir, "--http-addr", "127.0.0.1:0")
	cmd.Stderr = w
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	go func() { _, _ = io.Copy(io.Discard, r) }() // the log's reader, until it goes
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "listening on ") {
		t.Fatalf("no ready line: %q", sc.Text())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGHUP with the log's reader gone: %v, want 0 (a clean stop)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("daemon still running 30s after SIGHUP")
	}
	d2 := MustServe(t, dataDir)
	if strings.Contains(d2.stderr.String(), "did not stop cleanly") {
		t.Errorf("the start after the hangup counted an unclean stop:\n%s", grep(d2.stderr.String(), "did not stop cleanly"))
	}
	if err := d2.stop(t, 30*time.Second); err != nil {
		t.Errorf("second daemon exit: %v", err)
	}
}
