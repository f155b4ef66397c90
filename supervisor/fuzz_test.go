package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// fuzzMethods are the methods FuzzHTTPAPI picks from (by its method byte).
var fuzzMethods = []string{
	http.MethodPost, http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodOptions,
}

// FuzzHTTPAPI sends hostile requests to the HTTP API of a whole daemon (real HTTP platform,
// session actors, SQLite store, echo agent) over loopback, and checks G7: no answer is a 5xx,
// every 4xx carries the JSON error body, and a message the API accepts is stored as sent (its
// session key names its chat, and the transcript holds its text). The daemon lives as long as the
// fuzz run, so inputs also meet the state earlier ones left.
//
// Run it with make fuzz FUZZ=FuzzHTTPAPI PKG=./supervisor.
func FuzzHTTPAPI(f *testing.F) {
	for _, s := range []struct {
		method           uint8
		target, ct, leid string
		body             string
	}{
		{0, "/v1/messages", "application/json", "", `{"chat_id":"c1","user_id":"u1","text":"hello"}`},
		{0, "/v1/messages?wait=5s", "", "", `{"chat_id":"c1","user_id":"u1","text":"hi","message_id":"m1"}`},
		{0, "/v1/messages?wait=5s", "", "", `{"chat_id":"c1","user_id":"u1","text":"hi","message_id":"m1"}`},
		{0, "/v1/messages?wait=-1s", "", "", `{"chat_id":"c1","user_id":"u1","text":"x"}`},
		{0, "/v1/messages?wait=%zz", "", "", `{"chat_id":"c1","user_id":"u1","text":"x"}`},
		{0, "/v1/messages", "", "", `{"chat_id":"g:1/%","chat_type":"group","user_id":"u\u2028","user_name":"\u0000evil\nname]","text":"a\u0000b"}`},
		{0, "/v1/messages", "", "", `{"chat_id":"t","chat_type":"thread","thread_id":"th","user_id":"u","profile":"Main","text":"/status"}`},
		{0, "/v1/messages?wait=2s", "", "", `{"chat_id":"c2","user_id":"u","text":"/new"}`},
		{0, "/v1/messages?wait=2s", "", "", `{"chat_id":"c3","user_id":"u","text":"/title  Old\tchat "}`},
		{0, "/v1/messages?wait=2s", "", "", `{"chat_id":"c3","user_id":"u","text":"/reset"}`},
		{0, "/v1/messages?wait=2s", "", "", `{"chat_id":"c3","user_id":"u","text":"/resume old chat"}`},
		{0, "/v1/messages?wait=2s", "", "", `{"chat_id":"c3","user_id":"u","text":"/RESUME \"*\" OR x"}`},
		{0, "/v1/messages?wait=2s", "", "", `{"chat_id":"c3","user_id":"u","text":"/undo"}`},
		{0, "/v1/messages?wait=2s", "", "", `{"chat_id":"c3","user_id":"u","text":"/retry"}`},
		{0, "/v1/messages?wait=2s", "", "", `{"chat_id":"c3","user_id":"u","text":"/queue collect"}`},
		{0, "/v1/messages", "", "", `{"chat_id":"c3","user_id":"u","text":"one"}`},
		{0, "/v1/messages", "", "", `{"chat_id":"c3","user_id":"u","text":"two"}`},
		{0, "/v1/messages?wait=2s", "", "", `{"chat_id":"c3","user_id":"u","text":"/queue\nbogus"}`},
		{0, "/v1/messages?wait=2s", "", "", `{"chat_id":"c3","user_id":"u","text":"/stop"}`},
		{0, "/v1/messages?wait=2s", "", "", `{"chat_id":"c3","user_id":"u","text":"/nope \u0000"}`},
		{0, "/v1/messages", "text/plain", "", `{"chat_id":"c1","user_id":"u1","text":"x"}`},
		{0, "/v1/messages", "application/json; charset=\"", "", `{}`},
		{0, "/v1/messages", "", "", `{"chat_id":"c1","user_id":"u1","text":"x"} {}`},
		{0, "/v1/messages", "", "", `{"chat_id":1}`},
		{0, "/v1/messages", "", "", `{"chat_id":"c","user_id":"u","text":"x","extra":1}`},
		{0, "/v1/messages", "", "", "\xff\xfe"},
		{0, "/v1/messages", "", "", `[]`},
		{0, "/v1/messages", "", "", ``},
		{1, "/v1/messages", "", "", ``},
		{1, "/v1/sessions?limit=0&state=x", "", "", ``},
		{1, "/v1/sessions?limit=99999999999999999999&after=%00", "", "", ``},
		{1, "/v1/sessions/agent:main:http:dm:c1", "", "", ``},
		{1, "/v1/sessions/agent:main:http:dm:c1/transcript?after=-1&limit=1&session_id=x", "", "", ``},
		{1, "/v1/sessions/agent%3Amain%3Ahttp%3Adm%3Ac1/transcript?limit=1", "", "", ``},
		{1, "/v1/sessions/agent:main:http:dm:c1/events", "", "18446744073709551616", ``},
		{1, "/v1/sessions/agent:main:http:dm:c1/events?after=0", "", "", ``},
		{1, "/v1/sessions/agent:main:http:dm:%2/events", "", "", ``},
		{1, "/v1/sessions/%ff/events", "", "", ``},
		{0, "/v1/sessions/agent:main:http:dm:c9/reset", "", "", ``},
		{2, "/v1/sessions/nokey", "", "", ``},
		{3, "/v1/messages", "", "", `{}`},
		{1, "/../v1//sessions/./x", "", "", ``},
		{1, "/readyz", "", "", ``},
	} {
		f.Add(s.method, s.target, s.ct, s.leid, []byte(s.body))
	}
	logs := &testutil.Buffer{}
	r := MustStartDaemon(f, echo.New(), daemonOpts{logs: logs})
	f.Cleanup(func() { r.stop(f) })
	base := "http://" + r.d.Addr().String()
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{}}
	f.Cleanup(client.CloseIdleConnections)

	f.Fuzz(func(t *testing.T, method uint8, target, contentType, lastEventID string, body []byte) {
		if !strings.HasPrefix(target, "/") {
			target = "/" + target
		}
		u, err := url.Parse(base + target)
		if err != nil || u.Host != r.d.Addr().String() || u.Fragment != "" || !validRequestURI(u.RequestURI()) ||
			!validHeader(contentType) || !validHeader(lastEventID) {
			return // no client sends that (net/http's server answers a broken request line itself)
		}
		req, err := http.NewRequestWithContext(t.Context(), fuzzMethods[int(method)%len(fuzzMethods)], u.String(), bytes.NewReader(body))
		if err != nil {
			return
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if lastEventID != "" {
			req.Header.Set("Last-Event-ID", lastEventID)
		}
		status, header, answer := mustRoundTrip(t, client, req)
		if t.Failed() {
			return
		}
		what := req.Method + " " + target
		if status >= 500 {
			t.Fatalf("%s = %d %s, want no 5xx; logs:\n%s", what, status, answer, logs.String())
		}
		if status >= 400 && req.Method != http.MethodHead {
			var e httpplatform.ErrorResponse
			if ct := header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("%s = %d with Content-Type %q, want application/json; body %q", what, status, ct, answer)
			}
			if err := json.Unmarshal(answer, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Fatalf("%s = %d %q, want a JSON error body with a code and a message (%v)", what, status, answer, err)
			}
		}
		if req.Method == http.MethodPost && u.Path == "/v1/messages" && (status == http.StatusOK || status == http.StatusAccepted) {
			checkAccepted(t, client, base, body, answer)
		}
	})
}

