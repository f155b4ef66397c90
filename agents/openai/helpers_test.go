package openai_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/openai"
)

// testKey is the API key of every test; no output may ever contain it.
const testKey = "sk-test-4f9c2d7e1b8a6035c9e7d2f1a4b6c8e0"

// call is one request the fake model received.
type call struct {
	Body   string
	Header http.Header
}

// fakeModel is an httptest chat completions endpoint on loopback. Each request is answered by
// the next step (the last one repeats); every request is recorded first.
type fakeModel struct {
	t     testing.TB
	srv   *httptest.Server
	mu    sync.Mutex
	calls []call
	steps []http.HandlerFunc
	got   chan struct{} // receives once per request, after it is recorded
}

func newFakeModel(t testing.TB, steps ...http.HandlerFunc) *fakeModel {
	t.Helper()
	m := &fakeModel{t: t, steps: steps, got: make(chan struct{}, 64)}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *fakeModel) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, "wrong endpoint "+r.Method+" "+r.URL.Path, http.StatusNotFound)
		return
	}
	body, _ := io.ReadAll(r.Body)
	m.mu.Lock()
	m.calls = append(m.calls, call{Body: string(body), Header: r.Header.Clone()})
	n := len(m.calls)
	step := m.steps[min(n, len(m.steps))-1]
	m.mu.Unlock()
	m.got <- struct{}{}
	step(w, r)
}

func (m *fakeModel) url() string { return m.srv.URL + "/v1" }

func (m *fakeModel) recorded() []call {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]call(nil), m.calls...)
}

// waitCall blocks until the model received its next request.
func (m *fakeModel) waitCall(t testing.TB) {
	t.Helper()
	select {
	case <-m.got:
	case <-time.After(30 * time.Second):
		t.Fatal("the model got no request within 30s")
	}
}

// reply answers with one non-streamed completion.
func reply(text string, in, out int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			text, in, out, in+out)
	}
}

// status answers with an error status, optional headers ("Retry-After: 7") and body.
func status(code int, body string, headers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for _, h := range headers {
			k, v, _ := strings.Cut(h, ": ")
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
}

// stream answers with an SSE stream of content deltas, then a usage chunk and [DONE]. Before
// each delta after the first it waits for a value on gate (when gate is not nil).
func stream(gate <-chan struct{}, in, out int64, deltas ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		io.WriteString(w, ": keep-alive\n\n")
		fmt.Fprintf(w, "data: %s\n\n", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`)
		for i, d := range deltas {
			if i > 0 && gate != nil {
				select {
				case <-gate:
				case <-r.Context().Done():
					return
				}
			}
			b, _ := json.Marshal(d)
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%s},\"finish_reason\":null}]}\n\n", b)
			f.Flush()
		}
		fmt.Fprintf(w, "data: %s\n\n", `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\n", in, out)
		io.WriteString(w, "data: [DONE]\n\n")
	}
}

// sleeps records the waits of an agent's retries without waiting.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) waits() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// MustAgent builds an agent for m with the key in OPENAI_TEST_KEY, debug logs into logs (when
// not nil) and recorded sleeps; tweak changes the config first.
func MustAgent(t *testing.T, m *fakeModel, logs io.Writer, sl *sleeps, tweak func(*openai.Config)) *openai.Agent {
	t.Helper()
	t.Setenv("OPENAI_TEST_KEY", testKey)
	if logs == nil {
		logs = io.Discard
	}
	if sl == nil {
		sl = &sleeps{}
	}
	c := openai.Config{
		BaseURL: m.url(), Model: "gpt-test", APIKeyEnv: "OPENAI_TEST_KEY",
		MaxHistory: 20, MaxRetries: 3, Sleep: sl.sleep,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if tweak != nil {
		tweak(&c)
	}
	a, err := openai.New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return a
}

// compact returns the compact form of a JSON literal.
func compact(t testing.TB, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("compact %s: %v", s, err)
	}
	return b.String()
}
