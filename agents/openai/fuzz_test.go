package openai_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
)

// keyMarker in a fuzzed answer is replaced by the API key the request carried: an endpoint
// that echoes it back.
const keyMarker = "{KEY}"

// FuzzModelAnswer answers a turn's model call with whatever a broken or hostile endpoint
// might send (any status, content type and body, streamed or not) and checks what Run makes of
// it: an error or a reply, never a panic; a reply is valid UTF-8, not blank, at most MaxReply
// bytes, and what a streamed turn showed last (partials only ever grow); an error never carries
// the API key. (Token counts are passed on as the endpoint said: the session clamps them.)
//
// Run it with make fuzz FUZZ=FuzzModelAnswer PKG=./agents/openai.
func FuzzModelAnswer(f *testing.F) {
	const sse, js = "text/event-stream", "application/json"
	for _, s := range []struct {
		status uint16
		ct     string
		stream bool
		body   string
	}{
		{200, js, false, `{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`},
		{200, js, true, `{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"image"},{"text":"b"}]}}]}`},
		{200, js, false, `{"choices":[{"message":{"content":null,"refusal":"no"}}]}`},
		{200, js, false, `{"choices":[{"message":{"content":"  \n"}}]}`},
		{200, js, false, `{"choices":[]}`},
		{200, js, false, `{"error":{"message":"bad {KEY} sk-abcdefghijklmnop"}}`},
		{200, js, false, `{"error":"x","choices":[{"message":{"content":"hi"}}]}`},
		{200, js, false, `{"choices":[{"message":{"content":"\ud800"}}],"usage":{"prompt_tokens":-5,"completion_tokens":-9223372036854775808}}`},
		{200, js, false, "{\"choices\":[{\"message\":{\"content\":\"\xff\xfe\"}}]}"},
		{200, js, false, `{"choices":[{"message":{"content":"hi"}}]} trailing`},
		{200, "", false, `not json`},
		{200, sse, true, "data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"llo\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"},
		{200, sse, true, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n: keepalive\r\n\r\ndata: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2},\"choices\":[]}\n\ndata: [DONE]"},
		{200, sse, true, "data: {\"choices\":[{\"delta\":{\"content\":\"partial"},
		{200, sse, true, "data: {\"choices\":[{\"delta\":\ndata: {\"content\":\"split\"}}]}\n\ndata:[DONE]\n\n"},
		{200, sse, true, "event: error\ndata: {\"error\":{\"message\":\"overloaded {KEY}\"}}\n\n"},
		{200, sse, true, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: garbage\n\n"},
		{200, sse, true, "data: [DONE]\n\n"},
		{200, sse, true, "\n\n\n"},
		{200, sse, false, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"},
		{429, js, true, `{"error":{"message":"slow down"}}`},
		{422, js, true, `{"detail":[{"loc":["body","stream_options"],"msg":"Extra inputs are not permitted","input":{"k":"{KEY}"}}]}`},
		{400, js, true, `{"object":"error","message":"[{'type': 'value_error', 'loc': ('body',), 'input': {'stream_options': {}}}]","param":null}`},
		{500, "text/html", false, "<html>\x00{KEY}\n\n\x1b[31m</html>"},
		{502, "text/html", false, "<!DOCTYPE html><!--[if IE 7]><html><![endif]--><head><title>{KEY} | 502</title><style>{KEY}</style></head><script>x='{KEY}'</script><p>&lt;b&gt;\x1b[1m{KEY}\x1b]8;;u\x07</p>"},
		{200, sse, true, "data: error: \x1b[31m{KEY}[0m\x1b(B\n\nevent: error\ndata: <html>{KEY}</html>\n\n"},
		{401, js, false, `{"message":"Bearer {KEY} is wrong"}`},
		{302, "", false, ``},
		{204, "", false, ``},
	} {
		f.Add(s.status, s.ct, s.stream, []byte(s.body))
	}

	type answer struct {
		status int
		ct     string
		body   []byte
	}
	var mu sync.Mutex
	var next answer
	m := openaitest.New(f, func(_ int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		a := next
		mu.Unlock()
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if a.ct != "" {
			w.Header().Set("Content-Type", a.ct)
		}
		w.WriteHeader(a.status)
		_, _ = w.Write(bytes.ReplaceAll(a.body, []byte(keyMarker), []byte(key)))
	})
	f.Setenv("OPENAI_TEST_KEY", testKey)
	agent, err := openai.New(openai.Config{
		BaseURL: m.URL(), Model: "gpt-test", APIKeyEnv: "OPENAI_TEST_KEY", Timeout: 10 * time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, status uint16, contentType string, stream bool, body []byte) {
		if status < 200 || status > 599 || strings.ContainsAny(contentType, "\r\n\x00") {
			return // not an answer net/http serves
		}
		mu.Lock()
		next = answer{status: int(status), ct: contentType, body: body}
		mu.Unlock()

		var partials []string
		req := &agents.Request{Messages: []agents.Message{{Role: "user", Text: "hi"}}}
		if stream {
			req.Partial = func(s string) { partials = append(partials, s) } // called by Run's call, one at a time
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		resp, err := agent.Run(ctx, req)
		for i := 1; i < len(partials); i++ {
			if !strings.HasPrefix(partials[i], partials[i-1]) || partials[i] == partials[i-1] {
				t.Fatalf("Run on %q: partial %q after %q, want it to grow", body, partials[i], partials[i-1])
			}
		}
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, testKey) || !utf8.ValidString(msg) || len(msg) > 4<<10 {
				t.Fatalf("Run on %d %q: error %q, want a short valid message without the key", status, body, msg)
			}
			return
		}
		text := resp.Text
		switch {
		case !utf8.ValidString(text):
			t.Fatalf("Run on %q = %q, not valid UTF-8", body, text)
		case strings.TrimSpace(text) == "" || strings.TrimSpace(text) != text:
			t.Fatalf("Run on %q = %q, want a trimmed, not blank reply", body, text)
		case len(text) > openai.MaxReply:
			t.Fatalf("Run on %q: a reply of %d bytes, want at most %d", body, len(text), openai.MaxReply)
		case len(partials) > 0 && strings.TrimSpace(partials[len(partials)-1]) != text:
			t.Fatalf("Run on %q = %q, but the last partial shown was %q", body, text, partials[len(partials)-1])
		}
	})
}