// validHeader reports whether v may be sent as a header value by net/http's client.
func validHeader(v string) bool {
	return !strings.ContainsFunc(v, func(r rune) bool { return (r < ' ' && r != '\t') || r == 0x7f })
}

// validRequestURI reports whether uri can stand in a request line: no space or control byte.
func validRequestURI(uri string) bool {
	return !strings.ContainsFunc(uri, func(r rune) bool { return r <= ' ' || r == 0x7f })
}

// mustRoundTrip sends req and returns the answer. An event stream is closed at once: only its
// status and headers are read.
func mustRoundTrip(t *testing.T, c *http.Client, req *http.Request) (int, http.Header, []byte) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) && strings.Contains(ue.Err.Error(), "net/http: ") && !ue.Timeout() {
			return 0, nil, nil // refused by the client before it was sent
		}
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s = %d with an event stream, want 200", req.Method, req.URL, resp.StatusCode)
		}
		return resp.StatusCode, resp.Header, nil
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read the answer: %v", req.Method, req.URL, err)
	}
	return resp.StatusCode, resp.Header, b
}

// checkAccepted checks an accepted message against the store through the API: its session key
// names the chat it was sent in, and unless it was a duplicate or a command, the transcript of
// that session holds its text (NUL characters replaced: PostgreSQL stores none).
func checkAccepted(t *testing.T, c *http.Client, base string, body, answer []byte) {
	t.Helper()
	var sent httpplatform.MessageRequest
	if err := json.Unmarshal(body, &sent); err != nil {
		t.Fatalf("accepted body %q does not decode: %v", body, err)
	}
	var ack httpplatform.MessageResponse
	if err := json.Unmarshal(answer, &ack); err != nil {
		t.Fatalf("accepted answer %q does not decode: %v", answer, err)
	}
	parts, err := identity.ParseKey(ack.SessionKey)
	if err != nil {
		t.Fatalf("accepted %q: session key %q does not parse: %v", body, ack.SessionKey, err)
	}
	if parts.Platform != httpplatform.Name || parts.ChatID != sent.ChatID {
		t.Fatalf("accepted %q: session key %q names platform %q chat %q, want %q %q",
			body, ack.SessionKey, parts.Platform, parts.ChatID, httpplatform.Name, sent.ChatID)
	}
	if sent.MessageID != "" && ack.MessageID != sent.MessageID {
		t.Fatalf("accepted %q: message_id %q, want %q", body, ack.MessageID, sent.MessageID)
	}
	switch ack.Disposition {
	case platforms.Started, platforms.Queued, platforms.Collected, platforms.Steered, platforms.Interrupted,
		platforms.Duplicate, platforms.Command:
	default:
		t.Fatalf("accepted %q with disposition %q, want what happened to it", body, ack.Disposition)
	}
	path := base + "/v1/sessions/" + url.PathEscape(ack.SessionKey)
	if n := len(ack.Replies); n > 0 {
		checkEvent(t, c, path, ack.Replies[n-1])
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, path+"/transcript", nil)
	status, _, tb := mustRoundTrip(t, c, req)
	if status != http.StatusOK {
		t.Fatalf("accepted %q, then GET its transcript = %d %s, want 200", body, status, tb)
	}
	var tr httpplatform.Transcript
	if err := json.Unmarshal(tb, &tr); err != nil {
		t.Fatalf("accepted %q, then its transcript %q does not decode: %v", body, tb, err)
	}
	if ack.Disposition == "duplicate" || strings.HasPrefix(strings.TrimSpace(sent.Text), "/") || tr.SessionID != ack.SessionID {
		return // an earlier text, a command, or a session ended since (another input's /new)
	}
	want := strings.ReplaceAll(sent.Text, "\x00", "\uFFFD")
	for _, m := range tr.Messages {
		if m.MessageID == ack.MessageID && m.Role == "user" {
			if !strings.HasSuffix(m.Text, want) {
				t.Fatalf("accepted %q: the transcript holds %q, want it to end in %q", body, m.Text, want)
			}
			return
		}
	}
	t.Fatalf("accepted %q as %s in session %s: its transcript %s has no such user message", body, ack.MessageID, ack.SessionID, tb)
}

