package openai_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
	"github.com/agentgate/agentgate/internal/testutil"
)

// TestManyCutTurnsLeaveNothingBehind ends many turns midway, as interrupts, timeouts and a
// model that breaks off do, against a fake model on loopback, and checks that the process is
// left with what it had: each cut request's connection, its goroutines (the client's and the
// fake server's) and the turn's own goroutines end. A daemon that runs for months interrupts
// thousands of streams.
func TestManyCutTurnsLeaveNothingBehind(t *testing.T) {
	const turns = 200
	for _, tc := range []struct {
		name string
		// answer is the model's; cut ends the turn from outside once the model has streamed
		// (it is nil when the turn ends by itself).
		answer  http.HandlerFunc
		cut     func(cancel context.CancelFunc)
		timeout time.Duration
		stream  bool
		steer   bool
	}{
		{name: "interrupted mid-stream", stream: true, answer: streamUntilCancelled, cut: func(c context.CancelFunc) { c() }},
		{name: "interrupted mid-stream while steering", stream: true, steer: true, answer: streamUntilCancelled,
			cut: func(c context.CancelFunc) { c() }},
		{name: "interrupted before the reply", answer: func(w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush() // headers go out; the body never comes
			<-r.Context().Done()
		}, cut: func(c context.CancelFunc) { c() }},
		{name: "times out mid-stream", stream: true, answer: streamUntilCancelled, timeout: 20 * time.Millisecond},
		{name: "stream broken off by the model", stream: true, answer: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half\"}}]}\n\n")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection breaks without [DONE]
		}},
		{name: "answers", answer: openaitest.Reply("whole", 3, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := openaitest.New(t, func(_ int, w http.ResponseWriter, r *http.Request) { tc.answer(w, r) })
			// The client keeps a few idle connections for the next turns: they are closed
			// before each count, so that only what a turn left counts.
			client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) {
				c.HTTPClient = client
				c.MaxRetries = 0
				if tc.timeout > 0 {
					c.Timeout = tc.timeout
				}
			})
			run := func(n int) {
				var wg sync.WaitGroup
				for range n {
					wg.Go(func() { runCut(t, a, tc.stream, tc.steer, tc.cut) })
				}
				wg.Wait()
			}
			run(8)
			client.CloseIdleConnections()
			base := testutil.TakeResources()
			for range turns / 8 {
				run(8)
			}
			client.CloseIdleConnections()
			testutil.MustSettle(t, tc.name, base, testutil.Slack{Goroutines: 2, FDs: 2}, 10*time.Second)
		})
	}
}

// streamUntilCancelled streams one delta, then waits for the request to end.
func streamUntilCancelled(w http.ResponseWriter, r *http.Request) {
	openaitest.WriteStream(w, r, r.Context().Done(), 1, 1, "first", "never")
}

// runCut runs one turn; when cut is set, it calls it with the turn's cancel once the first
// partial text arrived (or, without streaming, once the model has the request).
func runCut(t *testing.T, a *openai.Agent, stream, steer bool, cut func(context.CancelFunc)) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req := &agents.Request{Messages: []agents.Message{{Role: "user", Text: "hi"}}}
	first := make(chan struct{})
	var once sync.Once
	if stream {
		req.Partial = func(string) { once.Do(func() { close(first) }) }
	}
	if steer {
		req.Steer = make(chan agents.Message) // open for the whole turn, as a Turn's is
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.Run(ctx, req)
		done <- err
	}()
	if cut != nil {
		if stream {
			select {
			case <-first:
			case err := <-done:
				t.Errorf("Run() = %v before its first partial text", err)
				return
			}
		} else {
			time.Sleep(5 * time.Millisecond) // a moment for the request to reach the model
		}
		cut(cancel)
	}
	if err := <-done; cut != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Run() after a cut = %v, want context.Canceled", err)
	}
}
