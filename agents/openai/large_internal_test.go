package openai

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
	"github.com/agentgate/agentgate/internal/testutil"
)

// TestLargeAnswersAreReadFewAtATime: the calls of an agent read at most maxLargeAnswers
// answers past largeAnswer at once, a body or a stream's event alike; the next one waits (and
// says so at Debug) until one of them ends, or until its own turn ends. Before, every call read
// its answer up to MaxBody at once, holding about three times that while it decoded it: the
// agent.max_concurrent calls (32 by default) of an endpoint that answered each so held some
// 3 GiB.
func TestLargeAnswersAreReadFewAtATime(t *testing.T) {
	const waits = "model answer waits: other large answers are being read"
	filler := strings.Repeat("x", 2*largeAnswer)
	tests := []struct {
		name        string
		contentType string
		head, tail  string // of the answer, sent before and after the gate opens
		streaming   bool
	}{
		{name: "bodies", contentType: "application/json",
			head: `{"choices":[{"index":0,"message":{"role":"assistant","content":"the answer","reasoning_content":"` + filler,
			tail: `"},"finish_reason":"stop"}]}`},
		{name: "stream events", contentType: "text/event-stream", streaming: true,
			head: `data: {"choices":[{"index":0,"delta":{"content":"the answer","reasoning_content":"` + filler,
			tail: `"},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gate := make(chan struct{})
			m := openaitest.New(t, func(_ int, w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				io.WriteString(w, tc.head)
				w.(http.Flusher).Flush()
				select {
				case <-gate:
				case <-r.Context().Done():
					return
				}
				io.WriteString(w, tc.tail)
			})
			var logs testutil.Buffer
			a, err := New(Config{BaseURL: m.URL(), Model: "m",
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			run := func(ctx context.Context) <-chan error {
				done := make(chan error, 1)
				req := &agents.Request{Messages: []agents.Message{{Role: "user", Text: "hi"}}}
				if tc.streaming {
					req.Partial = func(string) {}
				}
				go func() {
					resp, err := a.Run(ctx, req)
					if err == nil && resp.Text != "the answer" {
						err = fmt.Errorf("reply %q, want %q", resp.Text, "the answer")
					}
					done <- err
				}()
				return done
			}

			var held []<-chan error
			for range maxLargeAnswers {
				held = append(held, run(t.Context()))
			}
			waitFor(t, "the first answers to be read past largeAnswer", func() bool { return len(a.large) == maxLargeAnswers })
			ctx, cancel := context.WithCancel(t.Context())
			waiting := run(ctx)
			waitFor(t, "the next answer to wait", func() bool { return strings.Contains(logs.String(), waits) })
			cancel()
			if err := <-waiting; !errors.Is(err, context.Canceled) {
				t.Errorf("Run of the waiting turn, cancelled = %v, want context.Canceled", err)
			}

			close(gate)
			for _, done := range held {
				if err := <-done; err != nil {
					t.Errorf("Run of a turn read first = %v", err)
				}
			}
			if err := <-run(t.Context()); err != nil {
				t.Errorf("Run of a turn after them = %v", err)
			}
			if n := len(a.large); n != 0 {
				t.Errorf("%d large answers held after every turn ended, want 0", n)
			}
			if n := strings.Count(logs.String(), waits); n != 1 {
				t.Errorf("%d lines %q, want 1:\n%s", n, waits, logs.String())
			}
		})
	}
}

// TestStreamGivesBackItsLargeAnswer: a stream gives back the large answer an event took once
// that event is decoded, and a later large event takes one again. Before, it kept it to the
// stream's end: two long streams that each once had an event past largeAnswer made every other
// large answer wait until those turns ended.
func TestStreamGivesBackItsLargeAnswer(t *testing.T) {
	event := func(content string, large bool) string {
		filler := ""
		if large {
			filler = strings.Repeat("x", 2*largeAnswer)
		}
		return `data: {"choices":[{"index":0,"delta":{"content":"` + content + `","reasoning_content":"` + filler + `"}}]}` + "\n\n"
	}
	gate := make(chan struct{})
	m := openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n > maxLargeAnswers { // the answer that must not wait for the streams' ends
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"the other answer","reasoning_content":"`+
				strings.Repeat("x", 2*largeAnswer)+`"},"finish_reason":"stop"}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, event("the answer", true)+strings.Repeat(event("", false), 100))
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, event(" again", true)+strings.Repeat(event("", false), 100)+
			`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	})
	a, err := New(Config{BaseURL: m.URL(), Model: "m"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	req := func(partial func(string)) *agents.Request {
		return &agents.Request{Messages: []agents.Message{{Role: "user", Text: "hi"}}, Partial: partial}
	}

	var streams []<-chan error
	var shown atomic.Int32 // streams whose large event was decoded
	for range maxLargeAnswers {
		done := make(chan error, 1)
		var once sync.Once
		go func() {
			resp, err := a.Run(t.Context(), req(func(string) { once.Do(func() { shown.Add(1) }) }))
			if err == nil && resp.Text != "the answer again" {
				err = fmt.Errorf("reply %q, want %q", resp.Text, "the answer again")
			}
			done <- err
		}()
		streams = append(streams, done)
	}
	waitFor(t, "each stream's large event to be decoded", func() bool { return shown.Load() == maxLargeAnswers })

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if resp, err := a.Run(ctx, req(nil)); err != nil {
		t.Errorf("Run of a large answer while the streams go on = %v, want the answer before they end", err)
	} else if resp.Text != "the other answer" {
		t.Errorf("Run of a large answer while the streams go on = %q, want %q", resp.Text, "the other answer")
	}

	close(gate)
	for _, done := range streams {
		if err := <-done; err != nil {
			t.Errorf("Run of a stream = %v", err)
		}
	}
	if n := len(a.large); n != 0 {
		t.Errorf("%d large answers held after every turn ended, want 0", n)
	}
}

// waitFor polls cond until it holds or 10 seconds pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