// checkEvent resumes the event stream of a session (path) just before reply, as a client that
// lost it would, and checks that the first event is reply, whatever its text: its id, its kind
// and its data.
func checkEvent(t *testing.T, c *http.Client, path string, reply httpplatform.Reply) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, path+"/events", nil)
	req.Header.Set("Last-Event-ID", strconv.FormatInt(reply.Seq-1, 10))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", req.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d, want 200", req.URL, resp.StatusCode)
	}
	fields := map[string]string{}
	for r := bufio.NewReader(resp.Body); ; {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("GET %s: the stream ended with %q before an event: %v", req.URL, line, err)
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" && fields["data"] != "" {
			break
		}
		if name, value, ok := strings.Cut(line, ": "); ok && name != "" {
			if _, dup := fields[name]; dup {
				t.Fatalf("GET %s: field %s twice in one event, %q", req.URL, name, line)
			}
			fields[name] = value
		}
	}
	var ev httpplatform.Event
	if err := json.Unmarshal([]byte(fields["data"]), &ev); err != nil || fields["id"] != strconv.FormatInt(reply.Seq, 10) ||
		fields["event"] != reply.Kind || ev.Text != reply.Text {
		t.Fatalf("GET %s resumed with event %q (%v), want id %d, event %s, text %q", req.URL, fields, err, reply.Seq, reply.Kind, reply.Text)
	}
}
