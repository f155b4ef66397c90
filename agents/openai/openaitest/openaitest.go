// Package openaitest is a fake OpenAI-compatible chat completions endpoint for tests: an
// httptest server on loopback that records every request and answers it with a handler the
// test chooses, and the handlers for the answers a model gives (a completion, a stream of
// deltas, an error status). The openai agent's tests and the runtime's tests use the same one.
package openaitest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Request is one request the model received.
type Request struct {
	Body   string
	Header http.Header
	// URL is the request's path and query, as it was sent.
	URL string
}

// Model is the fake endpoint. It serves POST /v1/chat/completions only; every request is
// recorded before it is answered.
type Model struct {
	srv    *httptest.Server
	answer func(n int, w http.ResponseWriter, r *http.Request)

	mu      sync.Mutex
	reqs    []Request
	arrived chan struct{} // closed and replaced at every request
	waited  int           // requests Wait has returned for
}

// New starts a model that answers the n-th request (from 1) with answer, and stops it when the
// test ends.
func New(t testing.TB, answer func(n int, w http.ResponseWriter, r *http.Request)) *Model {
	t.Helper()
	m := &Model{answer: answer, arrived: make(chan struct{})}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

// Steps answers the n-th request with steps[n-1], and every request after the last step with
// the last step.
func Steps(steps ...http.HandlerFunc) func(n int, w http.ResponseWriter, r *http.Request) {
	return func(n int, w http.ResponseWriter, r *http.Request) {
		steps[min(n, len(steps))-1](w, r)
	}
}

func (m *Model) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, "wrong endpoint "+r.Method+" "+r.URL.Path, http.StatusNotFound)
		return
	}
	body, _ := io.ReadAll(r.Body)
	m.mu.Lock()
	m.reqs = append(m.reqs, Request{Body: string(body), Header: r.Header.Clone(), URL: r.URL.RequestURI()})
	n := len(m.reqs)
	close(m.arrived)
	m.arrived = make(chan struct{})
	m.mu.Unlock()
	m.answer(n, w, r)
}

// URL is the base URL an agent is configured with (it ends in /v1).
func (m *Model) URL() string { return m.srv.URL + "/v1" }

// Requests returns the requests received so far, in order.
func (m *Model) Requests() []Request {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Request(nil), m.reqs...)
}

// Count is the number of requests received so far.
func (m *Model) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.reqs)
}

// Body returns the n-th request's body (from 1); the test fails if there is none yet.
func (m *Model) Body(t testing.TB, n int) string {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.reqs) < n {
		t.Fatalf("the model got %d requests, want at least %d", len(m.reqs), n)
	}
	return m.reqs[n-1].Body
}

// WaitRequests blocks until the model has received n requests (30 s at most, then the test
// fails).
func (m *Model) WaitRequests(t testing.TB, n int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		m.mu.Lock()
		got, arrived := len(m.reqs), m.arrived
		m.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-arrived:
		case <-deadline:
			t.Fatalf("the model got %d requests within 30s, want %d", got, n)
		}
	}
}

// Wait blocks until the model has received one request more than when Wait last returned.
func (m *Model) Wait(t testing.TB) {
	t.Helper()
	m.mu.Lock()
	m.waited++
	n := m.waited
	m.mu.Unlock()
	m.WaitRequests(t, n)
}

// Reply answers with one non-streamed completion and its token usage.
func Reply(text string, in, out int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { WriteReply(w, text, in, out) }
}

// WriteReply writes one non-streamed completion and its token usage.
func WriteReply(w http.ResponseWriter, text string, in, out int64) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%s},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
		jsonString(text), in, out, in+out)
}

// Status answers with an error status, optional headers ("Retry-After: 7") and body.
func Status(code int, body string, headers ...string) http.HandlerFunc {
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

// Raw answers 200 with body as it is, labelled contentType: for the answers of servers and
// proxies that do not quite follow the API.
func Raw(contentType, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		io.WriteString(w, body)
	}
}

// Stream answers with a server-sent event stream as OpenAI sends it: a keep-alive comment, a
// first chunk with the role, one chunk per delta, a chunk with the finish reason, a usage
// chunk and [DONE]. Before each delta after the first it waits for a value on gate (when gate
// is not nil), or for the request to end.
func Stream(gate <-chan struct{}, in, out int64, deltas ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { WriteStream(w, r, gate, in, out, deltas...) }
}

// WriteStream writes the stream of Stream.
func WriteStream(w http.ResponseWriter, r *http.Request, gate <-chan struct{}, in, out int64, deltas ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	io.WriteString(w, ": keep-alive\n\n")
	io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n")
	for i, d := range deltas {
		if i > 0 && gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%s},\"finish_reason\":null}]}\n\n", jsonString(d))
		f.Flush()
	}
	io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\n", in, out)
	io.WriteString(w, "data: [DONE]\n\n")
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
