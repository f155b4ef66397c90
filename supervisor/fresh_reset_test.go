package supervisor

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// TestFreshSessionThroughTheHTTPAPI is a new user's walkthrough over the HTTP API. /status as a
// new chat's first message names the session its response's session_id names, and shows the
// reset policy. POST /v1/sessions/{key}/reset twice answers 200 with the same new session
// both times, and the store holds one new session, not a chain of empty ones; /new in that
// session says it is new already and keeps it. Before, /status said "Session (none yet)" with
// no reset policy line, and every reset or /new ended the empty session and began another.
func TestFreshSessionThroughTheHTTPAPI(t *testing.T) {
	r := MustStart(t, echo.New(), nil)
	base := "http://" + r.d.Addr().String()
	send := func(id, text string) (httpplatform.MessageResponse, string) {
		t.Helper()
		body := fmt.Sprintf(`{"chat_id":"c1","user_id":"u1","message_id":%q,"text":%q}`, id, text)
		resp, err := http.Post(base+"/v1/messages?wait=20s", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m httpplatform.MessageResponse
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK || len(m.Replies) == 0 {
			t.Fatalf("POST %q: %d %+v (%v), want 200 with its answer", text, resp.StatusCode, m, err)
		}
		return m, m.Replies[len(m.Replies)-1].Text
	}
	reset := func(key string) httpplatform.SessionInfo {
		t.Helper()
		resp, err := http.Post(base+"/v1/sessions/"+url.PathEscape(key)+"/reset", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var info httpplatform.SessionInfo
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &info) != nil {
			t.Fatalf("POST reset = %d %s, want 200 with the session", resp.StatusCode, b)
		}
		return info
	}
	sessions := func(key string) int {
		t.Helper()
		ss, err := r.d.store.SessionsOfKey(t.Context(), key, 100)
		if err != nil {
			t.Fatal(err)
		}
		return len(ss)
	}

	status, text := send("s1", "/status")
	if !strings.HasPrefix(text, "Session "+status.SessionID+"\n") || !strings.Contains(text, "\nReset policy: none") {
		t.Errorf("/status on a new chat (session_id %s) answered %q, want it to name that session and show the reset policy", status.SessionID, text)
	}
	if m1, _ := send("m1", "hello"); m1.SessionID != status.SessionID {
		t.Errorf("hello went to session %s, not %s, which /status named", m1.SessionID, status.SessionID)
	}

	key := status.SessionKey
	first := reset(key)
	if first.PrevSessionID != status.SessionID || first.EndedAt != nil {
		t.Fatalf("reset answered %+v, want a new session following %s", first, status.SessionID)
	}
	if again := reset(key); again.SessionID != first.SessionID || again.PrevSessionID != status.SessionID || again.EndedAt != nil {
		t.Errorf("a second reset answered session %s (prev %s), want the fresh %s kept (prev %s)",
			again.SessionID, again.PrevSessionID, first.SessionID, status.SessionID)
	}
	if n1, text := send("n1", "/new"); n1.SessionID != first.SessionID || !strings.Contains(text, "is new already") {
		t.Errorf("/new in the fresh session: session %s, answered %q; want %s kept and said new already", n1.SessionID, text, first.SessionID)
	}
	if n := sessions(key); n != 2 {
		t.Errorf("the key has %d sessions after a message, two resets and /new, want 2", n)
	}
}
