package supervisor

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/persistence"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// TestReusedMessageIDOverHTTP is a new user's walkthrough: in DM chat par, ann sends "hello" as
// p1, then bob sends "x" as p1. Bob is answered 409 message_id_reused, which tells him to send
// it with a new id, as is ann's other text as p1; nothing is stored for either. Ann's repeat of
// p1 (a client's retry) is still 202 duplicate, also of a text holding a NUL (compared as
// stored, with U+FFFD), and after a restart, when only the store knows p1. Before, bob was
// answered 202 duplicate: his text was discarded while his client believed it delivered.
func TestReusedMessageIDOverHTTP(t *testing.T) {
	dir := t.TempDir()
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir})
	post := func(user, id, text string) (int, []byte) {
		t.Helper()
		return r.postMessage(t, map[string]string{"chat_type": "dm", "chat_id": "par", "user_id": user, "text": text, "message_id": id})
	}
	accepted := func(what string, status int, b []byte, want ...string) {
		t.Helper()
		var m httpplatform.MessageResponse
		if status != http.StatusAccepted || json.Unmarshal(b, &m) != nil || !slices.Contains(want, m.Disposition) {
			t.Errorf("%s = %d %s, want 202 with disposition %q", what, status, b, want)
		}
	}
	reused := func(what string, status int, b []byte) {
		t.Helper()
		var e httpplatform.ErrorResponse
		if status != http.StatusConflict || json.Unmarshal(b, &e) != nil || e.Error.Code != httpplatform.CodeMessageIDReused ||
			!strings.Contains(e.Error.Message, "already used in this chat for another message") ||
			!strings.Contains(e.Error.Message, "with a new message_id") {
			t.Errorf("%s = %d %s, want 409 %s saying the id is another message's and to send it with a new one", what, status, b, httpplatform.CodeMessageIDReused)
		}
	}

	status, b := post("ann", "p1", "hello")
	accepted("ann's p1", status, b, "started")
	status, b = post("bob", "p1", "x")
	reused("bob's p1", status, b)
	status, b = post("ann", "p1", "hello again")
	reused("ann's other text as p1", status, b)
	status, b = post("ann", "p1", "hello")
	accepted("ann's retry of p1", status, b, "duplicate")
	status, b = post("ann", "n1", "a\x00b")
	accepted("ann's n1, holding a NUL", status, b, "started", "queued") // behind p1's turn, or after it
	status, b = post("ann", "n1", "a\x00b")
	accepted("ann's retry of n1", status, b, "duplicate")
	r.stop(t)

	r = MustStartDaemon(t, echo.New(), daemonOpts{dir: dir})
	t.Cleanup(func() { r.stop(t) })
	status, b = post("bob", "p1", "x")
	reused("bob's p1 after a restart", status, b)
	status, b = post("ann", "p1", "hello")
	accepted("ann's retry of p1 after a restart", status, b, "duplicate")
	status, b = post("ann", "n1", "a\x00b")
	accepted("ann's retry of n1 after a restart", status, b, "duplicate")

	msgs := r.onlyTranscript(t, "agent:main:http:dm:par")
	var inbound []string
	for _, m := range msgs {
		if m.Role == persistence.RoleUser {
			inbound = append(inbound, m.UserID+":"+m.Content)
		}
	}
	if want := []string{"ann:hello", "ann:a\uFFFDb"}; !slices.Equal(inbound, want) {
		t.Errorf("inbound rows of par: %q, want %q", inbound, want)
	}
}

// postMessage posts fields as a message to r's HTTP API, and returns the answer's status and body.
func (r *runtime) postMessage(t *testing.T, fields map[string]string) (int, []byte) {
	t.Helper()
	body, _ := json.Marshal(fields)
	resp, err := http.Post("http://"+r.d.Addr().String()+"/v1/messages", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// onlyTranscript is the stored transcript of key's session, which must be its only one.
func (r *runtime) onlyTranscript(t *testing.T, key string) []persistence.Message {
	t.Helper()
	ss, err := r.d.store.SessionsOfKey(t.Context(), key, 10)
	if err != nil || len(ss) != 1 {
		t.Fatalf("sessions of %s: %+v %v, want one", key, ss, err)
	}
	msgs, err := r.d.store.Transcript(t.Context(), ss[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}
