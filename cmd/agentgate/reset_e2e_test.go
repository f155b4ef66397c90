package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// blockingAgent is an exec agent whose turns run until they are cancelled: a turn's command
// writes "running" to the file $MARK names once it would see a SIGTERM, and "cancelled" when it
// does (MARK is no AGENTGATE_ variable, so the agent sees it).
const blockingAgent = `AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'trap "echo cancelled > \"$MARK\"; exit 143" TERM; echo running > "$MARK"; cat > /dev/null; sleep 60 & wait']`

// TestSessionsResetThroughTheDaemon: `agentgate sessions reset` while the daemon runs asks the
// daemon to reset the session, whose own reset cancels the turn it runs. Without the bearer
// token the daemon asks for, it says which variable to set and resets nothing.
func TestSessionsResetThroughTheDaemon(t *testing.T) {
	dir := t.TempDir()
	mark := filepath.Join(t.TempDir(), "mark")
	d := MustServe(t, dir, "AGENTGATE_AGENT_BACKEND=exec", blockingAgent, "MARK="+mark,
		"AGENTGATE_HTTP_TOKEN_ENV=ADMIN_TOKEN", "ADMIN_TOKEN=s3cret")
	call := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(method, d.base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer s3cret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out map[string]any
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s %s: %d %q: %v", method, path, resp.StatusCode, raw, err)
		}
		return resp.StatusCode, out
	}
	status, msg := call(http.MethodPost, "/v1/messages", `{"chat_id":"c1","user_id":"u1","text":"work on it"}`)
	if status != http.StatusAccepted || msg["disposition"] != "started" {
		t.Fatalf("POST: %d %v, want 202 started", status, msg)
	}
	key, first := msg["session_key"].(string), msg["session_id"].(string)
	readMark := func() string {
		b, _ := os.ReadFile(mark)
		return strings.TrimSpace(string(b))
	}
	// A SIGTERM before the command's trap is set would end it without a word.
	waitFor(t, 30*time.Second, func() bool { return readMark() == "running" })

	t.Setenv("AGENTGATE_HTTP_TOKEN_ENV", "ADMIN_TOKEN")
	t.Setenv("ADMIN_TOKEN", "")
	_, _, err := runSessions(t, "reset", "--data-dir", dir, key)
	if want := "asks for a bearer token: set ADMIN_TOKEN (http.token_env) to it"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("reset without the token: %v, want an error that says %q", err, want)
	}
	if _, info := call(http.MethodGet, "/v1/sessions/"+key, ""); info["session_id"] != first {
		t.Errorf("after the refused reset the session is %v, want %s still", info["session_id"], first)
	}

	t.Setenv("ADMIN_TOKEN", "s3cret")
	if _, _, err := runSessions(t, "reset", "--data-dir", dir, "agent:main:http:dm:nobody"); err == nil ||
		err.Error() != "sessions reset: the key agent:main:http:dm:nobody has no session, so nothing was reset; agentgate sessions list prints the keys that have one" {
		t.Errorf("reset of an unknown key through the daemon: %v, want that the key has no session", err)
	}
	out, _ := MustRunSessions(t, "reset", "--data-dir", dir, key)
	if want := "ended session " + first + " of " + key + " (reset_command) through the daemon at "; !strings.HasPrefix(out, want) {
		t.Errorf("reset said %q, want it to begin %q", out, want)
	}
	waitFor(t, 30*time.Second, func() bool { return readMark() == "cancelled" })
	_, info := call(http.MethodGet, "/v1/sessions/"+key, "")
	if info["prev_session_id"] != first || info["session_id"] == first {
		t.Errorf("after the reset: session %v, previous %v; want a new session after %s", info["session_id"], info["prev_session_id"], first)
	}
	// Reset again: the new session holds nothing yet, and is left as it is (before, the command
	// said it ended it, and a chain of empty sessions grew with each run).
	second := info["session_id"].(string)
	out, _ = MustRunSessions(t, "reset", "--data-dir", dir, key)
	if want := "session " + second + " of " + key + " holds no conversation yet (commands and notices do not count): the daemon at "; !strings.HasPrefix(out, want) {
		t.Errorf("a second reset said %q, want it to begin %q", out, want)
	}
	if _, info := call(http.MethodGet, "/v1/sessions/"+key, ""); info["session_id"] != second {
		t.Errorf("after the second reset the session is %v, want %s still", info["session_id"], second)
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("daemon exit: %v", err)
	}
}
